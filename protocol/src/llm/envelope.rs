//! The deployed JSON envelope.
//!
//! The deployed services exchange JSON objects that carry `trace_id`, `request_id`,
//! `correlation_id`, `session_id` and `ts_ms` next to their payload; a response adds
//! `ok`, `data` and `error: {code, message, details}`.
//!
//! The adapter never changes a request body. It only *recognises* an envelope
//! ([`EnvelopeMeta::detect`]) so that
//! - an error it generates itself can be a valid response envelope
//!   ([`ResponseEnvelope::error`]) echoing the five fields unchanged (same JSON values,
//!   same types), with `ok: false, data: null`;
//! - `request_id` and `session_id` can stand in for the `Weir-Request-Id` and
//!   `Weir-Session-Id` headers when a deployed caller does not send them.
//!
//! Detection rule: the body is a JSON object whose `trace_id`, `request_id` and `ts_ms`
//! members are present and not `null`. `correlation_id` and `session_id` are optional
//! (echoed as `null` when absent). Everything else in the object is ignored. As a fast
//! pre-check the body must contain the bytes `"trace_id"` (keys written plainly, as every
//! JSON encoder does; a key spelled with `\u` escapes is not recognised), so bodies that
//! are not envelopes — e.g. OpenAI chat requests — are not parsed at all.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ErrorBody;

/// The five envelope fields of a request, as the caller sent them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EnvelopeMeta {
    /// Trace id (echoed unchanged).
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::non_null"))]
    pub trace_id: Value,
    /// Request id (echoed unchanged).
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::non_null"))]
    pub request_id: Value,
    /// Correlation id (echoed unchanged; `null` when absent).
    #[serde(default)]
    pub correlation_id: Value,
    /// Session id (echoed unchanged; `null` when absent).
    #[serde(default)]
    pub session_id: Value,
    /// Timestamp in unix milliseconds (echoed unchanged).
    #[cfg_attr(feature = "schema", schemars(schema_with = "crate::schema::non_null"))]
    pub ts_ms: Value,
}

impl EnvelopeMeta {
    /// Recognises a deployed envelope in a request body. Returns `None` for anything
    /// else (not JSON, not an object, required members missing or `null`).
    pub fn detect(body: &[u8]) -> Option<Self> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace())?;
        if *first != b'{' || !contains(body, b"\"trace_id\"") {
            return None;
        }
        // Only the five members are read; the rest of the object is skipped. A missing
        // required member fails to deserialize, a `null` one is refused here.
        let meta: Self = serde_json::from_slice(body).ok()?;
        let required = [&meta.trace_id, &meta.request_id, &meta.ts_ms];
        (!required.iter().any(|v| v.is_null())).then_some(meta)
    }

    /// `request_id` as a string id, if it is a non-empty string or an integer.
    pub fn request_id_str(&self) -> Option<String> {
        value_as_id(&self.request_id)
    }

    /// `session_id` as a string id, if it is a non-empty string or an integer.
    pub fn session_id_str(&self) -> Option<String> {
        value_as_id(&self.session_id)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn value_as_id(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// A response envelope: the request's five fields, then `ok`, `data`, `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ResponseEnvelope {
    /// The request's envelope fields, echoed.
    #[serde(flatten)]
    pub meta: EnvelopeMeta,
    /// `true` on success.
    pub ok: bool,
    /// The payload on success, `null` on error.
    pub data: Value,
    /// The error, `null` on success.
    pub error: Option<ErrorBody>,
}

impl ResponseEnvelope {
    /// An error response echoing `meta`.
    pub fn error(meta: EnvelopeMeta, error: ErrorBody) -> Self {
        Self {
            meta,
            ok: false,
            data: Value::Null,
            error: Some(error),
        }
    }

    /// A success response echoing `meta`.
    pub fn ok(meta: EnvelopeMeta, data: Value) -> Self {
        Self {
            meta,
            ok: true,
            data,
            error: None,
        }
    }

    /// The JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        // Values that came out of serde_json always serialise again.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::error::{ErrorCode, ErrorDetails};
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "trace_id": "t-1",
            "request_id": "r-1",
            "correlation_id": "c-1",
            "session_id": "s-1",
            "ts_ms": 1_700_000_000_000u64,
            "data": {"messages": [{"role": "user", "content": "hi"}]}
        })
    }

    #[test]
    fn detects_the_deployed_envelope() {
        let body = serde_json::to_vec(&sample()).expect("test value");
        let meta = EnvelopeMeta::detect(&body).expect("test value");
        assert_eq!(meta.trace_id, json!("t-1"));
        assert_eq!(meta.request_id_str().as_deref(), Some("r-1"));
        assert_eq!(meta.session_id_str().as_deref(), Some("s-1"));
        assert_eq!(meta.ts_ms, json!(1_700_000_000_000u64));
    }

    #[test]
    fn anything_else_is_not_an_envelope() {
        for body in [
            &b""[..],
            b"   ",
            b"not json",
            b"[1,2,3]",
            b"[\"t\",\"r\",null,null,1]",
            b"{\"model\":\"x\",\"messages\":[]}",
            b"{\"trace_id\":\"t\",\"request_id\":null,\"ts_ms\":1}",
            b"{\"trace_id\":\"t\",\"request_id\":\"r\"}",
            b"{\"trace_id\":\"t\",\"request_id\":\"r\",\"ts_ms\":1",
        ] {
            assert_eq!(
                EnvelopeMeta::detect(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn optional_members_default_to_null_and_numbers_are_ids() {
        let meta = EnvelopeMeta::detect(br#"{"trace_id":"t","request_id":42,"ts_ms":5}"#)
            .expect("test value");
        assert_eq!(meta.correlation_id, Value::Null);
        assert_eq!(meta.session_id_str(), None);
        assert_eq!(meta.request_id_str().as_deref(), Some("42"));
    }

    #[test]
    fn error_response_echoes_fields_with_their_types() {
        let meta = EnvelopeMeta::detect(&serde_json::to_vec(&sample()).expect("test value"))
            .expect("test value");
        let err = ErrorBody::new(ErrorCode::QueueFull, "queue holds 64 requests").with_details(
            ErrorDetails {
                limit: Some(64),
                pending: Some(64),
                retry_after_ms: Some(20),
                ..Default::default()
            },
        );
        let v: Value = serde_json::from_slice(&ResponseEnvelope::error(meta, err).to_json())
            .expect("test value");
        assert_eq!(
            v,
            json!({
                "trace_id": "t-1", "request_id": "r-1", "correlation_id": "c-1",
                "session_id": "s-1", "ts_ms": 1_700_000_000_000u64,
                "ok": false, "data": null,
                "error": {"code": "queue_full", "message": "queue holds 64 requests",
                          "details": {"limit": 64, "pending": 64, "retry_after_ms": 20}}
            })
        );
        let back: ResponseEnvelope = serde_json::from_value(v).expect("test value");
        assert!(!back.ok);
        assert_eq!(back.error.expect("test value").code, ErrorCode::QueueFull);
    }

    #[test]
    fn ok_response_has_null_error() {
        let meta = EnvelopeMeta::detect(br#"{"trace_id":"t","request_id":"r","ts_ms":1}"#)
            .expect("test value");
        let v: Value =
            serde_json::from_slice(&ResponseEnvelope::ok(meta, json!({"text": "hello"})).to_json())
                .expect("test value");
        assert_eq!(v["ok"], json!(true));
        assert_eq!(v["error"], Value::Null);
        assert_eq!(v["data"]["text"], json!("hello"));
    }
}
