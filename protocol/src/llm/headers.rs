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
//! | [`CANCEL_SESSION`] `Weir-Cancel-Session` | session whose queued and running requests to cancel (cancel messages only) |
//! | [`SUPERSEDE`] `Weir-Supersede` | `session`: cancel the session's earlier requests before admitting this one ([`Supersede`]) |
//! | [`PRIORITY`] `Weir-Priority` | `interactive` or `batch` ([`Priority`]); absent = the matching `[[limits]]` key's class, else `interactive` |
//! | [`crate::llm::stream::STREAM`] `Weir-Stream` | `1`: a streamed reply (events in [`crate::llm::stream`]) |
//! | [`TRACEPARENT`] `traceparent` | W3C Trace Context: the caller's span ([`TraceParent`]) |
//! | [`TRACESTATE`] `tracestate` | W3C Trace Context vendor state, kept only beside a valid `traceparent` |
//!
//! Reply headers: [`QUEUE_MS`], [`INFERENCE_MS`] (milliseconds with three decimals),
//! [`REQUEST_ID`] (echoed), [`BACKEND`] (the backend that served a successful reply),
//! [`SUPERSEDED`] and [`SUPERSEDED_IDS`] (a superseding
//! request's reply), and on errors [`ERROR_CODE`] plus the service-API headers
//! [`NATS_SERVICE_ERROR`] and [`NATS_SERVICE_ERROR_CODE`].
//!
//! Invariants: every parser here is total — a malformed value gives a [`HeaderError`]
//! naming the header, never a panic (the trace-context parsers give `None`: a malformed
//! `traceparent` is ignored, never refused). Ids are limited to [`MAX_ID_LEN`] bytes of visible
//! ASCII so they can be echoed in headers and logs safely.

use std::fmt;
use std::time::Duration;

use crate::WireName;

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
/// Session to cancel: every queued and running request of that session is cancelled at
/// once. A message carrying it is a cancellation, not an inference request.
pub const CANCEL_SESSION: &str = "Weir-Cancel-Session";
/// `session`: this request supersedes its session's earlier requests, which are
/// cancelled (queued ones answered, running ones aborted) before it is admitted.
/// Requires [`SESSION_ID`].
pub const SUPERSEDE: &str = "Weir-Supersede";
/// The request's priority class: `interactive` or `batch` (case-insensitive,
/// [`Priority`]). Absent: the class configured for the request's key, else
/// `interactive`.
pub const PRIORITY: &str = "Weir-Priority";
/// Reply of a request sent with [`SUPERSEDE`]: how many earlier requests of its session
/// it cancelled (queued + running; `0` when there were none).
pub const SUPERSEDED: &str = "Weir-Superseded";
/// Reply of a request sent with [`SUPERSEDE`]: the request ids of the requests it
/// cancelled, running ones first, space-separated (ids are visible ASCII, so never
/// contain a space): as many whole ids as fit in [`MAX_SUPERSEDED_IDS_LEN`] bytes (the
/// count in [`SUPERSEDED`] is always whole); absent when none had an id.
pub const SUPERSEDED_IDS: &str = "Weir-Superseded-Ids";
/// Longest [`SUPERSEDED_IDS`] value, in bytes (a reply keeps room for its headers).
pub const MAX_SUPERSEDED_IDS_LEN: usize = 512;
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
/// Reply: the name of the backend that served the request (a `[[backends]]` member's
/// `name`, `default` for a single `[backend]`), on a successful unary reply and on a
/// stream's `end`. A request retried on another backend after a failover names the
/// one that answered; a cached or joined answer names the backend of the original call.
pub const BACKEND: &str = "Weir-Backend";
/// NATS backend cancel message (adapter → the backend's `cancel_subject`): the reply
/// inbox of the forwarded request the adapter stopped waiting for, so a service can
/// tell which call to stop even when the request had no [`REQUEST_ID`].
pub const CANCEL_INBOX: &str = "Weir-Cancel-Inbox";
/// Reply: the [`crate::llm::ErrorCode`] of a refusal, as its snake_case string.
pub const ERROR_CODE: &str = "Weir-Error-Code";
/// NATS service-API convention: human-readable error status.
pub const NATS_SERVICE_ERROR: &str = "Nats-Service-Error";
/// NATS service-API convention: numeric error code (HTTP-like).
pub const NATS_SERVICE_ERROR_CODE: &str = "Nats-Service-Error-Code";

/// W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the caller's trace and
/// span, `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`. The adapter makes its
/// `llm_request` span a child of it and passes a `traceparent` on to the backend.
pub const TRACEPARENT: &str = "traceparent";
/// W3C Trace Context vendor state; only meaningful beside a valid [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
/// Longest [`TRACESTATE`] value kept (the W3C limit: 32 members of at most 256 bytes
/// need not be kept; 512 bytes is what the spec asks a vendor to propagate at least).
pub const MAX_TRACESTATE_LEN: usize = 512;

/// Longest accepted id (request id, session id, client key), in bytes.
pub const MAX_ID_LEN: usize = 256;

/// What a request sent with [`SUPERSEDE`] supersedes. Only `session` exists.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Supersede {
    /// Every earlier queued or running request of the request's session.
    Session,
}

impl Supersede {
    /// Parses the [`SUPERSEDE`] header value (case-insensitive, surrounding spaces
    /// ignored); any other value is an error.
    pub fn parse(value: &str) -> Result<Self, HeaderError> {
        parse_name(SUPERSEDE, value, "expected `session`")
    }
}

/// A request's priority class ([`PRIORITY`]): inside the deadline order, interactive
/// requests go first within their slack, batch requests age (they are never starved)
/// and are refused first under overload.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// A caller waiting on the answer (a voice turn). The default.
    #[default]
    Interactive,
    /// Background work that may wait and is refused first under overload.
    Batch,
}

impl Priority {
    /// Parses the [`PRIORITY`] header value (case-insensitive, surrounding spaces
    /// ignored); any other value is an error naming the header.
    pub fn parse(value: &str) -> Result<Self, HeaderError> {
        parse_name(PRIORITY, value, "expected `interactive` or `batch`")
    }
}

/// Per-request choice when the session already has a request running.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum AdmissionPolicy {
    /// Wait behind the running request (FIFO per session). The default.
    #[default]
    Enqueue,
    /// Refuse at once with `concurrency_limit_exceeded` instead of waiting.
    Reject,
}

impl AdmissionPolicy {
    /// Parses the [`ADMISSION`] header value (case-insensitive, surrounding spaces ignored).
    pub fn parse(value: &str) -> Result<Self, HeaderError> {
        parse_name(ADMISSION, value, "expected `enqueue` or `reject`")
    }
}

/// The variant named `value` (case-insensitive, surrounding spaces ignored), else an
/// error naming `header` and what it `expected`.
fn parse_name<T: WireName>(
    header: &'static str,
    value: &str,
    expected: &str,
) -> Result<T, HeaderError> {
    let v = value.trim();
    T::ALL
        .iter()
        .copied()
        .find(|p| p.as_str().eq_ignore_ascii_case(v))
        .ok_or_else(|| HeaderError::invalid(header, expected))
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
    fn new(header: &'static str, kind: HeaderErrorKind, reason: impl Into<String>) -> Self {
        Self {
            header,
            kind,
            reason: reason.into(),
        }
    }

    fn empty(header: &'static str) -> Self {
        Self::new(header, HeaderErrorKind::Empty, "empty value")
    }

    pub(crate) fn invalid(header: &'static str, reason: impl Into<String>) -> Self {
        Self::new(header, HeaderErrorKind::Invalid, reason)
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
        return Err(HeaderError::empty(header));
    }
    if value.len() > MAX_ID_LEN {
        let reason = format!("{} bytes; at most {MAX_ID_LEN} allowed", value.len());
        return Err(HeaderError::new(header, HeaderErrorKind::TooLong, reason));
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
        return Err(HeaderError::empty(header));
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
    from_abs.into_iter().chain(from_rel).min()
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

/// A parsed W3C `traceparent`: which trace a request belongs to and which span sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace id (16 bytes, never all zero).
    pub trace_id: [u8; 16],
    /// The sender's span id (8 bytes, never all zero).
    pub parent_id: [u8; 8],
    /// Trace flags; bit 0 = sampled.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value as the W3C spec says a receiver must: lowercase hex,
    /// version `00` exactly 55 characters; a higher version (not `ff`) may append
    /// `-`-separated fields, which are ignored; all-zero ids are invalid. Surrounding
    /// spaces are allowed. `None` for anything else (the caller then ignores it).
    pub fn parse(value: &str) -> Option<Self> {
        let v = value.trim_matches([' ', '\t']).as_bytes();
        if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version = hex::<1>(&v[0..2])?[0];
        match version {
            0xff => return None,
            0 if v.len() != 55 => return None,
            _ if v.len() > 55 && v[55] != b'-' => return None,
            _ => {}
        }
        let trace_id = hex::<16>(&v[3..35])?;
        let parent_id = hex::<8>(&v[36..52])?;
        let flags = hex::<1>(&v[53..55])?[0];
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// Whether the sender sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Formats as a version-`00` header value.
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        write_hex(f, &self.trace_id)?;
        f.write_str("-")?;
        write_hex(f, &self.parent_id)?;
        write!(f, "-{:02x}", self.flags)
    }
}

/// Parses a trace id written as 32 hex digits (either case; the deployed envelope's
/// `trace_id` when it is a W3C one). `None` when it is anything else or all zero.
pub fn parse_trace_id(value: &str) -> Option<[u8; 16]> {
    let v = value.trim().to_ascii_lowercase();
    let id = (v.len() == 32).then(|| hex::<16>(v.as_bytes())).flatten()?;
    (id != [0; 16]).then_some(id)
}

/// The trace context a request carried: a valid `traceparent` and, beside it, a
/// `tracestate` that is at most [`MAX_TRACESTATE_LEN`] bytes of printable ASCII.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The caller's span.
    pub parent: TraceParent,
    /// Vendor state, passed on unchanged.
    pub state: Option<String>,
}

impl TraceContext {
    /// Reads the two header values. A malformed `traceparent` gives `None` (ignored);
    /// a malformed `tracestate` is dropped while the `traceparent` is kept (the spec's
    /// rule: the state never invalidates the parent).
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let parent = TraceParent::parse(traceparent?)?;
        let state = tracestate
            .map(str::trim)
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= MAX_TRACESTATE_LEN
                    && s.bytes().all(|b| (b' '..=b'~').contains(&b))
            })
            .map(str::to_owned);
        Some(Self { parent, state })
    }
}

fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *o = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
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
        assert_eq!(Supersede::parse(" Session "), Ok(Supersede::Session));
        for bad in ["", "sessions", "request", "1"] {
            let err = Supersede::parse(bad).expect_err("must be refused");
            assert_eq!(err.header(), SUPERSEDE);
            assert_eq!(err.kind(), HeaderErrorKind::Invalid);
        }
        assert_eq!(Priority::parse(" Batch "), Ok(Priority::Batch));
        assert_eq!(Priority::parse("INTERACTIVE"), Ok(Priority::Interactive));
        assert_eq!(Priority::default(), Priority::Interactive);
        for bad in ["", "low", "batch,interactive", "0"] {
            let err = Priority::parse(bad).expect_err("must be refused");
            assert_eq!(err.header(), PRIORITY);
            assert_eq!(err.kind(), HeaderErrorKind::Invalid);
        }
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

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_round_trips() {
        let tp = TraceParent::parse(TP).expect("valid");
        assert_eq!(tp.trace_id[0], 0x4b);
        assert_eq!(tp.parent_id[7], 0xb7);
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), TP);
        assert_eq!(TraceParent::parse(&format!("  {TP} ")), Some(tp));
        // A future version may append fields; they are ignored, the version written is 00.
        let v1 = TraceParent::parse(&format!("01{}-extra", &TP[2..])).expect("future version");
        assert_eq!(v1.to_string(), TP);
        assert!(
            !TraceParent::parse(&TP.replace("-01", "-00"))
                .expect("valid")
                .sampled()
        );
    }

    #[test]
    fn malformed_traceparents_are_ignored_not_errors() {
        let long = format!("{TP}-x");
        let bad = [
            "",
            "00",
            "garbage",
            &TP[..54],
            &long,                                                     // version 00 with more
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // forbidden version
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // uppercase
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473é-00f067aa0ba902b-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ];
        for b in bad {
            assert_eq!(TraceParent::parse(b), None, "{b:?}");
            assert_eq!(
                TraceContext::from_headers(Some(b), Some("a=b")),
                None,
                "{b:?}"
            );
        }
        assert_eq!(TraceContext::from_headers(None, Some("a=b")), None);
    }

    #[test]
    fn tracestate_is_kept_only_when_printable_and_bounded() {
        let ok = TraceContext::from_headers(Some(TP), Some(" vendor=a1,other=b ")).expect("kept");
        assert_eq!(ok.state.as_deref(), Some("vendor=a1,other=b"));
        let big = "a=".to_owned() + &"x".repeat(MAX_TRACESTATE_LEN);
        for bad in ["", "a=\u{7}", big.as_str(), "é=1"] {
            let tc = TraceContext::from_headers(Some(TP), Some(bad)).expect("parent kept");
            assert_eq!(tc.state, None, "{bad:?}");
        }
    }

    #[test]
    fn trace_ids_parse_in_either_case() {
        let id = parse_trace_id("4BF92F3577B34DA6A3CE929D0E0E4736").expect("valid");
        assert_eq!(Some(id), parse_trace_id("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "",
            "t",
            "4bf92f3577b34da6a3ce929d0e0e473",
            "0".repeat(32).as_str(),
        ] {
            assert_eq!(parse_trace_id(bad), None, "{bad:?}");
        }
        assert_eq!(parse_trace_id("4bf92f3577b34da6a3ce929d0e0e473é"), None);
    }
}
