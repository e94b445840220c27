//! Messages the door sends to the carrier (bidirectional streams), as the carriers
//! publish them: Twilio `{"event":"media","streamSid":..,"media":{"payload":..}}`,
//! `{"event":"mark","streamSid":..,"mark":{"name":..}}`, `{"event":"clear",
//! "streamSid":..}`; Telnyx the same without `streamSid` (its WebSocket carries one
//! stream). Payloads are standard, padded base64. Strings are JSON-escaped here, so
//! any stream id or mark name gives valid JSON.

use base64::Engine as _;

use super::Dialect;

/// A `media` message carrying `payload` (carrier-encoded audio bytes).
pub fn media_message(dialect: Dialect, stream_sid: &str, payload: &[u8]) -> String {
    let b64_len = payload.len().div_ceil(3) * 4;
    let mut out = String::with_capacity(64 + stream_sid.len() + b64_len);
    out.push_str(r#"{"event":"media","#);
    push_stream_sid(&mut out, dialect, stream_sid);
    out.push_str(r#""media":{"payload":""#);
    base64::engine::general_purpose::STANDARD.encode_string(payload, &mut out);
    out.push_str(r#""}}"#);
    out
}

/// A `mark` message: the carrier echoes it back when the audio sent before it has
/// played (or was cleared).
pub fn mark_message(dialect: Dialect, stream_sid: &str, name: &str) -> String {
    let mut out = String::with_capacity(64 + stream_sid.len() + name.len());
    out.push_str(r#"{"event":"mark","#);
    push_stream_sid(&mut out, dialect, stream_sid);
    out.push_str(r#""mark":{"name":"#);
    push_json_string(&mut out, name);
    out.push_str("}}");
    out
}

/// A `clear` message: the carrier drops the audio it has buffered and echoes the
/// pending marks.
pub fn clear_message(dialect: Dialect, stream_sid: &str) -> String {
    let mut out = String::with_capacity(48 + stream_sid.len());
    out.push_str(r#"{"event":"clear""#);
    if dialect == Dialect::Twilio {
        out.push_str(r#","streamSid":"#);
        push_json_string(&mut out, stream_sid);
    }
    out.push('}');
    out
}

/// `"streamSid":"..",` for Twilio; nothing for Telnyx.
fn push_stream_sid(out: &mut String, dialect: Dialect, stream_sid: &str) {
    if dialect == Dialect::Twilio {
        out.push_str(r#""streamSid":"#);
        push_json_string(out, stream_sid);
        out.push(',');
    }
}

/// `s` as a JSON string literal (serde_json's escaping; a `&str` always serializes).
fn push_json_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}
