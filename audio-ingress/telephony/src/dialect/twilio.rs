//! Twilio Media Streams, as published in "Media Streams - WebSocket Messages":
//! `connected {protocol, version}`; `start {sequenceNumber, start {accountSid,
//! streamSid, callSid, tracks, customParameters, mediaFormat {encoding, sampleRate,
//! channels}}, streamSid}`; `media {sequenceNumber, media {track, chunk, timestamp,
//! payload}, streamSid}`; `mark {sequenceNumber, streamSid, mark {name}}`;
//! `dtmf {streamSid, sequenceNumber, dtmf {track, digit}}`; `stop {sequenceNumber,
//! stop {accountSid, callSid}, streamSid}`. The `stop` body is not needed and not read.

use super::members::{
    Loose, Message, custom_parameters, missing, object, optional_string, read_format, required,
    string, track,
};
use super::{DialectError, DialectErrorKind, Inbound, Start};
use crate::codec::Encoding;

/// The `start` message.
pub(super) fn start(msg: &Message<'_>, seq: Option<u64>) -> Result<Inbound, DialectError> {
    let body = object(&msg.start, "start")?;
    // start.streamSid is the documented member; the top-level copy is the fallback.
    let stream_sid = match (&body.stream_sid, &msg.stream_sid) {
        (Some(sid), _) => string(sid, "start.streamSid")?,
        (None, Some(sid)) => string(sid, "streamSid")?,
        (None, None) => return Err(missing("start.streamSid")),
    };
    let call_id = required(&body.call_sid, "start.callSid", string)?;
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
        &body.media_format_camel,
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
        custom: custom_parameters(&body.custom_parameters_camel, "start.customParameters")?,
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
