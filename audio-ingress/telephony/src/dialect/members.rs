//! Reading a carrier message's members leniently, so that a wrong type becomes a
//! [`DialectError`] naming the member rather than a serde message: every leaf member
//! is a [`Loose`] value (any JSON value; strings borrowed from the text when they hold
//! no escape), every nested object an [`Obj`] (the object, or the name of the JSON
//! type found instead). serde then only fails on text that is not JSON (or a member
//! given twice); the checks below name each member by its path in the message.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use base64::Engine as _;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{DialectError, DialectErrorKind, Inbound, Media, Track};
use crate::codec::{Encoding, MediaFormat};

/// Any JSON value, read without failing on its type: strings (borrowed from the text
/// when they hold no escape), non-negative integers, arrays; any other value is only
/// named ([`Self::type_name`]).
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
#[allow(dead_code)] // the named-only variants' values are never read
pub(super) enum Loose<'a> {
    Str(#[serde(borrow)] Cow<'a, str>),
    Uint(u64),
    List(#[serde(borrow)] Vec<Loose<'a>>),
    Negative(i64),
    Fraction(f64),
    Boolean(bool),
    Null(()),
    Object(IgnoredAny),
}

impl Loose<'_> {
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Loose::Str(_) => "a string",
            Loose::Uint(_) => "a number",
            Loose::List(_) => "an array",
            Loose::Negative(_) => "a negative number",
            Loose::Fraction(_) => "a fractional number",
            Loose::Boolean(_) => "a boolean",
            Loose::Null(()) => "null",
            Loose::Object(_) => "an object",
        }
    }
}

/// A member that should be a JSON object: the object read as `T`, or the name of the
/// JSON type found instead.
#[derive(Debug)]
pub(super) enum Obj<T> {
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
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Obj::Not("an array"))
    }
}

/// A carrier message: the members of both carriers' messages (Twilio's `camelCase`,
/// Telnyx's `snake_case`); each dialect reads its own, the others are as unknown to it
/// as any member a carrier adds.
#[derive(serde::Deserialize)]
pub(super) struct Message<'a> {
    #[serde(borrow, default)]
    pub(super) event: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "sequenceNumber")]
    pub(super) sequence_number_camel: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) sequence_number: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "streamSid")]
    pub(super) stream_sid: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) stream_id: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) protocol: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) version: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) start: Option<Obj<Box<StartBody<'a>>>>, // boxed: rare and large, keeps the media path's struct small
    #[serde(borrow, default)]
    pub(super) media: Option<Obj<MediaBody<'a>>>,
    #[serde(borrow, default)]
    pub(super) mark: Option<Obj<MarkBody<'a>>>,
    #[serde(borrow, default)]
    pub(super) dtmf: Option<Obj<DtmfBody<'a>>>,
    /// Telnyx `error`'s body.
    #[serde(borrow, default)]
    pub(super) payload: Option<Obj<Box<ErrorBody<'a>>>>,
}

/// A `start` body: Twilio's members, then Telnyx's.
#[derive(serde::Deserialize)]
pub(super) struct StartBody<'a> {
    #[serde(borrow, default, rename = "streamSid")]
    pub(super) stream_sid: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "accountSid")]
    pub(super) account_sid: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "callSid")]
    pub(super) call_sid: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) tracks: Option<Loose<'a>>,
    #[serde(borrow, default, rename = "customParameters")]
    pub(super) custom_parameters_camel: Option<Obj<BTreeMap<String, Loose<'a>>>>,
    #[serde(borrow, default, rename = "mediaFormat")]
    pub(super) media_format_camel: Option<Obj<FormatBody<'a>>>,
    #[serde(borrow, default)]
    pub(super) user_id: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) call_control_id: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) custom_parameters: Option<Obj<BTreeMap<String, Loose<'a>>>>,
    #[serde(borrow, default)]
    pub(super) media_format: Option<Obj<FormatBody<'a>>>,
}

/// Telnyx `error.payload`.
#[derive(serde::Deserialize)]
pub(super) struct ErrorBody<'a> {
    #[serde(borrow, default)]
    pub(super) code: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) title: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) detail: Option<Loose<'a>>,
}

/// `media.{track,chunk,timestamp,payload}`: the same members in both dialects.
#[derive(serde::Deserialize, Default)]
pub(super) struct MediaBody<'a> {
    #[serde(borrow, default)]
    pub(super) track: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) chunk: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) timestamp: Option<Loose<'a>>,
    #[serde(borrow, default)]
    pub(super) payload: Option<Loose<'a>>,
}

/// `mark.name`.
#[derive(serde::Deserialize)]
pub(super) struct MarkBody<'a> {
    #[serde(borrow, default)]
    name: Option<Loose<'a>>,
}

/// `dtmf.digit` (`dtmf.track`, when present, is ignored).
#[derive(serde::Deserialize)]
pub(super) struct DtmfBody<'a> {
    #[serde(borrow, default)]
    digit: Option<Loose<'a>>,
}

// Member checks: each error names the member (its path in the carrier's message).

pub(super) fn missing(name: &str) -> DialectError {
    DialectError::new(DialectErrorKind::MissingField, format!("{name} is missing"))
}

/// The required member `name`, read by `read` (`string`, `number`, ...).
pub(super) fn required<'x, 'a, R>(
    value: &'x Option<Loose<'a>>,
    name: &str,
    read: impl FnOnce(&'x Loose<'a>, &str) -> Result<R, DialectError>,
) -> Result<R, DialectError> {
    read(value.as_ref().ok_or_else(|| missing(name))?, name)
}

pub(super) fn object<'x, T>(value: &'x Option<Obj<T>>, name: &str) -> Result<&'x T, DialectError> {
    match value {
        None => Err(missing(name)),
        Some(Obj::Map(inner)) => Ok(inner),
        Some(Obj::Not(found)) => Err(DialectError::new(
            DialectErrorKind::InvalidField,
            format!("{name} is not an object (found {found})"),
        )),
    }
}

pub(super) fn string<'x>(value: &'x Loose<'_>, name: &str) -> Result<&'x str, DialectError> {
    match value {
        Loose::Str(s) => Ok(s),
        other => Err(DialectError::new(
            DialectErrorKind::InvalidField,
            format!("{name} is not a string (found {})", other.type_name()),
        )),
    }
}

pub(super) fn optional_string(
    value: &Option<Loose<'_>>,
    name: &str,
) -> Result<Option<String>, DialectError> {
    value
        .as_ref()
        .map(|v| string(v, name).map(str::to_owned))
        .transpose()
}

/// A non-negative integer given as a JSON number or as a string of decimal digits.
pub(super) fn number(value: &Loose<'_>, name: &str) -> Result<u64, DialectError> {
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

pub(super) fn optional_number(
    value: &Option<Loose<'_>>,
    name: &str,
) -> Result<Option<u64>, DialectError> {
    value.as_ref().map(|v| number(v, name)).transpose()
}

/// A code given as a JSON number or a string (Telnyx `payload.code`).
pub(super) fn optional_code(
    value: &Option<Loose<'_>>,
    name: &str,
) -> Result<Option<String>, DialectError> {
    match value {
        None => Ok(None),
        Some(Loose::Uint(n)) => Ok(Some(n.to_string())),
        Some(other) => string(other, name).map(|s| Some(s.to_owned())),
    }
}

pub(super) fn track(value: &Loose<'_>, name: &str) -> Result<Track, DialectError> {
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

pub(super) fn payload(value: &Loose<'_>, name: &str) -> Result<Vec<u8>, DialectError> {
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

pub(super) fn custom_parameters(
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

pub(super) fn media(body: &MediaBody<'_>, seq: Option<u64>) -> Result<Inbound, DialectError> {
    Ok(Inbound::Media(Media {
        seq,
        track: required(&body.track, "media.track", track)?,
        chunk: required(&body.chunk, "media.chunk", number)?,
        timestamp_ms: required(&body.timestamp, "media.timestamp", number)?,
        payload: required(&body.payload, "media.payload", payload)?,
    }))
}

pub(super) fn mark(
    body: &Option<Obj<MarkBody<'_>>>,
    seq: Option<u64>,
) -> Result<Inbound, DialectError> {
    let body = object(body, "mark")?;
    let name = required(&body.name, "mark.name", string)?;
    Ok(Inbound::Mark {
        seq,
        name: name.to_owned(),
    })
}

pub(super) fn dtmf(body: &Option<Obj<DtmfBody<'_>>>) -> Result<Inbound, DialectError> {
    let body = object(body, "dtmf")?;
    let digit = required(&body.digit, "dtmf.digit", string)?;
    Ok(Inbound::Dtmf {
        digit: digit.to_owned(),
    })
}

pub(super) fn event<'x>(value: &'x Option<Loose<'_>>) -> Result<&'x str, DialectError> {
    required(value, "event", string)
}

/// At most 40 characters of carrier text quoted back in an error message.
pub(super) fn clip(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

/// A `start`'s media format object, both carriers' (`sampleRate` is Twilio's name of
/// `sample_rate`).
#[derive(serde::Deserialize)]
pub(super) struct FormatBody<'a> {
    #[serde(borrow, default)]
    encoding: Option<Loose<'a>>,
    #[serde(borrow, default, alias = "sampleRate")]
    sample_rate: Option<Loose<'a>>,
    #[serde(borrow, default)]
    channels: Option<Loose<'a>>,
}

/// The media format object at `path` (`rate` names its rate member in the carrier's
/// spelling; `encoding_of` maps the carrier's encoding names), validated; a missing
/// `channels` is 1.
pub(super) fn read_format(
    value: &Option<Obj<FormatBody<'_>>>,
    path: &str,
    rate: &str,
    encoding_of: fn(&str) -> Option<Encoding>,
) -> Result<MediaFormat, DialectError> {
    let format = object(value, path)?;
    let name = |member: &str| format!("{path}.{member}");
    let encoding_text = required(&format.encoding, &name("encoding"), string)?;
    let sample_rate = required(&format.sample_rate, &name(rate), number)?;
    let channels = match &format.channels {
        Some(c) => number(c, &name("channels"))?,
        None => 1,
    };
    // UnsupportedFormat names what the carrier asked for.
    let refuse = || {
        DialectError::new(
            DialectErrorKind::UnsupportedFormat,
            format!(
                "{path} {:?} at {sample_rate} Hz with {channels} channel(s) is not supported",
                clip(encoding_text)
            ),
        )
    };
    let encoding = encoding_of(encoding_text).ok_or_else(refuse)?;
    let rate = u32::try_from(sample_rate).map_err(|_| refuse())?;
    let channels_u32 = u32::try_from(channels).map_err(|_| refuse())?;
    MediaFormat::new(encoding, rate, channels_u32).map_err(|_| refuse())
}
