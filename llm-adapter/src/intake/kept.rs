//! Answers kept in the reply bucket, and the fingerprint of the request each answers:
//! what makes two requests with the same request id "the same request", as the core
//! path's idempotency compares them (session and body).
//!
//! A kept value is `name: value` header lines, an empty line, the body; its first line
//! is the request's fingerprint ([`FINGERPRINT_HEADER`]), which is taken out when the
//! value is read and never published.
//!
//! Invariants a reader must not break:
//! - the fingerprint is a function of the request's session (as the edge decodes it:
//!   the `Weir-Session-Id` header, else the envelope's `session_id`) and its body
//!   bytes only, so the replica that forwards a request and the one that pulls it from
//!   the stream compute the same value;
//! - it is SHA-256 over an unambiguous encoding (a presence byte, the session's length
//!   and bytes, then the body): a caller cannot craft another body with the same
//!   fingerprint, so a kept answer goes only to a request with the body it answered;
//! - a kept answer is handed out only when its fingerprint equals the asking
//!   request's ([`KeptReply::answers`]); one kept without a fingerprint (by an earlier
//!   version) never matches.

use std::fmt::Write as _;

use async_nats::HeaderMap;
use bytes::Bytes;
use ring::digest::{Context, SHA256};

/// The line of a kept answer that carries its request's fingerprint; never published
/// to a caller.
pub(crate) const FINGERPRINT_HEADER: &str = "Weir-Intake-Fingerprint";

/// The fingerprint of a request: `v1:` and 64 hex digits.
pub(crate) fn fingerprint(session: Option<&str>, body: &[u8]) -> String {
    let mut ctx = Context::new(&SHA256);
    match session {
        Some(s) => {
            ctx.update(&[1]);
            ctx.update(&(s.len() as u64).to_be_bytes());
            ctx.update(s.as_bytes());
        }
        None => ctx.update(&[0]),
    }
    ctx.update(body);
    let digest = ctx.finish();
    let mut out = String::with_capacity(3 + 64);
    out.push_str("v1:");
    for b in digest.as_ref() {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A kept answer, as read from the reply bucket.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeptReply {
    /// The answer's headers (without the fingerprint line).
    pub(crate) headers: HeaderMap,
    /// The answer's body.
    pub(crate) body: Bytes,
    /// The fingerprint of the request it answered (`None`: kept by an earlier version).
    pub(crate) fingerprint: Option<String>,
}

impl KeptReply {
    /// Whether this is the answer of the request with `fingerprint`.
    pub(crate) fn answers(&self, fingerprint: &str) -> bool {
        self.fingerprint.as_deref() == Some(fingerprint)
    }
}

/// Encodes an answer to keep. Header names and values never contain a newline (the
/// NATS header parser refuses them), nor does a fingerprint.
pub(crate) fn encode_reply(headers: &HeaderMap, body: &[u8], fingerprint: &str) -> Bytes {
    let mut out = Vec::with_capacity(body.len() + 256);
    let lines = std::iter::once((FINGERPRINT_HEADER, fingerprint)).chain(headers.iter().flat_map(
        |(name, values)| {
            values
                .iter()
                .map(move |v| (AsRef::<str>::as_ref(name), v.as_str()))
        },
    ));
    for (name, value) in lines {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out.extend_from_slice(body);
    out.into()
}

/// The inverse of [`encode_reply`]; `None` for bytes it did not write.
pub(crate) fn decode_reply(bytes: &Bytes) -> Option<KeptReply> {
    let mut headers = HeaderMap::new();
    let mut fingerprint = None;
    let mut at = 0;
    loop {
        let end = at + bytes.get(at..)?.iter().position(|b| *b == b'\n')?;
        if end == at {
            let body = bytes.slice(end + 1..);
            return Some(KeptReply {
                headers,
                body,
                fingerprint,
            });
        }
        let line = std::str::from_utf8(&bytes[at..end]).ok()?;
        let (name, value) = line.split_once(": ")?;
        if name.eq_ignore_ascii_case(FINGERPRINT_HEADER) {
            fingerprint = Some(value.to_owned());
        } else {
            let name: async_nats::HeaderName = name.parse().ok()?;
            let value: async_nats::HeaderValue = value.parse().ok()?;
            headers.append(name, value);
        }
        at = end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::header;

    #[test]
    fn session_and_body_both_count_and_cannot_be_shifted_into_each_other() {
        let base = fingerprint(Some("s1"), b"{\"a\":1}");
        assert_eq!(base, fingerprint(Some("s1"), b"{\"a\":1}"), "deterministic");
        assert_eq!(base.len(), 3 + 64);
        assert!(base.starts_with("v1:"));
        for other in [
            fingerprint(Some("s1"), b"{\"a\":2}"),
            fingerprint(Some("s2"), b"{\"a\":1}"),
            fingerprint(None, b"{\"a\":1}"),
            fingerprint(Some(""), b"{\"a\":1}"),
            // The boundary between session and body is part of the encoding.
            fingerprint(Some("s"), b"1{\"a\":1}"),
        ] {
            assert_ne!(base, other);
        }
        // Pinned: every replica computes the same value for the same request.
        assert_eq!(
            fingerprint(None, b""),
            "v1:6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        );
    }

    #[test]
    fn kept_replies_round_trip_with_headers_and_any_body() {
        let mut hm = HeaderMap::new();
        hm.insert("Weir-Queue-Ms", "1.500");
        hm.insert("Nats-Service-Error", "queue_full: x: y");
        hm.append("X-Multi", "a");
        hm.append("X-Multi", "b");
        let body = Bytes::from_static(b"line1\n\nline3: not a header\n");
        let fp = fingerprint(Some("s"), &body);
        let kept = decode_reply(&encode_reply(&hm, &body, &fp)).expect("decodes");
        assert_eq!(kept.body, body);
        assert!(kept.answers(&fp));
        assert!(!kept.answers(&fingerprint(Some("s"), b"other")));
        let h2 = Some(&kept.headers);
        assert_eq!(header(h2, "weir-queue-ms"), Some("1.500"));
        assert_eq!(header(h2, "Nats-Service-Error"), Some("queue_full: x: y"));
        assert_eq!(header(h2, FINGERPRINT_HEADER), None, "never published");
        assert_eq!(kept.headers.get_all("X-Multi").count(), 2);
        let empty = decode_reply(&encode_reply(&HeaderMap::new(), b"", &fp)).expect("empty");
        assert_eq!((empty.headers.iter().count(), empty.body.len()), (0, 0));
        // Kept by an earlier version: no fingerprint, never a match.
        let old = decode_reply(&Bytes::from_static(b"Weir-Request-Id: r\n\nx")).expect("old");
        assert_eq!(old.fingerprint, None);
        assert!(!old.answers(&fp));
        for junk in [
            &b""[..],
            b"no newline",
            b"bad header\n\nbody",
            b"\xff: v\n\n",
        ] {
            assert!(
                decode_reply(&Bytes::copy_from_slice(junk)).is_none(),
                "{junk:?}"
            );
        }
    }
}
