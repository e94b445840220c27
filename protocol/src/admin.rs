//! The services' admin and stdout contracts (docs/contracts.md): the ready line both
//! binaries print, latency percentiles, and the ingress's `/v1/stats` snapshot — one
//! definition, written by the services and read by the load test and by operators'
//! tools.
//!
//! Compatibility rules, as for the wire packets: fields are only ever added. Readers
//! ignore unknown fields and default missing ones (`#[serde(default)]` on every type),
//! and a field an older writer does not have is an `Option` (`None` when absent), so a
//! reader tells "not reported" from zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The one line each service prints on stdout once it is ready, e.g.
/// `{"event":"ready","ws":"127.0.0.1:4000","admin":"127.0.0.1:4001"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReadyLine {
    /// Always `ready`.
    pub event: String,
    /// The WebSocket door's address (the ingress).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ws: Option<String>,
    /// The admin HTTP address (both services).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
    /// The WHIP UDP address (the ingress, when WHIP is on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whip_udp: Option<String>,
}

impl ReadyLine {
    /// The `event` value of a ready line.
    pub const EVENT: &'static str = "ready";

    /// A ready line with the given addresses.
    pub fn new(ws: Option<String>, admin: Option<String>, whip_udp: Option<String>) -> Self {
        Self {
            event: Self::EVENT.to_owned(),
            ws,
            admin,
            whip_udp,
        }
    }

    /// Whether this is a ready line (`event` = `ready`).
    pub fn is_ready(&self) -> bool {
        self.event == Self::EVENT
    }

    /// The line as printed: one JSON object, no trailing newline.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| format!("{{\"event\":\"{}\"}}", Self::EVENT))
    }
}

/// A latency summary in milliseconds (`queue_wait_ms` and `round_ms` of the ingress's
/// `/v1/stats`, the adapter's latency objects).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Percentiles {
    /// Number of values.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// The ingress's `/v1/stats` snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IngressStats {
    /// Streams open now.
    pub active_streams: u64,
    /// Streams opened since start.
    pub streams_total: u64,
    /// Bytes of PCM held over all streams: queued, or handed to NATS and not yet
    /// confirmed by the server.
    pub pending_bytes: u64,
    /// Frames held (queued or unconfirmed), all streams.
    pub pending_frames: u64,
    /// The per-stream byte budget (`None`: a design without one).
    pub pending_bytes_limit_per_stream: Option<u64>,
    /// Age of the oldest frame held, ms.
    pub oldest_frame_age_ms: f64,
    /// Queue wait (admission → handed to NATS), cumulative since start.
    pub queue_wait_ms: Percentiles,
    /// Frame counters.
    pub frames: FrameStats,
    /// Stream opens refused (invalid id, already active, `max_streams`, shutting down).
    pub admission_rejects: u64,
    /// Overload signals raised (streams ended by the `close` policy).
    pub overloads: u64,
    /// Gap markers handed to NATS.
    pub gaps: u64,
    /// tokio tasks alive in the ingress process.
    pub tasks_alive: u64,
    /// Whether the ingress's NATS connection is up.
    pub nats_connected: bool,
    /// The server-confirmed window (`None`: an ingress without it).
    pub window: Option<WindowStats>,
}

/// The `frames` object of the ingress's `/v1/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct FrameStats {
    /// Frames offered by producers.
    pub offered: u64,
    /// Frames admitted (given a sequence number).
    pub admitted: u64,
    /// Frames handed to the NATS client (`None`: an ingress without the confirmed
    /// window, where `published` means handed over).
    pub handed_over: Option<u64>,
    /// Frames the server confirmed (without the window: handed over).
    pub published: u64,
    /// Frames handed over and not yet confirmed (part of pending).
    pub unconfirmed: u64,
    /// Frames unconfirmed when the NATS connection dropped: declared to consumers as
    /// possibly lost (`Weir-Possibly-Lost`), never counted as published.
    pub possibly_lost: u64,
    /// Frames not published, by reason (every reason present, zero included).
    pub dropped: BTreeMap<String, u64>,
    /// Shadow mode: frames the budget would have refused or dropped.
    pub would_reject: u64,
}

impl FrameStats {
    /// All drops, whatever the reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// The `window` object of the ingress's `/v1/stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct WindowStats {
    /// `confirmed`, `unconfirmed` (window off: handed over counts as published) or
    /// `jetstream` (`None` when not reported).
    pub mode: Option<String>,
    /// Bytes handed to NATS and not yet confirmed.
    pub unconfirmed_bytes: u64,
    /// Frames handed to NATS and not yet confirmed.
    pub unconfirmed_frames: u64,
    /// The current limit on `unconfirmed_bytes`.
    pub limit_bytes: u64,
    /// Confirmation rounds completed.
    pub rounds: u64,
    /// Round time (marker out → back), cumulative.
    pub round_ms: Percentiles,
    /// Age of the oldest unconfirmed frame (since admission), ms.
    pub oldest_unconfirmed_age_ms: f64,
    /// Connection losses that left frames unconfirmed (declared possibly lost).
    pub disconnects: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_defaults_what_an_older_writer_lacks_and_ignores_what_it_does_not_know() {
        let s: IngressStats = serde_json::from_str(
            r#"{"pending_frames":7,"frames":{"offered":3,"dropped":{"overload":1}},"future":1}"#,
        )
        .expect("decodes");
        assert_eq!(s.pending_frames, 7);
        assert_eq!(s.frames.handed_over, None);
        assert_eq!(s.frames.dropped_total(), 1);
        assert_eq!(s.window, None);
        assert_eq!(s.queue_wait_ms, Percentiles::default());
    }

    #[test]
    fn ready_lines_round_trip_and_leave_out_absent_addresses() {
        let r = ReadyLine::new(None, Some("127.0.0.1:9".into()), None);
        assert_eq!(r.to_line(), r#"{"event":"ready","admin":"127.0.0.1:9"}"#);
        let back: ReadyLine = serde_json::from_str(&r.to_line()).expect("decodes");
        assert!(back.is_ready());
        assert_eq!(back, r);
    }
}
