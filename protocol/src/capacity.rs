//! Recognition capacity: what a recognition worker announces about itself, and the
//! notice it sends when it refuses a stream (docs/protocol.md §5.1).
//!
//! - **Announcement** ([`Announcement`]), on core NATS, about once a second, subject
//!   [`announce_subject`] = `<prefix>.announce.<worker>` (prefix default
//!   [`DEFAULT_PREFIX`]): the worker's slots (`max_streams`), its load (live streams
//!   and the lag of each: the age of the oldest frame not yet taken by its handler),
//!   its real-time factor (handler busy time over audio time, a decaying p95) and the
//!   partitions it delivers now. A worker not heard for [`gone_after`] its own
//!   interval is gone.
//! - **Refusal** ([`Refusal`]), subject [`refused_subject`] =
//!   `<prefix>.refused.<stream>`: a worker at `max_streams` refused a new stream; the
//!   door that holds the stream's producer ends it with an explicit refusal.
//!
//! Invariants of the decoding ([`Announcement::decode`], [`Refusal::decode`]): the
//! payload is at most [`MAX_PAYLOAD_BYTES`]; the JSON is one object with exactly the
//! documented members (an unknown member refuses the message: a reader must not admit
//! on numbers it half understands); `v` is [`VERSION`]; the worker id is the subject's
//! last token and a safe id; every number is inside its documented range;
//! [`Announcement::check_fresh`] refuses a message sent too long ago (or too far in the
//! future) on the reader's clock. Each refusal is a [`CapacityError`] whose
//! [`kind`](CapacityError::kind) a reader counts. Nothing here panics on input.

use serde::{Deserialize, Serialize};

use crate::partition::MAX_PARTITIONS;
use crate::stream_id::StreamId;

/// The default subject prefix of announcements and refusals.
pub const DEFAULT_PREFIX: &str = "weir.capacity";
/// The version this build writes and reads (`v`).
pub const VERSION: u32 = 1;
/// Largest payload a reader decodes; anything longer is refused unread.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// At most this many live streams are listed in `streams` (the rest only counted, with
/// `streams_truncated`).
pub const MAX_LISTED_STREAMS: usize = 512;
/// Default announcement interval.
pub const DEFAULT_INTERVAL_MS: u64 = 1_000;
/// Allowed `interval_ms`.
pub const INTERVAL_RANGE_MS: (u64, u64) = (100, 60_000);
/// Largest `max_streams` (the consumer core's own cap).
pub const MAX_SLOTS: u64 = 1_000_000;
/// Largest lag a worker may report, ms (one hour).
pub const MAX_LAG_MS: u64 = 3_600_000;
/// Largest real-time factor a worker may report.
pub const MAX_RTF: f64 = 1_000.0;
/// How far ahead of the reader's clock `sent_at_ms` may be (clock skew), ms.
pub const MAX_CLOCK_AHEAD_MS: u64 = 5_000;
/// Longest worker id and instance nonce.
pub const MAX_ID_LEN: usize = 64;

/// How long after its last announcement a worker announcing every `interval_ms` is
/// gone: 2.5 intervals (2.5 s with the default), so a killed worker's slots leave a
/// reader's view within 3 s while one late announcement does not.
pub fn gone_after(interval_ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(interval_ms.saturating_mul(5) / 2)
}

/// `<prefix>.announce.<worker>`.
pub fn announce_subject(prefix: &str, worker: &str) -> String {
    format!("{prefix}.announce.{worker}")
}

/// `<prefix>.announce.*`: every worker's announcements.
pub fn announce_wildcard(prefix: &str) -> String {
    format!("{prefix}.announce.*")
}

/// `<prefix>.refused.<stream>`.
pub fn refused_subject(prefix: &str, stream: &StreamId) -> String {
    format!("{prefix}.refused.{}", stream.as_str())
}

/// `<prefix>.refused.*`: every refusal.
pub fn refused_wildcard(prefix: &str) -> String {
    format!("{prefix}.refused.*")
}

/// The last token of `subject` (the worker id of an announcement, the stream id of a
/// refusal).
pub fn last_token(subject: &str) -> &str {
    subject.rsplit('.').next().unwrap_or(subject)
}

/// Whether `id` is a safe worker id or instance nonce: 1..=64 of `A-Z a-z 0-9 _ -`
/// (the lease worker id's rule: a NATS subject token with no wildcard).
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether a subject prefix is usable: 1..=128 bytes of dot-separated non-empty tokens
/// without wildcards or whitespace.
pub fn is_valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 128
        && prefix.split('.').all(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'*' && b != b'>')
        })
}

/// How the worker's partitions are decided.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum OwnershipKind {
    /// A configured list (`owned`).
    Static,
    /// Leases in a JetStream KV bucket (`lease_bucket`), one key `p.<n>` per partition
    /// whose value is the owner's worker id.
    Lease,
}

/// One live stream of a worker and its lag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StreamLoad {
    /// The stream id.
    pub id: String,
    /// Age of the oldest frame of this stream not yet taken by its handler, ms (0 when
    /// none is waiting).
    pub lag_ms: u64,
}

/// A worker's capacity, announced about once a second on [`announce_subject`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Announcement {
    /// [`VERSION`].
    pub v: u32,
    /// The worker id (equal to the subject's last token).
    pub worker: String,
    /// A nonce drawn at the worker's start (same rule as a worker id): tells a
    /// restarted worker, or a second process claiming the same id, from the first.
    pub instance: String,
    /// 1 for the first announcement of an instance, then +1 each.
    pub seq: u64,
    /// Send time, Unix ms on the worker's clock.
    pub sent_at_ms: u64,
    /// The worker's announcement interval, ms (100..=60,000).
    pub interval_ms: u64,
    /// The subject template the worker reads (e.g. `audio.{partition}.{stream}`).
    pub subject: String,
    /// Partition count N of the template (1..=4096).
    pub partitions_total: u32,
    /// How the worker's partitions are decided.
    pub ownership: OwnershipKind,
    /// The lease bucket (`ownership = lease` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_bucket: Option<String>,
    /// The partitions it delivers now (each `< partitions_total`, no duplicates).
    pub partitions: Vec<u32>,
    /// Its slots: live streams it follows at once (1..=1,000,000).
    pub max_streams: u64,
    /// Its live streams now (`<= max_streams`).
    pub live_streams: u64,
    /// The largest lag of its live streams, ms (0..=3,600,000).
    pub lag_ms: u64,
    /// Handler busy time over audio time, a decaying p95 (0..=1,000; 0 before any
    /// audio).
    pub rtf_p95: f64,
    /// Its live streams with their lag, at most [`MAX_LISTED_STREAMS`].
    pub streams: Vec<StreamLoad>,
    /// Whether `streams` lists fewer than `live_streams` (only the first
    /// [`MAX_LISTED_STREAMS`]).
    pub streams_truncated: bool,
}

/// Why a worker refused a stream.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum RefusalReason {
    /// Every slot (`max_streams`) was taken.
    MaxStreams,
}

/// A worker refused a new stream; sent on [`refused_subject`] at once, then at most
/// once per announcement interval while the stream's packets keep arriving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Refusal {
    /// [`VERSION`].
    pub v: u32,
    /// The refusing worker's id.
    pub worker: String,
    /// The refused stream (equal to the subject's last token).
    pub stream: String,
    /// Why.
    pub reason: RefusalReason,
    /// The worker's slots.
    pub max_streams: u64,
    /// Its live streams when it refused.
    pub live_streams: u64,
    /// Send time, Unix ms on the worker's clock.
    pub sent_at_ms: u64,
}

/// Why a capacity message was ignored.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapacityErrorKind {
    /// Longer than [`MAX_PAYLOAD_BYTES`].
    TooLarge,
    /// Not one JSON object of the documented shape (a negative number, a string for a
    /// number, a missing member, ...).
    InvalidJson,
    /// A member this version does not know.
    UnknownField,
    /// `v` is not [`VERSION`].
    UnsupportedVersion,
    /// The worker (or stream) id in the body is not the subject's last token.
    SubjectMismatch,
    /// A worker id, instance, stream id, subject or bucket name that is not safe.
    InvalidId,
    /// A number outside its documented range, or inconsistent with another.
    OutOfRange,
    /// Sent too long ago, or too far in the future, on the reader's clock.
    Stale,
}

/// A refused capacity message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("capacity message ignored ({}): {detail}", kind.as_str())]
pub struct CapacityError {
    kind: CapacityErrorKind,
    detail: String,
}

impl CapacityError {
    fn new(kind: CapacityErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// Why the message was ignored.
    pub fn kind(&self) -> CapacityErrorKind {
        self.kind
    }
}

use crate::WireName as _;
use CapacityErrorKind as K;

/// `Ok` when `ok`, else a [`CapacityError`] of `kind` (its detail built only then).
fn ensure(ok: bool, kind: K, detail: impl FnOnce() -> String) -> Result<(), CapacityError> {
    match ok {
        true => Ok(()),
        false => Err(CapacityError::new(kind, detail())),
    }
}

/// Decodes one JSON object of type `T` with the refusals of this module.
fn decode_json<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Result<T, CapacityError> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(CapacityError::new(
            K::TooLarge,
            format!("{} bytes, at most {MAX_PAYLOAD_BYTES}", payload.len()),
        ));
    }
    serde_json::from_slice(payload).map_err(|e| {
        let text = e.to_string();
        let kind = if text.starts_with("unknown field") {
            K::UnknownField
        } else {
            K::InvalidJson
        };
        CapacityError::new(kind, text)
    })
}

fn check_version(v: u32) -> Result<(), CapacityError> {
    ensure(v == VERSION, K::UnsupportedVersion, || {
        format!("v = {v}, this reader knows {VERSION}")
    })
}

fn check_id(what: &str, id: &str) -> Result<(), CapacityError> {
    ensure(is_valid_id(id), K::InvalidId, || {
        format!("{what} {id:?}: 1..={MAX_ID_LEN} of A-Z a-z 0-9 _ -")
    })
}

fn check_stream_id(id: &str) -> Result<(), CapacityError> {
    ensure(StreamId::parse(id).is_ok(), K::InvalidId, || {
        format!("stream id {id:?} is not a safe stream id")
    })
}

fn check_subject_token(what: &str, body: &str, subject_token: &str) -> Result<(), CapacityError> {
    ensure(body == subject_token, K::SubjectMismatch, || {
        format!("{what} {body:?} announced on the subject of {subject_token:?}")
    })
}

impl Announcement {
    /// Decodes and validates an announcement received on `subject` (its last token is
    /// the worker id). Freshness is the reader's call: [`Announcement::check_fresh`].
    pub fn decode(subject: &str, payload: &[u8]) -> Result<Self, CapacityError> {
        let a: Self = decode_json(payload)?;
        a.validate()?;
        check_subject_token("worker", &a.worker, last_token(subject))?;
        Ok(a)
    }

    /// The JSON bytes.
    pub fn encode(&self) -> Vec<u8> {
        // A struct of strings, numbers and lists always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Every rule of the module doc but the subject's and the clock's.
    pub fn validate(&self) -> Result<(), CapacityError> {
        check_version(self.v)?;
        check_id("worker", &self.worker)?;
        check_id("instance", &self.instance)?;
        ensure(self.seq != 0, K::OutOfRange, || {
            "seq 0: the first announcement is 1".into()
        })?;
        let (lo, hi) = INTERVAL_RANGE_MS;
        ensure((lo..=hi).contains(&self.interval_ms), K::OutOfRange, || {
            format!("interval_ms {} outside {lo}..={hi}", self.interval_ms)
        })?;
        let template = crate::SubjectTemplate::parse(&self.subject);
        ensure(template.is_ok(), K::InvalidId, || {
            format!("subject {:?} is not a subject template", self.subject)
        })?;
        let total = self.partitions_total;
        ensure((1..=MAX_PARTITIONS).contains(&total), K::OutOfRange, || {
            format!("partitions_total {total} outside 1..={MAX_PARTITIONS}")
        })?;
        let lease = self.ownership == OwnershipKind::Lease;
        ensure(
            lease == self.lease_bucket.is_some(),
            K::OutOfRange,
            || match lease {
                true => "ownership lease without lease_bucket".into(),
                false => "lease_bucket with ownership static".into(),
            },
        )?;
        if let Some(bucket) = &self.lease_bucket {
            check_id("lease_bucket", bucket)?;
        }
        self.validate_partitions()?;
        self.validate_load()
    }

    fn validate_partitions(&self) -> Result<(), CapacityError> {
        let total = self.partitions_total;
        let listed = self.partitions.len();
        ensure(listed <= total as usize, K::OutOfRange, || {
            format!("{listed} partitions of {total}")
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for &p in &self.partitions {
            ensure(p < total && seen.insert(p), K::OutOfRange, || {
                format!("partition {p}: out of 0..{total} or listed twice")
            })?;
        }
        Ok(())
    }

    fn validate_load(&self) -> Result<(), CapacityError> {
        let (max, live, lag) = (self.max_streams, self.live_streams, self.lag_ms);
        ensure((1..=MAX_SLOTS).contains(&max), K::OutOfRange, || {
            format!("max_streams {max} outside 1..={MAX_SLOTS}")
        })?;
        ensure(live <= max, K::OutOfRange, || {
            format!("live_streams {live} above max_streams {max}")
        })?;
        ensure(lag <= MAX_LAG_MS, K::OutOfRange, || {
            format!("lag_ms {lag} above {MAX_LAG_MS}")
        })?;
        let rtf = self.rtf_p95;
        ensure(
            rtf.is_finite() && (0.0..=MAX_RTF).contains(&rtf),
            K::OutOfRange,
            || format!("rtf_p95 {rtf} outside 0..={MAX_RTF}"),
        )?;
        let listed = self.streams.len();
        let within = listed <= MAX_LISTED_STREAMS && listed as u64 <= live;
        ensure(within, K::OutOfRange, || {
            format!("{listed} streams listed for {live} live (at most {MAX_LISTED_STREAMS})")
        })?;
        let truncated = self.streams_truncated;
        ensure(truncated == ((listed as u64) < live), K::OutOfRange, || {
            format!("streams_truncated {truncated} with {listed} of {live} live listed")
        })?;
        for s in &self.streams {
            check_stream_id(&s.id)?;
            ensure(s.lag_ms <= lag, K::OutOfRange, || {
                format!(
                    "stream {} lag_ms {} above the worker's {lag}",
                    s.id, s.lag_ms
                )
            })?;
        }
        Ok(())
    }

    /// Refuses (kind `stale`) an announcement sent more than [`gone_after`] its
    /// interval before `now_ms`, or more than [`MAX_CLOCK_AHEAD_MS`] after it (both
    /// Unix ms): a replayed or delayed announcement never counts as current capacity.
    pub fn check_fresh(&self, now_ms: u64) -> Result<(), CapacityError> {
        let max_age = u64::try_from(gone_after(self.interval_ms).as_millis()).unwrap_or(u64::MAX);
        let sent = self.sent_at_ms;
        ensure(sent.saturating_add(max_age) >= now_ms, K::Stale, || {
            format!("sent {} ms ago", now_ms - sent)
        })?;
        ensure(
            sent <= now_ms.saturating_add(MAX_CLOCK_AHEAD_MS),
            K::Stale,
            || format!("sent {} ms in the future", sent - now_ms),
        )
    }

    /// Slots not taken by a live stream.
    pub fn free_slots(&self) -> u64 {
        self.max_streams.saturating_sub(self.live_streams)
    }
}

impl Refusal {
    /// Decodes and validates a refusal received on `subject` (its last token is the
    /// stream id).
    pub fn decode(subject: &str, payload: &[u8]) -> Result<Self, CapacityError> {
        let r: Self = decode_json(payload)?;
        check_version(r.v)?;
        check_id("worker", &r.worker)?;
        check_stream_id(&r.stream)?;
        check_subject_token("stream", &r.stream, last_token(subject))?;
        let (max, live) = (r.max_streams, r.live_streams);
        ensure(
            (1..=MAX_SLOTS).contains(&max) && live <= max,
            K::OutOfRange,
            || format!("max_streams {max} / live_streams {live}"),
        )?;
        Ok(r)
    }

    /// The JSON bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
