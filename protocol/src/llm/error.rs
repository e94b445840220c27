//! The error catalog: every refusal or failure the adapter answers with.
//!
//! An error is an [`ErrorCode`] (stable snake_case string — callers match on it), a
//! human-readable message (may change between versions; never parse it) and
//! [`ErrorDetails`], the numbers that explain the refusal. Details that do not apply
//! are omitted from the JSON, never sent as `null`.
//!
//! | code | NATS code | meaning | retry? |
//! |---|---|---|---|
//! | `queue_full` | 503 | the global queue holds `limit` requests | yes, after `retry_after_ms`, or another replica |
//! | `session_queue_full` | 429 | the session has `pending` = `limit` unsettled requests | after one settles |
//! | `concurrency_limit_exceeded` | 429 | a per-key limit (`key`) is busy and waiting is not possible | yes, after `retry_after_ms` |
//! | `token_budget_exceeded` | 429 | a per-key token budget (`key`, `limit` tokens per minute) has not `tokens_requested` left (`tokens_available`) | yes, after `retry_after_ms` (when the budget has refilled enough) |
//! | `deadline_exceeded` | 504 | the request cannot be answered within its deadline: predicted at admission (`predicted_start_ms`, `budget_ms`, `estimate_ms`, `retry_after_ms`), its remaining budget fell below the service-time estimate while queued, or the deadline passed (at admission, in the queue or during inference) | not the same request; a new one after `retry_after_ms` if given |
//! | `cancelled` | 499 | cancelled by request id | no |
//! | `request_id_conflict` | 409 | the request id is in use with another session or body | no (new id) |
//! | `backend_error` | 502 | the backend failed (`backend_status` = its HTTP status when it answered; `limit` = the byte cap when its reply was larger than a NATS message) | maybe; **yes** after `retry_after_ms` when `backend_status` is 429 or 503 (the backend's own `Retry-After`) |
//! | `backend_timeout` | 504 | the backend's own timeout elapsed before the deadline | maybe |
//! | `invalid_request` | 400 | a header or the body is malformed | no |
//! | `shutting_down` | 503 | this replica is stopping | yes, on another replica |

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::WireName;

/// Machine-readable error code.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum ErrorCode {
    /// The global queue is full.
    QueueFull,
    /// The session's pending cap is reached.
    SessionQueueFull,
    /// A per-key concurrency limit (or a busy session under `reject`) refused the request.
    ConcurrencyLimitExceeded,
    /// A per-key token budget (tokens per minute) has not enough tokens left.
    TokenBudgetExceeded,
    /// The deadline passed before the request could be answered.
    DeadlineExceeded,
    /// The request was cancelled by its request id.
    Cancelled,
    /// The request id is already used by a request with another session or body.
    RequestIdConflict,
    /// The backend answered with an error or could not be reached.
    BackendError,
    /// The backend's own timeout elapsed (before the request's deadline).
    BackendTimeout,
    /// A header or the body could not be used.
    InvalidRequest,
    /// The adapter is shutting down and admits nothing new.
    ShuttingDown,
}

impl ErrorCode {
    /// The numeric code sent in `Nats-Service-Error-Code` (HTTP-like).
    pub fn nats_code(self) -> u16 {
        match self {
            Self::QueueFull | Self::ShuttingDown => 503,
            Self::SessionQueueFull | Self::ConcurrencyLimitExceeded | Self::TokenBudgetExceeded => {
                429
            }
            Self::DeadlineExceeded | Self::BackendTimeout => 504,
            Self::Cancelled => 499,
            Self::RequestIdConflict => 409,
            Self::BackendError => 502,
            Self::InvalidRequest => 400,
        }
    }

    /// Whether the request itself was never run by this replica: a refusal at admission
    /// or in the queue, as opposed to a failure of an inference that started.
    pub fn is_overload(self) -> bool {
        matches!(
            self,
            Self::QueueFull
                | Self::SessionQueueFull
                | Self::ConcurrencyLimitExceeded
                | Self::TokenBudgetExceeded
                | Self::ShuttingDown
        )
    }

    /// Whether the same request may succeed if retried later (possibly elsewhere).
    pub fn is_retryable(self) -> bool {
        self.is_overload() || matches!(self, Self::BackendError | Self::BackendTimeout)
    }
}

/// A string that is not an [`ErrorCode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error code {0:?}")]
pub struct UnknownErrorCode(pub String);

impl FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_wire(s).ok_or_else(|| UnknownErrorCode(s.to_owned()))
    }
}

/// The numbers that explain a refusal. Only the fields that apply are set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorDetails {
    /// The limit that was hit (queue capacity, session cap, per-key limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Accepted-but-unsettled requests (queue depth, or the session's pending count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<u64>,
    /// Requests currently holding a slot of the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
    /// Requests currently waiting for a slot of the limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<u64>,
    /// How long this request waited before it was refused, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// A hint: retrying sooner than this is unlikely to succeed, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The limit's key (`client:<id>`, `session:<id>`, `service`, `body:<pointer>=<value>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `deadline_exceeded` at admission: predicted wait before inference would start,
    /// in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_start_ms: Option<u64>,
    /// `deadline_exceeded`: the request's remaining budget when it was refused, in
    /// milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_ms: Option<u64>,
    /// `deadline_exceeded`: the backend's service-time estimate used, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_ms: Option<u64>,
    /// `token_budget_exceeded`: the tokens this request would reserve (its
    /// `max_tokens`, or the configured default, plus its prompt estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_requested: Option<u64>,
    /// `token_budget_exceeded`: the tokens left in the key's budget now (0 when it is
    /// in debt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_available: Option<u64>,
    /// `backend_error`: the backend's own status (HTTP status code) when it answered
    /// with one; `429` / `503` mean the backend itself is overloaded, and its
    /// `Retry-After` is then in `retry_after_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_status: Option<u16>,
}

impl ErrorDetails {
    /// Whether no detail is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A complete error: code, message and details. This is the JSON error body
/// (`{"code":..,"message":..,"details":{..}}`) and the `error` member of an envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    /// The machine-readable code.
    pub code: ErrorCode,
    /// Human-readable explanation. Never parse it.
    pub message: String,
    /// The numbers that explain the error.
    #[serde(default)]
    pub details: ErrorDetails,
}

impl ErrorBody {
    /// An error with the given code and message and no details.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            details: ErrorDetails::default(),
        }
    }

    /// Replaces the details.
    pub fn with_details(mut self, details: ErrorDetails) -> Self {
        self.details = details;
        self
    }

    /// The JSON body sent to callers that did not use the envelope.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising a struct of strings and integers cannot fail; fall back to a
        // minimal body rather than panic if it ever did.
        serde_json::to_vec(self).unwrap_or_else(|_| {
            format!(
                "{{\"code\":\"{}\",\"message\":\"\",\"details\":{{}}}}",
                self.code
            )
            .into_bytes()
        })
    }

    /// Parses an error body. Returns `None` when `bytes` is not one.
    pub fn from_json(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    /// The `Nats-Service-Error` header value: `"<code>: <message>"` on one line.
    pub fn service_error_header(&self) -> String {
        let mut s = format!("{}: {}", self.code, self.message);
        s.retain(|c| c != '\r' && c != '\n');
        s
    }
}

impl fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_strings_and_serde() {
        for &code in ErrorCode::ALL {
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            let json = serde_json::to_string(&code).expect("test value");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(
                serde_json::from_str::<ErrorCode>(&json).expect("test value"),
                code
            );
            assert!((400..600).contains(&code.nats_code()));
        }
        assert!("nope".parse::<ErrorCode>().is_err());
    }

    #[test]
    fn body_omits_details_that_do_not_apply() {
        let body = ErrorBody::new(ErrorCode::SessionQueueFull, "session s1 has 5 pending")
            .with_details(ErrorDetails {
                limit: Some(5),
                pending: Some(5),
                retry_after_ms: Some(40),
                ..Default::default()
            });
        let v: serde_json::Value = serde_json::from_slice(&body.to_json()).expect("test value");
        assert_eq!(
            v,
            serde_json::json!({
                "code": "session_queue_full",
                "message": "session s1 has 5 pending",
                "details": {"limit": 5, "pending": 5, "retry_after_ms": 40}
            })
        );
        assert_eq!(ErrorBody::from_json(&body.to_json()), Some(body));
        assert_eq!(ErrorBody::from_json(b"{\"code\":\"what\"}"), None);
        assert_eq!(ErrorBody::from_json(b"not json"), None);
    }

    #[test]
    fn service_error_header_is_one_line() {
        let body = ErrorBody::new(ErrorCode::BackendError, "line1\r\nline2");
        assert_eq!(body.service_error_header(), "backend_error: line1line2");
    }

    #[test]
    fn overload_codes_are_retryable() {
        for &code in ErrorCode::ALL {
            if code.is_overload() {
                assert!(code.is_retryable(), "{code}");
            }
        }
        assert!(!ErrorCode::DeadlineExceeded.is_retryable());
        assert!(!ErrorCode::RequestIdConflict.is_retryable());
    }
}
