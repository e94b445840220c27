//! The transitions driven from outside the admission path: a worker takes the next
//! ready request ([`State::start_next`], which checks the start budget under the same
//! lock that marks it Running) and settles it ([`State::finish`], which feeds the
//! estimator); a cancel and shutdown answer queued requests and abort running ones.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::{ErrorBody, ErrorCode};

use super::{Effects, Stage, State};
use crate::admission::gates::{Gate, after_wait, shutting_down};
use crate::admission::pool::Progress;
use crate::admission::{AbortReason, CancelResult, Job};
use crate::backend::BackendReply;
use crate::trace::{TraceKind, ms};

impl<W> State<W> {
    /// Hands the next ready request bound to `member` to one of its workers, answering
    /// the ones whose deadline passed (or that could no longer finish in time) on the
    /// way. An ejected member starts nothing; one due for its probe starts one.
    pub(crate) fn start_next(
        &mut self,
        member: usize,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> Option<Job> {
        let m = self.pool.members.get(member)?;
        if !m.routable() {
            return None;
        }
        let estimate = m.estimator.estimate();
        while let Some((_, id)) = self.pool.members[member].ready.pop_first() {
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            if !matches!(e.stage, Stage::Ready(_)) {
                continue;
            }
            if let Some(queued) = e.queued(now, estimate)
                && let Err(r) = self.start_budget.check(&queued)
            {
                self.count(&r);
                self.retire(id, Err(*r.body), now, fx);
                self.run(now, fx);
                continue;
            }
            self.pool.starting(member, id);
            // The sweeper looks for stalls: one more call to watch.
            fx.timers_changed |= self.pool.health_on;
            return self.start(id, now);
        }
        None
    }

    /// Marks ready entry `id` Running and makes its job.
    fn start(&mut self, id: u64, now: Instant) -> Option<Job> {
        let e = self.entries.get_mut(&id)?;
        e.stage = Stage::Running;
        e.started_at = Some(now);
        e.stage_since = now;
        let (tx, rx) = oneshot::channel();
        e.abort = Some(tx);
        let progress = (self.pool.health_on).then(|| Arc::new(Progress::new(now)));
        e.progress = progress.clone();
        let queue_time = now.saturating_duration_since(e.received_at);
        let retry = e.failed_over;
        if !retry {
            self.stats.priority.started(e.priority, queue_time);
        }
        if let Some(k) = e.order.take() {
            self.deadline.leave(k);
        }
        if let Some(t) = e.deadline_timer.take() {
            self.timers.remove(&t);
        }
        let m = &mut self.pool.members[e.member];
        m.queued -= 1;
        m.running_since.insert(id, now);
        // A retry after a failover was counted when it first started (the move is
        // counted in `weir_llm_backend_failovers_total`).
        let late = e.deadline.is_some_and(|d| now >= d);
        self.stats.started(queue_time, late, retry);
        self.stream_queued.remove(&id);
        let job = Job {
            id,
            member: e.member,
            progress,
            request: e.request.take()?,
            answer_by: e.answer_by,
            started_at: now,
            queue_time,
            abort: rx,
            stream: e.stream.clone(),
            retry,
            span: e.span.clone(),
        };
        self.emit(TraceKind::Started, &self.entries[&id], now, |ev| {
            ev.waited_ms = Some(ms(queue_time));
        });
        Some(job)
    }

    /// Whether a worker of `member` has anything to pick.
    pub(crate) fn has_ready(&self, member: usize) -> bool {
        self.pool
            .members
            .get(member)
            .is_some_and(|m| !m.ready.is_empty() && m.routable())
    }

    /// Feeds the estimator with a finished call: `ok` and the calls ended by a deadline
    /// or the backend timeout (those are lower bounds of the service time, and a slow
    /// backend shows up only through them). Failures, cancels and shutdown aborts say
    /// nothing about how long an answer takes.
    fn observe(&mut self, member: usize, took: Duration, code: &str, fx: &mut Effects<W>) {
        let counts = code == "ok"
            || code == ErrorCode::DeadlineExceeded.as_str()
            || code == ErrorCode::BackendTimeout.as_str();
        if !counts {
            return;
        }
        let Some(m) = self.pool.members.get_mut(member) else {
            return;
        };
        let cold = m.estimator.estimate().is_none();
        m.estimator.observe(took);
        if cold && self.start_budget.adaptive() {
            // First estimate: the queued requests' timers move to `answer_by − estimate`.
            for id in self.queued_ids() {
                if self.entries.get(&id).is_some_and(|e| e.member == member) {
                    self.arm_deadline(id, fx);
                }
            }
        }
    }

    /// Settles a running request with the backend's result.
    pub(crate) fn finish(
        &mut self,
        id: u64,
        mut result: Result<BackendReply, ErrorBody>,
        took: Duration,
        now: Instant,
        fx: &mut Effects<W>,
    ) {
        let code = result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok");
        self.stats.inference_done(took, code);
        if let Some(e) = self.entries.get(&id) {
            let (member, session) = (e.member, e.session.clone());
            if let (Ok(reply), Some(m)) = (&mut result, self.pool.members.get(member)) {
                name_backend(reply, &m.backend.name);
            }
            self.observe(member, took, code, fx);
            self.call_ended(member, id, code, session.as_deref(), now, fx);
        }
        self.retire(id, result, now, fx);
        self.run(now, fx);
    }

    // ------------------------------------------------------------ cancellation

    /// Cancels the request with `request_id`: a queued one is answered `cancelled` now,
    /// a running one is told to abort (its worker answers `cancelled`).
    pub(crate) fn cancel(
        &mut self,
        request_id: &str,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> CancelResult {
        let Some(&id) = self.by_request_id.get(request_id) else {
            return CancelResult::NotFound;
        };
        let Some(e) = self.entries.get_mut(&id) else {
            return CancelResult::NotFound;
        };
        if e.stage == Stage::Running {
            if let Some(tx) = e.abort.take() {
                let _ = tx.send(AbortReason::Cancelled);
            }
            return CancelResult::Running;
        }
        let waited = now.saturating_duration_since(e.received_at);
        let err = after_wait(ErrorCode::Cancelled, "cancelled while queued", waited);
        self.retire(id, Err(err), now, fx);
        self.run(now, fx);
        CancelResult::Queued
    }

    // ---------------------------------------------------------------- shutdown

    /// Stops admitting and answers every queued request `shutting_down`.
    pub(crate) fn begin_shutdown(&mut self, now: Instant, fx: &mut Effects<W>) -> usize {
        self.shutting_down = true;
        let queued = self.queued_ids();
        let n = queued.len();
        for id in queued {
            self.retire(id, Err(shutting_down()), now, fx);
            self.run(now, fx);
        }
        n
    }

    /// Tells every running request to abort with `shutting_down` (its abort sender
    /// dropped); returns how many.
    pub(crate) fn abort_running(&mut self) -> usize {
        (self.entries.values_mut())
            .filter(|e| e.stage == Stage::Running)
            .filter_map(|e| e.abort.take())
            .count()
    }
}

/// Puts `Weir-Backend: <name>` on a successful reply (replacing one the backend sent):
/// the caller sees which backend served it.
fn name_backend(reply: &mut BackendReply, name: &str) {
    use weir_protocol::llm::headers::BACKEND;
    reply
        .headers
        .retain(|(n, _)| !n.eq_ignore_ascii_case(BACKEND));
    reply.headers.push((BACKEND.to_owned(), name.to_owned()));
}
