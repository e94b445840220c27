//! Stream affinity: the shard key and the subjects built from it.
//!
//! `partition = FNV-1a-32(stream id bytes) mod N`. This is exactly what nats-server's
//! subject mapping computes for `{{partition(N,k)}}` when the k-th token is the stream
//! id (the selected tokens are hashed concatenated without separator; with one token,
//! that is the token itself). A producer can therefore compute the partition itself and
//! publish to a partitioned subject, or publish to the plain subject and let the server
//! map it — both land every frame of one stream on the same partition.
//!
//! Changing N moves most streams to other partitions: N is a deployment constant.
//!
//! Subjects are built from a [`SubjectTemplate`] such as
//! `inference.whisper.stream.{stream}` (the deployed default) or
//! `audio.{partition}.{stream}`. A template is validated once; rendering it with a
//! validated [`StreamId`] always yields a valid, wildcard-free subject.

use std::fmt;
use std::num::NonZeroU32;

use crate::stream_id::StreamId;

/// FNV-1a 32-bit offset basis.
const FNV_OFFSET: u32 = 0x811c_9dc5;
/// FNV-1a 32-bit prime.
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a 32-bit hash of `bytes` (Go's `hash/fnv.New32a`).
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV_OFFSET, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// The partition of `stream` among `partitions`, as nats-server's `partition()` maps it.
pub fn partition_of(stream: &StreamId, partitions: NonZeroU32) -> u32 {
    fnv1a_32(stream.as_bytes()) % partitions.get()
}

/// The placeholder for the stream id in a subject template.
pub const STREAM_PLACEHOLDER: &str = "{stream}";

/// The largest partition count, for producers and consumers alike: a consumer holds one
/// subscription per owned partition, so a producer must not spread streams over more
/// partitions than a consumer can own.
pub const MAX_PARTITIONS: u32 = 4_096;
/// The placeholder for the partition number in a subject template.
pub const PARTITION_PLACEHOLDER: &str = "{partition}";

/// The deployed frame subject.
pub const DEFAULT_STREAM_TEMPLATE: &str = "inference.whisper.stream.{stream}";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(String),
    Stream,
    Partition,
}

/// A validated subject template with a `{stream}` token and optionally a `{partition}`
/// token; every other token is a literal without wildcards.
#[derive(Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    source: String,
    tokens: Vec<Token>,
}

/// Why a subject template was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid subject template {template:?}: {reason}")]
pub struct TemplateError {
    template: String,
    reason: String,
}

impl SubjectTemplate {
    /// Parses and validates a template.
    pub fn parse(template: &str) -> Result<Self, TemplateError> {
        let fail = |reason: String| TemplateError {
            template: template.to_owned(),
            reason,
        };
        if template.is_empty() {
            return Err(fail("empty".into()));
        }
        let mut tokens = Vec::new();
        for (i, tok) in template.split('.').enumerate() {
            let token = match tok {
                STREAM_PLACEHOLDER => Token::Stream,
                PARTITION_PLACEHOLDER => Token::Partition,
                "" => return Err(fail(format!("token {} is empty", i + 1))),
                lit => {
                    if let Some(c) = lit.chars().find(|c| {
                        matches!(c, '*' | '>' | '{' | '}') || c.is_whitespace() || c.is_control()
                    }) {
                        return Err(fail(format!("token {lit:?} contains {c:?}")));
                    }
                    Token::Literal(lit.to_owned())
                }
            };
            tokens.push(token);
        }
        let count = |t: &Token| tokens.iter().filter(|x| *x == t).count();
        if count(&Token::Stream) != 1 {
            return Err(fail(
                "must contain {stream} exactly once as a whole token".into(),
            ));
        }
        if count(&Token::Partition) > 1 {
            return Err(fail("may contain {partition} at most once".into()));
        }
        Ok(Self {
            source: template.to_owned(),
            tokens,
        })
    }

    /// The deployed frame subject template, [`DEFAULT_STREAM_TEMPLATE`]. Infallible:
    /// built token by token (a unit test checks it equals `parse` of the constant).
    pub fn deployed() -> Self {
        Self {
            source: DEFAULT_STREAM_TEMPLATE.to_owned(),
            tokens: vec![
                Token::Literal("inference".to_owned()),
                Token::Literal("whisper".to_owned()),
                Token::Literal("stream".to_owned()),
                Token::Stream,
            ],
        }
    }

    /// Whether the template has a `{partition}` token.
    pub fn is_partitioned(&self) -> bool {
        self.tokens.contains(&Token::Partition)
    }

    /// The subject for `stream`; `partition` fills `{partition}` if the template has one.
    pub fn render(&self, stream: &StreamId, partition: u32) -> String {
        self.build(stream.as_str(), &partition.to_string())
    }

    /// The subscription pattern for every stream of one partition (`{stream}` → `*`).
    /// For a template without `{partition}` this is the same as [`Self::wildcard`].
    pub fn pattern_for_partition(&self, partition: u32) -> String {
        self.build("*", &partition.to_string())
    }

    /// The subscription pattern for every stream of every partition.
    pub fn wildcard(&self) -> String {
        self.build("*", "*")
    }

    /// Extracts the stream id token (and the partition, if the template has one) from a
    /// subject this template produced. `None` when the subject does not fit the template.
    pub fn parse_subject<'s>(&self, subject: &'s str) -> Option<(&'s str, Option<u32>)> {
        let parts: Vec<&str> = subject.split('.').collect();
        if parts.len() != self.tokens.len() {
            return None;
        }
        let mut stream = None;
        let mut partition = None;
        for (part, token) in parts.iter().zip(&self.tokens) {
            match token {
                Token::Literal(l) if l != part => return None,
                Token::Literal(_) => {}
                Token::Stream => stream = Some(*part),
                Token::Partition => partition = Some(part.parse().ok()?),
            }
        }
        stream.map(|s| (s, partition))
    }

    fn build(&self, stream: &str, partition: &str) -> String {
        let mut out = String::with_capacity(self.source.len() + stream.len());
        for (i, token) in self.tokens.iter().enumerate() {
            if i > 0 {
                out.push('.');
            }
            out.push_str(match token {
                Token::Literal(l) => l,
                Token::Stream => stream,
                Token::Partition => partition,
            });
        }
        out
    }

    /// The template text as configured.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl fmt::Debug for SubjectTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SubjectTemplate({:?})", self.source)
    }
}

impl fmt::Display for SubjectTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for SubjectTemplate {
    type Err = TemplateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> StreamId {
        StreamId::parse(s).expect("valid id")
    }

    #[test]
    fn fnv1a_known_vectors() {
        // Reference values of FNV-1a 32 (Go hash/fnv, the FNV test suite).
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn partition_is_stable_and_in_range() {
        let n = NonZeroU32::new(8).expect("non-zero");
        for i in 0..1000 {
            let s = id(&format!("call-{i}"));
            let p = partition_of(&s, n);
            assert!(p < 8);
            assert_eq!(p, partition_of(&s, n));
        }
    }

    #[test]
    fn default_template_renders_deployed_subject() {
        let t = SubjectTemplate::parse(DEFAULT_STREAM_TEMPLATE).expect("valid");
        assert_eq!(t, SubjectTemplate::deployed());
        assert!(!t.is_partitioned());
        assert_eq!(t.render(&id("abc"), 3), "inference.whisper.stream.abc");
        assert_eq!(t.wildcard(), "inference.whisper.stream.*");
        assert_eq!(
            t.parse_subject("inference.whisper.stream.abc"),
            Some(("abc", None))
        );
        assert_eq!(t.parse_subject("inference.whisper.text.abc"), None);
    }

    #[test]
    fn partitioned_template_round_trips() {
        let t = SubjectTemplate::parse("audio.{partition}.{stream}").expect("valid");
        assert!(t.is_partitioned());
        assert_eq!(t.render(&id("abc"), 5), "audio.5.abc");
        assert_eq!(t.pattern_for_partition(5), "audio.5.*");
        assert_eq!(t.wildcard(), "audio.*.*");
        assert_eq!(t.parse_subject("audio.5.abc"), Some(("abc", Some(5))));
        assert_eq!(t.parse_subject("audio.x.abc"), None);
    }

    #[test]
    fn bad_templates_are_refused() {
        for bad in [
            "",
            "audio",
            "audio.*.{stream}",
            "audio.>",
            "audio..{stream}",
            "audio.{stream}.{stream}",
            "audio.{partition}.{partition}.{stream}",
            "audio.x{stream}",
            "a b.{stream}",
        ] {
            assert!(SubjectTemplate::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
