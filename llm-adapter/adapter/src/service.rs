//! The NATS edge: a NATS micro service (`$SRV.PING|INFO|STATS`) with four endpoints in
//! one queue group — inference, cancel, capabilities, limits.
//!
//! Inference requests: headers (`Weir-*`, see [`weir_protocol::llm::headers`]) become a
//! [`Submission`]; the body is passed to the backend unchanged and never logged. When a
//! deployed caller sends the JSON envelope without the headers, the envelope's
//! `request_id` / `session_id` stand in for them, validated like the headers (an invalid
//! one is `invalid_request` naming the envelope field, never silently ignored).
//!
//! Replies: success = the backend's body (and the headers a NATS backend returned) plus
//! `Weir-Queue-Ms`, `Weir-Inference-Ms`, `Weir-Request-Id`. Errors carry
//! `Nats-Service-Error` (`"<code>: <message>"`), `Nats-Service-Error-Code` (HTTP-like
//! number), `Weir-Error-Code` (`queue_full`, ...) and a JSON body: the
//! [`ErrorBody`] (`{"code","message","details"}`), or a response envelope
//! (`ok:false, data:null, error:{...}`) echoing the request's envelope fields when the
//! request body was one.
//!
//! Invariants:
//! - intake never spawns per message: each endpoint has one task that decodes, submits
//!   and moves on; answers are published by whoever settles the request;
//! - every message an endpoint loop takes is counted ([`NatsEvents::took`]), so that
//!   messages the NATS client received but dropped (slow consumer) are counted too:
//!   `in_messages − taken` (see [`crate::nats_events`]);
//! - every reply publish is bounded by `nats.publish_timeout_ms` (a publish waits
//!   without limit when the client's channel is full); a reply that cannot be published
//!   is counted (`weir_llm_reply_failed_total`), never retried or waited for;
//! - nothing from the network can panic the edge: header names/values are built with the
//!   fallible parsers, ids are validated, oversize replies become `backend_error`.
//!
//! The `$SRV.STATS` `data` of the inference endpoint is the
//! [`crate::admission::StatsSnapshot`]; that is where requests and refusals by code are
//! counted. The service API's own `num_requests` / `num_errors` of that endpoint stay 0:
//! its error path drops the JSON body this adapter must send, and the answers are
//! published by the workers straight to the reply subject (the service `Request` is not
//! kept while a request waits — a waiter is just the reply subject and the body).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{PublishAckFuture, PublishError};
use async_nats::jetstream::publish::PublishAck;
use async_nats::service::{Request, Service, ServiceExt};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio::time::error::Elapsed;
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::stream as s;
use weir_protocol::llm::{
    AdmissionPolicy, EnvelopeMeta, ErrorBody, ErrorCode, HeaderError, ResponseEnvelope, StreamEvent,
};

use crate::admission::{Admission, Outcome, RequestStatus, Sink, Submission};
use crate::config::Config;
use crate::intake::{Admit, IntakeEdge, Pulled, Settle, SlotRefusal, TermReason, Ticket};
use crate::metrics as m;
use crate::millis::{unix_ms_now, whole_ms};
use crate::nats_events::NatsEvents;
use crate::stream::{AckHub, Delivered, NatsStream, StreamLimits};

/// One caller waiting for an answer: the reply subject, the request body (kept for
/// envelope detection; a reference-counted view, not a copy) and, when the body was the
/// deployed envelope, its fields to echo. Small on purpose: it is moved through the
/// queue and the answer path.
pub struct NatsWaiter {
    reply: async_nats::Subject,
    payload: Bytes,
    /// `None` until needed: detection parses the body, which only error replies and
    /// requests without id headers need.
    envelope: Option<Option<Box<EnvelopeMeta>>>,
    /// The caller asked for a streamed reply: the answer is `end` (or an error reply
    /// marked `Weir-Stream-Event: error`), which reports what this caller received.
    stream: Option<Arc<Delivered>>,
    /// A request pulled from the durable intake: acknowledged after its answer was
    /// published, handed back (`-NAK`, no answer) when this replica stops.
    intake: Option<Ticket>,
}

impl NatsWaiter {
    /// A unary waiter whose envelope is not looked for yet.
    fn new(reply: async_nats::Subject, payload: Bytes, intake: Option<Ticket>) -> Self {
        Self {
            reply,
            payload,
            envelope: None,
            stream: None,
            intake,
        }
    }

    fn envelope(&mut self) -> Option<&EnvelopeMeta> {
        let payload = &self.payload;
        self.envelope
            .get_or_insert_with(|| EnvelopeMeta::detect(payload).map(Box::new))
            .as_deref()
    }
}

/// Publishes answers as NATS replies.
pub struct NatsSink {
    client: async_nats::Client,
    publish_timeout: Duration,
    /// The server's `max_payload`, read once at start (reading it per reply clones the
    /// whole server info). A reply over it becomes `backend_error`.
    max_payload: usize,
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
const REPLY_HEADROOM: usize = 1024;

/// Runs `fut` to completion if it finishes on its first poll (the common case: the
/// publish only queues into the client's channel); otherwise bounds it by `limit`.
/// Saves arming a timer per reply. `None` when the bound elapsed.
async fn bounded<F: std::future::Future>(limit: Duration, fut: F) -> Option<F::Output> {
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
fn put(map: &mut HeaderMap, name: &str, value: &str) {
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

fn error_body(headers: &mut HeaderMap, e: &ErrorBody, envelope: Option<&EnvelopeMeta>) -> Bytes {
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
fn stream_chunks(reply: &crate::backend::BackendReply) -> u64 {
    reply
        .headers
        .iter()
        .find(|(n, _)| n == s::STREAM_CHUNKS)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Looks a header up by exact name, then case-insensitively (Go clients canonicalise,
/// others may not).
pub(crate) fn header<'a>(map: Option<&'a HeaderMap>, name: &'static str) -> Option<&'a str> {
    let map = map?;
    if let Some(v) = map.get(HeaderName::from_static(name)) {
        return Some(v.as_str());
    }
    map.iter()
        .find(|(k, _)| AsRef::<str>::as_ref(*k).eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.first())
        .map(HeaderValue::as_str)
}

/// The request headers the adapter reads, found in one pass over the map (names
/// compared case-insensitively; the first value of a repeated header wins).
#[derive(Default)]
struct Known<'a> {
    request_id: Option<&'a str>,
    session: Option<&'a str>,
    client_key: Option<&'a str>,
    admission: Option<&'a str>,
    deadline: Option<&'a str>,
    timeout: Option<&'a str>,
    cancel: Option<&'a str>,
    stream: Option<&'a str>,
    traceparent: Option<&'a str>,
    tracestate: Option<&'a str>,
}

impl<'a> Known<'a> {
    fn read(map: Option<&'a HeaderMap>) -> Self {
        let mut k = Self::default();
        let Some(map) = map else {
            return k;
        };
        for (name, values) in map.iter() {
            let Some(v) = values.first().map(HeaderValue::as_str) else {
                continue;
            };
            let n: &str = name.as_ref();
            let slots = [
                (h::REQUEST_ID, &mut k.request_id),
                (h::SESSION_ID, &mut k.session),
                (h::CLIENT_KEY, &mut k.client_key),
                (h::ADMISSION, &mut k.admission),
                (h::DEADLINE_MS, &mut k.deadline),
                (h::TIMEOUT_MS, &mut k.timeout),
                (h::CANCEL, &mut k.cancel),
                (s::STREAM, &mut k.stream),
                (h::TRACEPARENT, &mut k.traceparent),
                (h::TRACESTATE, &mut k.tracestate),
            ];
            if let Some((_, slot)) = slots.into_iter().find(|(h, _)| n.eq_ignore_ascii_case(h)) {
                slot.get_or_insert(v);
            }
        }
        k
    }
}

fn invalid(e: &HeaderError) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, e.to_string())
}

/// A header error as the refusal (boxed: `ErrorBody` is large for a `Result`).
fn inv<T>(r: Result<T, HeaderError>) -> Result<T, Box<ErrorBody>> {
    r.map_err(|e| Box::new(invalid(&e)))
}

/// Decodes one inference request. The envelope is looked for only when an id header is
/// missing (`None` = not looked for; the sink looks when it must shape an error).
fn decode(
    msg: &async_nats::Message,
    known: &Known<'_>,
    received_at: Instant,
) -> (Option<Option<EnvelopeMeta>>, Result<Submission, ErrorBody>) {
    let envelope = (known.request_id.is_none() || known.session.is_none())
        .then(|| EnvelopeMeta::detect(&msg.payload));
    let env = envelope.as_ref().and_then(Option::as_ref);
    let sub = (|| -> Result<Submission, Box<ErrorBody>> {
        let id = |name: &'static str, v: Option<&str>| -> Result<Option<String>, HeaderError> {
            v.map(|v| h::parse_id(name, v.trim()).map(str::to_owned))
                .transpose()
        };
        let request_id = match inv(id(h::REQUEST_ID, known.request_id))? {
            Some(r) => Some(r),
            None => env_id("request_id", env.and_then(EnvelopeMeta::request_id_str))?,
        };
        let session = match inv(id(h::SESSION_ID, known.session))? {
            Some(s) => Some(s),
            None => env_id("session_id", env.and_then(EnvelopeMeta::session_id_str))?,
        };
        let client_key = inv(id(h::CLIENT_KEY, known.client_key))?;
        let policy =
            inv(known.admission.map(AdmissionPolicy::parse).transpose())?.unwrap_or_default();
        let ms = |name, v: Option<&str>| inv(v.map(|v| h::parse_ms(name, v)).transpose());
        let deadline = ms(h::DEADLINE_MS, known.deadline)?;
        let timeout = ms(h::TIMEOUT_MS, known.timeout)?;
        Ok(Submission {
            // Opened by the replica that admits it ([`open_span`]), not by one that
            // only forwards it to the durable intake.
            span: tracing::Span::none(),
            // Never a refusal: a malformed `traceparent` is ignored.
            trace: h::TraceContext::from_headers(known.traceparent, known.tracestate),
            request_id,
            session,
            client_key,
            policy,
            // The wall clock is read only for absolute deadlines.
            budget: h::remaining_budget(
                deadline,
                timeout,
                if deadline.is_some() { unix_ms_now() } else { 0 },
            ),
            received_at,
            body: msg.payload.clone(),
            stream: None,
        })
    })()
    .map_err(|e| *e);
    (envelope, sub)
}

/// The session a request decodes to (the header, else the envelope's `session_id`),
/// unvalidated: what the durable intake's request fingerprint names
/// ([`crate::intake::fingerprint`]). For a valid request it equals
/// [`Submission::session`].
pub(crate) fn session_of(msg: &async_nats::Message) -> Option<String> {
    match Known::read(msg.headers.as_ref()).session {
        Some(s) => Some(s.trim().to_owned()),
        None => EnvelopeMeta::detect(&msg.payload).and_then(|e| e.session_id_str()),
    }
}

/// Opens the request's `llm_request` span ([`crate::trace::request_span`]): child of
/// its `traceparent`, else of the envelope's W3C `trace_id`.
fn open_span(sub: &mut Submission, envelope: Option<&EnvelopeMeta>) {
    sub.span = crate::trace::request_span(
        sub.trace.as_ref(),
        sub.request_id.as_deref(),
        sub.session.as_deref(),
        envelope.and_then(|e| e.trace_id.as_str()),
    );
}

/// The capabilities document of a running adapter: [`Config::capabilities`] plus the
/// backend's live service-time estimate under `estimator.current`.
pub fn capabilities<S: Sink>(config: &Config, admission: &Admission<S>) -> serde_json::Value {
    let mut v = config.capabilities();
    if let Some(est) = v.get_mut("estimator").and_then(|e| e.as_object_mut()) {
        est.insert("backend".into(), config.backend.kind.name().into());
        est.insert(
            "current".into(),
            serde_json::to_value(admission.estimate()).unwrap_or_default(),
        );
    }
    v
}

/// Validates an id taken from the JSON envelope like the header ids: an envelope id
/// that is not 1..=[`h::MAX_ID_LEN`] bytes of visible ASCII is refused with `invalid_request` naming
/// the envelope field (it used to be ignored, silently turning off the session cap,
/// ordering and idempotency for that request).
fn env_id(field: &'static str, v: Option<String>) -> Result<Option<String>, Box<ErrorBody>> {
    let Some(v) = v else {
        return Ok(None);
    };
    match h::parse_id(field, &v) {
        Ok(_) => Ok(Some(v)),
        Err(e) => {
            let text = e.to_string();
            let reason = text.split_once(": ").map_or(text.as_str(), |(_, r)| r);
            Err(Box::new(ErrorBody::new(
                ErrorCode::InvalidRequest,
                format!("envelope field {field}: {reason}"),
            )))
        }
    }
}

/// Reply of the cancel endpoint (a wire schema: `weir_protocol::llm::CancelReply`).
pub use weir_protocol::llm::CancelReply;

/// The request id a cancel or status message names: the `Weir-Cancel` header, else
/// `Weir-Request-Id`, else the body (trimmed).
fn request_id_of(req: &Request) -> String {
    let hm = req.message.headers.as_ref();
    header(hm, h::CANCEL)
        .or_else(|| header(hm, h::REQUEST_ID))
        .map(str::to_owned)
        .or_else(|| {
            std::str::from_utf8(&req.message.payload)
                .ok()
                .map(str::to_owned)
        })
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Reply of the status endpoint (`llm.status`): where a request is.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct StatusReply {
    /// The request id asked about.
    pub request_id: String,
    /// `queued`, `running`, `done` or `not_found`.
    pub status: String,
    /// `queued`: 1-based position (1 = next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    /// `queued`: predicted wait before inference starts, ms (absent without an
    /// estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_start_ms: Option<u64>,
    /// `queued`: time since receipt, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// `running`: time since inference started, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
}

impl StatusReply {
    fn new(request_id: String, status: RequestStatus) -> Self {
        let mut r = Self {
            request_id,
            status: status.as_str().to_owned(),
            ..Self::default()
        };
        match status {
            RequestStatus::Queued {
                position,
                predicted_start,
                waited,
            } => {
                r.position = Some(position);
                r.predicted_start_ms = predicted_start.map(whole_ms);
                r.waited_ms = Some(whole_ms(waited));
            }
            RequestStatus::Running { elapsed } => r.elapsed_ms = Some(whole_ms(elapsed)),
            RequestStatus::Done | RequestStatus::NotFound => {}
        }
        r
    }
}

/// Shared by the endpoint tasks.
struct Edge {
    admission: Admission<NatsSink>,
    events: NatsEvents,
    config: Arc<Config>,
    publish_timeout: Duration,
    client: async_nats::Client,
    acks: AckHub,
    /// `intake = "jetstream"` with `jetstream.forward`: core requests go to the stream.
    forward: Option<async_nats::jetstream::Context>,
    /// Where forwarded requests wait for the stream's acknowledgement.
    forward_acks: Option<tokio::sync::mpsc::Sender<PendingForward>>,
}

impl Edge {
    async fn reply_json(&self, req: &Request, value: &impl Serialize) {
        let body = serde_json::to_vec(value).unwrap_or_default();
        let mut headers = HeaderMap::new();
        put(&mut headers, "Content-Type", "application/json");
        let respond = req.respond_with_headers(Ok(body.into()), headers);
        publish_reply(self.publish_timeout, respond).await;
    }

    async fn handle_infer(&self, req: Request) {
        let received_at = Instant::now();
        let Some(reply) = req.message.reply.clone() else {
            metrics::counter!(m::NO_REPLY_SUBJECT_TOTAL).increment(1);
            return;
        };
        let known = Known::read(req.message.headers.as_ref());
        if let Some(target) = known.cancel {
            let target = target.trim().to_owned();
            return self.handle_cancel_of(&req, target).await;
        }
        if let Some(js) = &self.forward {
            return self
                .forward(js, &req.message, reply, &known, received_at)
                .await;
        }
        self.admit_message(&req.message, reply, &known, received_at, None)
            .await;
    }

    /// Decodes one request and submits it (or answers it at once). `intake`: the
    /// request came from the durable intake (`edge` = this edge, shared); a refusal
    /// before admission terminates it, and a request that must wait for a cluster-wide
    /// wait-limit slot waits in a task of its own (at most one per intake permit), so
    /// that the pull loop keeps reading — a pulled message nobody reads gets no
    /// progress acknowledgement and is redelivered after `ack_wait`.
    async fn admit_message(
        &self,
        message: &async_nats::Message,
        reply: async_nats::Subject,
        known: &Known<'_>,
        received_at: Instant,
        intake: Option<(Ticket, Arc<Self>)>,
    ) {
        let (mut intake, edge) = intake.unzip();
        let (envelope, mut sub) = decode(message, known, received_at);
        if let Ok(sub) = &mut sub {
            open_span(sub, envelope.as_ref().and_then(Option::as_ref));
        }
        let stream = known.stream.map(s::wants_stream).transpose();
        if (sub.is_err() || stream.is_err())
            && let Some(t) = &mut intake
        {
            t.terminate(TermReason::Invalid);
        }
        let mut waiter = NatsWaiter {
            envelope: envelope.map(|e| e.map(Box::new)),
            stream: matches!(stream, Ok(Some(true))).then(Arc::default),
            ..NatsWaiter::new(reply, message.payload.clone(), intake)
        };
        match (sub, stream) {
            (Ok(sub), Ok(wants)) => {
                // Durable intake: the cluster-wide session cap and limits, taken as KV
                // slot leases before the local admission.
                if let Some(t) = &mut waiter.intake {
                    let keys = crate::admission::resolve_keys(self.admission.config(), &sub)
                        .unwrap_or_default();
                    match t.take_cluster_slots(sub.session.as_deref(), &keys).await {
                        Ok(()) => {}
                        Err(SlotRefusal::MustWait(from)) => {
                            // Some with every intake ticket (they come as a pair).
                            let Some(edge) = edge else {
                                return;
                            };
                            let dl = &self.config.admission.deadline;
                            let deadline = sub
                                .budget
                                .or(dl.default)
                                .map(|b| sub.received_at + b.min(dl.max));
                            tokio::spawn(async move {
                                let r = match &mut waiter.intake {
                                    Some(t) => t.wait_cluster_slots(from, &keys, deadline).await,
                                    None => Ok(()),
                                };
                                if let Some(waiter) = edge.after_slots(r, waiter, received_at).await
                                {
                                    edge.submit(sub, waiter, wants).await;
                                }
                            });
                            return;
                        }
                        r => {
                            let Some(w) = self.after_slots(r, waiter, received_at).await else {
                                return;
                            };
                            waiter = w;
                        }
                    }
                }
                self.submit(sub, waiter, wants).await;
            }
            (Err(err), _) => self.admission.answer_now(waiter, err, received_at).await,
            (Ok(_), Err(e)) => {
                waiter.stream = None;
                self.admission
                    .answer_now(waiter, invalid(&e), received_at)
                    .await
            }
        }
    }

    /// Settles a cluster-slot outcome: `Some` = go on to the local admission; `None`
    /// = answered (`Full`) or handed back (`Store`) here.
    async fn after_slots(
        &self,
        r: Result<(), SlotRefusal>,
        mut waiter: NatsWaiter,
        received_at: Instant,
    ) -> Option<NatsWaiter> {
        match r {
            Ok(()) => Some(waiter),
            Err(SlotRefusal::Full(reason, err)) => {
                if let Some(t) = &mut waiter.intake {
                    t.terminate(reason);
                }
                self.admission.answer_now(waiter, *err, received_at).await;
                None
            }
            Err(SlotRefusal::Store(e)) => {
                metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => "error").increment(1);
                // On its last delivery the server would not deliver it again: answer it.
                if let Some(t) = waiter.intake.as_mut().filter(|t| t.last_delivery()) {
                    tracing::warn!(error = %e, "cluster slot store failed on a request's last delivery; refused");
                    t.terminate(TermReason::SlotStore);
                    let err = ErrorBody::new(
                        ErrorCode::QueueFull,
                        format!(
                            "the cluster slot store failed on this request's last delivery; not started: {e}"
                        ),
                    );
                    self.admission.answer_now(waiter, err, received_at).await;
                    return None;
                }
                tracing::warn!(error = %e, "cluster slot store failed; request handed back");
                if let Some(t) = waiter.intake.take() {
                    t.settle(Settle::Retry).await;
                }
                None
            }
            // Only `take_cluster_slots` asks not to wait; its caller handles this.
            Err(SlotRefusal::MustWait(_)) => Some(waiter),
        }
    }

    /// Hands a decoded request to the local admission (with its reply stream when it
    /// asked for one).
    async fn submit(&self, mut sub: Submission, waiter: NatsWaiter, wants: Option<bool>) {
        if let (Some(true), Some(sent)) = (wants, &waiter.stream) {
            let sc = &self.config.stream;
            sub.stream = Some(Arc::new(NatsStream::new(
                self.client.clone(),
                waiter.reply.clone(),
                sub.request_id.clone(),
                &self.acks,
                StreamLimits {
                    window: sc.window,
                    ack_timeout: sc.ack_timeout,
                    publish_timeout: self.publish_timeout,
                },
                sent.clone(),
            )));
        }
        self.admission.submit(sub, waiter).await;
    }

    async fn handle_status(&self, req: Request) {
        let target = request_id_of(&req);
        if let Err(e) = h::parse_id(h::REQUEST_ID, &target) {
            return self.reply_invalid(&req, &e).await;
        }
        let status = self.admission.status(&target);
        metrics::counter!(m::STATUS_TOTAL, "result" => status.as_str()).increment(1);
        let reply = StatusReply::new(target, status);
        self.reply_json(&req, &reply).await;
    }

    /// Answers one request taken from `route`'s endpoint.
    async fn serve(&self, route: Route, req: Request) {
        match route {
            Route::Infer => self.handle_infer(req).await,
            Route::Cancel => self.handle_cancel_of(&req, request_id_of(&req)).await,
            Route::Capabilities => {
                let value = capabilities(&self.config, &self.admission);
                self.reply_json(&req, &value).await;
            }
            Route::Limits => {
                let top = std::str::from_utf8(&req.message.payload)
                    .ok()
                    .and_then(|s| s.trim().parse::<usize>().ok())
                    .unwrap_or(20)
                    .clamp(1, 1000);
                self.reply_json(&req, &self.admission.limits_view(top))
                    .await;
            }
            Route::Status => self.handle_status(req).await,
        }
    }

    /// Answers `invalid_request` for a bad request id on the cancel or status subject.
    async fn reply_invalid(&self, req: &Request, e: &HeaderError) {
        let (headers, body) = render(
            &Outcome {
                result: Err(invalid(e)),
                queue_time: Duration::ZERO,
                inference_time: None,
                request_id: None,
            },
            None,
            usize::MAX,
        );
        let _ = tokio::time::timeout(
            self.publish_timeout,
            req.respond_with_headers(Ok(body), headers),
        )
        .await;
    }

    async fn handle_cancel_of(&self, req: &Request, target: String) {
        if let Err(e) = h::parse_id(h::CANCEL, &target) {
            return self.reply_invalid(req, &e).await;
        }
        let result = self.admission.cancel(&target).await;
        let reply = CancelReply {
            request_id: target,
            result: result.as_str().to_owned(),
        };
        self.reply_json(req, &reply).await;
    }
}

impl Edge {
    /// `jetstream.forward`: puts a core request into the durable intake, with its reply
    /// subject in `Weir-Reply-To`, its request id as `Nats-Msg-Id` and its deadline
    /// made absolute (a relative budget counts from this receipt). A malformed request
    /// is answered here; one the stream does not store is answered `queue_full`; a
    /// duplicate (same request id within the duplicate window) is answered
    /// `request_id_conflict`: the answer goes to the first copy's reply subject.
    async fn forward(
        &self,
        js: &async_nats::jetstream::Context,
        message: &async_nats::Message,
        reply: async_nats::Subject,
        known: &Known<'_>,
        received_at: Instant,
    ) {
        let (envelope, sub) = decode(message, known, received_at);
        let waiter = |envelope: Option<Option<EnvelopeMeta>>| NatsWaiter {
            envelope: envelope.map(|e| e.map(Box::new)),
            ..NatsWaiter::new(reply.clone(), message.payload.clone(), None)
        };
        let stream = known.stream.map(s::wants_stream).transpose();
        let sub = match (sub, stream.map_err(|e| invalid(&e))) {
            (Ok(sub), Ok(_)) => sub,
            (Err(e), _) | (Ok(_), Err(e)) => {
                return self
                    .admission
                    .answer_now(waiter(envelope), e, received_at)
                    .await;
            }
        };
        let deadline_ms = sub
            .budget
            .map(|b| unix_ms_now().saturating_add(whole_ms(b)));
        let mut headers = crate::intake::set_deadline(
            message.headers.as_ref().unwrap_or(&HeaderMap::new()),
            deadline_ms,
        );
        put_static(&mut headers, h::REPLY_TO, reply.as_str());
        if let Some(rid) = &sub.request_id {
            put_static(&mut headers, h::NATS_MSG_ID, rid);
            put_static(&mut headers, h::REQUEST_ID, rid);
        }
        if let Some(session) = &sub.session {
            put_static(&mut headers, h::SESSION_ID, session);
        }
        let subject = self
            .config
            .intake
            .jetstream()
            .map(|j| j.subject.clone())
            .unwrap_or_default();
        let limit = self.publish_timeout;
        let queued = tokio::time::timeout(
            limit,
            js.publish_with_headers(subject, headers, message.payload.clone()),
        )
        .await;
        let failure = match queued {
            Ok(Ok(ack)) => {
                let dl = &self.config.admission.deadline;
                let meta = PendingMeta {
                    waiter: waiter(envelope),
                    received_at,
                    request_id: sub.request_id.clone(),
                    fingerprint: crate::intake::fingerprint(sub.session.as_deref(), &sub.body),
                    until: received_at
                        + sub
                            .budget
                            .or(dl.default)
                            .unwrap_or(dl.max)
                            .min(dl.max)
                            .saturating_sub(dl.reply_margin),
                };
                // The stream's acknowledgement is awaited by the forwarding task, so
                // that this intake loop takes the next request meanwhile; the bounded
                // channel makes the loop wait when FORWARDS_IN_FLIGHT are unconfirmed (a
                // slow stream slows intake instead of growing a list).
                if let Some(tx) = &self.forward_acks
                    && let Err(e) = tx.send((ack, meta)).await
                {
                    let (_, p) = e.0;
                    self.admission
                        .answer_now(p.waiter, not_confirmed(limit), p.received_at)
                        .await;
                }
                return;
            }
            Ok(Err(e)) => not_stored(&e),
            Err(_) => not_confirmed(limit),
        };
        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => "failed").increment(1);
        self.admission
            .answer_now(waiter(envelope), failure, received_at)
            .await;
    }
}

/// Most forwarded requests whose stream acknowledgement is awaited at once.
const FORWARDS_IN_FLIGHT: usize = 1024;

/// `queue_full`: the stream refused a forwarded request.
fn not_stored(e: &impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::QueueFull,
        format!("the durable intake did not store the request: {e}"),
    )
}

/// `queue_full`: the stream did not acknowledge a forwarded request in time.
fn not_confirmed(limit: Duration) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::QueueFull,
        format!(
            "the durable intake did not confirm the request within nats.publish_timeout_ms ({} ms)",
            limit.as_millis()
        ),
    )
}

/// A forwarded request waiting for the stream's acknowledgement.
type PendingForward = (PublishAckFuture, PendingMeta);

/// What one forwarded request's future ended with.
enum Forwarded {
    /// The stream's acknowledgement (or its timeout).
    Acked(
        Result<Result<PublishAck, PublishError>, Elapsed>,
        PendingMeta,
    ),
    /// A duplicate's wait for the original's kept answer.
    Kept(Option<crate::intake::KeptReply>, PendingMeta),
}

/// A forwarded request: who waits for its answer.
struct PendingMeta {
    waiter: NatsWaiter,
    received_at: Instant,
    request_id: Option<String>,
    /// The request's fingerprint: a duplicate gets the kept answer only when it is
    /// this request's.
    fingerprint: String,
    /// A duplicate waits for the original's kept answer until then.
    until: Instant,
}

/// Shared by [`forward_acks`]' answers.
struct ForwardCtx {
    admission: Admission<NatsSink>,
    client: async_nats::Client,
    limit: Duration,
    replies: Option<async_nats::jetstream::kv::Store>,
}

/// Awaits the stream's acknowledgements of forwarded requests (at most `limit` each)
/// and answers the ones not stored (`queue_full`). A duplicate (the stream already has
/// this request id) is answered with the original's answer from the reply bucket when
/// it comes before the duplicate's own deadline (`deadline_exceeded` otherwise), or
/// `request_id_conflict` without a reply bucket. Ends when the edge is gone and every
/// pending future was handled.
async fn forward_acks(mut rx: tokio::sync::mpsc::Receiver<PendingForward>, ctx: ForwardCtx) {
    let mut pending: futures::stream::FuturesUnordered<
        futures::future::BoxFuture<'static, Forwarded>,
    > = futures::stream::FuturesUnordered::new();
    let limit = ctx.limit;
    let mut open = true;
    loop {
        tokio::select! {
            p = rx.recv(), if open => match p {
                Some((ack, meta)) => {
                    pending.push(Box::pin(async move {
                        Forwarded::Acked(tokio::time::timeout(limit, ack.into_future()).await, meta)
                    }));
                }
                None => open = false,
            },
            Some(done) = pending.next(), if !pending.is_empty() => {
                let (failure, meta) = match done {
                    Forwarded::Acked(Ok(Ok(ack)), meta) if ack.duplicate => {
                        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => "duplicate")
                            .increment(1);
                        if let (Some(kv), Some(rid)) = (&ctx.replies, meta.request_id.clone()) {
                            let (kv, until) = (kv.clone(), meta.until);
                            pending.push(Box::pin(async move {
                                let kept = crate::intake::wait_kept_reply(kv, rid, until).await;
                                Forwarded::Kept(kept, meta)
                            }));
                            continue;
                        }
                        (
                            ErrorBody::new(
                                ErrorCode::RequestIdConflict,
                                "this request id is already in the durable intake (within \
                                 jetstream.duplicate_window_ms); its answer goes to the first \
                                 copy's reply subject",
                            ),
                            meta,
                        )
                    }
                    Forwarded::Acked(Ok(Ok(_)), _) => {
                        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => "stored")
                            .increment(1);
                        continue;
                    }
                    Forwarded::Acked(failed, meta) => {
                        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => "failed")
                            .increment(1);
                        let failure = match failed {
                            Ok(Err(e)) => not_stored(&e),
                            _ => not_confirmed(limit),
                        };
                        (failure, meta)
                    }
                    Forwarded::Kept(Some(kept), meta) if kept.answers(&meta.fingerprint) => {
                        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => "joined")
                            .increment(1);
                        let reply = meta.waiter.reply;
                        let publish = ctx.client.publish_with_headers(reply, kept.headers, kept.body);
                        publish_reply(limit, publish).await;
                        continue;
                    }
                    // Another request's answer (another body or session), or one that
                    // cannot be told apart (kept by an earlier version): never sent.
                    Forwarded::Kept(Some(_), meta) => {
                        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => "conflict")
                            .increment(1);
                        let rid = meta.request_id.clone().unwrap_or_default();
                        (crate::intake::conflict(&rid), meta)
                    }
                    Forwarded::Kept(None, meta) => (
                        ErrorBody::new(
                            ErrorCode::DeadlineExceeded,
                            "a copy of this request id is in the durable intake and was not \
                             answered within this request's budget",
                        ),
                        meta,
                    ),
                };
                ctx.admission.answer_now(meta.waiter, failure, meta.received_at).await;
            }
            else => return,
        }
    }
}

impl Admit for Edge {
    async fn admit(self: &Arc<Self>, pulled: Pulled) {
        let received_at = Instant::now();
        let Pulled {
            message,
            reply,
            mut ticket,
        } = pulled;
        let known = Known::read(message.headers.as_ref());
        if known.cancel.is_some() {
            ticket.terminate(TermReason::Invalid);
            let waiter = NatsWaiter::new(reply, message.payload.clone(), Some(ticket));
            let e = ErrorBody::new(
                ErrorCode::InvalidRequest,
                format!(
                    "{} on the durable intake: send cancellations to {}",
                    h::CANCEL,
                    self.config.service.cancel_subject
                ),
            );
            return self.admission.answer_now(waiter, e, received_at).await;
        }
        self.admit_message(
            &message,
            reply,
            &known,
            received_at,
            Some((ticket, Arc::clone(self))),
        )
        .await;
    }

    fn refuse(
        &self,
        pulled: Pulled,
        error: ErrorBody,
        received_at: Instant,
    ) -> impl Future<Output = ()> + Send {
        let waiter = NatsWaiter::new(pulled.reply, pulled.message.payload, Some(pulled.ticket));
        self.admission.answer_now(waiter, error, received_at)
    }
}

/// The service's endpoints, each served by one task ([`Edge::serve`]).
#[derive(Debug, Clone, Copy)]
enum Route {
    Infer,
    Cancel,
    Capabilities,
    Limits,
    Status,
}

/// The inference endpoint's name (its `$SRV.STATS` data is the admission's stats).
const INFER_ENDPOINT: &str = "infer";

/// The running NATS edge.
pub(crate) struct ServiceEdge {
    service: Option<Service>,
    tasks: Vec<JoinHandle<()>>,
    /// The acknowledgement router: it outlives the endpoints, since running streams
    /// still need their acknowledgements while shutdown drains them.
    acks: Option<JoinHandle<()>>,
    /// The durable intake's pull loop and keeper (`intake = "jetstream"`).
    intake: Option<IntakeEdge>,
}

impl ServiceEdge {
    /// Registers the service and its endpoints and starts one intake task per endpoint.
    pub(crate) async fn start(
        client: &async_nats::Client,
        config: Arc<Config>,
        admission: Admission<NatsSink>,
        events: NatsEvents,
    ) -> Result<Self, async_nats::Error> {
        let sc = &config.service;
        let stats_admission = admission.clone();
        let service = client
            .service_builder()
            .description(&sc.description)
            .queue_group(&sc.queue_group)
            .metadata(HashMap::from([
                (
                    "weir.capabilities_subject".to_owned(),
                    sc.capabilities_subject.clone(),
                ),
                (
                    "weir.backend".to_owned(),
                    config.backend.kind.name().to_owned(),
                ),
            ]))
            .stats_handler(move |endpoint, _| {
                if endpoint == INFER_ENDPOINT {
                    serde_json::to_value(stats_admission.stats()).unwrap_or_default()
                } else {
                    serde_json::Value::Null
                }
            })
            .start(&sc.name, &sc.version)
            .await?;
        let mut endpoints = Vec::new();
        for (route, name, subject) in [
            (Route::Infer, INFER_ENDPOINT, &sc.subject),
            (Route::Cancel, "cancel", &sc.cancel_subject),
            (
                Route::Capabilities,
                "capabilities",
                &sc.capabilities_subject,
            ),
            (Route::Limits, "limits", &sc.limits_subject),
            (Route::Status, "status", &sc.status_subject),
        ] {
            let endpoint = service.endpoint_builder().name(name).add(subject).await?;
            endpoints.push((route, endpoint));
        }
        let (acks, ack_task) = AckHub::start(client, events.clone()).await?;

        let forward = config.intake.jetstream().filter(|j| j.forward).map(|_| {
            let mut js = async_nats::jetstream::new(client.clone());
            js.set_timeout(config.nats.publish_timeout);
            js
        });
        let replies = match config.intake.jetstream() {
            Some(j) => crate::intake::open_reply_bucket(client, j).await?,
            None => None,
        };
        let mut tasks = Vec::new();
        let forward_acks = forward.as_ref().map(|_| {
            let (tx, rx) = tokio::sync::mpsc::channel(FORWARDS_IN_FLIGHT);
            tasks.push(tokio::spawn(forward_acks(
                rx,
                ForwardCtx {
                    admission: admission.clone(),
                    client: client.clone(),
                    limit: config.nats.publish_timeout,
                    replies: replies.clone(),
                },
            )));
            tx
        });
        let edge = Arc::new(Edge {
            admission,
            events,
            publish_timeout: config.nats.publish_timeout,
            config: config.clone(),
            client: client.clone(),
            acks,
            forward,
            forward_acks,
        });
        let intake = match config.intake.jetstream() {
            None => None,
            Some(_) => Some(
                IntakeEdge::start(client, config.clone(), edge.clone(), replies)
                    .await
                    .map_err(|e| -> async_nats::Error { e.into() })?,
            ),
        };
        for (route, mut endpoint) in endpoints {
            let edge = edge.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(req) = endpoint.next().await {
                    edge.events.took();
                    edge.serve(route, req).await;
                }
            }));
        }
        Ok(Self {
            service: Some(service),
            tasks,
            acks: Some(ack_task),
            intake,
        })
    }

    /// Stops routing stream acknowledgements (after the running requests ended) and,
    /// once the intake's requests are settled (bounded: see
    /// [`IntakeEdge::stop_keeper`]), their progress.
    pub(crate) async fn stop_acks(&mut self) {
        if let Some(t) = self.acks.take() {
            t.abort();
        }
        if let Some(i) = &mut self.intake {
            i.stop_keeper().await;
        }
    }

    /// Stops pulling from the durable intake (requests of the last pull are handed back
    /// with `-NAK`), so that other replicas take what waits in the stream. Bounded by
    /// `wait`; nothing to do for the core intake.
    pub(crate) async fn stop_intake(&mut self, wait: Duration) {
        if let Some(i) = &mut self.intake {
            i.stop_pulling(wait).await;
        }
    }

    /// Unsubscribes every endpoint; the intake tasks answer what is already buffered and
    /// end. Bounded by `wait`.
    pub(crate) async fn stop(&mut self, wait: Duration) {
        self.stop_intake(wait).await;
        if let Some(service) = self.service.take() {
            let _ = tokio::time::timeout(wait, service.stop()).await;
        }
        let tasks = std::mem::take(&mut self.tasks);
        let all = futures::future::join_all(tasks);
        if tokio::time::timeout(wait, all).await.is_err() {
            tracing::warn!("endpoint intake tasks did not end in time");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendReply;
    use weir_protocol::llm::ErrorDetails;

    fn outcome(result: Result<BackendReply, ErrorBody>) -> Outcome {
        Outcome {
            result,
            queue_time: Duration::from_micros(1500),
            inference_time: Some(Duration::from_millis(20)),
            request_id: Some("r1".into()),
        }
    }

    #[test]
    fn success_reply_carries_timings_and_passthrough_headers() {
        let reply = BackendReply {
            body: Bytes::from_static(b"{\"text\":\"hi\"}"),
            headers: vec![
                ("X-Backend".into(), "v1".into()),
                ("Bad\nName".into(), "x".into()),
            ],
        };
        let (hm, body) = render(&outcome(Ok(reply)), None, 1 << 20);
        assert_eq!(&body[..], b"{\"text\":\"hi\"}");
        assert_eq!(header(Some(&hm), h::QUEUE_MS), Some("1.500"));
        assert_eq!(header(Some(&hm), h::INFERENCE_MS), Some("20.000"));
        assert_eq!(header(Some(&hm), h::REQUEST_ID), Some("r1"));
        assert_eq!(header(Some(&hm), "x-backend"), Some("v1"));
        assert_eq!(header(Some(&hm), h::NATS_SERVICE_ERROR), None);
    }

    #[test]
    fn error_reply_has_service_headers_and_json_or_envelope_body() {
        let err = ErrorBody::new(ErrorCode::QueueFull, "queue holds 4 requests (capacity)")
            .with_details(ErrorDetails {
                limit: Some(4),
                pending: Some(4),
                retry_after_ms: Some(12),
                ..Default::default()
            });
        let (hm, body) = render(&outcome(Err(err.clone())), None, 1 << 20);
        assert_eq!(header(Some(&hm), h::NATS_SERVICE_ERROR_CODE), Some("503"));
        assert_eq!(header(Some(&hm), h::ERROR_CODE), Some("queue_full"));
        assert_eq!(
            header(Some(&hm), h::NATS_SERVICE_ERROR),
            Some("queue_full: queue holds 4 requests (capacity)")
        );
        assert_eq!(ErrorBody::from_json(&body), Some(err.clone()));

        let meta = EnvelopeMeta::detect(br#"{"trace_id":"t","request_id":"r","correlation_id":"c","session_id":"s","ts_ms":5,"data":{}}"#)
            .expect("envelope");
        let (_, body) = render(&outcome(Err(err.clone())), Some(&meta), 1 << 20);
        let env: ResponseEnvelope = serde_json::from_slice(&body).expect("envelope json");
        assert_eq!(env.meta, meta);
        assert!(!env.ok);
        assert_eq!(env.data, serde_json::Value::Null);
        assert_eq!(env.error, Some(err));
    }

    #[test]
    fn oversize_replies_become_backend_errors() {
        let reply = BackendReply::body(vec![b'x'; 5000]);
        let (hm, body) = render(&outcome(Ok(reply)), None, 4096);
        assert_eq!(header(Some(&hm), h::ERROR_CODE), Some("backend_error"));
        assert!(ErrorBody::from_json(&body).is_some());
    }

    #[test]
    fn decode_reads_headers_and_falls_back_to_the_envelope() {
        let mut hm = HeaderMap::new();
        put(&mut hm, "weir-session-id", "s-hdr");
        put(&mut hm, h::TIMEOUT_MS, "1500");
        put(&mut hm, h::ADMISSION, "reject");
        put(&mut hm, h::CLIENT_KEY, "tenant-a");
        let msg = async_nats::Message {
            subject: "llm.infer".into(),
            reply: Some("_INBOX.x".into()),
            payload: Bytes::from_static(
                br#"{"trace_id":"t","request_id":"r-env","session_id":"s-env","ts_ms":1}"#,
            ),
            headers: Some(hm),
            status: None,
            description: None,
            length: 0,
        };
        let (env, sub) = decode(&msg, &Known::read(msg.headers.as_ref()), Instant::now());
        let sub = sub.expect("valid");
        assert!(env.is_some_and(|e| e.is_some()));
        assert_eq!(sub.request_id.as_deref(), Some("r-env"));
        assert_eq!(
            sub.session.as_deref(),
            Some("s-hdr"),
            "header wins, case-insensitively"
        );
        assert_eq!(sub.client_key.as_deref(), Some("tenant-a"));
        assert_eq!(sub.policy, AdmissionPolicy::Reject);
        assert_eq!(sub.budget, Some(Duration::from_millis(1500)));

        let mut bad = msg.clone();
        let mut hm = HeaderMap::new();
        put(&mut hm, h::TIMEOUT_MS, "-5");
        bad.headers = Some(hm);
        let (env, sub) = decode(&bad, &Known::read(bad.headers.as_ref()), Instant::now());
        assert!(env.is_some_and(|e| e.is_some()));
        let err = sub.expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert!(err.message.contains(h::TIMEOUT_MS), "{}", err.message);
    }

    #[test]
    fn trace_context_is_read_and_a_malformed_one_ignored() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let msg = |traceparent: &str| {
            let mut hm = HeaderMap::new();
            put(&mut hm, "TraceParent", traceparent);
            put(&mut hm, h::TRACESTATE, "v=1");
            async_nats::Message {
                subject: "llm.infer".into(),
                reply: Some("_INBOX.x".into()),
                payload: Bytes::from_static(b"{}"),
                headers: Some(hm),
                status: None,
                description: None,
                length: 0,
            }
        };
        let m = msg(tp);
        let (_, sub) = decode(&m, &Known::read(m.headers.as_ref()), Instant::now());
        let trace = sub.expect("valid").trace.expect("read, case-insensitively");
        assert_eq!(trace.parent.to_string(), tp);
        assert_eq!(trace.state.as_deref(), Some("v=1"));
        for bad in ["00-xyz-01", "", &tp.to_uppercase()] {
            let m = msg(bad);
            let (_, sub) = decode(&m, &Known::read(m.headers.as_ref()), Instant::now());
            assert_eq!(sub.expect("never refused").trace, None, "{bad:?}");
        }
    }

    #[test]
    fn envelope_ids_are_validated_like_header_ids() {
        let msg = |body: &'static [u8]| async_nats::Message {
            subject: "llm.infer".into(),
            reply: Some("_INBOX.x".into()),
            payload: Bytes::from_static(body),
            headers: None,
            status: None,
            description: None,
            length: 0,
        };
        for (body, field) in [
            (
                &br#"{"trace_id":"t","request_id":"r x","session_id":"s","ts_ms":1}"#[..],
                "request_id",
            ),
            (
                br#"{"trace_id":"t","request_id":"r","session_id":"s\u00e9","ts_ms":1}"#,
                "session_id",
            ),
            (
                br#"{"trace_id":"t","request_id":"r","session_id":"s x","ts_ms":1}"#,
                "session_id",
            ),
        ] {
            let m = msg(body);
            let (env, sub) = decode(&m, &Known::read(None), Instant::now());
            assert!(env.is_some_and(|e| e.is_some()));
            let err = sub.expect_err("refused");
            assert_eq!(err.code, ErrorCode::InvalidRequest);
            assert!(
                err.message.starts_with(&format!("envelope field {field}:")),
                "{}",
                err.message
            );
        }
        // Valid envelope ids still stand in for missing headers.
        let m = msg(br#"{"trace_id":"t","request_id":"r-1","session_id":"s-1","ts_ms":1}"#);
        let (_, sub) = decode(&m, &Known::read(None), Instant::now());
        let sub = sub.expect("valid");
        assert_eq!(
            (sub.request_id.as_deref(), sub.session.as_deref()),
            (Some("r-1"), Some("s-1"))
        );
    }
}
