//! The hot path's reader: a `media` message in the plain shape both carriers send — one
//! JSON object whose members are strings and non-negative integers, plus a `media`
//! object of the same — read in one forward scan instead of through serde (the message
//! comes 50 times a second per call; serde's reader was the door's largest cost after
//! the resampler).
//!
//! Invariant: the answer is always the full reader's. Whatever is not exactly that shape
//! — an escape or a control character in a string, any other JSON value (`null`, a
//! fraction, a nested array or object anywhere but `media`), a repeated member, trailing
//! text, another event — returns `None` and the dialect's serde reader decides. The
//! values found go through the same member checks (`members::media`,
//! `optional_number`), in the same order, so the refusals are the same too (a test
//! compares both readers over thousands of mutated messages).

use std::borrow::Cow;

use super::members::{Loose, MediaBody, media, optional_number};
use super::{DialectError, Inbound};

/// Most members an object may have on this path (a carrier's `media` message has 4 at
/// the top and 4 in `media`); more → the full reader.
const MAX_MEMBERS: usize = 12;

/// Reads `text` as a `media` message whose sequence number is the member `seq_key`;
/// `None` when the text is not in the plain shape (the caller then runs its full reader).
pub(super) fn media_message(text: &str, seq_key: &str) -> Option<Result<Inbound, DialectError>> {
    let mut scan = Scan {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    let (mut event, mut seq, mut body) = (None, None, None);
    scan.object(|key, scan| {
        match key {
            "event" => event = Some(scan.value()?),
            "media" => body = Some(scan.media_body()?),
            k if k == seq_key => seq = Some(scan.value()?),
            _ => {
                scan.value()?;
            }
        }
        Some(())
    })?;
    scan.skip_ws();
    if scan.at != scan.bytes.len() {
        return None;
    }
    match event {
        Some(Loose::Str(ref e)) if e == "media" => {}
        _ => return None,
    }
    // The full reader's order: the `media` object, then the sequence number, then the
    // media members.
    let body = body?;
    Some(optional_number(&seq, seq_key).and_then(|seq| media(&body, seq)))
}

/// A forward scan over the message's bytes.
struct Scan<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.bytes.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// An object of members, each handed to `member` after its key and colon; a repeated
    /// key, or more than [`MAX_MEMBERS`], is `None`.
    fn object(&mut self, mut member: impl FnMut(&'a str, &mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        let mut seen: [&str; MAX_MEMBERS] = [""; MAX_MEMBERS];
        for slot in 0..MAX_MEMBERS {
            let key = self.string()?;
            if seen[..slot].contains(&key) {
                return None;
            }
            seen[slot] = key;
            self.eat(b':')?;
            member(key, self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
        None
    }

    /// A string without escapes or control characters, borrowed from the text.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let rest = self.bytes.get(start..)?;
        let len = memchr::memchr2(b'"', b'\\', rest)?;
        // No early exit: the compiler vectorises the whole check.
        let controls = rest[..len].iter().fold(false, |any, &b| any | (b < 0x20));
        if rest[len] == b'"' && !controls {
            self.at = start + len + 1;
            return self.text.get(start..start + len);
        }
        None
    }

    /// A non-negative integer in JSON's form (no leading zero, no fraction or exponent)
    /// that fits in a `u64`.
    fn integer(&mut self) -> Option<u64> {
        let start = self.at;
        let mut n: u64 = 0;
        while let Some(&d @ b'0'..=b'9') = self.bytes.get(self.at) {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.at += 1;
        }
        let digits = self.at - start;
        let leading_zero = digits > 1 && self.bytes[start] == b'0';
        let more = matches!(self.bytes.get(self.at), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !more).then_some(n)
    }

    /// A string or a non-negative integer; anything else is `None`.
    fn value(&mut self) -> Option<Loose<'a>> {
        match self.peek()? {
            b'"' => self.string().map(|s| Loose::Str(Cow::Borrowed(s))),
            b'0'..=b'9' => self.integer().map(Loose::Uint),
            _ => None,
        }
    }

    /// The `media` object.
    fn media_body(&mut self) -> Option<MediaBody<'a>> {
        let mut body = MediaBody::default();
        self.object(|key, scan| {
            let value = scan.value()?;
            match key {
                "track" => body.track = Some(value),
                "chunk" => body.chunk = Some(value),
                "timestamp" => body.timestamp = Some(value),
                "payload" => body.payload = Some(value),
                _ => {}
            }
            Some(())
        })?;
        Some(body)
    }
}
