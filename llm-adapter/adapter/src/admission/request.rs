//! What goes into the admission core and what comes out: a [`Submission`] (built with
//! its setters), the [`Outcome`] shared by every waiter of a request, what the core's
//! `submit`, `cancel` and `status` report ([`Admitted`], [`CancelResult`],
//! [`RequestStatus`]), and the [`Sink`] answers are delivered through.
//!
//! Invariants: the core calls [`Sink::deliver`] exactly once per waiter, and a sink
//! never waits without bound; an [`Outcome`] is shared (`Arc`) by every waiter of its
//! request and is not changed once built.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::{AdmissionPolicy, ErrorBody, ErrorCode, TraceContext};

use super::{Priority, StreamOut};
use crate::backend::BackendReply;

/// One request offered to the admission core.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The caller's request id (idempotency and cancellation).
    pub request_id: Option<String>,
    /// The session (cap, ordering, session-keyed limits).
    pub session: Option<String>,
    /// The caller's identity for client-keyed limits.
    pub client_key: Option<String>,
    /// What to do when the session is busy.
    pub policy: AdmissionPolicy,
    /// Remaining budget at `received_at`; `None` = the configured default.
    pub budget: Option<Duration>,
    /// When the adapter received the request (queue time starts here).
    pub received_at: Instant,
    /// The body, passed to the backend unchanged.
    pub body: Bytes,
    /// Where a streamed reply goes (`Weir-Stream: 1`); `None` = a unary reply.
    pub stream: Option<Arc<dyn StreamOut>>,
    /// The request's `llm_request` span ([`crate::trace::request_span`]): the trace
    /// events are emitted inside it, the backend call runs in a child of it.
    pub span: tracing::Span,
    /// The caller's W3C trace context (`traceparent`), passed on to the backend.
    pub trace: Option<TraceContext>,
    /// `Weir-Priority`; `None` = the class of its keys (`limits[].priority`), else
    /// interactive.
    pub priority: Option<Priority>,
}

impl Submission {
    /// A submission received now with no metadata.
    pub fn new(body: impl Into<Bytes>) -> Self {
        Self {
            request_id: None,
            session: None,
            client_key: None,
            policy: AdmissionPolicy::Enqueue,
            budget: None,
            received_at: Instant::now(),
            body: body.into(),
            stream: None,
            span: crate::trace::request_span(None, None, None, None),
            trace: None,
            priority: None,
        }
    }

    /// Sets the priority class.
    pub fn priority(mut self, p: Priority) -> Self {
        self.priority = Some(p);
        self
    }

    /// Asks for a streamed reply through `out`.
    pub fn stream(mut self, out: Arc<dyn StreamOut>) -> Self {
        self.stream = Some(out);
        self
    }

    /// Sets the request id.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Sets the session.
    pub fn session(mut self, s: impl Into<String>) -> Self {
        self.session = Some(s.into());
        self
    }

    /// Sets the client key.
    pub fn client_key(mut self, k: impl Into<String>) -> Self {
        self.client_key = Some(k.into());
        self
    }

    /// Sets the session-busy policy.
    pub fn policy(mut self, p: AdmissionPolicy) -> Self {
        self.policy = p;
        self
    }

    /// Sets the budget.
    pub fn budget(mut self, b: Duration) -> Self {
        self.budget = Some(b);
        self
    }
}

/// How a request ended, shared by every waiter of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The backend's reply, or why there is none.
    pub result: Result<BackendReply, ErrorBody>,
    /// Receipt → start of inference (or → the answer, if it never started).
    pub queue_time: Duration,
    /// Duration of the backend call, if one started.
    pub inference_time: Option<Duration>,
    /// The request id.
    pub request_id: Option<String>,
}

impl Outcome {
    /// A refusal answered without a backend call, `queue_time` after receipt.
    pub fn refused(err: ErrorBody, queue_time: Duration, request_id: Option<String>) -> Self {
        Self {
            result: Err(err),
            queue_time,
            inference_time: None,
            request_id,
        }
    }

    /// `ok` or the error code.
    pub fn code(&self) -> &'static str {
        match &self.result {
            Ok(_) => "ok",
            Err(e) => e.code.as_str(),
        }
    }

    /// The error code, `None` on success.
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.result.as_ref().err().map(|e| e.code)
    }
}

/// What [`Admission::submit`](super::Admission::submit) did with a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Queued; the answer comes later.
    Queued,
    /// Joined a live request with the same id; the answer comes with it.
    Joined,
    /// Answered from the completion cache (already delivered).
    Cached,
    /// Refused (already delivered).
    Refused(ErrorCode),
}

/// What [`Admission::cancel`](super::Admission::cancel) found.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelResult {
    /// It was queued; it has been answered `cancelled`.
    Queued,
    /// It was running; the backend call is being aborted and answered `cancelled`.
    Running,
    /// No queued or running request has this id.
    NotFound,
}

/// Where a request is, by request id (`llm.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum RequestStatus {
    /// Admitted, waiting to start.
    Queued {
        /// 1-based position among the queued requests (1 = next), in the order workers
        /// take them (deadline order under EDF, arrival under FIFO).
        position: usize,
        /// Predicted wait before inference starts (`None` without an estimate).
        predicted_start: Option<Duration>,
        /// Time since receipt.
        waited: Duration,
    },
    /// Inference in progress.
    Running {
        /// Since the start of inference.
        elapsed: Duration,
    },
    /// Finished `ok`, and its reply is still in the idempotency cache (a retry with the
    /// same id gets it without running again).
    Done,
    /// Not queued, not running, not cached.
    NotFound,
}

impl RequestStatus {
    /// `queued`, `running`, `done` or `not_found`.
    pub fn as_str(&self) -> &'static str {
        self.into()
    }
}

/// Where answers go. The NATS edge publishes a reply; [`ChannelSink`] sends on a
/// oneshot channel.
pub trait Sink: Send + Sync + 'static {
    /// Identifies one caller waiting for an answer.
    type Waiter: Send + 'static;

    /// Delivers `outcome` to `waiter`. Called exactly once per waiter. Must not wait
    /// without bound (the NATS sink bounds its publish with a timeout). The future is
    /// awaited in place (not boxed): one reply costs no allocation here.
    fn deliver(
        &self,
        waiter: Self::Waiter,
        outcome: Arc<Outcome>,
    ) -> impl Future<Output = ()> + Send;
}

/// A [`Sink`] whose waiters are oneshot senders (tests, in-process callers).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChannelSink;

impl Sink for ChannelSink {
    type Waiter = oneshot::Sender<Arc<Outcome>>;

    fn deliver(
        &self,
        waiter: Self::Waiter,
        outcome: Arc<Outcome>,
    ) -> impl Future<Output = ()> + Send {
        // The receiver may be gone (caller stopped waiting); the answer is then dropped.
        let _ = waiter.send(outcome);
        std::future::ready(())
    }
}
