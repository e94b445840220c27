//! NATS header names used by the LLM adapter, and parsers for their values.
//!
//! Request headers (all optional):
//!
//! | header | value |
//! |---|---|
//! | [`REQUEST_ID`] `Weir-Request-Id` | caller-chosen id; a retry with the same id joins the first |
//! | [`SESSION_ID`] `Weir-Session-Id` | conversation/session id (per-session cap and ordering) |
//! | [`DEADLINE_MS`] `Weir-Deadline-Ms` | absolute deadline, unix time in milliseconds |
//! | [`TIMEOUT_MS`] `Weir-Timeout-Ms` | relative budget in milliseconds from receipt |
//! | [`ADMISSION`] `Weir-Admission` | `enqueue` (default) or `reject` when the session is busy |
//! | [`CLIENT_KEY`] `Weir-Client-Key` | caller identity for per-client limits |
//! | [`CANCEL`] `Weir-Cancel` | request id to cancel (cancel messages only) |
//! | [`crate::llm::stream::STREAM`] `Weir-Stream` | `1`: a streamed reply (events in [`crate::llm::stream`]) |
//!
//! Reply headers: [`QUEUE_MS`], [`INFERENCE_MS`] (milliseconds with three decimals),
//! [`REQUEST_ID`] (echoed), and on errors [`ERROR_CODE`] plus the service-API headers
//! [`NATS_SERVICE_ERROR`] and [`NATS_SERVICE_ERROR_CODE`].
//!
//! Invariants: every parser here is total — a malformed value gives a [`HeaderError`]
//! naming the header, never a panic. Ids are limited to [`MAX_ID_LEN`] bytes of visible
//! ASCII so they can be echoed in headers and logs safely.

use std::fmt;
use std::time::Duration;

/// Caller-chosen request id (idempotency key; also the id to cancel).
pub const REQUEST_ID: &str = "Weir-Request-Id";
/// Session id: the per-session pending cap and per-session ordering use it.
pub const SESSION_ID: &str = "Weir-Session-Id";
/// Absolute deadline as unix time in milliseconds.
pub const DEADLINE_MS: &str = "Weir-Deadline-Ms";
/// Relative deadline: the budget in milliseconds, counted from when the adapter
/// received the request.
pub const TIMEOUT_MS: &str = "Weir-Timeout-Ms";
/// What to do when the session already has a request running: `enqueue` or `reject`.
pub const ADMISSION: &str = "Weir-Admission";
/// Caller identity for limits keyed by client.
pub const CLIENT_KEY: &str = "Weir-Client-Key";
/// Request id to cancel. A message carrying it is a cancellation, not an inference
/// request.
pub const CANCEL: &str = "Weir-Cancel";
/// Durable intake (a request published to the adapter's JetStream work-queue stream):
/// the subject the answer goes to. JetStream does not keep a publisher's reply
/// subject, so it travels in this header.
pub const REPLY_TO: &str = "Weir-Reply-To";
/// JetStream's deduplication header: on the durable intake it carries the request id,
/// so that the same request published twice (a retry, two forwarding replicas) is
/// stored once within the stream's duplicate window.
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// Reply: time spent between receipt and the start of inference, in milliseconds.
pub const QUEUE_MS: &str = "Weir-Queue-Ms";
/// Reply: time spent in the backend call, in milliseconds.
pub const INFERENCE_MS: &str = "Weir-Inference-Ms";
/// Reply: the [`crate::llm::ErrorCode`] of a refusal, as its snake_case string.
pub const ERROR_CODE: &str = "Weir-Error-Code";
/// NATS service-API convention: human-readable error status.
pub const NATS_SERVICE_ERROR: &str = "Nats-Service-Error";
/// NATS service-API convention: numeric error code (HTTP-like).
pub const NATS_SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";

/// Longest accepted id (request id, session id, client key), in bytes.
pub const MAX_ID_LEN: usize = 256;

/// Per-request choice when the session already has a request running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum AdmissionPolicy {
    /// Wait behind the running request (FIFO per session). The default.
    #[default]
    Enqueue,
    /// Refuse at once with `concurrency_limit_exceeded` instead of waiting.
    Reject,
}

impl AdmissionPolicy {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enqueue => "enqueue",
            Self::Reject => "reject",
        }
    }

    /// Parses the [`ADMISSION`] header value (case-insensitive, surrounding spaces ignored).
    pub fn parse(value: &str) -> Result<Self, HeaderError> {
        let v = value.trim();
        if v.eq_ignore_ascii_case("enqueue") {
            Ok(Self::Enqueue)
        } else if v.eq_ignore_ascii_case("reject") {
            Ok(Self::Reject)
        } else {
            Err(HeaderError::invalid(
                ADMISSION,
                "expected `enqueue` or `reject`",
            ))
        }
    }
}

impl fmt::Display for AdmissionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A header value that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("header {header}: {reason}")]
pub struct HeaderError {
    header: &'static str,
    kind: HeaderErrorKind,
    reason: String,
}

/// Machine-readable kind of a [`HeaderError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeaderErrorKind {
    /// The value does not parse.
    Invalid,
    /// The value is longer than allowed.
    TooLong,
    /// The value is empty.
    Empty,
}

impl HeaderError {
    pub(crate) fn invalid(header: &'static str, reason: impl Into<String>) -> Self {
        Self {
            header,
            kind: HeaderErrorKind::Invalid,
            reason: reason.into(),
        }
    }

    /// The header that carried the bad value.
    pub fn header(&self) -> &'static str {
        self.header
    }

    /// The kind, for callers that match on it.
    pub fn kind(&self) -> HeaderErrorKind {
        self.kind
    }
}

/// Validates an id-like header value ([`REQUEST_ID`], [`SESSION_ID`], [`CLIENT_KEY`],
/// [`CANCEL`]): 1..=[`MAX_ID_LEN`] bytes of visible ASCII (`!`..=`~`), no whitespace.
pub fn parse_id<'a>(header: &'static str, value: &'a str) -> Result<&'a str, HeaderError> {
    if value.is_empty() {
        return Err(HeaderError {
            header,
            kind: HeaderErrorKind::Empty,
            reason: "empty value".into(),
        });
    }
    if value.len() > MAX_ID_LEN {
        return Err(HeaderError {
            header,
            kind: HeaderErrorKind::TooLong,
            reason: format!("{} bytes; at most {MAX_ID_LEN} allowed", value.len()),
        });
    }
    if let Some((i, b)) = value
        .bytes()
        .enumerate()
        .find(|(_, b)| !(b'!'..=b'~').contains(b))
    {
        return Err(HeaderError::invalid(
            header,
            format!("byte {b:#04x} at {i} is not visible ASCII"),
        ));
    }
    Ok(value)
}

/// Parses a non-negative integer number of milliseconds ([`DEADLINE_MS`],
/// [`TIMEOUT_MS`]). Signs, fractions, exponents and spaces inside are refused.
pub fn parse_ms(header: &'static str, value: &str) -> Result<u64, HeaderError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(HeaderError {
            header,
            kind: HeaderErrorKind::Empty,
            reason: "empty value".into(),
        });
    }
    if v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HeaderError::invalid(
            header,
            "expected a whole number of milliseconds (digits only)",
        ));
    }
    v.parse::<u64>()
        .map_err(|_| HeaderError::invalid(header, "number out of range"))
}

/// Remaining budget of a request, from its optional absolute deadline (unix ms) and its
/// optional relative budget (ms from now). When both are given the earlier wins.
///
/// Returns `None` when neither is given, `Some(Duration::ZERO)` when the deadline is
/// already in the past, else the remaining time.
pub fn remaining_budget(
    deadline_unix_ms: Option<u64>,
    timeout_ms: Option<u64>,
    now_unix_ms: u64,
) -> Option<Duration> {
    let from_abs = deadline_unix_ms.map(|d| Duration::from_millis(d.saturating_sub(now_unix_ms)));
    let from_rel = timeout_ms.map(Duration::from_millis);
    match (from_abs, from_rel) {
        (Some(a), Some(r)) => Some(a.min(r)),
        (a, r) => a.or(r),
    }
}

/// Formats a duration as milliseconds with three decimals (`"12.345"`), the format of
/// [`QUEUE_MS`] and [`INFERENCE_MS`].
pub fn format_ms(d: Duration) -> String {
    // Written by hand: this runs twice per reply and `format!` costs more than the rest.
    let mut buf = [0u8; 48];
    let mut i = buf.len();
    let mut n = d.as_micros();
    for pos in 0.. {
        if pos == 3 {
            i -= 1;
            buf[i] = b'.';
        }
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 && pos >= 3 {
            break;
        }
    }
    String::from_utf8_lossy(&buf[i..]).into_owned()
}

/// Parses a value written by [`format_ms`] (or any non-negative decimal) back into a
/// duration. Returns `None` for anything else.
pub fn parse_format_ms(value: &str) -> Option<Duration> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let ms: f64 = v.parse().ok()?;
    if !(0.0..=1e12).contains(&ms) {
        return None;
    }
    Some(Duration::from_secs_f64(ms / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_parses_both_values_case_insensitively() {
        assert_eq!(
            AdmissionPolicy::parse("enqueue"),
            Ok(AdmissionPolicy::Enqueue)
        );
        assert_eq!(
            AdmissionPolicy::parse(" Reject "),
            Ok(AdmissionPolicy::Reject)
        );
        let err = AdmissionPolicy::parse("drop").expect_err("must be refused");
        assert_eq!(err.header(), ADMISSION);
        assert_eq!(err.kind(), HeaderErrorKind::Invalid);
        assert_eq!(AdmissionPolicy::default(), AdmissionPolicy::Enqueue);
    }

    #[test]
    fn ids_must_be_visible_ascii_and_bounded() {
        assert_eq!(parse_id(REQUEST_ID, "req-1:a"), Ok("req-1:a"));
        assert_eq!(
            parse_id(REQUEST_ID, "")
                .expect_err("must be refused")
                .kind(),
            HeaderErrorKind::Empty
        );
        assert_eq!(
            parse_id(SESSION_ID, "a b")
                .expect_err("must be refused")
                .kind(),
            HeaderErrorKind::Invalid
        );
        assert_eq!(
            parse_id(SESSION_ID, "é")
                .expect_err("must be refused")
                .kind(),
            HeaderErrorKind::Invalid
        );
        let long = "x".repeat(MAX_ID_LEN + 1);
        assert_eq!(
            parse_id(CLIENT_KEY, &long)
                .expect_err("must be refused")
                .kind(),
            HeaderErrorKind::TooLong
        );
        assert!(parse_id(CLIENT_KEY, &long[..MAX_ID_LEN]).is_ok());
    }

    #[test]
    fn ms_values_are_whole_non_negative_numbers() {
        assert_eq!(parse_ms(TIMEOUT_MS, "1500"), Ok(1500));
        assert_eq!(parse_ms(TIMEOUT_MS, " 0 "), Ok(0));
        for bad in [
            "-1",
            "1.5",
            "1e3",
            "+5",
            "abc",
            "",
            "1 000",
            "99999999999999999999999",
        ] {
            let err = parse_ms(TIMEOUT_MS, bad).expect_err("must be refused");
            assert_eq!(err.header(), TIMEOUT_MS, "{bad}");
        }
    }

    #[test]
    fn budget_takes_the_earlier_deadline() {
        let now = 1_000_000;
        assert_eq!(remaining_budget(None, None, now), None);
        assert_eq!(
            remaining_budget(Some(now + 500), None, now),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            remaining_budget(None, Some(200), now),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            remaining_budget(Some(now + 500), Some(200), now),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            remaining_budget(Some(now + 100), Some(200), now),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            remaining_budget(Some(now - 5), Some(200), now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn ms_format_round_trips() {
        let d = Duration::from_micros(12_345);
        assert_eq!(format_ms(d), "12.345");
        assert_eq!(format_ms(Duration::from_micros(7)), "0.007");
        assert_eq!(format_ms(Duration::ZERO), "0.000");
        assert_eq!(format_ms(Duration::from_millis(1500)), "1500.000");
        assert_eq!(format_ms(Duration::from_micros(1_000_001)), "1000.001");
        assert_eq!(
            format_ms(Duration::MAX),
            format!(
                "{}.{:03}",
                Duration::MAX.as_micros() / 1000,
                Duration::MAX.as_micros() % 1000
            )
        );
        assert_eq!(parse_format_ms("12.345"), Some(d));
        assert_eq!(parse_format_ms("3"), Some(Duration::from_millis(3)));
        assert_eq!(parse_format_ms("-1"), None);
        assert_eq!(parse_format_ms("nan"), None);
        assert_eq!(parse_format_ms(""), None);
    }
}
