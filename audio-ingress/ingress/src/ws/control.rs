//! The WebSocket door's text messages. The only valid one is the JSON object
//! `{"type":"end"}`; other members are ignored.
//!
//! Invariants: a message is refused unless it is one JSON value in which **no object
//! repeats a key**, at any depth, keys compared after unescaping (`"t\u0079pe"` is
//! `"type"`). JSON leaves duplicates undefined (RFC 8259 §4): one parser keeps the
//! first, another the last, so `{"type":"x","type":"end"}` would mean an `end` to one
//! reader and a bad message to the next; such a message means nothing here. The walk
//! keeps no value but the `type` string; its depth is bounded by serde_json's recursion
//! limit (128) and its size by the WebSocket message limit.

use std::collections::HashSet;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// Why a text message is not a control message (its text is the close reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ControlError {
    /// Not one JSON value, or one with a duplicate key (the parser's explanation).
    #[error("not a JSON control message: {0}")]
    NotJson(String),
    /// A `type` other than `end`.
    #[error("unknown message type {0:?}; the only text message is {{\"type\":\"end\"}}")]
    UnknownType(String),
    /// An object without a string `type`.
    #[error("a control message needs a string \"type\"; the only one is {{\"type\":\"end\"}}")]
    NeedsType,
    /// Not an object.
    #[error("a control message is a JSON object, {{\"type\":\"end\"}}")]
    NotAnObject,
}

/// Checks a text message: `Ok` for `{"type":"end"}`; `Err` says what is wrong.
pub(super) fn parse(text: &str) -> Result<(), ControlError> {
    let value: Checked =
        serde_json::from_str(text).map_err(|e| ControlError::NotJson(e.to_string()))?;
    match value {
        Checked::Object(Some(ty)) => match *ty {
            Checked::Str(s) if s == "end" => Ok(()),
            Checked::Str(other) => Err(ControlError::UnknownType(other)),
            _ => Err(ControlError::NeedsType),
        },
        Checked::Object(None) => Err(ControlError::NeedsType),
        Checked::Str(_) | Checked::Other => Err(ControlError::NotAnObject),
    }
}

/// A JSON value checked for duplicate keys, reduced to what the door reads.
enum Checked {
    /// A string.
    Str(String),
    /// An object, with its `type` member if it has one.
    Object(Option<Box<Checked>>),
    /// Anything else (number, boolean, null, array).
    Other,
}

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

/// The visits of the values the door does not read: each is [`Checked::Other`].
macro_rules! other {
    ($($visit:ident($($arg:ty)?)),*) => {$(
        fn $visit<E: de::Error>(self $(, _: $arg)?) -> Result<Checked, E> {
            Ok(Checked::Other)
        }
    )*};
}

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    other!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_f64(f64),
        visit_unit(),
        visit_none()
    );

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Checked, E> {
        Ok(Checked::Str(s.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        let mut seen = HashSet::new();
        let mut ty = None;
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value::<Checked>()?;
            if key == "type" {
                ty = Some(Box::new(value));
            }
            if !seen.insert(key) {
                return Err(de::Error::custom("duplicate key in a JSON object"));
            }
        }
        Ok(Checked::Object(ty))
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_the_end_object_is_an_end() {
        assert_eq!(parse(r#"{"type":"end"}"#), Ok(()));
        assert_eq!(
            parse(r#" { "type" : "end", "note": [1, {"a": null}] } "#),
            Ok(())
        );
        for bad in [
            r#"["end"]"#,
            r#""end""#,
            "1",
            "null",
            "{}",
            r#"{"type":1}"#,
            r#"{"type":"x"}"#,
            r#"{"type":"end"} x"#,
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_duplicate_key_at_any_depth_is_refused() {
        for bad in [
            r#"{"type":"x","type":"end"}"#,
            r#"{"type":"end","type":"x"}"#,
            r#"{"type":"end","type":"end"}"#,
            r#"{"type":"end","t\u0079pe":"end"}"#,
            r#"{"type":"end","a":1,"a":1}"#,
            r#"{"type":"end","m":{"k":1,"k":2}}"#,
            r#"{"type":"end","l":[{"k":1},{"k":2,"k":3}]}"#,
        ] {
            let e = parse(bad).expect_err(bad).to_string();
            assert!(e.contains("duplicate key"), "{bad}: {e}");
        }
        // The same key in sibling objects is not a duplicate.
        assert_eq!(parse(r#"{"type":"end","l":[{"k":1},{"k":2}]}"#), Ok(()));
    }
}
