//! Running one job: the backend call of a request a worker took, bounded by its
//! deadline (`deadline − reply_margin`), its member's backend timeout, an abort
//! (cancel, supersede, end of the shutdown grace) and, with health on, a stall found by
//! the sweeper; then the one state transition that settles it.
//!
//! Invariants: when several ends are ready at once, an abort wins, then the backend's
//! answer, then a stall, then the deadline or timeout; a job ends in exactly one
//! transition (`finish` with its result, or `failover` after a stall, which hands the
//! request back for another member); the state lock is not held while the call runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use weir_protocol::llm::{ErrorBody, ErrorCode, ErrorDetails};

use super::{Inner, Sink, StreamOut, pool, streaming};
use crate::backend::{BackendErrorKind, BackendRequest};

/// Why a request is cancelled (queued) or its call aborted (running); a running call
/// whose abort sender is dropped unsent is aborted by the shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AbortReason {
    /// A cancel (by request id, or `Weir-Cancel-Session`).
    Cancelled,
    /// A later request of the same session superseded it (`Weir-Supersede: session`,
    /// with its request id, if any).
    Superseded { by: Option<String> },
}

/// A request handed to a worker.
pub(crate) struct Job {
    pub(crate) id: u64,
    /// The member of the pool it runs on.
    pub(crate) member: usize,
    /// How far the call got (pool with health on): written here, read by the sweeper.
    pub(crate) progress: Option<Arc<pool::Progress>>,
    pub(crate) request: BackendRequest,
    /// `deadline − reply_margin`: the call is aborted then.
    pub(crate) answer_by: Option<Instant>,
    pub(crate) started_at: Instant,
    /// Receipt → start.
    pub(crate) queue_time: Duration,
    pub(crate) abort: oneshot::Receiver<AbortReason>,
    /// Where the reply is streamed, for a streamed request.
    pub(crate) stream: Option<Arc<dyn StreamOut>>,
    /// A retry on another backend after a failover: a streamed one already got its
    /// `started` event and was counted as a stream.
    pub(crate) retry: bool,
    /// The request's `llm_request` span.
    pub(crate) span: tracing::Span,
}

impl<S: Sink> Inner<S> {
    /// Runs the job's backend call on its member, then settles the request: `finish`
    /// with the call's result, or `failover` if the call stalled.
    pub(super) async fn run_job(&self, job: Job) {
        let Job {
            id,
            member,
            progress,
            mut request,
            answer_by: deadline,
            started_at,
            queue_time,
            mut abort,
            stream,
            retry: again,
            span: _,
        } = job;
        let Some(backend) = self.backends.get(member % self.backends.len().max(1)) else {
            return;
        };
        // The backend call's own span, child of `llm_request` (the current span); its
        // context is what the backend receives as `traceparent`.
        let backend_span = tracing::info_span!("backend_call", backend = backend.name());
        request.trace = crate::trace::outgoing(&backend_span, request.trace.as_ref());
        // Failover on (a pool with health): the call keeps a copy of its request.
        let pool = &self.cfg.pool;
        let retry = (!pool.is_empty()).then(|| request.clone());
        let backend_timeout = pool
            .get(member)
            .map_or(self.cfg.backend_timeout, |p| p.timeout);
        let limit = CallLimit::new(started_at, deadline, backend_timeout);
        let failed_over = AtomicBool::new(false);
        let stall = stalled(progress.as_deref(), &failed_over);
        // Precedence when several are ready at once: an abort, then the backend's
        // answer, then a stall, then the deadline / backend timeout.
        let result = match stream {
            None => {
                let call = tracing::Instrument::instrument(
                    backend_span.in_scope(|| backend.call(request)),
                    backend_span,
                );
                tokio::select! {
                    biased;
                    reason = &mut abort => Err(aborted(reason)),
                    r = call => r.map_err(|e| backend_failure(&e, deadline)),
                    e = stall => Err(e),
                    _ = tokio::time::sleep_until(limit.at) => Err(limit.answer()),
                }
            }
            Some(out) => {
                let stop = async {
                    tokio::select! {
                        biased;
                        reason = &mut abort => aborted(reason),
                        e = stall => e,
                        _ = tokio::time::sleep_until(limit.at) => limit.answer(),
                    }
                };
                if !again {
                    self.stats.streams.add(1);
                    out.started(queue_time).await;
                }
                tracing::Instrument::instrument(
                    streaming::run_stream(
                        &**backend,
                        request,
                        &*out,
                        &self.stats,
                        self.cfg.stream,
                        started_at,
                        progress.as_deref(),
                        stop,
                    ),
                    backend_span,
                )
                .await
            }
        };
        // A stalled call is handed back (with its kept request), any other finished.
        let stalled = failed_over.load(Ordering::Relaxed);
        self.step(|st, now, fx| {
            let took = now.saturating_duration_since(started_at);
            match stalled {
                true => st.failover(id, retry, now, fx),
                false => st.finish(id, result, took, now, fx),
            }
        })
        .await;
    }
}

/// Where a running call is cut off: at the request's deadline (`answer_by`) or at its
/// member's backend timeout, whichever comes first.
struct CallLimit {
    /// The instant the call is dropped.
    at: Instant,
    /// The deadline comes first (or with the timeout): the answer is
    /// `deadline_exceeded`, else `backend_timeout`.
    deadline_first: bool,
    started_at: Instant,
    backend_timeout: Duration,
}

impl CallLimit {
    fn new(started_at: Instant, deadline: Option<Instant>, backend_timeout: Duration) -> Self {
        let backend_end = started_at + backend_timeout;
        let (at, deadline_first) = match deadline {
            Some(d) if d <= backend_end => (d, true),
            _ => (backend_end, false),
        };
        Self {
            at,
            deadline_first,
            started_at,
            backend_timeout,
        }
    }

    /// The answer of a call cut off at [`CallLimit::at`].
    fn answer(&self) -> ErrorBody {
        if self.deadline_first {
            ErrorBody::new(ErrorCode::DeadlineExceeded, DEADLINE_DURING_INFERENCE).with_details(
                ErrorDetails {
                    waited_ms: Some(weir_service::config::whole_ms(self.at - self.started_at)),
                    ..Default::default()
                },
            )
        } else {
            ErrorBody::new(
                ErrorCode::BackendTimeout,
                format!(
                    "backend did not answer within backend.timeout_ms ({} ms)",
                    self.backend_timeout.as_millis()
                ),
            )
        }
    }
}

/// The answer of a call aborted for `reason`; a dropped sender counts as the shutdown's
/// abort.
fn aborted(reason: Result<AbortReason, oneshot::error::RecvError>) -> ErrorBody {
    match reason {
        Ok(AbortReason::Cancelled) => ErrorBody::new(
            ErrorCode::Cancelled,
            "cancelled while running; backend call aborted",
        ),
        Ok(AbortReason::Superseded { by: Some(by) }) => ErrorBody::new(
            ErrorCode::Cancelled,
            format!(
                "superseded by request {by} of the same session while running; backend call aborted"
            ),
        ),
        Ok(AbortReason::Superseded { by: None }) => ErrorBody::new(
            ErrorCode::Cancelled,
            "superseded by a later request of the same session while running; backend call aborted",
        ),
        _ => ErrorBody::new(
            ErrorCode::ShuttingDown,
            "shutdown grace period ended; backend call aborted",
        ),
    }
}

/// A stall found by the sweeper (pool with health; never without `progress`): resolves
/// once the call is told to fail over, after setting `failed_over`, so that the call is
/// dropped and the request handed back for a failover.
async fn stalled(progress: Option<&pool::Progress>, failed_over: &AtomicBool) -> ErrorBody {
    match progress {
        Some(p) => p.failed_over().await,
        None => std::future::pending().await,
    }
    failed_over.store(true, Ordering::Relaxed);
    ErrorBody::new(
        ErrorCode::BackendError,
        "backend stalled (no reply bytes) and was ejected; call aborted",
    )
}

/// The message of a call aborted (or timed out) at its deadline.
const DEADLINE_DURING_INFERENCE: &str = "deadline passed during inference; backend call aborted";

/// The answer for a failed backend call.
pub(crate) fn backend_failure(
    e: &crate::backend::BackendError,
    deadline: Option<Instant>,
) -> ErrorBody {
    match e.kind() {
        // A backend that bounds its call by the remaining budget (the NATS backend)
        // times out at the deadline: that is the deadline's doing.
        BackendErrorKind::Timeout if deadline.is_some_and(|d| Instant::now() >= d) => {
            ErrorBody::new(ErrorCode::DeadlineExceeded, DEADLINE_DURING_INFERENCE)
        }
        BackendErrorKind::Timeout => ErrorBody::new(ErrorCode::BackendTimeout, e.to_string()),
        // The backend's own overload: retryable after its `Retry-After` (kept as
        // `backend_error` so that callers built before the distinction still match).
        BackendErrorKind::Overloaded => ErrorBody::new(ErrorCode::BackendError, e.to_string())
            .with_details(ErrorDetails {
                retry_after_ms: e.retry_after().map(weir_service::config::whole_ms),
                backend_status: e.status(),
                ..Default::default()
            }),
        BackendErrorKind::TooLarge | BackendErrorKind::Failed | BackendErrorKind::Unavailable => {
            ErrorBody::new(ErrorCode::BackendError, e.to_string()).with_details(ErrorDetails {
                backend_status: e.status(),
                limit: e.limit(),
                ..Default::default()
            })
        }
    }
}
