//! Token counts read from bodies, for the per-key token budgets
//! ([`super::gates::tokens`]): what a request may cost (read at admission from its body)
//! and what it did cost (the backend's `usage`, read from its reply when it ends).
//!
//! Invariants a reader must not break:
//! - every read is bounded and never fails a request: a body that is too large or not
//!   the expected JSON gives the fallback (the configured default `max_tokens`, the
//!   whole body as prompt); a reply whose `usage` cannot be read gives `None`;
//! - the request estimate reads at most [`MAX_COST_BODY`] bytes with a typed parse
//!   that allocates nothing for the members it skips; the `usage` of a reply is looked
//!   for in its last [`USAGE_SCAN`] bytes only, and its object may be at most
//!   [`MAX_USAGE_OBJECT`] bytes: an oversized or garbage `usage` is `None`, never a
//!   count;
//! - a streamed reply keeps only its last [`USAGE_SCAN`] bytes ([`StreamTail`]) to look
//!   for the last `data:` event that carries `usage`.

use std::fmt;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Largest request body whose `max_tokens` and prompt are parsed; a larger one costs
/// the default `max_tokens` plus its whole length as prompt.
pub(crate) const MAX_COST_BODY: usize = 256 * 1024;

/// Bytes at the end of a reply searched for `usage` (a unary body, or the tail of a
/// stream).
pub(crate) const USAGE_SCAN: usize = 8 * 1024;

/// Largest `usage` object read (`{"prompt_tokens":..,"completion_tokens":..,...}` with
/// the detail members some servers add fits easily).
pub(crate) const MAX_USAGE_OBJECT: usize = 1024;

/// Prompt bytes per token of the estimate (an English text averages about four).
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

/// What a request may cost, read from its body at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestCost {
    /// `max_tokens` (or `max_completion_tokens`) of the body, `None` when absent or not
    /// a whole number (the budget's default applies).
    pub(crate) max_tokens: Option<u64>,
    /// Estimated prompt tokens: the bytes of the text in `messages` and `prompt`
    /// divided by [`BYTES_PER_TOKEN`], rounded up (the whole body when unreadable).
    pub(crate) prompt: u64,
}

impl RequestCost {
    /// Reads `body`; never fails (see the module rules).
    pub(crate) fn of(body: &[u8]) -> Self {
        let fallback = Self {
            max_tokens: None,
            prompt: tokens_of_bytes(body.len() as u64),
        };
        // Only an object is a chat or completion body (serde would read a struct
        // from an array too).
        if body.len() > MAX_COST_BODY || body.trim_ascii_start().first() != Some(&b'{') {
            return fallback;
        }
        match serde_json::from_slice::<CostFields>(body) {
            Ok(f) => Self {
                max_tokens: f.max_tokens.0.or(f.max_completion_tokens.0),
                prompt: tokens_of_bytes(f.messages.0.saturating_add(f.prompt.0)),
            },
            Err(_) => fallback,
        }
    }
}

/// `bytes / BYTES_PER_TOKEN`, rounded up.
fn tokens_of_bytes(bytes: u64) -> u64 {
    bytes.div_ceil(BYTES_PER_TOKEN)
}

/// The members of a chat or completion body that cost tokens; the rest is skipped.
#[derive(Deserialize, Default)]
#[serde(default)]
struct CostFields {
    max_tokens: WholeNumber,
    max_completion_tokens: WholeNumber,
    messages: TextBytes,
    prompt: TextBytes,
}

/// The `Visitor` methods shared by the any-value readers below: `expecting`, and
/// `visit_*` methods that answer `$value` to every scalar of their kind (the scalars
/// [`WholeNumber`] and [`TextBytes`] do not count).
macro_rules! any_value_methods {
    ($value:expr, $($visit:ident($($arg:ty)?)),*) => {
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        $(fn $visit<E: de::Error>(self, $(_: $arg)?) -> Result<Self::Value, E> {
            Ok($value)
        })*
    };
}

/// A non-negative whole number, or `None` for anything else (a string, a float, a
/// negative number, an object): such a value is ignored, not an error.
#[derive(Default)]
struct WholeNumber(Option<u64>);

impl<'de> Deserialize<'de> for WholeNumber {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = WholeNumber;
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<WholeNumber, E> {
                Ok(WholeNumber(Some(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<WholeNumber, E> {
                Ok(WholeNumber(u64::try_from(v).ok()))
            }
            any_value_methods!(
                WholeNumber(None),
                visit_f64(f64),
                visit_bool(bool),
                visit_str(&str),
                visit_unit()
            );
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<WholeNumber, A::Error> {
                while s.next_element::<IgnoredAny>()?.is_some() {}
                Ok(WholeNumber(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<WholeNumber, A::Error> {
                while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(WholeNumber(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// The bytes of every string inside a value (at any depth; the parser's recursion
/// limit bounds it), keys excluded: the text of `messages` (`content`, `role`, the
/// parts of a multi-part content) or of `prompt` (a string or a list of them).
#[derive(Default)]
struct TextBytes(u64);

impl<'de> Deserialize<'de> for TextBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextBytes;
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TextBytes, E> {
                Ok(TextBytes(v.len() as u64))
            }
            any_value_methods!(
                TextBytes(0),
                visit_u64(u64),
                visit_i64(i64),
                visit_f64(f64),
                visit_bool(bool),
                visit_unit()
            );
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<TextBytes, A::Error> {
                let mut n = 0u64;
                while let Some(TextBytes(b)) = s.next_element()? {
                    n = n.saturating_add(b);
                }
                Ok(TextBytes(n))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<TextBytes, A::Error> {
                let mut n = 0u64;
                while let Some((IgnoredAny, TextBytes(b))) = m.next_entry()? {
                    n = n.saturating_add(b);
                }
                Ok(TextBytes(n))
            }
        }
        d.deserialize_any(V)
    }
}

/// The token counts a backend reported (`usage`), read leniently: each count is a
/// whole number or absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    /// The tokens to charge: `total_tokens`, else `prompt_tokens + completion_tokens`.
    pub(crate) total: u64,
}

/// The `usage` members; any other member is skipped.
#[derive(Deserialize)]
struct UsageFields {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    total_tokens: Option<u64>,
}

/// The last `usage` object in the last [`USAGE_SCAN`] bytes of `reply` (a unary JSON
/// body, or the tail of an SSE stream). `None`: none there, or not readable (not an
/// object, a count that is negative, fractional, text or beyond `u64`, no count at
/// all, or an object over [`MAX_USAGE_OBJECT`] bytes).
pub(crate) fn reported_usage(reply: &[u8]) -> Option<Usage> {
    const NEEDLE: &[u8] = b"\"usage\"";
    let from = reply.len().saturating_sub(USAGE_SCAN);
    let tail = &reply[from..];
    // Bounded: each step moves `end` left by at least one byte.
    let mut end = tail.len();
    while let Some(at) = tail[..end].windows(NEEDLE.len()).rposition(|w| w == NEEDLE) {
        end = at;
        // A `"usage"` inside a string is escaped (`\"usage\"`): skip it.
        if at > 0 && tail[at - 1] == b'\\' {
            continue;
        }
        let rest = tail[at + NEEDLE.len()..].trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b":") else {
            continue;
        };
        let rest = rest.trim_ascii_start();
        if rest.first() != Some(&b'{') {
            // `"usage": null` (streams send it on every chunk but the last): look on.
            continue;
        }
        let window = &rest[..rest.len().min(MAX_USAGE_OBJECT)];
        let mut it = serde_json::Deserializer::from_slice(window).into_iter::<UsageFields>();
        return match it.next() {
            Some(Ok(u)) => usage_of(&u),
            _ => None,
        };
    }
    None
}

fn usage_of(u: &UsageFields) -> Option<Usage> {
    let total = match (u.total_tokens, u.prompt_tokens, u.completion_tokens) {
        (Some(t), _, _) => t,
        (None, None, None) => return None,
        (None, p, c) => p.unwrap_or(0).saturating_add(c.unwrap_or(0)),
    };
    Some(Usage { total })
}

/// The last [`USAGE_SCAN`] bytes of a streamed reply, kept as its pieces pass (memory:
/// at most twice that).
#[derive(Debug, Default)]
pub(crate) struct StreamTail {
    buf: BytesMut,
}

impl StreamTail {
    /// Keeps the end of `piece`.
    pub(crate) fn push(&mut self, piece: &[u8]) {
        let piece = &piece[piece.len().saturating_sub(USAGE_SCAN)..];
        if self.buf.len() + piece.len() > 2 * USAGE_SCAN {
            let keep = USAGE_SCAN.saturating_sub(piece.len());
            let cut = self.buf.len().saturating_sub(keep);
            let _ = self.buf.split_to(cut);
        }
        self.buf.extend_from_slice(piece);
    }

    /// The kept tail.
    pub(crate) fn into_bytes(self) -> Bytes {
        let from = self.buf.len().saturating_sub(USAGE_SCAN);
        self.buf.freeze().slice(from..)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_reads_max_tokens_and_the_prompt_text() {
        let body = br#"{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hello world!"}]}"#;
        // "user" (4) + "hello world!" (12) = 16 bytes = 4 tokens.
        assert_eq!(
            RequestCost::of(body),
            RequestCost {
                max_tokens: Some(500),
                prompt: 4
            }
        );
        let parts = br#"{"max_completion_tokens":7,"messages":[{"role":"u","content":[{"type":"text","text":"abcdefg"}]}]}"#;
        // "u" + "text" + "abcdefg" = 12 bytes.
        assert_eq!(RequestCost::of(parts).max_tokens, Some(7));
        assert_eq!(RequestCost::of(parts).prompt, 3);
        let prompt = br#"{"prompt":["abcd","efgh1"],"max_tokens":-3}"#;
        assert_eq!(
            RequestCost::of(prompt),
            RequestCost {
                max_tokens: None,
                prompt: 3
            }
        );
    }

    #[test]
    fn an_unreadable_body_costs_the_default_and_its_length() {
        for body in [
            &b"not json at all"[..],
            br#"{"max_tokens":"many","messages":"#,
            br#"[1,2,3]"#,
        ] {
            let c = RequestCost::of(body);
            assert_eq!(c.max_tokens, None, "{body:?}");
            assert_eq!(c.prompt, (body.len() as u64).div_ceil(4), "{body:?}");
        }
        let big = vec![b' '; MAX_COST_BODY + 1];
        assert_eq!(RequestCost::of(&big).prompt, (big.len() as u64).div_ceil(4));
        // Wrong types are ignored, not errors.
        let odd = br#"{"max_tokens":2.5,"messages":{"a":["xy",{"b":"zw"}]},"prompt":7}"#;
        assert_eq!(
            RequestCost::of(odd),
            RequestCost {
                max_tokens: None,
                prompt: 1
            }
        );
    }

    #[test]
    fn usage_is_read_from_a_unary_reply_and_the_last_sse_event() {
        let unary = br#"{"id":"x","choices":[{"message":{"content":"say \"usage\": {}"}}],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(reported_usage(unary), Some(Usage { total: 42 }));
        let no_total = br#"{"usage":{"prompt_tokens":12,"completion_tokens":30}}"#;
        assert_eq!(reported_usage(no_total), Some(Usage { total: 42 }));
        let sse = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n\
                    data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9,\"total_tokens\":12}}\n\n\
                    data: [DONE]\n\n";
        assert_eq!(reported_usage(sse), Some(Usage { total: 12 }));
        assert_eq!(reported_usage(b"data: [DONE]\n\n"), None);
        assert_eq!(reported_usage(b""), None);
    }

    #[test]
    fn garbage_negative_huge_or_oversized_usage_is_none() {
        for reply in [
            &br#"{"usage":{"total_tokens":-5}}"#[..],
            br#"{"usage":{"total_tokens":1.5}}"#,
            br#"{"usage":{"total_tokens":"12"}}"#,
            br#"{"usage":{"total_tokens":99999999999999999999999}}"#,
            br#"{"usage":{}}"#,
            br#"{"usage":"lots"}"#,
            br#"{"usage":{"prompt_tokens":1,"completion_tokens":"#,
        ] {
            assert_eq!(
                reported_usage(reply),
                None,
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
        let pad = "x".repeat(MAX_USAGE_OBJECT);
        let oversized = format!(r#"{{"usage":{{"pad":"{pad}","total_tokens":5}}}}"#);
        assert_eq!(reported_usage(oversized.as_bytes()), None);
        // A usage further than the scan from the end is not looked for.
        let far = format!(
            r#"{{"usage":{{"total_tokens":5}},"pad":"{}"}}"#,
            "y".repeat(USAGE_SCAN)
        );
        assert_eq!(reported_usage(far.as_bytes()), None);
    }

    #[test]
    fn the_stream_tail_keeps_the_last_bytes_only() {
        let mut t = StreamTail::default();
        for i in 0..1000u32 {
            t.push(format!("data: {{\"n\":{i}}}\n\n").as_bytes());
            assert!(t.buf.len() <= 2 * USAGE_SCAN);
        }
        t.push(br#"data: {"usage":{"total_tokens":77}}"#);
        t.push(b"\n\ndata: [DONE]\n\n");
        let tail = t.into_bytes();
        assert!(tail.len() <= USAGE_SCAN);
        assert_eq!(reported_usage(&tail), Some(Usage { total: 77 }));
        let mut t = StreamTail::default();
        t.push(&vec![b'z'; 3 * USAGE_SCAN]);
        assert_eq!(t.into_bytes().len(), USAGE_SCAN);
    }
}
