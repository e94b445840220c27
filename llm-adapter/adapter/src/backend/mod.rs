//! Inference backends behind one trait.
//!
//! - [`sim::SimBackend`]: latency distribution, error rate, pause/resume (tests, load runs);
//! - [`openai::OpenAiBackend`]: any OpenAI-compatible HTTP server (vLLM, llama.cpp
//!   server, Ollama); the body is POSTed unchanged over a pooled HTTP/1.1 client;
//! - [`nats::NatsBackend`]: forwards to an existing NATS service subject, with a timeout
//!   equal to the remaining deadline — the service stays unchanged behind a bounded front.
//!
//! Contract: a call is aborted by dropping its future. The admission worker drops it at
//! the request's deadline, at the backend timeout, on cancellation and at the end of the
//! shutdown grace period, so a backend must not rely on running to completion (the
//! HTTP backend's connection is closed, the NATS backend's inbox is unsubscribed and,
//! with a `cancel_subject`, a cancel message is published, the simulated call stops
//! sleeping). Backends never log request bodies.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;
use weir_protocol::llm::TraceContext;

use crate::config::{BackendConfig, BackendKind};

pub mod nats;
pub mod nats_cancel;
pub mod openai;
pub mod sim;

/// One inference call.
#[derive(Debug, Clone)]
pub struct BackendRequest {
    /// The request body, unchanged.
    pub body: Bytes,
    /// The caller's request id, if any.
    pub request_id: Option<String>,
    /// The session, if any.
    pub session: Option<String>,
    /// When the answer is no longer useful (the worker also enforces it).
    pub deadline: Option<Instant>,
    /// Most bytes a unary reply body may have (the NATS `max_payload` less room for
    /// headers). A backend that reads a body stops at this many bytes and fails with
    /// [`BackendErrorKind::TooLarge`] instead of holding more; `usize::MAX` = no cap.
    pub max_reply_bytes: usize,
    /// The W3C trace context to send on (`traceparent`, `tracestate`): set by the
    /// worker from [`crate::trace::outgoing`] just before the call. A backend that can
    /// carry headers sends it; `None` = send none.
    pub trace: Option<TraceContext>,
}

/// A successful backend answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendReply {
    /// The reply body, passed to the caller unchanged.
    pub body: Bytes,
    /// Headers to pass through to the caller (e.g. those of a forwarded NATS reply).
    pub headers: Vec<(String, String)>,
}

impl BackendReply {
    /// A reply with just a body.
    pub fn body(body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            ..Self::default()
        }
    }
}

/// Why a backend call failed: weir's one error shape ([`weir_service::Error`]: a
/// kind, a message, the HTTP or NATS client's error as
/// [`source`](std::error::Error::source)) plus what the admission reads to answer the
/// caller — the backend's retry hint, its status and the limit that was hit. That data
/// is why this stays its own type rather than a bare
/// `weir_service::Error<BackendErrorKind>`.
///
/// `Display` is the message, then `: ` and the cause, on one line (carriage returns and
/// line feeds of the cause are shown as spaces): it goes into the caller's error body.
#[derive(Debug)]
pub struct BackendError {
    inner: weir_service::Error<BackendErrorKind>,
    retry_after: Option<Duration>,
    status: Option<u16>,
    limit: Option<u64>,
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.inner.message())?;
        if let Some(cause) = std::error::Error::source(&self.inner) {
            let cause = cause.to_string();
            write!(f, ": {}", cause.replace(['\r', '\n'], " "))?;
        }
        Ok(())
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.inner)
    }
}

/// `message` on one line (it goes into the caller's error body).
fn one_line(message: impl Into<String>) -> String {
    let mut message: String = message.into();
    message.retain(|c| c != '\r' && c != '\n');
    message
}

/// Machine-readable kind of a [`BackendError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendErrorKind {
    /// The backend answered with an error, or the answer was unusable.
    Failed,
    /// The backend could not be reached (connection refused, no responders).
    Unavailable,
    /// The backend's own timeout elapsed.
    Timeout,
    /// The backend said it is overloaded (HTTP 429 / 503), possibly with a
    /// `Retry-After` ([`BackendError::retry_after`]).
    Overloaded,
    /// The reply body exceeded [`BackendRequest::max_reply_bytes`]; reading stopped.
    TooLarge,
}

impl BackendError {
    /// A new error. `message` must not contain request bodies.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        Self::from_inner(weir_service::Error::new(kind, one_line(message)))
    }

    /// A new error caused by `source` (the HTTP or NATS client's error), which stays
    /// reachable through [`std::error::Error::source`]. `message` must not contain
    /// request bodies.
    pub fn with_source(
        kind: BackendErrorKind,
        message: impl Into<String>,
        source: impl Into<weir_service::error::Source>,
    ) -> Self {
        Self::from_inner(weir_service::Error::with_source(
            kind,
            one_line(message),
            source,
        ))
    }

    fn from_inner(inner: weir_service::Error<BackendErrorKind>) -> Self {
        Self {
            inner,
            retry_after: None,
            status: None,
            limit: None,
        }
    }

    /// Sets the backend's retry hint (its `Retry-After`).
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Sets the backend's status (HTTP status code).
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// Sets the limit that was hit (the byte cap of [`BackendErrorKind::TooLarge`]).
    pub fn with_limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The limit that was hit, if any.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// The backend's retry hint, if it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The backend's status code, if it has one (HTTP).
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The kind, for callers that match on it.
    pub fn kind(&self) -> BackendErrorKind {
        self.inner.kind()
    }

    /// The explanation, without the cause (`to_string()` has both).
    pub fn message(&self) -> &str {
        self.inner.message()
    }
}

/// An inference backend.
pub trait Backend: Send + Sync + 'static {
    /// Short name for capabilities and logs (`sim`, `openai`, `nats`).
    fn name(&self) -> &'static str;

    /// Runs one call. Dropping the returned future aborts the call.
    fn call(&self, request: BackendRequest) -> Call;

    /// Runs one call whose reply body is handed to `chunks` piece by piece as it
    /// arrives (for a streamed reply: the SSE bytes, unchanged), and returns the reply
    /// with an empty body when the backend ends it. `chunks` is bounded: a slow reader
    /// slows the backend read (backpressure), it never grows a buffer. If the receiver
    /// is gone the call ends with an error. Dropping the future aborts the call.
    ///
    /// The default runs [`Backend::call`] and sends its body as pieces of at most
    /// [`MAX_PIECE`] bytes: correct for backends that cannot stream (the NATS one).
    fn call_stream(&self, request: BackendRequest, chunks: ChunkTx) -> Call {
        let call = self.call(request);
        Box::pin(async move {
            let mut reply = call.await?;
            let body = std::mem::take(&mut reply.body);
            for at in (0..body.len()).step_by(MAX_PIECE) {
                let end = (at + MAX_PIECE).min(body.len());
                send_piece(&chunks, body.slice(at..end)).await?;
            }
            Ok(reply)
        })
    }
}

/// A running backend call: dropping it aborts the call.
pub type Call = BoxFuture<'static, Result<BackendReply, BackendError>>;

/// Where [`Backend::call_stream`] puts the pieces of a reply body.
pub type ChunkTx = tokio::sync::mpsc::Sender<Bytes>;

/// Largest piece [`Backend::call_stream`]'s default sends at once.
pub const MAX_PIECE: usize = 16 * 1024;

/// Sends one piece; the receiver being gone (the stream was aborted) is an error.
pub async fn send_piece(chunks: &ChunkTx, piece: Bytes) -> Result<(), BackendError> {
    chunks.send(piece).await.map_err(|_| {
        BackendError::new(
            BackendErrorKind::Failed,
            "stream receiver gone (request aborted)",
        )
    })
}

impl fmt::Debug for dyn Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({})", self.name())
    }
}

/// What [`pool_from_config`] built: one backend per pool member, in order, and the sim
/// handles by member name (pause one to stall that backend).
pub struct BuiltPool {
    /// The backends, in the pool's order.
    pub backends: Vec<Arc<dyn Backend>>,
    /// `(name, handle)` of each simulated member.
    pub sims: Vec<(String, sim::SimHandle)>,
}

impl BuiltPool {
    /// The pause/resume handle of the simulated member `name`.
    pub fn sim(&self, name: &str) -> Option<&sim::SimHandle> {
        self.sims.iter().find(|(n, _)| n == name).map(|(_, h)| h)
    }
}

/// Builds the pool of `config`: each `[[backends]]` member, or the single `[backend]`
/// (named `default`).
pub fn pool_from_config(
    config: &crate::Config,
    client: &async_nats::Client,
) -> Result<BuiltPool, BackendError> {
    let members: Vec<(&str, &BackendConfig)> = if config.backends.is_empty() {
        vec![("default", &config.backend)]
    } else {
        (config.backends.iter())
            .map(|m| (m.name.as_str(), &m.backend))
            .collect()
    };
    let mut pool = BuiltPool {
        backends: Vec::with_capacity(members.len()),
        sims: Vec::new(),
    };
    for (name, cfg) in members {
        let backend: Arc<dyn Backend> = match &cfg.kind {
            BackendKind::Sim(s) => {
                let b = sim::SimBackend::new(*s);
                pool.sims.push((name.to_owned(), b.clone()));
                Arc::new(b)
            }
            BackendKind::OpenAi(o) => Arc::new(openai::OpenAiBackend::new(o, cfg.timeout)?),
            // Its name labels the cancel counter.
            BackendKind::Nats(n) => Arc::new(nats::NatsBackend::new(client, n, cfg.timeout, name)),
        };
        pool.backends.push(backend);
    }
    Ok(pool)
}
