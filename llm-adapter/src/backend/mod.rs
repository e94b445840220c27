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
//! HTTP backend's connection is closed, the NATS backend's inbox is unsubscribed, the
//! simulated call stops sleeping). Backends never log request bodies.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::config::{BackendConfig, BackendKind};

pub mod nats;
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
}

impl BackendRequest {
    /// Time left before the deadline, `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
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
            headers: Vec::new(),
        }
    }
}

/// Why a backend call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct BackendError {
    kind: BackendErrorKind,
    message: String,
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
}

impl BackendError {
    /// A new error. `message` must not contain request bodies.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        let mut message: String = message.into();
        message.retain(|c| c != '\r' && c != '\n');
        Self { kind, message }
    }

    /// The kind, for callers that match on it.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// The explanation.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// An inference backend.
pub trait Backend: Send + Sync + 'static {
    /// Short name for capabilities and logs (`sim`, `openai`, `nats`).
    fn name(&self) -> &'static str;

    /// Runs one call. Dropping the returned future aborts the call.
    fn call(
        &self,
        request: BackendRequest,
    ) -> BoxFuture<'static, Result<BackendReply, BackendError>>;
}

impl fmt::Debug for dyn Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({})", self.name())
    }
}

/// What [`from_config`] built: the backend, and the sim handle when it is the sim.
pub struct BuiltBackend {
    /// The backend.
    pub backend: Arc<dyn Backend>,
    /// Pause/resume handle when the backend is simulated.
    pub sim: Option<sim::SimHandle>,
}

/// Builds the configured backend. The NATS backend uses `client` (the adapter's own
/// connection).
pub fn from_config(
    cfg: &BackendConfig,
    client: &async_nats::Client,
) -> Result<BuiltBackend, BackendError> {
    Ok(match &cfg.kind {
        BackendKind::Sim(s) => {
            let b = sim::SimBackend::new(*s);
            let handle = b.handle();
            BuiltBackend {
                backend: Arc::new(b),
                sim: Some(handle),
            }
        }
        BackendKind::OpenAi(o) => BuiltBackend {
            backend: Arc::new(openai::OpenAiBackend::new(o, cfg.timeout)?),
            sim: None,
        },
        BackendKind::Nats(n) => BuiltBackend {
            backend: Arc::new(nats::NatsBackend::new(
                client.clone(),
                n.subject.clone(),
                cfg.timeout,
            )),
            sim: None,
        },
    })
}
