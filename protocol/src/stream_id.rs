//! Stream ids as NATS subject tokens.
//!
//! A stream id is interpolated into a NATS subject (`inference.whisper.stream.<id>`), so
//! anything that could change the subject's shape is refused before it gets near a
//! publish: the token separator `.`, the wildcards `*` and `>`, whitespace, control
//! characters, and the empty string. The accepted alphabet is deliberately narrow —
//! ASCII letters, digits and `-` `_` `:` `=` `@` `+` — which covers UUIDs, telephony
//! call SIDs and `tenant:call` style ids. A leading `$` (NATS system subjects) can never
//! occur because `$` is not in the alphabet.
//!
//! Invariant: every [`StreamId`] value is a single safe subject token of at most
//! [`MAX_STREAM_ID_LEN`] bytes. The only way to build one is [`StreamId::parse`].

use std::fmt;

/// Longest accepted stream id, in bytes.
pub const MAX_STREAM_ID_LEN: usize = 128;

/// A validated stream id: one safe NATS subject token.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(String);

/// Why a stream id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(StreamIdErrorKind), derive(Hash))]
#[strum_discriminants(doc = "Machine-readable kind of a [`StreamIdError`]: its variant.")]
pub enum StreamIdError {
    /// The id is empty.
    #[error("stream id is empty")]
    Empty,
    /// The id is longer than [`MAX_STREAM_ID_LEN`] bytes.
    #[error("stream id is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Length of the refused id in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The id contains a character outside the safe alphabet.
    #[error(
        "stream id contains {ch:?} at byte {index}; allowed are ASCII letters, digits and - _ : = @ +"
    )]
    ForbiddenChar {
        /// The offending character.
        ch: char,
        /// Its byte offset.
        index: usize,
    },
}

impl StreamIdError {
    /// The kind, for callers that match on it.
    pub fn kind(&self) -> StreamIdErrorKind {
        self.into()
    }
}

/// Whether `b` is in the stream id alphabet.
fn is_allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'=' | b'@' | b'+')
}

impl StreamId {
    /// Validates `s` as a stream id.
    pub fn parse(s: &str) -> Result<Self, StreamIdError> {
        if s.is_empty() {
            return Err(StreamIdError::Empty);
        }
        if s.len() > MAX_STREAM_ID_LEN {
            return Err(StreamIdError::TooLong {
                len: s.len(),
                max: MAX_STREAM_ID_LEN,
            });
        }
        if let Some((index, ch)) = s
            .char_indices()
            .find(|&(_, c)| !c.is_ascii() || !is_allowed(c as u8))
        {
            return Err(StreamIdError::ForbiddenChar { ch, index });
        }
        Ok(Self(s.to_owned()))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as bytes (what the partition hash reads).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::str::FromStr for StreamId {
    type Err = StreamIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamId({:?})", self.0)
    }
}

impl AsRef<str> for StreamId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_common_id_shapes() {
        for ok in [
            "call-42",
            "CA1234567890abcdef",
            "3f2b8c1e-9d4a-4b7e-8f00-123456789abc",
            "tenant:call=7",
            "a_b+c@d",
            &"x".repeat(MAX_STREAM_ID_LEN),
        ] {
            assert_eq!(
                StreamId::parse(ok).map(|s| s.to_string()).as_deref(),
                Ok(ok)
            );
        }
    }

    #[test]
    fn refuses_subject_injection_and_garbage() {
        let cases: &[(&str, StreamIdErrorKind)] = &[
            ("", StreamIdErrorKind::Empty),
            ("a.b", StreamIdErrorKind::ForbiddenChar),
            ("*", StreamIdErrorKind::ForbiddenChar),
            (">", StreamIdErrorKind::ForbiddenChar),
            ("a b", StreamIdErrorKind::ForbiddenChar),
            ("a\tb", StreamIdErrorKind::ForbiddenChar),
            ("a\nb", StreamIdErrorKind::ForbiddenChar),
            ("a\u{0}b", StreamIdErrorKind::ForbiddenChar),
            ("$SYS", StreamIdErrorKind::ForbiddenChar),
            ("caf\u{e9}", StreamIdErrorKind::ForbiddenChar),
            ("a/b", StreamIdErrorKind::ForbiddenChar),
        ];
        for (input, kind) in cases {
            let err = StreamId::parse(input).expect_err(input);
            assert_eq!(err.kind(), *kind, "{input:?}: {err}");
        }
        let long = "x".repeat(MAX_STREAM_ID_LEN + 1);
        assert_eq!(
            StreamId::parse(&long).map_err(|e| e.kind()),
            Err(StreamIdErrorKind::TooLong)
        );
    }

    #[test]
    fn forbidden_char_error_names_position() {
        let err = StreamId::parse("ab.c").expect_err("dot");
        assert_eq!(err, StreamIdError::ForbiddenChar { ch: '.', index: 2 });
    }
}
