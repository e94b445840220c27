//! What a carrier's media-stream WebSocket speaks: Twilio Media Streams and Telnyx media
//! streaming, parsed from the JSON text messages the carriers publish (inbound) and
//! written for them (outbound, in [`outbound`]).
//!
//! Invariants a reader must not break:
//! - the message shapes are the carriers' *published* ones (Twilio "Media Streams -
//!   WebSocket Messages", Telnyx "Stream call media over WebSocket"), so a client
//!   written from their docs works unchanged; numbers arrive as strings (`"chunk": "2"`)
//!   and a JSON number is accepted too;
//! - unknown *members* are ignored (carriers add fields); an unknown *event* parses to
//!   [`Inbound::Other`]; a known member of the wrong type is refused, naming it;
//! - a text over [`MAX_MESSAGE_BYTES`] is refused ([`DialectErrorKind::TooLarge`])
//!   before any parsing;
//! - [`parse`] never panics: every refusal is a [`DialectError`] with a `kind()`, a
//!   stable snake_case `code()` and a message naming the member
//!   (e.g. "media.payload is not base64");
//! - the media message (50 per second per call) is read in one forward scan when it has
//!   the plain shape carriers send (`fast`), else by serde; either way its strings are
//!   borrowed from the text and its payload is base64-decoded once, and both readers
//!   give the same answer (a test compares them over mutated messages).
//!
//! Layout: `twilio` and `telnyx` read what differs between the carriers (`start`,
//! Telnyx's `error`); `fast` is the media message's hot-path reader; `members` holds
//! the messages' shapes and reads members leniently (a wrong type becomes an error
//! naming the member); `outbound` writes the messages sent to the carrier.

mod fast;
mod members;
mod outbound;
mod telnyx;
mod twilio;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests unwrap what they construct
mod tests;

use std::collections::BTreeMap;

use crate::codec::MediaFormat;
use members::{Loose, Message, dtmf, event, mark, media, object, optional_number, optional_string};

pub use outbound::{clear_message, mark_message, media_message};

/// A text message longer than this is refused ([`DialectErrorKind::TooLarge`]) before
/// parsing. A 200 ms PCMU chunk is 1,600 bytes, 2,136 in base64; 16 KiB leaves room
/// for L16 at 16 kHz (6,400 bytes per 200 ms, 8,536 in base64) and carrier metadata.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// The carrier whose messages a WebSocket carries; displayed as `twilio` / `telnyx`,
/// parsed from those names ASCII case-insensitively.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::Display, strum::EnumString,
)]
#[strum(serialize_all = "lowercase", ascii_case_insensitive)]
#[strum(parse_err_ty = UnknownDialect, parse_err_fn = UnknownDialect::of)]
pub enum Dialect {
    /// Twilio Media Streams (`camelCase` members, `streamSid`).
    Twilio,
    /// Telnyx media streaming (`snake_case` members, `stream_id`).
    Telnyx,
}

impl Dialect {
    /// The member holding the message's sequence number.
    fn seq_member(self) -> &'static str {
        match self {
            Dialect::Twilio => "sequenceNumber",
            Dialect::Telnyx => "sequence_number",
        }
    }

    /// `"twilio"` / `"telnyx"`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A dialect name that is neither `twilio` nor `telnyx`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown telephony dialect {0:?} (expected \"twilio\" or \"telnyx\")")]
pub struct UnknownDialect(pub String);

impl UnknownDialect {
    fn of(name: &str) -> Self {
        Self(name.to_owned())
    }
}

/// A media track: the caller's audio (`inbound`) or the audio played to the caller
/// (`outbound`). Twilio's `dtmf.track` spells it `inbound_track`; both are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Track {
    /// The caller's audio.
    Inbound,
    /// The audio played to the caller.
    Outbound,
}

/// A stream's `start` message.
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    /// Twilio `sequenceNumber` / Telnyx `sequence_number`.
    pub seq: Option<u64>,
    /// Twilio `start.streamSid` (or the top-level `streamSid`) / Telnyx `stream_id`.
    pub stream_sid: String,
    /// Twilio `start.callSid` / Telnyx `start.call_control_id`.
    pub call_id: String,
    /// Twilio `start.accountSid` / Telnyx `start.user_id`.
    pub account: Option<String>,
    /// Twilio `start.mediaFormat` / Telnyx `start.media_format`, validated.
    pub format: MediaFormat,
    /// Twilio `start.tracks`; empty for Telnyx, whose `start` does not list them.
    pub tracks: Vec<Track>,
    /// Twilio `start.customParameters` / Telnyx `start.custom_parameters` (string
    /// values only; any other value is refused).
    pub custom: BTreeMap<String, String>,
}

/// A `media` message: one chunk of carrier audio.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Media {
    /// Twilio `sequenceNumber` / Telnyx `sequence_number` (counts every message, not
    /// only media: it cannot show a missing chunk).
    pub seq: Option<u64>,
    /// `media.chunk`: the per-track media counter (starts at 1), the reorder key.
    pub chunk: u64,
    /// `media.timestamp`: milliseconds from the start of the stream.
    pub timestamp_ms: u64,
    /// `media.track`.
    pub track: Track,
    /// `media.payload`, base64-decoded: the carrier-encoded audio bytes.
    pub payload: Vec<u8>,
}

/// One message from the carrier.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// The first message: Twilio `{protocol: "Call", version}`, Telnyx `{version}`.
    Connected {
        /// Twilio `protocol` (`"Call"`); absent for Telnyx.
        protocol: Option<String>,
        /// The protocol version (`"1.0.0"`).
        version: Option<String>,
    },
    /// Stream metadata, once, before any media.
    Start(Start),
    /// A chunk of audio.
    Media(Media),
    /// A mark the door sent, echoed back when the audio before it has played (or was
    /// cleared).
    Mark {
        /// The message's sequence number.
        seq: Option<u64>,
        /// `mark.name`, as the door sent it.
        name: String,
    },
    /// A key press (`dtmf.digit`).
    Dtmf {
        /// The key: `0`-`9`, `*`, `#`, `A`-`D`.
        digit: String,
    },
    /// Telnyx `error` frame (`payload.code`, `payload.title`, `payload.detail`): the
    /// carrier reports a streaming error (e.g. a malformed frame the door sent).
    /// Addition to the contract's list.
    Error {
        /// `payload.code` (a number or a string in the carrier's frame).
        code: Option<String>,
        /// `payload.title`.
        title: Option<String>,
        /// `payload.detail`.
        detail: Option<String>,
    },
    /// The stream stopped (call ended or stream stopped).
    Stop,
    /// An event this module does not know; the door counts and ignores it.
    Other {
        /// The message's `event`.
        event: String,
    },
}

/// What went wrong with a carrier message; see [`DialectErrorKind::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum DialectErrorKind {
    /// The text is over [`MAX_MESSAGE_BYTES`].
    TooLarge,
    /// The text is not JSON (or not an object, or repeats a member).
    InvalidJson,
    /// A member the message needs is missing (or `null`).
    MissingField,
    /// A member has the wrong type or value.
    InvalidField,
    /// `media.payload` is not standard, padded base64.
    InvalidBase64,
    /// The stream's media format is not one the codecs handle.
    UnsupportedFormat,
}

impl DialectErrorKind {
    /// A stable snake_case code: `too_large`, `invalid_json`, `missing_field`,
    /// `invalid_field`, `invalid_base64`, `unsupported_format`.
    pub fn code(self) -> &'static str {
        self.into()
    }
}

/// A carrier message refused, with a message naming the member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DialectError {
    kind: DialectErrorKind,
    message: String,
}

impl DialectError {
    fn new(kind: DialectErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> DialectErrorKind {
        self.kind
    }

    /// The kind's stable snake_case code.
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }

    /// The human-readable message (names the member).
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Which dialect a connection speaks, from its first message: Twilio's `connected` has
/// `protocol`, its other messages `streamSid` / `sequenceNumber`; Telnyx's have
/// `stream_id` / `sequence_number`, and its `connected` has only `version`. `None`
/// when the text says neither (or is not a JSON object, or is too large).
pub fn detect(text: &str) -> Option<Dialect> {
    if text.len() > MAX_MESSAGE_BYTES || !text.trim_start().starts_with('{') {
        return None;
    }
    let msg: Message<'_> = serde_json::from_str(text).ok()?;
    let twilio =
        msg.protocol.is_some() || msg.stream_sid.is_some() || msg.sequence_number_camel.is_some();
    let telnyx = msg.stream_id.is_some() || msg.sequence_number.is_some();
    match (twilio, telnyx) {
        (true, false) => Some(Dialect::Twilio),
        (false, true) => Some(Dialect::Telnyx),
        (true, true) => None,
        (false, false) => {
            let connected = matches!(&msg.event, Some(Loose::Str(e)) if e == "connected");
            (connected && msg.version.is_some()).then_some(Dialect::Telnyx)
        }
    }
}

/// Parses one text message from a carrier speaking `dialect`.
pub fn parse(dialect: Dialect, text: &str) -> Result<Inbound, DialectError> {
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(DialectError::new(
            DialectErrorKind::TooLarge,
            format!(
                "message of {} bytes is over the limit of {MAX_MESSAGE_BYTES} bytes",
                text.len()
            ),
        ));
    }
    // serde would read a JSON array positionally into the message struct: refuse
    // anything but an object up front.
    if !text.trim_start().starts_with('{') {
        return Err(DialectError::new(
            DialectErrorKind::InvalidJson,
            "message is not a JSON object",
        ));
    }
    // A `media` message by the hot path's reader ([`fast`]), anything else by serde.
    fast::media_message(text, dialect.seq_member()).unwrap_or_else(|| parse_full(dialect, text))
}

/// The full reader (serde), for every message the hot path's reader passes on.
fn parse_full(dialect: Dialect, text: &str) -> Result<Inbound, DialectError> {
    let msg: Message<'_> = serde_json::from_str(text).map_err(|e| invalid_json(&e))?;
    let seq = match dialect {
        Dialect::Twilio => &msg.sequence_number_camel,
        Dialect::Telnyx => &msg.sequence_number,
    };
    let seq = || optional_number(seq, dialect.seq_member());
    match event(&msg.event)? {
        "media" => media(object(&msg.media, "media")?, seq()?),
        "start" => match dialect {
            Dialect::Twilio => twilio::start(&msg, seq()?),
            Dialect::Telnyx => telnyx::start(&msg, seq()?),
        },
        "connected" => Ok(Inbound::Connected {
            protocol: match dialect {
                Dialect::Twilio => optional_string(&msg.protocol, "protocol")?,
                Dialect::Telnyx => None,
            },
            version: optional_string(&msg.version, "version")?,
        }),
        "mark" => mark(&msg.mark, seq()?),
        "dtmf" => dtmf(&msg.dtmf),
        "error" if dialect == Dialect::Telnyx => telnyx::error(&msg.payload),
        "stop" => Ok(Inbound::Stop),
        other => Ok(Inbound::Other {
            event: other.to_owned(),
        }),
    }
}

/// serde_json's error for text that is not a JSON object of the expected members.
fn invalid_json(err: &serde_json::Error) -> DialectError {
    DialectError::new(
        DialectErrorKind::InvalidJson,
        format!("message is not a JSON object: {err}"),
    )
}
