//! Reply writing: the waiter a caller is answered through ([`NatsWaiter`]), the sink
//! that publishes answers ([`NatsSink`]), and the rendering of an outcome into headers
//! and a body (the backend's reply, or the error body / response envelope).
//!
//! Invariants: every reply publish is bounded by `nats.publish_timeout_ms`, and one
//! that cannot be published is counted (`weir_llm_reply_failed_total`), never retried;
//! a reply over the connection's `max_payload` becomes `backend_error`; header names
//! and values are built with the fallible parsers.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::stream as s;
use weir_protocol::llm::{EnvelopeMeta, ErrorBody, ErrorCode, ResponseEnvelope, StreamEvent};

use crate::admission::{Outcome, SessionCancel, Sink};
use crate::intake::{Settle, Ticket};
use crate::metrics as m;
use crate::stream::Delivered;

/// One caller waiting for an answer: the reply subject, the request body (kept for
/// envelope detection; a reference-counted view, not a copy) and, when the body was the
/// deployed envelope, its fields to echo. Small on purpose: it is moved through the
/// queue and the answer path.
pub struct NatsWaiter {
    pub(super) reply: async_nats::Subject,
    pub(super) payload: Bytes,
    /// `None` until needed: detection parses the body, which only error replies and
    /// requests without id headers need.
    pub(super) envelope: Option<Option<Box<EnvelopeMeta>>>,
    /// The caller asked for a streamed reply: the answer is `end` (or an error reply
    /// marked `Weir-Stream-Event: error`), which reports what this caller received.
    pub(super) stream: Option<Arc<Delivered>>,
    /// A request pulled from the durable intake: acknowledged after its answer was
    /// published, handed back (`-NAK`, no answer) when this replica stops.
    pub(super) intake: Option<Ticket>,
    /// Sent with `Weir-Supersede: session`: what it superseded (reply headers
    /// `Weir-Superseded`, `Weir-Superseded-Ids`).
    pub(super) superseded: Option<Box<SessionCancel>>,
}

impl NatsWaiter {
    /// A unary waiter whose envelope is not looked for yet.
    pub(super) fn new(reply: async_nats::Subject, payload: Bytes, intake: Option<Ticket>) -> Self {
        Self {
            reply,
            payload,
            envelope: None,
            stream: None,
            intake,
            superseded: None,
        }
    }

    pub(super) fn envelope(&mut self) -> Option<&EnvelopeMeta> {
        let payload = &self.payload;
        self.envelope
            .get_or_insert_with(|| EnvelopeMeta::detect(payload).map(Box::new))
            .as_deref()
    }
}

/// Publishes answers as NATS replies.
pub struct NatsSink {
    pub(super) client: async_nats::Client,
    publish_timeout: Duration,
    /// The server's `max_payload`, read once at start (reading it per reply clones the
    /// whole server info). A reply over it becomes `backend_error`.
    pub(super) max_payload: usize,
}

impl NatsSink {
    /// A sink publishing over `client`, each reply bounded by `publish_timeout`.
    pub fn new(client: async_nats::Client, publish_timeout: Duration) -> Self {
        let max_payload = client
            .try_server_info()
            .map_or(1024 * 1024, |i| i.max_payload)
            .max(64 * 1024);
        Self {
            client,
            publish_timeout,
            max_payload,
        }
    }

    /// The largest reply body that fits a NATS message with the reply's headers: what a
    /// backend may read for a unary reply before it stops ([`crate::backend::BackendRequest::max_reply_bytes`]).
    pub fn max_reply_bytes(&self) -> usize {
        self.max_payload - REPLY_HEADROOM
    }
}

/// Room left in a reply for its headers (timings, ids, passthrough headers).
pub(super) const REPLY_HEADROOM: usize = 1024;

/// Runs `fut` to completion if it finishes on its first poll (the common case: the
/// publish only queues into the client's channel); otherwise bounds it by `limit`.
/// Saves arming a timer per reply. `None` when the bound elapsed.
pub(super) async fn bounded<F: std::future::Future>(limit: Duration, fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    if let std::task::Poll::Ready(v) = futures::poll!(fut.as_mut()) {
        return Some(v);
    }
    tokio::time::timeout(limit, fut).await.ok()
}

/// Publishes one reply within `limit` ([`bounded`]); a reply that is not published
/// (timeout, connection closed) is counted (`weir_llm_reply_failed_total`), never
/// retried. `true` = published.
pub(crate) async fn publish_reply<E>(
    limit: Duration,
    publish: impl Future<Output = Result<(), E>>,
) -> bool {
    let sent = matches!(bounded(limit, publish).await, Some(Ok(())));
    if !sent {
        metrics::counter!(m::REPLY_FAILED_TOTAL).increment(1);
    }
    sent
}

/// Inserts a header if name and value are valid; silently skips otherwise (values
/// built here are always valid; passthrough values come from parsed headers).
pub(super) fn put(map: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(n), Ok(v)) = (HeaderName::from_str(name), HeaderValue::from_str(value)) {
        map.insert(n, v);
    }
}

/// Inserts one of our own (constant, valid) header names without allocating the name.
pub(crate) fn put_static(map: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        map.insert(HeaderName::from_static(name), v);
    }
}

/// Headers and body of the reply to one waiter.
pub(crate) fn render(
    outcome: &Outcome,
    envelope: Option<&EnvelopeMeta>,
    max_payload: usize,
) -> (HeaderMap, Bytes) {
    let mut headers = HeaderMap::new();
    let body = match &outcome.result {
        Ok(reply) if reply.body.len() + REPLY_HEADROOM <= max_payload => {
            for (n, v) in &reply.headers {
                put(&mut headers, n, v);
            }
            reply.body.clone()
        }
        Ok(reply) => error_body(
            &mut headers,
            &ErrorBody::new(
                ErrorCode::BackendError,
                format!(
                    "backend reply of {} bytes exceeds the NATS max_payload ({max_payload})",
                    reply.body.len()
                ),
            ),
            envelope,
        ),
        Err(e) => error_body(&mut headers, e, envelope),
    };
    // Digits and a dot only: the value is valid by construction (no second copy).
    headers.insert(
        HeaderName::from_static(h::QUEUE_MS),
        HeaderValue::from(h::format_ms(outcome.queue_time)),
    );
    if let Some(t) = outcome.inference_time {
        headers.insert(
            HeaderName::from_static(h::INFERENCE_MS),
            HeaderValue::from(h::format_ms(t)),
        );
    }
    if let Some(rid) = &outcome.request_id {
        put_static(&mut headers, h::REQUEST_ID, rid);
    }
    (headers, body)
}

pub(super) fn error_body(
    headers: &mut HeaderMap,
    e: &ErrorBody,
    envelope: Option<&EnvelopeMeta>,
) -> Bytes {
    put(headers, h::NATS_SERVICE_ERROR, &e.service_error_header());
    put(
        headers,
        h::NATS_SERVICE_ERROR_CODE,
        &e.code.nats_code().to_string(),
    );
    put(headers, h::ERROR_CODE, e.code.as_str());
    match envelope {
        Some(meta) => ResponseEnvelope::error(meta.clone(), e.clone())
            .to_json()
            .into(),
        None => e.to_json().into(),
    }
}

impl Sink for NatsSink {
    type Waiter = NatsWaiter;

    fn deliver(
        &self,
        mut waiter: NatsWaiter,
        outcome: Arc<Outcome>,
    ) -> impl Future<Output = ()> + Send {
        let max_payload = self.max_payload;
        let mut intake = waiter.intake.take();
        // An intake request this replica cannot finish because it stops goes back to
        // the stream for another replica; its caller is answered by that one.
        let hand_over = intake.is_some() && outcome.error_code() == Some(ErrorCode::ShuttingDown);
        let conflict = outcome.error_code() == Some(ErrorCode::RequestIdConflict);
        let envelope = if outcome.result.is_err() {
            waiter.envelope()
        } else {
            None
        };
        let (mut headers, mut body) = render(&outcome, envelope, max_payload);
        if let Some(r) = &waiter.superseded {
            super::barge_in::put_superseded(&mut headers, r);
        }
        // A refusal before admission carries no request id in its outcome; an intake
        // request's answer always names it (the caller may match answers by id).
        if outcome.request_id.is_none()
            && let Some(rid) = intake.as_ref().and_then(Ticket::request_id)
        {
            put_static(&mut headers, h::REQUEST_ID, rid);
        }
        let timeout = self.publish_timeout;
        let client = self.client.clone();
        // A streaming caller whose answer has a body (it joined a unary request, or got
        // a cached unary reply) receives that body as chunk 1 before `end`; one that
        // joined another caller's stream (or found it cached) received no chunk: its
        // `end` says 0 chunks and `Weir-Stream-Outcome: joined` (the text went to the
        // first caller and is not kept).
        let mut first_chunk = None;
        if let Some(sent) = &waiter.stream {
            let rid = outcome.request_id.as_deref();
            let event = if outcome.result.is_ok() {
                StreamEvent::End
            } else {
                StreamEvent::Error
            };
            for (n, v) in crate::stream::event_headers(event, rid).iter() {
                for v in v {
                    headers.insert(n.clone(), v.clone());
                }
            }
            if let Ok(reply) = &outcome.result {
                let (chunks, bytes) = sent.get();
                let streamed = reply.headers.iter().any(|(n, _)| n == s::STREAM_CHUNKS);
                let mut result = "ok";
                if !body.is_empty() {
                    let mut ch = crate::stream::event_headers(StreamEvent::Chunk, rid);
                    put_static(&mut ch, s::STREAM_SEQ, "1");
                    put_static(&mut headers, s::STREAM_CHUNKS, "1");
                    put_static(&mut headers, s::STREAM_BYTES, &body.len().to_string());
                    first_chunk = Some((ch, std::mem::take(&mut body)));
                } else if streamed {
                    if chunks == 0 && stream_chunks(reply) > 0 {
                        result = "joined";
                    }
                    put_static(&mut headers, s::STREAM_CHUNKS, &chunks.to_string());
                    put_static(&mut headers, s::STREAM_BYTES, &bytes.to_string());
                }
                put_static(&mut headers, s::STREAM_OUTCOME, result);
            }
        }
        async move {
            if hand_over {
                if let Some(t) = intake {
                    t.settle(Settle::HandOver).await;
                }
                return;
            }
            if let Some((ch, chunk)) = first_chunk {
                let _ = bounded(
                    timeout,
                    client.publish_with_headers(waiter.reply.clone(), ch, chunk),
                )
                .await;
            }
            // A unary answer to an intake request is kept for duplicates (not a
            // streamed one: its text went out in chunks). Never a `request_id_conflict`:
            // the id's kept answer, if any, is the other request's and stays.
            if let Some(t) = &mut intake
                && waiter.stream.is_none()
                && !conflict
            {
                t.keep_reply(&headers, &body);
            }
            let publish = client.publish_with_headers(waiter.reply, headers, body);
            if !publish_reply(timeout, publish).await {
                tracing::debug!(outcome = outcome.code(), "reply not published");
            }
            // Acknowledged after the answer was published: a replica that dies in
            // between leaves the request to be answered again (at least once).
            if let Some(t) = intake {
                t.settle(Settle::Answered).await;
            }
        }
    }
}

/// The chunk count a streamed reply reports (0 when absent).
pub(super) fn stream_chunks(reply: &crate::backend::BackendReply) -> u64 {
    reply
        .headers
        .iter()
        .find(|(n, _)| n == s::STREAM_CHUNKS)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}
