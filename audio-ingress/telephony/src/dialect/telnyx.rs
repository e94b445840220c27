//! Telnyx media streaming, as published in "Stream call media over WebSocket" and the
//! media-streaming guide: `connected {version}`; `start {sequence_number, stream_id,
//! start {user_id, call_control_id, call_session_id, from, to, client_state,
//! custom_parameters, media_format {encoding, sample_rate, channels}}}`;
//! `media {sequence_number, media {track, chunk, timestamp, payload}, stream_id}`;
//! `mark {sequence_number, stream_id, mark {name}}`; `dtmf {..., dtmf {digit}}`;
//! `error {..., payload {code, title, detail}}`; `stop {sequence_number, stop {...},
//! stream_id}`. Encodings accepted: `PCMU`, `PCMA` (8 kHz), `L16` (8 or 16 kHz); the
//! others Telnyx can stream (`G722`, `OPUS`, `AMR-WB`) are refused as unsupported.

use super::members::{
    ErrorBody, Message, Obj, custom_parameters, object, optional_code, optional_string,
    read_format, required, string,
};
use super::{DialectError, Inbound, Start};
use crate::codec::Encoding;

/// The `start` message.
pub(super) fn start(msg: &Message<'_>, seq: Option<u64>) -> Result<Inbound, DialectError> {
    let stream_sid = required(&msg.stream_id, "stream_id", string)?;
    let body = object(&msg.start, "start")?;
    let call_id = required(&body.call_control_id, "start.call_control_id", string)?;
    let format = read_format(
        &body.media_format,
        "start.media_format",
        "sample_rate",
        encoding_of,
    )?;
    Ok(Inbound::Start(Start {
        seq,
        stream_sid: stream_sid.to_owned(),
        call_id: call_id.to_owned(),
        account: optional_string(&body.user_id, "start.user_id")?,
        format,
        tracks: Vec::new(),
        custom: custom_parameters(&body.custom_parameters, "start.custom_parameters")?,
    }))
}

/// The `error` message.
pub(super) fn error(body: &Option<Obj<Box<ErrorBody<'_>>>>) -> Result<Inbound, DialectError> {
    // An error frame without a readable payload is still an error report.
    let Some(Obj::Map(body)) = body else {
        return Ok(Inbound::Error {
            code: None,
            title: None,
            detail: None,
        });
    };
    Ok(Inbound::Error {
        code: optional_code(&body.code, "payload.code")?,
        title: optional_string(&body.title, "payload.title")?,
        detail: optional_string(&body.detail, "payload.detail")?,
    })
}

/// The encodings this carrier names in `start`.
fn encoding_of(name: &str) -> Option<Encoding> {
    match name {
        "PCMU" => Some(Encoding::Pcmu),
        "PCMA" => Some(Encoding::Pcma),
        "L16" => Some(Encoding::L16),
        _ => None,
    }
}
