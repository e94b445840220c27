//! The JSON text messages of the ingress's producer doors (docs/protocol.md §6, §6.1):
//! the one control message a producer sends on the WebSocket, and the events the
//! ingress sends back on the WebSocket and on a WHIP publisher's `weir` data channel.
//!
//! Each message is one JSON object whose `type` names it. Compatibility rules, as for
//! the packets: fields are only ever added, and a reader ignores members it does not
//! know; a new event gets a new `type`, which an older reader skips.
//!
//! The `closed` event comes last, once the stream has finished: its counts are final.

use serde::{Deserialize, Serialize};

use super::GapReason;
use super::extension::{EndReason, OverloadReason};

/// Producer → ingress: a WebSocket text message. The only one is `{"type":"end"}`,
/// which ends the stream (other members are ignored; an object that repeats a key is
/// refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Control {
    /// The producer finished the stream.
    End,
}

/// The frames a resumed stream declared lost: the `resume` gap marker it publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ResumeGap {
    /// First missing sequence number (the door's seq + 1).
    pub first_seq: u64,
    /// Last missing sequence number (the producer's `next_seq` - 1).
    pub last_seq: u64,
    /// Frames missing.
    pub frames: u64,
    /// Samples missing.
    pub samples: u64,
}

/// Ingress → producer: one event. `opened` (or `resumed`) comes first when the stream
/// is resumable; then `ack`s, `gap`s, `degraded`/`recovered`, in the order they
/// happen; `overload` or `error` when the stream stops; `closed` last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Event {
    /// The stream was opened and can be resumed: keep the token. Sent first, only
    /// when resume is on (`resume_window_ms` > 0).
    Opened {
        /// The stream id.
        stream_id: String,
        /// The opaque token a reconnecting producer presents (`resume_token`).
        resume_token: String,
        /// How long a dropped stream waits for its producer, ms.
        resume_window_ms: u64,
    },
    /// The door has taken every frame up to `seq` (sent at most once a second, only
    /// when it took new frames): the producer's `last_seq` for a resume.
    Ack {
        /// Sequence number of the last frame the door admitted.
        seq: u64,
    },
    /// A reconnecting producer took the stream back: the same stream continues.
    Resumed {
        /// The stream id.
        stream_id: String,
        /// Sequence number of the last frame the door took before the resume.
        seq: u64,
        /// The sequence number the next frame gets.
        next_seq: u64,
        /// The frames declared lost (`seq + 1 ..= next_seq - 1`), if any.
        gap: Option<ResumeGap>,
        /// The token, for the next resume (unchanged).
        resume_token: String,
        /// How long a dropped stream waits for its producer, ms.
        resume_window_ms: u64,
    },
    /// The stream overloaded under the `close` policy and is ending.
    Overload {
        /// What tripped it.
        reason: OverloadReason,
        /// Frames not published because of it (refused, or dropped from the queue).
        dropped_frames: u64,
        /// Samples in those frames.
        dropped_samples: u64,
        /// Bytes pending when it tripped.
        pending_bytes: u64,
        /// The byte budget.
        max_bytes: u64,
        /// The age budget, milliseconds.
        max_age_ms: u64,
        /// Frames the server confirmed so far.
        frames_published: u64,
    },
    /// A gap marker was published for frames the ingress dropped on purpose.
    Gap {
        /// First missing sequence number.
        first_seq: u64,
        /// Last missing sequence number.
        last_seq: u64,
        /// Frames missing (`last_seq - first_seq + 1`).
        frames: u64,
        /// Samples missing.
        samples: u64,
        /// Why.
        reason: GapReason,
        /// Gap markers published on this stream so far.
        gaps_total: u64,
    },
    /// The recognition worker serving this stream fell behind: its lag (age of the
    /// oldest frame not yet taken by its handler) went above the door's threshold.
    /// Sent once when it crosses, then at most once per worker announcement while it
    /// stays above; `recovered` follows when it is back below.
    Degraded {
        /// The stream's lag at the worker, ms.
        lag_ms: u64,
        /// The door's threshold (`capacity.max_lag_ms`), ms.
        threshold_ms: u64,
        /// The worker's id.
        worker: String,
    },
    /// The worker's lag for this stream is back below the threshold.
    Recovered {
        /// The stream's lag at the worker, ms.
        lag_ms: u64,
    },
    /// A bad message or a broken WebSocket protocol ends the stream (reason `error`).
    Error {
        /// `bad_frame`, `bad_message`, `invalid_utf8`, `message_too_big`,
        /// `protocol_error`, or `taken_over` (a resume on another connection took the
        /// stream; this connection closes with 4001 and the stream goes on there).
        code: String,
        /// What was wrong, for humans.
        message: String,
    },
    /// The stream has finished; the last event.
    Closed {
        /// Why the stream ended.
        reason: EndReason,
        /// Frames the server confirmed, over the whole stream.
        frames_published: u64,
        /// Frames not published, whatever the reason.
        frames_dropped: u64,
        /// Whether the `end` packet got through.
        end_delivered: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_events_are_objects_named_by_type() {
        let end: Control = serde_json::from_str(r#"{"type":"end","extra":1}"#).expect("end");
        assert_eq!(end, Control::End);
        assert_eq!(
            serde_json::to_string(&end).expect("json"),
            r#"{"type":"end"}"#
        );
        let closed = Event::Closed {
            reason: EndReason::Producer,
            frames_published: 50,
            frames_dropped: 0,
            end_delivered: true,
        };
        assert_eq!(
            serde_json::to_string(&closed).expect("json"),
            r#"{"type":"closed","reason":"producer","frames_published":50,"frames_dropped":0,"end_delivered":true}"#
        );
    }
}
