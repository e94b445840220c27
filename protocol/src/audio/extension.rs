//! Versioned additions to the deployed packet that an old consumer never trips over.
//!
//! Two channels, chosen by what an old consumer does with them:
//! - **NATS headers** on the deployed `frame`/`end` packets. The deployed consumers read
//!   only the message body, so headers are invisible to them: protocol version, capture
//!   time, why a stream ended, and the overload report travel here, on every deployment.
//! - **New packet types** (`gap`) that change the timeline. An old consumer would treat
//!   an unknown type as an error, so they are sent only when the deployment declares
//!   its consumers understand them (the ingress `gap` policy). See [`super::packet`].
//!
//! Rollback rule: removing weir (old producers) or deploying old consumers never breaks
//! the `frame`/`end` exchange, because the body of `frame` and `end` is byte-for-byte
//! the deployed layout and nothing old depends on a header.
//!
//! Header values are ASCII: integers in decimal, names in snake_case, the overload report
//! as compact JSON. Readers ignore unknown header names and treat a malformed value as
//! absent (and count it), never as a reason to drop the packet.

use serde::{Deserialize, Serialize};

use crate::WireName;

/// The extension version weir writes in [`headers::VERSION`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Header names.
pub mod headers {
    /// Extension version (`1`). Absent on packets from deployed Python producers.
    pub const VERSION: &str = "Weir-Audio-Version";
    /// Unix time in milliseconds at which the ingress accepted the frame.
    pub const CAPTURED_AT_MS: &str = "Weir-Captured-At-Ms";
    /// On `end`: why the stream ended ([`super::EndReason`]).
    pub const END_REASON: &str = "Weir-End-Reason";
    /// On `end` after an overload: the [`super::Overload`] report as JSON.
    pub const OVERLOAD: &str = "Weir-Overload";
    /// Frames of this stream that may not have reached the server (see
    /// [`super::PossibleLoss`]); compact JSON. Sent on the next packet after the
    /// ingress declares them, and (cumulative) on the `end`.
    pub const POSSIBLY_LOST: &str = "Weir-Possibly-Lost";
}

/// Why a stream ended, carried on the `end` packet.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum EndReason {
    /// The producer finished the stream.
    Producer,
    /// The ingress ended the stream because it could not keep within its budget.
    Overload,
    /// The ingress is shutting down.
    Shutdown,
    /// The producer disappeared without ending the stream (socket dropped).
    ProducerGone,
    /// The producer was silent for longer than the idle timeout.
    Idle,
    /// An internal error ended the stream.
    Error,
    /// The recognition worker that owns the stream's partition refused it (every slot
    /// taken): the door ended it rather than publish audio nobody will recognise.
    NoCapacity,
}

/// What tripped the overload.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum OverloadReason {
    /// The byte budget stayed full for longer than `max_wait`.
    QueueFull,
    /// The oldest pending frame outlived `max_age`.
    MaxAge,
    /// NATS did not take a publish within its timeout.
    PublishTimeout,
    /// The producer sent audio faster than `max_rate` × real time beyond its burst.
    Rate,
    /// A reason this version does not know.
    #[serde(other)]
    Other,
}

/// The overload report carried in [`headers::OVERLOAD`] and sent to the producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Overload {
    /// What tripped it.
    pub reason: OverloadReason,
    /// Frames not published because of it (refused, or dropped from the queue).
    pub dropped_frames: u64,
    /// Samples in those frames.
    pub dropped_samples: u64,
    /// Bytes pending when it tripped.
    pub pending_bytes: u64,
    /// The byte budget.
    pub max_bytes: u64,
    /// The age budget in milliseconds.
    pub max_age_ms: u64,
    /// The seqs of the admitted frames the overload dropped (`dropped_first_seq ..=
    /// dropped_last_seq`; refused frames never got one): a consumer counts the hole they
    /// leave before the `end` as declared, not as an undetected loss. Absent when no
    /// admitted frame was dropped, and from producers that do not write the field (readers
    /// then see an undeclared hole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_first_seq: Option<u64>,
    /// See `dropped_first_seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_last_seq: Option<u64>,
}

impl Overload {
    /// The header value (compact JSON).
    pub fn to_header_value(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a header value; `None` when it is not a valid report.
    pub fn from_header_value(s: &str) -> Option<Self> {
        serde_json::from_str(s).ok()
    }
}

/// A declared *possible* loss: packets of one stream that the ingress handed to its NATS
/// client but that the server had not confirmed when the connection dropped. Core
/// NATS is at-most-once and the client discards its unsent buffer on reconnect, so some,
/// all or none of them may have arrived. A consumer that saw a hole inside
/// `first_seq..=last_seq` counts it as *declared* possible loss, not as an undetected
/// hole.
///
/// Header [`headers::POSSIBLY_LOST`], compact JSON:
/// `{"first_seq":101,"last_seq":125,"frames":25,"total_frames":25,"reason":"unconfirmed_at_disconnect"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PossibleLoss {
    /// First seq of the range declared by this packet.
    pub first_seq: u64,
    /// Last seq of the range declared by this packet.
    pub last_seq: u64,
    /// Frames (audio packets) inside the range that were unconfirmed.
    pub frames: u64,
    /// All frames of the stream declared possibly lost so far (cumulative).
    pub total_frames: u64,
    /// Why.
    pub reason: PossibleLossReason,
}

/// Why packets are possibly lost.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum PossibleLossReason {
    /// The connection dropped (reconnect) before the server confirmed them.
    UnconfirmedAtDisconnect,
    /// The producer's connection dropped and it resumed the stream: frames it offered
    /// that never reached the ingress (none of them arrived). The `close` policy's
    /// declaration of a resume; the `gap` policy sends a `gap` packet instead.
    Resume,
    /// The audio never reached the ingress from its source (a telephony carrier's
    /// missing or late chunks): the `close` policy's declaration of them; the `gap`
    /// policy sends a `gap` packet instead.
    Source,
    /// A reason this version does not know.
    #[serde(other)]
    Other,
}

impl PossibleLoss {
    /// The header value (compact JSON).
    pub fn to_header_value(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a header value; `None` when malformed: not a JSON object (serde would
    /// also take a positional array), a missing or mistyped field, or `first_seq` 0 or
    /// above `last_seq`.
    pub fn from_header_value(s: &str) -> Option<Self> {
        if !s.trim_start().starts_with('{') {
            return None;
        }
        serde_json::from_str::<Self>(s)
            .ok()
            .filter(|p| p.first_seq >= 1 && p.first_seq <= p.last_seq)
    }
}

/// The extension fields of one packet, read from its headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extensions {
    /// [`headers::VERSION`], if present and valid.
    pub version: Option<u32>,
    /// [`headers::CAPTURED_AT_MS`], if present and valid.
    pub captured_at_ms: Option<u64>,
    /// [`headers::END_REASON`], if present and known.
    pub end_reason: Option<EndReason>,
    /// [`headers::OVERLOAD`], if present and valid.
    pub overload: Option<Overload>,
    /// [`headers::POSSIBLY_LOST`], if present and valid.
    pub possibly_lost: Option<PossibleLoss>,
    /// How many present headers had a malformed value (ignored, not fatal).
    pub malformed: u32,
}

impl Extensions {
    /// Reads the extension headers through `get` (a lookup by header name).
    pub fn read<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        let mut ext = Self::default();
        if let Some(v) = get(headers::VERSION) {
            ext.version = v.trim().parse().ok();
            ext.malformed += u32::from(ext.version.is_none());
        }
        if let Some(v) = get(headers::CAPTURED_AT_MS) {
            ext.captured_at_ms = v.trim().parse().ok();
            ext.malformed += u32::from(ext.captured_at_ms.is_none());
        }
        if let Some(v) = get(headers::END_REASON) {
            ext.end_reason = EndReason::from_wire(v.trim());
            ext.malformed += u32::from(ext.end_reason.is_none());
        }
        if let Some(v) = get(headers::OVERLOAD) {
            ext.overload = Overload::from_header_value(v);
            ext.malformed += u32::from(ext.overload.is_none());
        }
        if let Some(v) = get(headers::POSSIBLY_LOST) {
            ext.possibly_lost = PossibleLoss::from_header_value(v);
            ext.malformed += u32::from(ext.possibly_lost.is_none());
        }
        ext
    }

    /// The headers to write, as (name, value) pairs, version first.
    pub fn to_pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(4);
        if let Some(v) = self.version {
            out.push((headers::VERSION, v.to_string()));
        }
        if let Some(v) = self.captured_at_ms {
            out.push((headers::CAPTURED_AT_MS, v.to_string()));
        }
        if let Some(r) = self.end_reason {
            out.push((headers::END_REASON, r.as_str().to_owned()));
        }
        if let Some(o) = &self.overload {
            out.push((headers::OVERLOAD, o.to_header_value()));
        }
        if let Some(p) = &self.possibly_lost {
            out.push((headers::POSSIBLY_LOST, p.to_header_value()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn headers_round_trip() {
        let ext = Extensions {
            version: Some(PROTOCOL_VERSION),
            captured_at_ms: Some(1_700_000_000_123),
            end_reason: Some(EndReason::Overload),
            overload: Some(Overload {
                reason: OverloadReason::QueueFull,
                dropped_frames: 3,
                dropped_samples: 960,
                dropped_first_seq: None,
                dropped_last_seq: None,
                pending_bytes: 16_000,
                max_bytes: 16_000,
                max_age_ms: 500,
            }),
            possibly_lost: None,
            malformed: 0,
        };
        let map: HashMap<&str, String> = ext.to_pairs().into_iter().collect();
        let back = Extensions::read(|k| map.get(k).map(String::as_str));
        assert_eq!(back, ext);
    }

    #[test]
    fn malformed_values_are_counted_not_fatal() {
        let map: HashMap<&str, &str> = [
            (headers::VERSION, "one"),
            (headers::END_REASON, "meteor"),
            (headers::OVERLOAD, "{not json"),
            (headers::CAPTURED_AT_MS, "17"),
        ]
        .into_iter()
        .collect();
        let ext = Extensions::read(|k| map.get(k).copied());
        assert_eq!(ext.malformed, 3);
        assert_eq!(ext.captured_at_ms, Some(17));
        assert_eq!(ext.version, None);
    }

    #[test]
    fn possible_loss_round_trips_as_compact_json() {
        let loss = PossibleLoss {
            first_seq: 101,
            last_seq: 125,
            frames: 25,
            total_frames: 40,
            reason: PossibleLossReason::UnconfirmedAtDisconnect,
        };
        let value = loss.to_header_value();
        assert_eq!(
            value,
            r#"{"first_seq":101,"last_seq":125,"frames":25,"total_frames":40,"reason":"unconfirmed_at_disconnect"}"#
        );
        assert_eq!(PossibleLoss::from_header_value(&value), Some(loss.clone()));
        // Through the header map, next to the other extensions.
        let ext = Extensions {
            version: Some(PROTOCOL_VERSION),
            possibly_lost: Some(loss),
            ..Extensions::default()
        };
        let pairs = ext.to_pairs();
        assert_eq!(
            pairs.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec![headers::VERSION, headers::POSSIBLY_LOST]
        );
        let map: HashMap<&str, String> = pairs.into_iter().collect();
        let back = Extensions::read(|k| map.get(k).map(String::as_str));
        assert_eq!(back, ext);
        // A single frame, key order and spacing free, unknown keys ignored; an unknown
        // reason is `Other`, not a refusal.
        let one = PossibleLoss::from_header_value(
            r#" { "reason" : "cosmic_ray", "total_frames":1, "frames":1, "last_seq":7, "first_seq":7, "new":[1] } "#,
        )
        .expect("valid");
        assert_eq!((one.first_seq, one.last_seq), (7, 7));
        assert_eq!(one.reason, PossibleLossReason::Other);
        assert_eq!(PossibleLossReason::Other.as_str(), "other");
    }

    #[test]
    fn malformed_possible_loss_is_absent_and_counted() {
        for bad in [
            "",
            "25",
            "{not json",
            r#"{"first_seq":0,"last_seq":5,"frames":5,"total_frames":5,"reason":"unconfirmed_at_disconnect"}"#,
            r#"{"first_seq":9,"last_seq":5,"frames":5,"total_frames":5,"reason":"unconfirmed_at_disconnect"}"#,
            r#"{"first_seq":1,"last_seq":5,"frames":5,"reason":"unconfirmed_at_disconnect"}"#,
            r#"{"first_seq":"1","last_seq":5,"frames":5,"total_frames":5,"reason":"unconfirmed_at_disconnect"}"#,
            r#"{"first_seq":1,"last_seq":5,"frames":-1,"total_frames":5,"reason":"unconfirmed_at_disconnect"}"#,
            r#"{"first_seq":1,"last_seq":5,"frames":5,"total_frames":5,"reason":7}"#,
            r#"[1,5,5,5,"unconfirmed_at_disconnect"]"#,
        ] {
            assert_eq!(PossibleLoss::from_header_value(bad), None, "{bad:?}");
            let ext = Extensions::read(|k| (k == headers::POSSIBLY_LOST).then_some(bad));
            assert_eq!(ext.possibly_lost, None, "{bad:?}");
            assert_eq!(ext.malformed, 1, "{bad:?}");
        }
    }

    #[test]
    fn old_packets_have_no_extensions() {
        let ext = Extensions::read(|_| None);
        assert_eq!(ext, Extensions::default());
    }
}
