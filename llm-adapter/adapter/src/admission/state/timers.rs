//! Timers: a queued request's deadline timer (answered by its `answer_by`, or earlier
//! under the adaptive start budget) and a key-gate waiter's `max_wait`. One ordered set
//! holds them all; the sweeper task sleeps until the first one ([`State::next_wake`])
//! and calls [`State::expire`].
//!
//! Invariant: an entry's timers are in the set exactly while the entry refers to them
//! (`deadline_timer`, `gate_timer`); whoever clears the field removes the timer.

use std::time::Duration;

use tokio::time::Instant;

use super::{Effects, Entry, Stage, State};
use crate::admission::gates::key_limits::KeyAsk;
use crate::admission::gates::start_budget::{AtTimer, Queued};
use crate::trace::{TraceKind, ms};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum TimerKind {
    /// A queued request's deadline timer.
    Deadline,
    /// A key-gate waiter's `max_wait`.
    GateWait,
}

/// One timer: when, for which entry, of which kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Timer {
    pub(super) at: Instant,
    pub(super) id: u64,
    pub(super) kind: TimerKind,
}

impl<W> Entry<W> {
    /// The entry as the start budget sees it at `now`; `None` without a deadline.
    pub(super) fn queued(&self, now: Instant, estimate: Option<Duration>) -> Option<Queued> {
        Some(Queued {
            deadline: self.deadline?,
            answer_by: self.answer_by?,
            probe: self.probe,
            waited: now.saturating_duration_since(self.received_at),
            now,
            estimate,
        })
    }
}

impl<W> State<W> {
    /// (Re-)arms the deadline timer of a queued entry.
    pub(super) fn arm_deadline(&mut self, id: u64, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        let (Some(answer_by), old) = (e.answer_by, e.deadline_timer) else {
            return;
        };
        let at = self
            .start_budget
            .timer_at(answer_by, e.probe, self.estimate_of(e.member));
        let t = Timer {
            at,
            id,
            kind: TimerKind::Deadline,
        };
        if let Some(old) = old {
            self.timers.remove(&old);
        }
        if let Some(e) = self.entries.get_mut(&id) {
            e.deadline_timer = Some(t);
        }
        self.add_timer(t, fx);
    }

    pub(super) fn add_timer(&mut self, t: Timer, fx: &mut Effects<W>) {
        if self.timers.first().is_none_or(|first| t < *first) {
            fx.timers_changed = true;
        }
        self.timers.insert(t);
    }

    /// The earliest instant at which [`State::expire`] has work.
    pub(crate) fn next_wake(&self) -> Option<Instant> {
        [
            self.timers.first().map(|t| t.at),
            self.cache.next_expiry(),
            self.next_position_pass,
            self.next_health_wake(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Answers queued requests whose deadline passed and waiters whose `max_wait`
    /// elapsed; drops expired cache entries.
    pub(crate) fn expire(&mut self, now: Instant, fx: &mut Effects<W>) {
        self.cache.purge(now);
        self.position_pass(now, fx);
        self.health_pass(now, fx);
        while let Some(t) = self.timers.first().copied() {
            if t.at > now {
                break;
            }
            self.timers.remove(&t);
            match t.kind {
                TimerKind::Deadline => self.deadline_due(t.id, now, fx),
                TimerKind::GateWait => self.gate_wait_over(t.id, now, fx),
            }
            self.run(now, fx);
        }
    }

    /// A queued request's deadline timer fired: answered `deadline_exceeded` (the
    /// start budget), or looked at again later.
    fn deadline_due(&mut self, id: u64, now: Instant, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.deadline_timer = None;
        if e.stage == Stage::Running {
            return;
        }
        let member = e.member;
        let estimate = self.estimate_of(member);
        let Some(queued) = self.entries[&id].queued(now, estimate) else {
            return;
        };
        match self.start_budget.at_timer(&queued) {
            AtTimer::Refuse(r) => {
                self.count(&r);
                self.retire(id, Err(*r.body), now, fx);
            }
            AtTimer::Rearm => self.arm_deadline(id, fx),
        }
    }

    /// A key-gate waiter's `max_wait` elapsed: answered `concurrency_limit_exceeded`.
    fn gate_wait_over(&mut self, id: u64, now: Instant, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.gate_timer = None;
        let Stage::Gate(gate) = e.stage else {
            return;
        };
        let waited = now.saturating_duration_since(e.stage_since);
        let Some(Some(key)) = e.keys.get(gate).cloned() else {
            return;
        };
        let ask = KeyAsk {
            gate,
            key: &key,
            hint: self.service_estimate(),
        };
        let r = self.keys.wait_expired(&ask, waited);
        self.count(&r);
        let name = self.keys.limit(gate).name.clone();
        self.emit(TraceKind::SlotBusy, &self.entries[&id], now, |ev| {
            ev.rule = Some(name);
            ev.key = Some(key.clone());
            ev.waited_ms = Some(ms(waited));
        });
        self.retire(id, Err(*r.body), now, fx);
    }
}
