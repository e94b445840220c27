//! Priority classes in the state machine (`admission/priority.rs` states the rules):
//! the class of a submission and its counts, a batch request's later place in the EDF
//! order, and the displacement of queued batch requests for interactive work.
//!
//! Invariants: a request is displaced only once the interactive request it makes room
//! for passed every check (`State::submit`), so nothing is displaced for a request
//! that is then refused; a displaced request is retired like any other (answered
//! once, its slots and token reservation released); only queued (not running) batch
//! requests are displaced, the one with the latest order key first.

use tokio::time::Instant;
use weir_protocol::llm::{ErrorCode, ErrorDetails};

use super::routing::Routed;
use super::{Effects, Stage, State};
use crate::admission::gates::deadline::ReadyKey;
use crate::admission::gates::{Ask, millis_ceil, refusal, retry_after};
use crate::admission::priority::Priority;
use crate::admission::{Admitted, Submission};
use crate::config::QueueOrder;
use weir_service::config::whole_ms as millis;

/// Why a batch request is displaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Displaced {
    /// The queue bound was full.
    Room,
    /// An interactive request ahead of which it was would not start in time.
    Deadline,
}

impl<W> State<W> {
    /// Admits, joins, answers from cache, or refuses one submission, and counts it
    /// under its priority class.
    pub(crate) fn submit(
        &mut self,
        sub: Submission,
        waiter: W,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> Admitted {
        let mut class = sub.priority.unwrap_or_default();
        let admitted = self.submit_as(sub, waiter, &mut class, now, fx);
        match admitted {
            Admitted::Refused(_) => self.stats.priority.refused(class),
            Admitted::Queued => self.stats.priority.admitted(class),
            Admitted::Joined | Admitted::Cached => {}
        }
        admitted
    }

    /// A new request of class `p` entered as entry `id`: a batch one is remembered
    /// (displacement, the prediction's view of the classes). It is counted as admitted
    /// by [`State::submit`], once it is queued (a key gate may still refuse it).
    pub(super) fn admitted_as(&mut self, id: u64, p: Priority) -> Priority {
        if p == Priority::Batch {
            self.batch.insert(id);
        }
        p
    }

    /// The due instant of a request of class `p` in the EDF order: a batch request's
    /// is `priority.batch_delay_ms` later (under FIFO nothing changes).
    pub(super) fn class_due(&self, due: Instant, p: Priority) -> Instant {
        match (p, self.cfg.queue_order) {
            (Priority::Batch, QueueOrder::Edf) => due + self.cfg.priority.batch_delay,
            _ => due,
        }
    }

    /// Whether a full queue admits this request anyway by displacing a queued batch
    /// request (an interactive request, and a batch request is queued).
    pub(super) fn may_displace_for_room(&self, ask: &Ask<'_>) -> bool {
        ask.priority == Priority::Interactive
            && self.queued() >= self.cfg.queue_capacity.get()
            && self.latest_batch(None, None).is_some()
    }

    /// Displaces what the admission of a new interactive request routed by `routed`
    /// needs: the batch requests ahead of it that its prediction counted
    /// (`placement.displace`), then, if the queue is still full, the latest queued
    /// batch request.
    pub(super) fn displace_for(&mut self, routed: &Routed, now: Instant, fx: &mut Effects<W>) {
        let before = Some(routed.placement.order);
        for _ in 0..routed.placement.displace {
            let Some(id) = self.latest_batch(Some(routed.member), before) else {
                break;
            };
            self.displace(id, Displaced::Deadline, now, fx);
        }
        // Called once the new request is queued: the bound is exceeded by it.
        if self.queued() > self.cfg.queue_capacity.get()
            && let Some(id) = self.latest_batch(None, None)
        {
            self.displace(id, Displaced::Room, now, fx);
        }
    }

    /// The queued batch request with the latest order key (bound to `member`, ordered
    /// before `before`, when given). Linear in the batch requests (bounded by
    /// `queue_capacity + workers`).
    fn latest_batch(&self, member: Option<usize>, before: Option<ReadyKey>) -> Option<u64> {
        (self.batch.iter())
            .filter_map(|id| self.entries.get(id))
            .filter(|e| e.stage != Stage::Running)
            .filter(|e| member.is_none_or(|m| e.member == m))
            .filter(|e| before.is_none_or(|b| e.place < b))
            .max_by_key(|e| e.place)
            .map(|e| e.id)
    }

    /// Answers queued batch request `id` at once, displaced by interactive work.
    fn displace(&mut self, id: u64, why: Displaced, now: Instant, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        let waited = now.saturating_duration_since(e.received_at);
        let (queued, workers) = (self.queued(), self.cfg.workers.get());
        let retry = retry_after(self.service_estimate(), queued as f64 / workers as f64);
        let body = match why {
            Displaced::Room => refusal(
                ErrorCode::QueueFull,
                format!(
                    "displaced by interactive work: the queue was full ({queued} requests, the \
                     capacity) and batch requests are refused first"
                ),
                ErrorDetails {
                    limit: Some(self.cfg.queue_capacity.get() as u64),
                    pending: Some(queued as u64),
                    waited_ms: Some(millis(waited)),
                    retry_after_ms: retry,
                    ..Default::default()
                },
            ),
            Displaced::Deadline => refusal(
                ErrorCode::DeadlineExceeded,
                "displaced by interactive work: an interactive request needed its place to \
                 start before its deadline, and batch requests are refused first"
                    .into(),
                ErrorDetails {
                    waited_ms: Some(millis(waited)),
                    budget_ms: e.deadline.map(|d| millis(d.saturating_duration_since(now))),
                    estimate_ms: self.estimate_of(e.member).map(millis_ceil),
                    retry_after_ms: retry,
                    ..Default::default()
                },
            ),
        };
        self.stats.priority.displaced(Priority::Batch);
        self.retire(id, Err(body), now, fx);
    }

    /// `batch` holds exactly the batch-class entries (tests).
    #[cfg(test)]
    pub(super) fn check_priority_invariants(&self) {
        for id in &self.batch {
            assert_eq!(self.entries[id].priority, Priority::Batch, "batch set");
        }
        let n = (self.entries.values())
            .filter(|e| e.priority == Priority::Batch)
            .count();
        assert_eq!(n, self.batch.len(), "every batch entry in the batch set");
    }
}
