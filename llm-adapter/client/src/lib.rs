//! A Rust client for the adapter (crate `weir-llm-client`: async-nats and the wire
//! contracts only, so a caller does not build the adapter).
//!
//! ```no_run
//! use std::time::Duration;
//! use weir_llm_client::{ClientErrorKind, LlmClient};
//! use weir_protocol::llm::ErrorCode;
//!
//! # async fn demo(nats: async_nats::Client) -> Result<(), Box<dyn std::error::Error>> {
//! // Subjects and the per-session cap come from the capabilities answer.
//! let llm = LlmClient::discover(nats, "llm.capabilities", Duration::from_secs(1)).await?;
//! match llm
//!     .request(r#"{"messages":[]}"#)
//!     .session("call-42")
//!     .request_id("call-42:turn-7")
//!     .timeout(Duration::from_secs(2))
//!     .send()
//!     .await
//! {
//!     Ok(reply) => println!("{} bytes after {:?} queued", reply.body.len(), reply.queue_time),
//!     Err(e) if e.kind() == ClientErrorKind::Server(ErrorCode::QueueFull) => {
//!         println!("busy, retry after {:?}", e.retry_after());
//!     }
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! Invariants:
//! - every request uses its own inbox (`Request::inbox(client.new_inbox())`): async-nats
//!   keeps an entry for every muxed request that is never answered, for the life of the
//!   connection; inboxes follow the client's `custom_inbox_prefix` (set it where each
//!   user may read only its own, e.g. `_INBOX.caller` in deploy/nats-server.conf);
//! - the NATS wait is the request's budget plus a small margin, so the server's own
//!   `deadline_exceeded` answer arrives before the client gives up; the whole call
//!   (including queuing the publish) is bounded;
//! - error replies (`Nats-Service-Error`) are never returned as `Ok`: they become a
//!   [`ClientError`] whose [`ClientError::kind`] callers match on;
//! - the optional local session cap mirrors the server's advertised
//!   `session.pending_cap` to fail early without a round trip; it counts only this
//!   client's requests (a slot is released when the call returns or is dropped), and
//!   the server stays the authority;
//! - [`LlmClient::durable`] sends unary requests through the adapter's durable intake
//!   (a JetStream work-queue stream): the call returns only after the stream stored
//!   the request (its acknowledgement), with `Nats-Msg-Id` = the request id (one is
//!   made when the caller gave none) and the reply subject in `Weir-Reply-To`; the
//!   reply inbox is subscribed before publishing;
//! - W3C trace context: a request carries `traceparent` (and `tracestate`) when the
//!   caller gave one ([`RequestBuilder::trace_context`]) or, with the feature `otel`,
//!   from the current `tracing` span when an OpenTelemetry layer records it; the
//!   adapter's `llm_request` span becomes its child.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{
    AdmissionPolicy, ErrorBody, ErrorCode, ErrorDetails, Priority, ResponseEnvelope, TraceContext,
};

use weir_protocol::llm::{CancelReply, SessionCancelReply};

mod stream;
pub use stream::{LlmEvent, LlmStream, StreamEnd};

/// Machine-readable kind of a [`ClientError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientErrorKind {
    /// The adapter answered with this error code.
    Server(ErrorCode),
    /// Refused locally: this client already has `session.pending_cap` requests pending
    /// for the session (mirrors the server's `session_queue_full`).
    LocalSessionCap,
    /// An error reply that is not the adapter's (e.g. passed through from a NATS backend).
    ServiceError,
    /// No reply within the budget + margin.
    TimedOut,
    /// Nobody listens on the subject.
    NoResponders,
    /// Connection or publish failure.
    Transport,
    /// A reply that could not be understood.
    InvalidReply,
}

/// A failed call: weir's one error shape ([`weir_service::Error`]: a kind, a message,
/// the async-nats or decoding error as [`source`](std::error::Error::source)) plus,
/// when the adapter refused the request, its error body. Callers read that body (the
/// code's details: limit, pending, retry hint), which is why this stays its own type
/// rather than a bare `weir_service::Error<ClientErrorKind>`.
#[derive(Debug)]
pub struct ClientError {
    inner: weir_service::Error<ClientErrorKind>,
    body: Option<Box<ErrorBody>>,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

impl ClientError {
    fn new(kind: ClientErrorKind, message: impl Into<String>) -> Self {
        Self::refused(kind, message, None)
    }

    /// An error caused by `source` (kept as [`std::error::Error::source`]).
    fn with_source(
        kind: ClientErrorKind,
        message: impl Into<String>,
        source: impl Into<weir_service::error::Source>,
    ) -> Self {
        Self {
            inner: weir_service::Error::with_source(kind, message, source),
            body: None,
        }
    }

    /// A refusal, with the adapter's (or the local cap's) error body.
    fn refused(kind: ClientErrorKind, message: impl Into<String>, body: Option<ErrorBody>) -> Self {
        Self {
            inner: weir_service::Error::new(kind, message),
            body: body.map(Box::new),
        }
    }

    /// The kind, for callers that match on it.
    pub fn kind(&self) -> ClientErrorKind {
        self.inner.kind()
    }

    /// The adapter's error (code, message, details), when it sent one.
    pub fn body(&self) -> Option<&ErrorBody> {
        self.body.as_deref()
    }

    /// The error details (empty when none were sent).
    pub fn details(&self) -> ErrorDetails {
        self.body
            .as_ref()
            .map(|b| b.details.clone())
            .unwrap_or_default()
    }

    /// The server's retry hint.
    pub fn retry_after(&self) -> Option<Duration> {
        self.body
            .as_ref()
            .and_then(|b| b.details.retry_after_ms)
            .map(Duration::from_millis)
    }
}

/// A successful reply.
#[derive(Debug, Clone)]
pub struct LlmReply {
    /// The backend's body, unchanged.
    pub body: Bytes,
    /// Time the request waited before inference started (`Weir-Queue-Ms`).
    pub queue_time: Option<Duration>,
    /// Inference time (`Weir-Inference-Ms`).
    pub inference_time: Option<Duration>,
    /// All reply headers.
    pub headers: HeaderMap,
}

#[derive(Debug, Default)]
struct LocalCap {
    cap: usize,
    pending: Mutex<HashMap<String, usize>>,
}

/// A local session slot; released on drop.
struct LocalSlot {
    cap: Arc<LocalCap>,
    session: String,
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        let mut p = self.cap.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = p.get_mut(&self.session) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                p.remove(&self.session);
            }
        }
    }
}

/// A client of one adapter service.
#[derive(Debug, Clone)]
pub struct LlmClient {
    nats: async_nats::Client,
    subject: String,
    cancel_subject: String,
    default_timeout: Duration,
    local_cap: Option<Arc<LocalCap>>,
    /// The durable intake's subject (`None` = core request/reply).
    intake: Option<String>,
}

fn put(map: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(n), Ok(v)) = (HeaderName::from_str(name), HeaderValue::from_str(value)) {
        map.insert(n, v);
    }
}

/// The current `tracing` span's W3C context, when an OpenTelemetry layer records it.
#[cfg(feature = "otel")]
fn current_trace_context() -> Option<TraceContext> {
    weir_service::trace_context::traceparent_of(&tracing::Span::current())
}

/// Without the feature `otel` only an explicit [`RequestBuilder::trace_context`] is sent.
#[cfg(not(feature = "otel"))]
fn current_trace_context() -> Option<TraceContext> {
    None
}

fn get<'a>(map: &'a HeaderMap, name: &str) -> Option<&'a str> {
    HeaderName::from_str(name)
        .ok()
        .and_then(|n| map.get(n))
        .map(HeaderValue::as_str)
}

/// A duration header written by [`h::format_ms`].
fn ms_header(hm: &HeaderMap, name: &str) -> Option<Duration> {
    get(hm, name).and_then(h::parse_format_ms)
}

impl LlmClient {
    /// A client sending to `subject` (cancel subject `llm.cancel`, default timeout 30 s
    /// for requests without a budget, no local cap).
    pub fn new(nats: async_nats::Client, subject: impl Into<String>) -> Self {
        Self {
            nats,
            subject: subject.into(),
            cancel_subject: "llm.cancel".into(),
            default_timeout: Duration::from_secs(30),
            local_cap: None,
            intake: None,
        }
    }

    /// Sends unary requests ([`RequestBuilder::send`]) through the adapter's durable
    /// intake: a JetStream publish to `intake_subject` (the adapter's
    /// `jetstream.subject`, `llm.intake` by default; see `intake` in the capabilities).
    /// A request is then kept by the stream until a replica answers it, also when the
    /// replica that took it dies. A second request with the same id within the stream's
    /// duplicate window is not stored again: the client then asks the service subject
    /// (core request/reply), whose forwarding replica answers with the first copy's
    /// answer once it is kept (`jetstream.reply_bucket`), or `request_id_conflict`
    /// when the adapter keeps no answers.
    /// Streamed requests ([`RequestBuilder::stream`]) stay on core request/reply.
    pub fn durable(mut self, intake_subject: impl Into<String>) -> Self {
        self.intake = Some(intake_subject.into());
        self
    }

    /// Asks the adapter's capabilities subject for its subjects and per-session cap, and
    /// mirrors the cap locally.
    pub async fn discover(
        nats: async_nats::Client,
        capabilities_subject: &str,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let req = async_nats::Request::new();
        let bound = timeout + Duration::from_millis(100);
        let msg = request(
            &nats,
            capabilities_subject,
            req,
            timeout,
            bound,
            "capabilities: no reply",
        )
        .await?;
        let caps: serde_json::Value = serde_json::from_slice(&msg.payload).map_err(|e| {
            ClientError::with_source(ClientErrorKind::InvalidReply, "capabilities", e)
        })?;
        let subject = caps["service"]["subject"].as_str().ok_or_else(|| {
            ClientError::new(
                ClientErrorKind::InvalidReply,
                "capabilities: no service.subject",
            )
        })?;
        let mut client = Self::new(nats, subject);
        if let Some(c) = caps["service"]["cancel_subject"].as_str() {
            client.cancel_subject = c.to_owned();
        }
        let cap = caps["session"]["pending_cap"]
            .as_u64()
            .and_then(|c| usize::try_from(c).ok())
            .and_then(NonZeroUsize::new);
        Ok(client.local_session_cap(cap))
    }

    /// Sets the cancel subject.
    pub fn cancel_subject(mut self, subject: impl Into<String>) -> Self {
        self.cancel_subject = subject.into();
        self
    }

    /// Timeout for requests sent without a budget or deadline.
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self
    }

    /// Enables (or disables with `None`) the local early-fail session cap.
    pub fn local_session_cap(mut self, cap: Option<NonZeroUsize>) -> Self {
        self.local_cap = cap.map(|c| {
            Arc::new(LocalCap {
                cap: c.get(),
                ..LocalCap::default()
            })
        });
        self
    }

    /// The local cap, if enabled.
    pub fn session_cap(&self) -> Option<usize> {
        self.local_cap.as_ref().map(|c| c.cap)
    }

    /// Starts building a request with this body (passed to the backend unchanged).
    pub fn request(&self, body: impl Into<Bytes>) -> RequestBuilder<'_> {
        RequestBuilder {
            client: self,
            body: body.into(),
            session: None,
            request_id: None,
            budget: None,
            deadline: None,
            policy: None,
            client_key: None,
            trace: None,
            supersede: false,
            priority: None,
        }
    }

    /// Cancels a queued or running request by its id.
    pub async fn cancel(&self, request_id: &str) -> Result<CancelReply, ClientError> {
        self.cancel_by(h::CANCEL, request_id, "cancel reply").await
    }

    /// Cancels every queued and running request of a session (`Weir-Cancel-Session`);
    /// the reply comes once the running ones were aborted and answered.
    pub async fn cancel_session(&self, session: &str) -> Result<SessionCancelReply, ClientError> {
        self.cancel_by(h::CANCEL_SESSION, session, "session cancel reply")
            .await
    }

    /// One message on the cancel subject with `header: value`, its JSON reply read as
    /// `T` (`what` names it in an error).
    async fn cancel_by<T: serde::de::DeserializeOwned>(
        &self,
        header: &str,
        value: &str,
        what: &'static str,
    ) -> Result<T, ClientError> {
        let mut headers = HeaderMap::new();
        put(&mut headers, header, value);
        let t = Duration::from_secs(2);
        let req = async_nats::Request::new().headers(headers);
        let msg = request(
            &self.nats,
            &self.cancel_subject,
            req,
            t,
            t + MARGIN,
            "cancel: no reply",
        )
        .await?;
        check_error(&msg)?;
        serde_json::from_slice(&msg.payload)
            .map_err(|e| ClientError::with_source(ClientErrorKind::InvalidReply, what, e))
    }

    /// A local session slot, when the cap is on and the request names a session.
    fn take_slot(&self, session: Option<&str>) -> Result<Option<LocalSlot>, ClientError> {
        let (Some(cap), Some(session)) = (&self.local_cap, session) else {
            return Ok(None);
        };
        let mut p = cap.pending.lock().unwrap_or_else(|e| e.into_inner());
        let n = p.entry(session.to_owned()).or_insert(0);
        if *n >= cap.cap {
            let pending = *n as u64;
            return Err(ClientError::refused(
                ClientErrorKind::LocalSessionCap,
                format!("local session cap {} reached", cap.cap),
                Some(
                    ErrorBody::new(
                        ErrorCode::SessionQueueFull,
                        format!(
                            "this client has {pending} requests pending for the session (local cap)"
                        ),
                    )
                    .with_details(ErrorDetails {
                        limit: Some(cap.cap as u64),
                        pending: Some(pending),
                        ..Default::default()
                    }),
                ),
            ));
        }
        *n += 1;
        Ok(Some(LocalSlot {
            cap: cap.clone(),
            session: session.to_owned(),
        }))
    }
}

fn request_error(e: async_nats::RequestError) -> ClientError {
    use async_nats::RequestErrorKind as K;
    let kind = match e.kind() {
        K::TimedOut => ClientErrorKind::TimedOut,
        K::NoResponders => ClientErrorKind::NoResponders,
        _ => ClientErrorKind::Transport,
    };
    ClientError::with_source(kind, "NATS request", e)
}

/// Turns an error reply into a [`ClientError`].
fn check_error(msg: &async_nats::Message) -> Result<(), ClientError> {
    let Some(hm) = &msg.headers else {
        return Ok(());
    };
    let Some(status) = get(hm, h::NATS_SERVICE_ERROR) else {
        return Ok(());
    };
    let body = ErrorBody::from_json(&msg.payload).or_else(|| {
        serde_json::from_slice::<ResponseEnvelope>(&msg.payload)
            .ok()
            .and_then(|e| e.error)
    });
    let code = body
        .as_ref()
        .map(|b| b.code)
        .or_else(|| get(hm, h::ERROR_CODE).and_then(|c| c.parse().ok()));
    Err(match code {
        Some(code) => ClientError::refused(
            ClientErrorKind::Server(code),
            body.as_ref()
                .map_or_else(|| status.to_owned(), ToString::to_string),
            body,
        ),
        None => ClientError::new(
            ClientErrorKind::ServiceError,
            format!("service error: {status}"),
        ),
    })
}

/// A request being built; see [`LlmClient::request`].
#[must_use = "a request does nothing until sent"]
pub struct RequestBuilder<'a> {
    client: &'a LlmClient,
    body: Bytes,
    session: Option<String>,
    request_id: Option<String>,
    budget: Option<Duration>,
    deadline: Option<SystemTime>,
    policy: Option<AdmissionPolicy>,
    client_key: Option<String>,
    trace: Option<TraceContext>,
    supersede: bool,
    priority: Option<Priority>,
}

/// Setters of optional request fields: `fn $name(self, value) -> Self` stores
/// `Some(value.into())` in `$field`.
macro_rules! setters {
    ($( $(#[$doc:meta])* $name:ident => $field:ident: $ty:ty, )*) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: $ty) -> Self {
                self.$field = Some(value.into());
                self
            }
        )*
    };
}

impl RequestBuilder<'_> {
    setters! {
        /// The session (per-session cap and ordering).
        session => session: impl Into<String>,
        /// The request id (idempotent retries, cancellation).
        request_id => request_id: impl Into<String>,
        /// Relative budget (`Weir-Timeout-Ms`), also the NATS wait (plus a margin).
        timeout => budget: Duration,
        /// Absolute deadline (`Weir-Deadline-Ms`; needs synchronised clocks).
        deadline => deadline: SystemTime,
        /// `enqueue` (default) or `reject` when the session is busy.
        policy => policy: AdmissionPolicy,
        /// The caller's identity for client-keyed limits.
        client_key => client_key: impl Into<String>,
        /// The W3C trace context to send as `traceparent` / `tracestate` (e.g. one
        /// received from upstream). Without it, the feature `otel` sends the current
        /// `tracing` span's context when an OpenTelemetry layer records it; otherwise
        /// none is sent.
        trace_context => trace: TraceContext,
        /// The priority class (`Weir-Priority`): `interactive` (the default) or `batch`.
        priority => priority: Priority,
    }

    /// Supersedes the session's earlier requests (`Weir-Supersede: session`; needs
    /// [`Self::session`]): they are cancelled before this one is admitted, and the reply
    /// carries `Weir-Superseded` (how many) and `Weir-Superseded-Ids`.
    pub fn supersede(mut self) -> Self {
        self.supersede = true;
        self
    }

    /// The request headers and how long to wait for the answer.
    fn headers_and_wait(&self) -> (HeaderMap, Duration) {
        let c = self.client;
        let mut headers = HeaderMap::new();
        if let Some(t) = self.trace.clone().or_else(current_trace_context) {
            put(&mut headers, h::TRACEPARENT, &t.parent.to_string());
            if let Some(state) = &t.state {
                put(&mut headers, h::TRACESTATE, state);
            }
        }
        let named = [
            (h::REQUEST_ID, self.request_id.as_deref()),
            (h::SESSION_ID, self.session.as_deref()),
            (h::CLIENT_KEY, self.client_key.as_deref()),
            (h::SUPERSEDE, self.supersede.then_some("session")),
            (h::ADMISSION, self.policy.map(WireName::as_str)),
            (h::PRIORITY, self.priority.map(WireName::as_str)),
        ];
        for (name, value) in named {
            if let Some(v) = value {
                put(&mut headers, name, v);
            }
        }
        if let Some(b) = self.budget {
            put(&mut headers, h::TIMEOUT_MS, &b.as_millis().to_string());
        }
        let mut wait = self.budget;
        if let Some(at) = self.deadline {
            let unix = at.duration_since(UNIX_EPOCH).unwrap_or_default();
            put(&mut headers, h::DEADLINE_MS, &unix.as_millis().to_string());
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            wait = Some(wait.map_or(left, |w| w.min(left)));
        }
        (headers, wait.map_or(c.default_timeout, |w| w + MARGIN))
    }

    /// Sends the request and waits for the answer.
    pub async fn send(self) -> Result<LlmReply, ClientError> {
        let c = self.client;
        let _slot = c.take_slot(self.session.as_deref())?;
        if let Some(intake) = &c.intake {
            return self.send_durable(intake).await;
        }
        let (headers, wait) = self.headers_and_wait();
        send_core(c, headers, wait, self.body).await
    }

    /// [`Self::send`] through the durable intake.
    async fn send_durable(self, intake: &str) -> Result<LlmReply, ClientError> {
        let c = self.client;
        let (mut headers, wait) = self.headers_and_wait();
        let inbox = c.nats.new_inbox();
        let rid = match &self.request_id {
            Some(r) => r.clone(),
            // A fresh unique token: the inbox's own.
            None => {
                let id = inbox.rsplit('.').next().unwrap_or(&inbox).to_owned();
                put(&mut headers, h::REQUEST_ID, &id);
                id
            }
        };
        put(&mut headers, h::NATS_MSG_ID, &rid);
        put(&mut headers, h::REPLY_TO, &inbox);
        let transport = |what: &str, e: weir_service::error::Source| {
            ClientError::with_source(
                ClientErrorKind::Transport,
                format!("durable intake: {what}"),
                e,
            )
        };
        let bound = wait + MARGIN;
        // Retries of a publish the stream did not store give up this long before the
        // bound, so that the caller sees why rather than a bare timeout.
        let give_up = tokio::time::Instant::now() + bound.saturating_sub(DURABLE_RETRY);
        let call = async {
            let mut sub = c
                .nats
                .subscribe(inbox.clone())
                .await
                .map_err(|e| transport("subscribe", e.into()))?;
            let js = async_nats::jetstream::new(c.nats.clone());
            // While the stream elects a new leader (a node died: 4.5-6.3 s measured on
            // a 3-node cluster) a publish fails with no responders or times out: again
            // with the same `Nats-Msg-Id` (the stream drops a second copy).
            let ack = loop {
                let stored = async {
                    js.publish_with_headers(intake.to_owned(), headers.clone(), self.body.clone())
                        .await?
                        .await
                }
                .await;
                match stored {
                    Ok(ack) => break ack,
                    Err(e)
                        if matches!(
                            e.kind(),
                            PublishErrorKind::StreamNotFound
                                | PublishErrorKind::TimedOut
                                | PublishErrorKind::BrokenPipe
                                | PublishErrorKind::MaxAckPending
                        ) && tokio::time::Instant::now() + DURABLE_RETRY < give_up =>
                    {
                        tokio::time::sleep(DURABLE_RETRY).await;
                    }
                    Err(e) => return Err(transport("not stored", e.into())),
                }
            };
            if ack.duplicate {
                return Ok(None);
            }
            futures::StreamExt::next(&mut sub)
                .await
                .map(Some)
                .ok_or_else(|| {
                    ClientError::new(
                        ClientErrorKind::Transport,
                        "durable intake: reply: subscription closed",
                    )
                })
        };
        let msg = tokio::time::timeout(bound, call)
            .await
            .map_err(|_| ClientError::new(ClientErrorKind::TimedOut, "no reply in time"))??;
        match msg {
            Some(msg) => reply_of(msg),
            // The stream already has this id (a retry): ask the service subject, whose
            // forwarding replica answers with the original's kept answer.
            None => {
                let (mut headers, wait) = self.headers_and_wait();
                put(&mut headers, h::REQUEST_ID, &rid);
                send_core(c, headers, wait, self.body).await
            }
        }
    }
}

/// Added to a request's own wait: the server's `deadline_exceeded` answer arrives first.
const MARGIN: Duration = Duration::from_millis(250);

/// How long a durable request waits before publishing again into a stream that did not
/// store it.
const DURABLE_RETRY: Duration = Duration::from_millis(250);

/// One core request/reply to the service subject, bounded by `wait` + the margin.
async fn send_core(
    c: &LlmClient,
    headers: HeaderMap,
    wait: Duration,
    body: Bytes,
) -> Result<LlmReply, ClientError> {
    let req = async_nats::Request::new().payload(body).headers(headers);
    let bound = wait + MARGIN;
    reply_of(request(&c.nats, &c.subject, req, wait, bound, "no reply in time").await?)
}

/// One NATS request on its own inbox: the server-side wait is `wait`, the whole call
/// (including queuing the publish) is bounded by `bound`; `timed_out` is the message
/// when that bound passes.
async fn request(
    nats: &async_nats::Client,
    subject: &str,
    req: async_nats::Request,
    wait: Duration,
    bound: Duration,
    timed_out: &str,
) -> Result<async_nats::Message, ClientError> {
    let req = req.timeout(Some(wait)).inbox(nats.new_inbox());
    tokio::time::timeout(bound, nats.send_request(subject.to_owned(), req))
        .await
        .map_err(|_| ClientError::new(ClientErrorKind::TimedOut, timed_out))?
        .map_err(request_error)
}

/// The reply, or its error.
fn reply_of(msg: async_nats::Message) -> Result<LlmReply, ClientError> {
    check_error(&msg)?;
    let headers = msg.headers.unwrap_or_default();
    Ok(LlmReply {
        queue_time: ms_header(&headers, h::QUEUE_MS),
        inference_time: ms_header(&headers, h::INFERENCE_MS),
        body: msg.payload,
        headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(headers: Option<HeaderMap>, body: &'static [u8]) -> async_nats::Message {
        async_nats::Message {
            subject: "x".into(),
            reply: None,
            payload: Bytes::from_static(body),
            headers,
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn error_replies_map_to_kinds() {
        assert!(check_error(&msg(None, b"ok")).is_ok());
        let mut hm = HeaderMap::new();
        put(&mut hm, h::NATS_SERVICE_ERROR, "queue_full: full");
        put(&mut hm, h::ERROR_CODE, "queue_full");
        let e = check_error(&msg(
            Some(hm.clone()),
            br#"{"code":"queue_full","message":"full","details":{"retry_after_ms":40}}"#,
        ))
        .expect_err("error");
        assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::QueueFull));
        assert_eq!(e.retry_after(), Some(Duration::from_millis(40)));

        // Envelope body.
        let e = check_error(&msg(
            Some(hm.clone()),
            br#"{"trace_id":"t","request_id":"r","correlation_id":null,"session_id":null,"ts_ms":1,"ok":false,"data":null,"error":{"code":"cancelled","message":"x","details":{}}}"#,
        ))
        .expect_err("error");
        assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::Cancelled));

        // Unparseable body: the header still gives the code.
        let e = check_error(&msg(Some(hm), b"")).expect_err("error");
        assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::QueueFull));

        // Somebody else's service error.
        let mut other = HeaderMap::new();
        put(&mut other, h::NATS_SERVICE_ERROR, "boom");
        let e = check_error(&msg(Some(other), b"")).expect_err("error");
        assert_eq!(e.kind(), ClientErrorKind::ServiceError);
    }

    #[test]
    fn a_nats_failure_keeps_the_request_error_as_source() {
        let e = request_error(async_nats::RequestError::new(
            async_nats::RequestErrorKind::NoResponders,
        ));
        assert_eq!(e.kind(), ClientErrorKind::NoResponders);
        assert!(e.body().is_none());
        let cause = std::error::Error::source(&e)
            .and_then(|c| c.downcast_ref::<async_nats::RequestError>())
            .expect("RequestError kept");
        assert_eq!(cause.kind(), async_nats::RequestErrorKind::NoResponders);
        assert_eq!(e.to_string(), format!("NATS request: {cause}"));
    }

    #[test]
    fn a_refusal_keeps_its_body_and_has_no_source() {
        let mut hm = HeaderMap::new();
        put(&mut hm, h::NATS_SERVICE_ERROR, "session_queue_full: full");
        let e = check_error(&msg(
            Some(hm),
            br#"{"code":"session_queue_full","message":"full","details":{"limit":2,"pending":2}}"#,
        ))
        .expect_err("error");
        assert_eq!(
            e.kind(),
            ClientErrorKind::Server(ErrorCode::SessionQueueFull)
        );
        assert_eq!(e.details().limit, Some(2));
        assert!(std::error::Error::source(&e).is_none());
    }
}
