//! The streaming-reply protocol (opt-in per request with [`STREAM`]` = 1`): the events
//! the adapter publishes to the caller's reply subject, and their headers. The full
//! specification, precise enough to implement a client, is `docs/protocol.md` §8.
//!
//! In order, on the reply subject:
//! - `queued` ([`QUEUE_POSITION`], [`PREDICTED_START_MS`]) when the request had to
//!   wait, again at most once a second while its position changes;
//! - `started` ([`super::headers::QUEUE_MS`]);
//! - `chunk` × N: the body is one or more SSE events from the backend, unchanged;
//!   [`STREAM_SEQ`] counts from 1 without gaps; the message's reply subject is the
//!   acknowledgement subject (flow control, see the spec);
//! - exactly one last message: `end` ([`super::headers::QUEUE_MS`],
//!   [`super::headers::INFERENCE_MS`], [`TTFT_MS`], [`STREAM_CHUNKS`],
//!   [`STREAM_BYTES`], [`STREAM_OUTCOME`]) or the usual error reply (with
//!   [`STREAM_EVENT`]` = error`).
//!
//! Invariants: [`StreamEvent::parse`] is total (unknown names give `None`, so a newer
//! adapter's events are skipped by an older client, never mistaken for another).

use crate::WireName;

/// Request header: `1` asks for a streamed reply. Absent (or `0`): the unary reply.
pub const STREAM: &str = "Weir-Stream";
/// Every streamed message: which event it is ([`StreamEvent`]).
pub const STREAM_EVENT: &str = "Weir-Stream-Event";
/// `chunk`: sequence number, 1, 2, 3, ... without gaps.
pub const STREAM_SEQ: &str = "Weir-Stream-Seq";
/// `queued` (and `llm.status`): 1-based position among queued requests (1 = next).
pub const QUEUE_POSITION: &str = "Weir-Queue-Position";
/// `queued`: predicted wait before inference starts, in milliseconds (absent while the
/// adapter has no service-time estimate).
pub const PREDICTED_START_MS: &str = "Weir-Predicted-Start-Ms";
/// `end`: start of inference → first chunk published, milliseconds (absent without
/// chunks).
pub const TTFT_MS: &str = "Weir-Ttft-Ms";
/// `end`: how many `chunk` messages were sent (= the last [`STREAM_SEQ`]).
pub const STREAM_CHUNKS: &str = "Weir-Stream-Chunks";
/// `end`: body bytes sent in chunks.
pub const STREAM_BYTES: &str = "Weir-Stream-Bytes";
/// `end`: the outcome, `ok`, or `joined` when this caller joined another caller's
/// stream with the same request id (or found it in the completion cache) and so
/// received no chunk (errors are sent as error replies instead of `end`).
pub const STREAM_OUTCOME: &str = "Weir-Stream-Outcome";

/// One event of a streamed reply.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamEvent {
    /// Accepted and waiting; carries the position.
    Queued,
    /// Inference started; carries the queue wait.
    Started,
    /// Part of the reply body.
    Chunk,
    /// The reply is complete; carries the timings.
    End,
    /// The request failed or was refused; the message is the usual error reply.
    Error,
}

impl StreamEvent {
    /// Reads a header value (surrounding spaces ignored); `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        Self::from_wire(value.trim())
    }
}

/// Whether a [`STREAM`] header value asks for a streamed reply: `1` / `true` (any case)
/// yes, `0` / `false` no, anything else is `Err` (a malformed value is refused, never
/// silently ignored).
pub fn wants_stream(value: &str) -> Result<bool, super::HeaderError> {
    match value.trim() {
        "1" => Ok(true),
        "0" => Ok(false),
        v if v.eq_ignore_ascii_case("true") => Ok(true),
        v if v.eq_ignore_ascii_case("false") => Ok(false),
        _ => Err(super::HeaderError::invalid(
            STREAM,
            "expected 1 or 0 (true or false)",
        )),
    }
}

/// Reads a streaming acknowledgement body: the sequence number of the last chunk taken,
/// in canonical ASCII decimal (`0` or a non-zero digit followed by digits; no sign, no
/// leading zero, no space, nothing else) that fits a `u64`. Anything else is `None`:
/// the adapter ignores it, as it ignores a number above the last chunk it sent.
pub fn parse_ack(body: &[u8]) -> Option<u64> {
    let canonical = match body {
        [] => false,
        [b'0'] => true,
        [first, rest @ ..] => (b'1'..=b'9').contains(first) && rest.iter().all(u8::is_ascii_digit),
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(body).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledgements_parse_only_in_canonical_decimal() {
        for (body, want) in [
            (&b"0"[..], Some(0)),
            (b"1", Some(1)),
            (b"17", Some(17)),
            (b"100", Some(100)),
            (b"18446744073709551615", Some(u64::MAX)),
        ] {
            assert_eq!(parse_ack(body), want, "{:?}", String::from_utf8_lossy(body));
        }
        for body in [
            &b""[..],
            b"+100",
            b"-1",
            b"0100",
            b"00",
            b" 100",
            b"100 ",
            b"100\n",
            b"1e3",
            b"0x10",
            b"18446744073709551616",
            b"\xff1",
            "\u{0661}".as_bytes(),
        ] {
            assert_eq!(parse_ack(body), None, "{:?}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn events_round_trip_and_unknown_names_are_none() {
        for &e in StreamEvent::ALL {
            assert_eq!(StreamEvent::parse(e.as_str()), Some(e));
        }
        assert_eq!(StreamEvent::parse(" chunk "), Some(StreamEvent::Chunk));
        assert_eq!(StreamEvent::parse("progress"), None);
        assert_eq!(StreamEvent::parse(""), None);
    }

    #[test]
    fn stream_header_values() {
        assert_eq!(wants_stream("1"), Ok(true));
        assert_eq!(wants_stream("TRUE"), Ok(true));
        assert_eq!(wants_stream("0"), Ok(false));
        let e = wants_stream("yes").expect_err("refused");
        assert_eq!(e.header(), STREAM);
    }
}
