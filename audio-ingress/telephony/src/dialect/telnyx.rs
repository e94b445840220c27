//! Telnyx media streaming, as published in "Stream call media over WebSocket" and the
//! media-streaming guide: `connected {version}`; `start {sequence_number, stream_id,
//! start {user_id, call_control_id, call_session_id, from, to, client_state,
//! custom_parameters, media_format {encoding, sample_rate, channels}}}`;
//! `media {sequence_number, media {track, chunk, timestamp, payload}, stream_id}`;
//! `mark {sequence_number, stream_id, mark {name}}`; `dtmf {..., dtmf {digit}}`;
//! `error {..., payload {code, title, detail}}`; `stop {sequence_number, stop {...},
//! stream_id}`. Encodings accepted: `PCMU`, `PCMA` (8 kHz), `L16` (8 or 16 kHz); the
//! others Telnyx can stream (`G722`, `OPUS`, `AMR-WB`) are refused as unsupported.

use std::collections::BTreeMap;

use super::members::{
    DtmfBody, FormatBody, Loose, MarkBody, MediaBody, Obj, custom_parameters, dtmf, event, mark,
    media, object, optional_code, optional_number, optional_string, read_format, required, string,
};
use super::{DialectError, Inbound, Start, invalid_json};
use crate::codec::Encoding;

#[derive(serde::Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    event: Option<Loose<'a>>,
    #[serde(borrow, default)]
    sequence_number: Option<Loose<'a>>,
    #[serde(borrow, default)]
    stream_id: Option<Loose<'a>>,
    #[serde(borrow, default)]
    version: Option<Loose<'a>>,
    #[serde(borrow, default)]
    start: Option<Obj<Box<StartBody<'a>>>>, // boxed: rare and large, keeps the media path's struct small
    #[serde(borrow, default)]
    media: Option<Obj<MediaBody<'a>>>,
    #[serde(borrow, default)]
    mark: Option<Obj<MarkBody<'a>>>,
    #[serde(borrow, default)]
    dtmf: Option<Obj<DtmfBody<'a>>>,
    #[serde(borrow, default)]
    payload: Option<Obj<Box<ErrorBody<'a>>>>,
}

#[derive(serde::Deserialize)]
struct StartBody<'a> {
    #[serde(borrow, default)]
    user_id: Option<Loose<'a>>,
    #[serde(borrow, default)]
    call_control_id: Option<Loose<'a>>,
    #[serde(borrow, default)]
    custom_parameters: Option<Obj<BTreeMap<String, Loose<'a>>>>,
    #[serde(borrow, default)]
    media_format: Option<Obj<FormatBody<'a>>>,
}

#[derive(serde::Deserialize)]
struct ErrorBody<'a> {
    #[serde(borrow, default)]
    code: Option<Loose<'a>>,
    #[serde(borrow, default)]
    title: Option<Loose<'a>>,
    #[serde(borrow, default)]
    detail: Option<Loose<'a>>,
}

/// The full reader (serde), for every message the hot path's reader passes on.
pub(super) fn parse_full(text: &str) -> Result<Inbound, DialectError> {
    let msg: Message<'_> = serde_json::from_str(text).map_err(|e| invalid_json(&e))?;
    let seq = || optional_number(&msg.sequence_number, "sequence_number");
    match event(&msg.event)? {
        "media" => media(object(&msg.media, "media")?, seq()?),
        "start" => start(&msg, seq()?),
        "connected" => Ok(Inbound::Connected {
            protocol: None,
            version: optional_string(&msg.version, "version")?,
        }),
        "mark" => mark(&msg.mark, seq()?),
        "dtmf" => dtmf(&msg.dtmf),
        "error" => error(&msg.payload),
        "stop" => Ok(Inbound::Stop),
        other => Ok(Inbound::Other {
            event: other.to_owned(),
        }),
    }
}

fn start(msg: &Message<'_>, seq: Option<u64>) -> Result<Inbound, DialectError> {
    let stream_sid = string(required(&msg.stream_id, "stream_id")?, "stream_id")?;
    let body = object(&msg.start, "start")?;
    let call_id = string(
        required(&body.call_control_id, "start.call_control_id")?,
        "start.call_control_id",
    )?;
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

fn error(body: &Option<Obj<Box<ErrorBody<'_>>>>) -> Result<Inbound, DialectError> {
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
