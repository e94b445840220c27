//! Twilio Media Streams, as published in "Media Streams - WebSocket Messages":
//! `connected {protocol, version}`; `start {sequenceNumber, start {accountSid,
//! streamSid, callSid, tracks, customParameters, mediaFormat {encoding, sampleRate,
//! channels}}, streamSid}`; `media {sequenceNumber, media {track, chunk, timestamp,
//! payload}, streamSid}`; `mark {sequenceNumber, streamSid, mark {name}}`;
//! `dtmf {streamSid, sequenceNumber, dtmf {track, digit}}`; `stop {sequenceNumber,
//! stop {accountSid, callSid}, streamSid}`. The `stop` body is not needed and not read.

use std::collections::BTreeMap;

use super::members::{
    DtmfBody, FormatBody, Loose, MarkBody, MediaBody, Obj, custom_parameters, dtmf, event, mark,
    media, missing, object, optional_number, optional_string, read_format, required, string, track,
};
use super::{DialectError, DialectErrorKind, Inbound, Start, invalid_json};
use crate::codec::Encoding;

#[derive(serde::Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    event: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "sequenceNumber")]
    sequence_number: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "streamSid")]
    stream_sid: Option<Loose<'a>>,
    #[serde(borrow, default)]
    protocol: Option<Loose<'a>>,
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
}

#[derive(serde::Deserialize)]
struct StartBody<'a> {
    #[serde(borrow, default, rename = "streamSid")]
    stream_sid: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "accountSid")]
    account_sid: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "callSid")]
    call_sid: Option<Loose<'a>>,
    #[serde(borrow, default)]
    tracks: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "customParameters")]
    custom_parameters: Option<Obj<BTreeMap<String, Loose<'a>>>>,
    #[serde(borrow, default, rename = "mediaFormat")]
    media_format: Option<Obj<FormatBody<'a>>>,
}

/// The full reader (serde), for every message the hot path's reader passes on.
pub(super) fn parse_full(text: &str) -> Result<Inbound, DialectError> {
    let msg: Message<'_> = serde_json::from_str(text).map_err(|e| invalid_json(&e))?;
    let seq = || optional_number(&msg.sequence_number, "sequenceNumber");
    match event(&msg.event)? {
        "media" => media(object(&msg.media, "media")?, seq()?),
        "start" => start(&msg, seq()?),
        "connected" => Ok(Inbound::Connected {
            protocol: optional_string(&msg.protocol, "protocol")?,
            version: optional_string(&msg.version, "version")?,
        }),
        "mark" => mark(&msg.mark, seq()?),
        "dtmf" => dtmf(&msg.dtmf),
        "stop" => Ok(Inbound::Stop),
        other => Ok(Inbound::Other {
            event: other.to_owned(),
        }),
    }
}

fn start(msg: &Message<'_>, seq: Option<u64>) -> Result<Inbound, DialectError> {
    let body = object(&msg.start, "start")?;
    // start.streamSid is the documented member; the top-level copy is the fallback.
    let stream_sid = match (&body.stream_sid, &msg.stream_sid) {
        (Some(sid), _) => string(sid, "start.streamSid")?,
        (None, Some(sid)) => string(sid, "streamSid")?,
        (None, None) => return Err(missing("start.streamSid")),
    };
    let call_id = string(required(&body.call_sid, "start.callSid")?, "start.callSid")?;
    let tracks = match &body.tracks {
        None => Vec::new(),
        Some(Loose::List(items)) => items
            .iter()
            .map(|t| track(t, "start.tracks[]"))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(DialectError::new(
                DialectErrorKind::InvalidField,
                format!("start.tracks is not an array (found {})", other.type_name()),
            ));
        }
    };
    let format = read_format(
        &body.media_format,
        "start.mediaFormat",
        "sampleRate",
        encoding_of,
    )?;
    Ok(Inbound::Start(Start {
        seq,
        stream_sid: stream_sid.to_owned(),
        call_id: call_id.to_owned(),
        account: optional_string(&body.account_sid, "start.accountSid")?,
        format,
        tracks,
        custom: custom_parameters(&body.custom_parameters, "start.customParameters")?,
    }))
}

/// The encodings this carrier names in `start`.
fn encoding_of(name: &str) -> Option<Encoding> {
    match name {
        "audio/x-mulaw" => Some(Encoding::Pcmu),
        "audio/x-alaw" => Some(Encoding::Pcma),
        _ => None,
    }
}
