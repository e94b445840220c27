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
//! - the media message (50 per second per call) is parsed in one pass, borrowing its
//!   strings from the text, and its payload is base64-decoded once.
//!
//! How a wrong type becomes a named error: every leaf member is read as a [`Loose`]
//! value (any JSON value; strings borrowed), every nested object as an [`Obj`] (an
//! object, or the name of what was there instead). serde then only fails on text that
//! is not JSON (or a member given twice), and the dialect code checks each member's
//! type itself.

mod outbound;
mod telnyx;
mod twilio;

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests unwrap what they construct
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use base64::Engine as _;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::codec::MediaFormat;

pub use outbound::{clear_message, mark_message, media_message};

/// A text message longer than this is refused ([`DialectErrorKind::TooLarge`]) before
/// parsing. A 200 ms PCMU chunk is 1,600 bytes, 2,136 in base64; 16 KiB leaves room
/// for L16 at 16 kHz (6,400 bytes per 200 ms, 8,536 in base64) and carrier metadata.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;

/// The carrier whose messages a WebSocket carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// Twilio Media Streams (`camelCase` members, `streamSid`).
    Twilio,
    /// Telnyx media streaming (`snake_case` members, `stream_id`).
    Telnyx,
}

impl Dialect {
    /// `"twilio"` / `"telnyx"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Twilio => "twilio",
            Dialect::Telnyx => "telnyx",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dialect name that is neither `twilio` nor `telnyx`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown telephony dialect {0:?} (expected \"twilio\" or \"telnyx\")")]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;

    /// `twilio` / `telnyx`, ASCII case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("twilio") {
            Ok(Dialect::Twilio)
        } else if s.eq_ignore_ascii_case("telnyx") {
            Ok(Dialect::Telnyx)
        } else {
            Err(UnknownDialect(s.to_owned()))
        }
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
        match self {
            DialectErrorKind::TooLarge => "too_large",
            DialectErrorKind::InvalidJson => "invalid_json",
            DialectErrorKind::MissingField => "missing_field",
            DialectErrorKind::InvalidField => "invalid_field",
            DialectErrorKind::InvalidBase64 => "invalid_base64",
            DialectErrorKind::UnsupportedFormat => "unsupported_format",
        }
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
    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(borrow, default)]
        event: Option<Loose<'a>>,
        #[serde(default)]
        protocol: Option<IgnoredAny>,
        #[serde(default, rename = "streamSid")]
        stream_sid: Option<IgnoredAny>,
        #[serde(default, rename = "sequenceNumber")]
        sequence_number_camel: Option<IgnoredAny>,
        #[serde(default)]
        stream_id: Option<IgnoredAny>,
        #[serde(default)]
        sequence_number: Option<IgnoredAny>,
        #[serde(default)]
        version: Option<IgnoredAny>,
    }
    if text.len() > MAX_MESSAGE_BYTES || !text.trim_start().starts_with('{') {
        return None;
    }
    let probe: Probe<'_> = serde_json::from_str(text).ok()?;
    let twilio = probe.protocol.is_some()
        || probe.stream_sid.is_some()
        || probe.sequence_number_camel.is_some();
    let telnyx = probe.stream_id.is_some() || probe.sequence_number.is_some();
    match (twilio, telnyx) {
        (true, false) => Some(Dialect::Twilio),
        (false, true) => Some(Dialect::Telnyx),
        (true, true) => None,
        (false, false) => {
            let connected = matches!(&probe.event, Some(Loose::Str(e)) if e == "connected");
            (connected && probe.version.is_some()).then_some(Dialect::Telnyx)
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
    match dialect {
        Dialect::Twilio => twilio::parse(text),
        Dialect::Telnyx => telnyx::parse(text),
    }
}

/// serde_json's error for text that is not a JSON object of the expected members.
fn invalid_json(err: &serde_json::Error) -> DialectError {
    DialectError::new(
        DialectErrorKind::InvalidJson,
        format!("message is not a JSON object: {err}"),
    )
}

// ---------------------------------------------------------------------------------
// Lenient reading: wrong types become named errors, not serde messages.
// ---------------------------------------------------------------------------------

/// Any JSON value, read without failing on its type: strings (borrowed from the text
/// when they hold no escape), non-negative integers, arrays; anything else is only
/// named.
#[derive(Debug)]
pub(crate) enum Loose<'a> {
    Str(Cow<'a, str>),
    Uint(u64),
    List(Vec<Loose<'a>>),
    Other(&'static str),
}

impl Loose<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Loose::Str(_) => "a string",
            Loose::Uint(_) => "a number",
            Loose::List(_) => "an array",
            Loose::Other(name) => name,
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LooseVisitor(PhantomData))
    }
}

struct LooseVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for LooseVisitor<'a> {
    type Value = Loose<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Loose::Str(Cow::Owned(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Loose::Uint(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(v).map_or(Loose::Other("a negative number"), Loose::Uint))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Loose::Other("a fractional number"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Loose::Other("a boolean"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Loose::Other("null"))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Loose::Other("null"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Loose<'a>>()? {
            items.push(item);
        }
        Ok(Loose::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Loose::Other("an object"))
    }
}

/// A member that should be a JSON object: the object read as `T`, or the name of the
/// JSON type found instead.
#[derive(Debug)]
pub(crate) enum Obj<T> {
    Map(T),
    Not(&'static str),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ObjVisitor(PhantomData))
    }
}

struct ObjVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjVisitor<T> {
    type Value = Obj<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Obj::Map)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Obj::Not("a string"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Obj::Not("a number"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Obj::Not("a number"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Obj::Not("a number"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Obj::Not("a boolean"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Obj::Not("null"))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Obj::Not("null"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Obj::Not("an array"))
    }
}

/// `media.{track,chunk,timestamp,payload}`: the same members in both dialects.
#[derive(serde::Deserialize)]
pub(crate) struct MediaBody<'a> {
    #[serde(borrow, default)]
    track: Option<Loose<'a>>,
    #[serde(borrow, default)]
    chunk: Option<Loose<'a>>,
    #[serde(borrow, default)]
    timestamp: Option<Loose<'a>>,
    #[serde(borrow, default)]
    payload: Option<Loose<'a>>,
}

/// `mark.name`.
#[derive(serde::Deserialize)]
pub(crate) struct MarkBody<'a> {
    #[serde(borrow, default)]
    name: Option<Loose<'a>>,
}

/// `dtmf.digit` (`dtmf.track`, when present, is ignored).
#[derive(serde::Deserialize)]
pub(crate) struct DtmfBody<'a> {
    #[serde(borrow, default)]
    digit: Option<Loose<'a>>,
}

// ---------------------------------------------------------------------------------
// Member checks: each error names the member (its path in the carrier's message).
// ---------------------------------------------------------------------------------

fn missing(name: &str) -> DialectError {
    DialectError::new(DialectErrorKind::MissingField, format!("{name} is missing"))
}

fn required<'x, 'a>(
    value: &'x Option<Loose<'a>>,
    name: &str,
) -> Result<&'x Loose<'a>, DialectError> {
    value.as_ref().ok_or_else(|| missing(name))
}

fn object<'x, T>(value: &'x Option<Obj<T>>, name: &str) -> Result<&'x T, DialectError> {
    match value {
        None => Err(missing(name)),
        Some(Obj::Map(inner)) => Ok(inner),
        Some(Obj::Not(found)) => Err(DialectError::new(
            DialectErrorKind::InvalidField,
            format!("{name} is not an object (found {found})"),
        )),
    }
}

fn string<'x>(value: &'x Loose<'_>, name: &str) -> Result<&'x str, DialectError> {
    match value {
        Loose::Str(s) => Ok(s),
        other => Err(DialectError::new(
            DialectErrorKind::InvalidField,
            format!("{name} is not a string (found {})", other.type_name()),
        )),
    }
}

fn optional_string(value: &Option<Loose<'_>>, name: &str) -> Result<Option<String>, DialectError> {
    value
        .as_ref()
        .map(|v| string(v, name).map(str::to_owned))
        .transpose()
}

/// A non-negative integer given as a JSON number or as a string of decimal digits.
fn number(value: &Loose<'_>, name: &str) -> Result<u64, DialectError> {
    let invalid = |found: &str| {
        DialectError::new(
            DialectErrorKind::InvalidField,
            format!("{name} is not a non-negative integer (found {found})"),
        )
    };
    match value {
        Loose::Uint(n) => Ok(*n),
        Loose::Str(s) => {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid(&format!("the string {:?}", clip(s))));
            }
            s.parse::<u64>()
                .map_err(|_| invalid("a string out of range"))
        }
        other => Err(invalid(other.type_name())),
    }
}

fn optional_number(value: &Option<Loose<'_>>, name: &str) -> Result<Option<u64>, DialectError> {
    value.as_ref().map(|v| number(v, name)).transpose()
}

/// A code given as a JSON number or a string (Telnyx `payload.code`).
fn optional_code(value: &Option<Loose<'_>>, name: &str) -> Result<Option<String>, DialectError> {
    match value {
        None => Ok(None),
        Some(Loose::Uint(n)) => Ok(Some(n.to_string())),
        Some(other) => string(other, name).map(|s| Some(s.to_owned())),
    }
}

fn track(value: &Loose<'_>, name: &str) -> Result<Track, DialectError> {
    match string(value, name)? {
        "inbound" | "inbound_track" => Ok(Track::Inbound),
        "outbound" | "outbound_track" => Ok(Track::Outbound),
        other => Err(DialectError::new(
            DialectErrorKind::InvalidField,
            format!(
                "{name} is not \"inbound\" or \"outbound\" (found {:?})",
                clip(other)
            ),
        )),
    }
}

fn payload(value: &Loose<'_>, name: &str) -> Result<Vec<u8>, DialectError> {
    let text = string(value, name)?;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|err| {
            DialectError::new(
                DialectErrorKind::InvalidBase64,
                format!("{name} is not base64 ({err})"),
            )
        })
}

fn custom_parameters(
    value: &Option<Obj<BTreeMap<String, Loose<'_>>>>,
    name: &str,
) -> Result<BTreeMap<String, String>, DialectError> {
    if value.is_none() {
        return Ok(BTreeMap::new());
    }
    let map = object(value, name)?;
    map.iter()
        .map(|(key, v)| {
            let s = string(v, &format!("{name}.{}", clip(key)))?;
            Ok((key.clone(), s.to_owned()))
        })
        .collect()
}

fn media(body: &MediaBody<'_>, seq: Option<u64>) -> Result<Inbound, DialectError> {
    Ok(Inbound::Media(Media {
        seq,
        track: track(required(&body.track, "media.track")?, "media.track")?,
        chunk: number(required(&body.chunk, "media.chunk")?, "media.chunk")?,
        timestamp_ms: number(
            required(&body.timestamp, "media.timestamp")?,
            "media.timestamp",
        )?,
        payload: payload(required(&body.payload, "media.payload")?, "media.payload")?,
    }))
}

fn mark(body: &Option<Obj<MarkBody<'_>>>, seq: Option<u64>) -> Result<Inbound, DialectError> {
    let body = object(body, "mark")?;
    let name = string(required(&body.name, "mark.name")?, "mark.name")?;
    Ok(Inbound::Mark {
        seq,
        name: name.to_owned(),
    })
}

fn dtmf(body: &Option<Obj<DtmfBody<'_>>>) -> Result<Inbound, DialectError> {
    let body = object(body, "dtmf")?;
    let digit = string(required(&body.digit, "dtmf.digit")?, "dtmf.digit")?;
    Ok(Inbound::Dtmf {
        digit: digit.to_owned(),
    })
}

fn event<'x>(value: &'x Option<Loose<'_>>) -> Result<&'x str, DialectError> {
    string(required(value, "event")?, "event")
}

/// At most 40 characters of carrier text quoted back in an error message.
fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

fn unsupported(message: String) -> DialectError {
    DialectError::new(DialectErrorKind::UnsupportedFormat, message)
}

/// The validated format, or UnsupportedFormat naming what the carrier asked for.
fn media_format(
    name: &str,
    encoding_text: &str,
    encoding: Option<crate::codec::Encoding>,
    sample_rate: u64,
    channels: u64,
) -> Result<MediaFormat, DialectError> {
    let refuse = || {
        unsupported(format!(
            "{name} {:?} at {sample_rate} Hz with {channels} channel(s) is not supported",
            clip(encoding_text)
        ))
    };
    let encoding = encoding.ok_or_else(refuse)?;
    let rate = u32::try_from(sample_rate).map_err(|_| refuse())?;
    let channels_u32 = u32::try_from(channels).map_err(|_| refuse())?;
    MediaFormat::new(encoding, rate, channels_u32).map_err(|_| refuse())
}
