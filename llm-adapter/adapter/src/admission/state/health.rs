//! Health of the pool's backends, and failover (`admission/pool.rs`; on with
//! `[[backends]]`, off for a single `[backend]`).
//!
//! - Passive signals: `eject_after_errors` consecutive failed calls (backend errors
//!   and timeouts), or a *stall*: a running call with no reply byte for
//!   `stall_factor` × its backend's estimate (at least `stall_floor`). The sweeper
//!   checks stalls at its timer ([`State::next_health_wake`]): no task per request.
//! - An ejected member takes nothing for its back-off (doubled by each failed probe,
//!   up to `backoff_max`); then the next request routed to it (or the first queued
//!   there) is its probe, and the probe's success re-admits it.
//! - Failover: at ejection the queued requests bound to it are bound to another
//!   member with the same order key (their place in the deadline order is kept); its
//!   stalled calls are aborted, and a unary one (or a streamed one that sent no chunk
//!   yet) goes back to the queue on another member, in its old place, if its deadline
//!   still allows; a streamed one that sent chunks ends with a clear `backend_error`.
//!
//! Invariants: a request is still answered exactly once (a failover moves an entry,
//! it never retires it); the entries stay bounded by `queue_capacity + workers`.

use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::{ErrorBody, ErrorCode};

use super::{Effects, Stage, State};
use crate::admission::gates::deadline::{global_start, running_left};
use crate::admission::gates::shutting_down;
use crate::admission::pool::{Health, Member, bit};
use crate::backend::BackendRequest;

/// Wakes the workers of `m` (member `b`) for what is ready there (its workers slept
/// while it could start nothing).
fn wake_if_ready<W>(m: &Member, b: usize, fx: &mut Effects<W>) {
    if !m.ready.is_empty() {
        fx.ready_added += m.ready.len();
        fx.ready_on |= bit(b);
    }
}

impl<W> State<W> {
    /// A call on `member` ended with `code`: the health signals and the affinity.
    pub(super) fn call_ended(
        &mut self,
        member: usize,
        id: u64,
        code: &str,
        session: Option<&str>,
        now: Instant,
        fx: &mut Effects<W>,
    ) {
        if !self.pool.health_on {
            return;
        }
        let limit = self.pool.health.eject_after_errors;
        let base = self.pool.health.backoff_base;
        let Some(m) = self.pool.members.get_mut(member) else {
            return;
        };
        let probe = m.health == Health::Probing { id };
        let ejected = matches!(m.health, Health::Ejected { .. });
        let failed =
            code == ErrorCode::BackendError.as_str() || code == ErrorCode::BackendTimeout.as_str();
        if code == "ok" {
            m.failures = 0;
            if probe {
                m.health = Health::Healthy;
                m.backoff = base;
                tracing::info!(backend = %m.backend.name, "backend re-admitted: its probe succeeded");
                wake_if_ready(m, member, fx);
                self.rescue_stranded(now, fx);
            }
            if let Some(s) = session {
                self.pool.served(s, member);
            }
        } else if failed {
            m.failures = m.failures.saturating_add(1);
            if !ejected && (probe || m.failures >= limit) {
                self.eject(member, now, fx);
            }
        } else if probe {
            // Cancelled, or its deadline: says nothing of the backend; probe again.
            m.health = Health::ProbeDue;
            wake_if_ready(m, member, fx);
        }
    }

    /// Ejects `member` for its back-off (the next one twice as long) and moves its
    /// queued requests away.
    fn eject(&mut self, member: usize, now: Instant, fx: &mut Effects<W>) {
        let max = self.pool.health.backoff_max;
        let m = &mut self.pool.members[member];
        let until = now + m.backoff;
        tracing::warn!(
            backend = %m.backend.name,
            backoff_ms = m.backoff.as_millis() as u64,
            failures = m.failures,
            "backend ejected"
        );
        m.health = Health::Ejected { until };
        m.backoff = m.backoff.saturating_mul(2).min(max);
        m.failures = 0;
        m.ejections += 1;
        fx.timers_changed = true;
        self.rebind_queued(member, now, fx);
    }

    /// The best other member for a request moved off `from` at `now`: routable, the
    /// lowest weight, then the soonest predicted finish (everything queued there
    /// counted ahead).
    fn failover_target(&self, from: usize, now: Instant) -> Option<usize> {
        let score = |(b, m): (usize, &Member)| {
            let busy = m.health == Health::ProbeDue && m.queued + m.running() > 0;
            if b == from || !m.routable() || busy {
                return None;
            }
            let e = m.estimator.estimate().map_or(0.0, |d| d.as_secs_f64());
            let left = running_left(&m.running_since, e, now);
            let start = global_start(m.backend.slots.get(), m.running(), m.queued, e, left);
            let finish = Duration::try_from_secs_f64(start + e).ok()?;
            Some(((m.backend.weight, finish), b))
        };
        (self.pool.members.iter().enumerate())
            .filter_map(score)
            .min()
            .map(|(_, b)| b)
    }

    /// Binds every queued request of `from` to another member, keeping its order key.
    fn rebind_queued(&mut self, from: usize, now: Instant, fx: &mut Effects<W>) {
        let ids: Vec<u64> = (self.entries.values())
            .filter(|e| e.member == from && e.stage != Stage::Running)
            .map(|e| e.id)
            .collect();
        for id in ids {
            let Some(to) = self.failover_target(from, now) else {
                return;
            };
            self.move_queued(id, from, to, fx);
        }
    }

    /// A member came back: the requests left queued on ejected members (none was
    /// routable when those were ejected) move to the routable ones.
    fn rescue_stranded(&mut self, now: Instant, fx: &mut Effects<W>) {
        let stranded: Vec<usize> = (self.pool.members.iter().enumerate())
            .filter(|(_, m)| matches!(m.health, Health::Ejected { .. }) && m.queued > 0)
            .map(|(b, _)| b)
            .collect();
        for b in stranded {
            self.rebind_queued(b, now, fx);
        }
    }

    /// Moves queued entry `id` from member `from` to `to`, in the same place.
    fn move_queued(&mut self, id: u64, from: usize, to: usize, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.member = to;
        self.pool.members[from].queued -= 1;
        self.pool.members[from].failovers += 1;
        self.pool.members[to].queued += 1;
        if let Stage::Ready(k) = e.stage {
            self.pool.members[from].ready.remove(&k);
            self.pool.members[to].ready.insert(k, id);
            fx.ready_added += 1;
            fx.ready_on |= bit(to);
        }
        if let Some(k) = e.order {
            self.deadline.rebind(k, to);
        }
        // Its start budget follows its new member's estimate.
        self.arm_deadline(id, fx);
    }

    /// Ends the back-offs that are over, and finds stalled calls: their member is
    /// ejected and they are aborted for a failover.
    pub(super) fn health_pass(&mut self, now: Instant, fx: &mut Effects<W>) {
        if !self.pool.health_on {
            return;
        }
        for (b, m) in self.pool.members.iter_mut().enumerate() {
            if let Health::Ejected { until } = m.health
                && until <= now
            {
                m.health = Health::ProbeDue;
                wake_if_ready(m, b, fx);
            }
        }
        let stalled: Vec<(usize, u64)> = (self.stall_times(now))
            .filter(|(.., at)| *at <= now)
            .map(|(b, id, _)| (b, id))
            .collect();
        for (b, id) in stalled {
            if !matches!(self.pool.members[b].health, Health::Ejected { .. }) {
                self.eject(b, now, fx);
            }
            if let Some(p) = self.entries.get(&id).and_then(|e| e.progress.as_ref()) {
                p.fail_over();
            }
        }
    }

    /// Each running call watched for a stall (with health on, an estimate, and not
    /// told to fail over yet): its member, its id, and when it becomes a stall.
    fn stall_times(&self, now: Instant) -> impl Iterator<Item = (usize, u64, Instant)> + '_ {
        (self.pool.members.iter().enumerate()).flat_map(move |(b, m)| {
            let after = self.pool.stall_after(b);
            m.running_since.keys().filter_map(move |id| {
                let p = self.entries.get(id)?.progress.as_ref()?;
                Some((b, *id, p.last(now) + after?)).filter(|_| !p.failing_over())
            })
        })
    }

    /// The earliest instant [`State::health_pass`] has work: a back-off ending, or a
    /// running call becoming a stall.
    pub(super) fn next_health_wake(&self) -> Option<Instant> {
        if !self.pool.health_on {
            return None;
        }
        let ejected = (self.pool.members.iter()).filter_map(|m| match m.health {
            Health::Ejected { until } => Some(until),
            _ => None,
        });
        // A call waiting for its caller is looked at again one stall period from now.
        let stalls = self.stall_times(Instant::now()).map(|(.., at)| at);
        ejected.chain(stalls).min()
    }

    /// A call aborted for a failover ended: back to the queue on another member in its
    /// old place if it can still be retried and its deadline allows, otherwise answered.
    pub(crate) fn failover(
        &mut self,
        id: u64,
        request: Option<BackendRequest>,
        now: Instant,
        fx: &mut Effects<W>,
    ) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        let from = e.member;
        let name = self.pool.members[from].backend.name.clone();
        // A cancel (or the end of the shutdown grace) that came meanwhile took the
        // abort channel: it wins.
        let told = e.abort.is_none();
        let sent = e.progress.as_ref().is_some_and(|p| p.sent());
        let target = self.failover_target(from, now);
        let fits = |to: usize| {
            let est = self.estimate_of(to).unwrap_or(Duration::ZERO);
            e.answer_by.is_none_or(|by| now + est <= by)
        };
        let err = match (sent, request, target) {
            _ if told && self.shutting_down => shutting_down(),
            _ if told => ErrorBody::new(
                ErrorCode::Cancelled,
                "cancelled while running; backend call aborted",
            ),
            // Shutting down: the other backends' workers may be gone already, so a
            // request moved there would never be answered.
            _ if self.shutting_down => shutting_down(),
            (false, Some(request), Some(to)) if fits(to) => {
                self.requeue(id, to, request, now, fx);
                return;
            }
            (true, _, _) => ErrorBody::new(
                ErrorCode::BackendError,
                format!("backend {name:?} stalled after the stream began; stream ended"),
            ),
            _ => ErrorBody::new(
                ErrorCode::DeadlineExceeded,
                format!("backend {name:?} stalled; no backend can finish it before the deadline"),
            ),
        };
        let took = e
            .started_at
            .map_or(Duration::ZERO, |s| now.saturating_duration_since(s));
        self.stats.inference_done(took, err.code.as_str());
        self.retire(id, Err(err), now, fx);
        self.run(now, fx);
    }

    /// Puts running entry `id` back in the queue, bound to `to`, in its old place.
    fn requeue(
        &mut self,
        id: u64,
        to: usize,
        request: BackendRequest,
        now: Instant,
        fx: &mut Effects<W>,
    ) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let from = std::mem::replace(&mut e.member, to);
        e.started_at = None;
        e.abort = None;
        e.progress = None;
        e.failed_over = true;
        e.request = Some(request);
        self.pool.members[from].running_since.remove(&id);
        self.pool.members[from].failovers += 1;
        self.pool.members[to].queued += 1;
        e.order = self.deadline.enter(e.place, e.answer_by, to);
        self.make_ready(id, now, fx);
        self.arm_deadline(id, fx);
    }
}
