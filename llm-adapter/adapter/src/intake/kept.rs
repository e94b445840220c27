//! Answers kept in the reply bucket, and the fingerprint of the request each answers:
//! what makes two requests with the same request id "the same request", as the core
//! path's idempotency compares them (session and body). Reading them back: a
//! forwarding replica waiting for a duplicate's answer ([`wait_kept_reply`]), a pulled
//! request checked before it runs ([`replay_kept`]).
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

use std::time::Duration;

use async_nats::jetstream::{kv, stream};
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use futures::StreamExt;
use ring::digest::{Context, SHA256};
use tokio::time::Instant;
use weir_protocol::llm::{ErrorBody, ErrorCode};

use super::{Hub, IntakeError, IntakeErrorKind, KEEP_RETRY, Settle, Ticket, reply_key};
use crate::metrics as m;
use weir_service::config::whole_ms;

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
    format!("v1:{}", super::cluster::hex(ctx.finish().as_ref()))
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

/// The kept answer of `request_id`, read through the bucket stream's leader (a direct
/// get may be answered by a follower that has not stored the latest write yet):
/// `Ok(None)` = none kept, `Err` = the bucket did not answer within `limit`.
pub(super) async fn read_kept_reply(
    kv: &kv::Store,
    request_id: &str,
    limit: Duration,
) -> Result<Option<KeptReply>, IntakeError> {
    let subject = format!("{}{}", kv.prefix, reply_key(request_id));
    let read = tokio::time::timeout(limit, kv.stream.get_last_raw_message_by_subject(&subject));
    match read.await {
        Ok(Ok(msg)) => {
            let op = msg
                .headers
                .get(KV_OPERATION)
                .map_or("", |v| v.as_str())
                .to_owned();
            Ok((op.is_empty() || op == "PUT")
                .then(|| decode_reply(&msg.payload))
                .flatten())
        }
        Ok(Err(e)) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Ok(Err(e)) => Err(IntakeError::with_source(
            IntakeErrorKind::Bucket,
            "cannot read the reply bucket",
            e,
        )),
        Err(_) => Err(IntakeError::new(
            IntakeErrorKind::Bucket,
            format!(
                "the reply bucket gave no answer within {} ms",
                whole_ms(limit)
            ),
        )),
    }
}

/// The header that marks a KV delete or purge (absent or `PUT` on a value).
const KV_OPERATION: &str = "KV-Operation";

/// Waits until the reply bucket holds the answer of `request_id` (or `until`): what a
/// forwarding replica answers a duplicate with.
pub(crate) async fn wait_kept_reply(
    kv: kv::Store,
    request_id: String,
    until: Instant,
) -> Option<KeptReply> {
    let key = reply_key(&request_id);
    tokio::time::timeout_at(until, async move {
        let mut watch = kv.watch_with_history(&key).await.ok()?;
        while let Some(entry) = watch.next().await {
            match entry {
                Ok(e) if e.operation == kv::Operation::Put => return decode_reply(&e.value),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

/// What [`replay_kept`] found.
pub(super) enum Replay {
    /// The kept answer was sent again and the request settled.
    Done,
    /// Nothing kept for this request (or the bucket stayed unreadable on its last
    /// delivery): run it.
    Run(Ticket),
    /// The request id's kept answer is another request's (another body or session):
    /// refuse it `request_id_conflict`.
    Conflict(Ticket),
}

/// The refusal of a request whose id has an answer kept for another request.
pub(crate) fn conflict(rid: &str) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::RequestIdConflict,
        format!(
            "request id {rid:?} was used with a different session or body within \
             jetstream.duplicate_window_ms; its answer goes only to that request"
        ),
    )
}

/// Answers a request from the reply bucket when its own answer is kept (and settles
/// it). A kept answer whose fingerprint is another request's is never sent:
/// [`Replay::Conflict`]; one kept without a fingerprint (an earlier version) counts as
/// nothing kept. An unreadable bucket is read again every [`KEEP_RETRY`] while the
/// request stays held (the keeper sends its progress), for at most `keep_limit`; then
/// the request goes back to the stream for later (`-NAK` after [`super::STORE_ERROR_DELAY`]),
/// or runs on its last delivery (at least once rather than never).
pub(super) async fn replay_kept(
    hub: &Hub,
    ticket: Ticket,
    reply: &Subject,
    delivered: i64,
) -> Replay {
    let (Some(kv), Some(rid)) = (&hub.replies, ticket.request_id.clone()) else {
        return Replay::Run(ticket);
    };
    let until = Instant::now() + hub.keep_limit;
    loop {
        match read_kept_reply(kv, &rid, hub.publish_timeout).await {
            Ok(Some(kept)) if kept.answers(&ticket.fingerprint) => {
                metrics::counter!(m::INTAKE_REPLAYED_TOTAL).increment(1);
                let publish =
                    hub.client
                        .publish_with_headers(reply.clone(), kept.headers, kept.body);
                let _ = tokio::time::timeout(hub.publish_timeout, publish).await;
                ticket.settle(Settle::Answered).await;
                return Replay::Done;
            }
            Ok(Some(kept)) if kept.fingerprint.is_some() => return Replay::Conflict(ticket),
            Ok(_) => return Replay::Run(ticket),
            Err(_) if Instant::now() + KEEP_RETRY < until => {
                tokio::time::sleep(KEEP_RETRY).await;
            }
            Err(e) => {
                metrics::counter!(m::INTAKE_REPLAY_CHECK_FAILED_TOTAL).increment(1);
                let last = ticket.last_delivery;
                tracing::warn!(error = %e, request_id = %rid, delivered, last,
                    "reply bucket unreadable for a redelivered request; {}",
                    if last { "last delivery: running it" } else { "handed back for later" });
                if last {
                    return Replay::Run(ticket);
                }
                ticket.settle(Settle::Retry).await;
                return Replay::Done;
            }
        }
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
