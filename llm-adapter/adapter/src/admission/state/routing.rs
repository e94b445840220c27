//! Routing a new request over the backend pool (`admission/pool.rs`): the deadline
//! prediction of [`crate::admission::gates::deadline`] is made once per member — its
//! queue ahead of the request, its slots, its estimate — and the request is bound to
//! the member where it is predicted to start and finish in time, preferring:
//! 1. the member that served its session's last turn, if in time there (affinity; a
//!    request sent elsewhere because it was not is a counted *spill*);
//! 2. a member due for its health probe, if in time there;
//! 3. the lowest `weight`, then the soonest predicted finish, then the least occupied.
//!
//! A prediction that only admits as a *probe* (an idle member predicted too slow) is
//! taken only when no member is in time. It is refused at once only if no member can
//! make it (the refusal with the shortest `retry_after_ms` is given), or if every
//! member is ejected.
//!
//! With one member this is exactly the single-backend prediction.

use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::llm::{ErrorCode, ErrorDetails};

use super::State;
use crate::admission::gates::deadline::{Load, Placement};
use crate::admission::gates::{Ask, Gate, Refusal, refusal};
use crate::admission::pool::Health;

/// Where routing put a new request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Routed {
    pub(crate) placement: Placement,
    /// The member it is bound to.
    pub(crate) member: usize,
    /// The member that served its session's last turn, when it missed the deadline
    /// there and was sent here (a spill).
    pub(crate) spilled_from: Option<usize>,
}

/// Lower is better: probe-only last, then displacing batch work (fewest displaced
/// first), a due probe first, then weight, predicted finish, occupancy (per mille of
/// the slots) and configuration order.
type Score = (bool, usize, bool, u32, Duration, usize, usize);

impl<W> State<W> {
    /// What the predictor sees on member `b` for a new request (admission id `id`,
    /// due at `due`).
    pub(super) fn load_on(&self, b: usize, id: u64, due: Instant, ask: &Ask<'_>) -> Load<'_> {
        let m = &self.pool.members[b];
        Load {
            member: b,
            workers: m.backend.slots.get(),
            estimate: m.estimator.estimate(),
            queued: m.queued,
            running: m.running(),
            ready: m.ready.len(),
            running_since: &m.running_since,
            members: &self.pool.members,
            sessions: &self.session_order,
            keys: &self.keys,
            shadow: self.shadow(),
            id,
            due,
            priority: ask.priority,
            batch: &self.batch,
        }
    }

    /// Binds a new request to a member, or refuses it (see the module docs).
    pub(super) fn route(&self, ask: &Ask<'_>, id: u64, due: Instant) -> Result<Routed, Refusal> {
        let members = &self.pool.members;
        let last = (members.len() > 1)
            .then(|| self.pool.last_of(ask.sub.session.as_deref()))
            .flatten();
        let mut best: Option<(Score, Routed)> = None;
        let mut refused: Option<Refusal> = None;
        for (b, m) in members.iter().enumerate() {
            let due_probe = m.health == Health::ProbeDue;
            // A member due for its probe takes one request, not a queue of them.
            if !m.routable() || (due_probe && m.queued + m.running() > 0) {
                continue;
            }
            let load = self.load_on(b, id, due, ask);
            let placement = match self.deadline.check((ask, load, self.epoch)) {
                Ok(p) => p,
                Err(r) => {
                    if refused.as_ref().is_none_or(|old| retry(&r) < retry(old)) {
                        refused = Some(r);
                    }
                    continue;
                }
            };
            let routed = Routed {
                placement,
                member: b,
                spilled_from: None,
            };
            if Some(b) == last && !placement.probe && placement.displace == 0 {
                return Ok(routed);
            }
            let occupancy = (m.queued + m.running()).saturating_mul(1000) / m.backend.slots.get();
            let score = (
                placement.probe,
                placement.displace,
                !due_probe,
                m.backend.weight,
                placement.finish.unwrap_or(Duration::ZERO),
                occupancy,
                b,
            );
            if best.as_ref().is_none_or(|(s, _)| score < *s) {
                best = Some((score, routed));
            }
        }
        match best {
            Some((_, mut routed)) => {
                routed.spilled_from = last.filter(|l| *l != routed.member);
                Ok(routed)
            }
            None => Err(refused.unwrap_or_else(|| self.all_ejected(ask.now))),
        }
    }

    /// The refusal when every member is ejected: `backend_error`, retry after the
    /// first back-off ends.
    fn all_ejected(&self, now: Instant) -> Refusal {
        let first = (self.pool.members.iter())
            .filter_map(|m| match m.health {
                Health::Ejected { until } => Some(until.saturating_duration_since(now)),
                _ => None,
            })
            .min()
            .unwrap_or(Duration::ZERO);
        let ms = crate::admission::gates::millis_ceil(first).max(1);
        Refusal::uncounted(refusal(
            ErrorCode::BackendError,
            format!(
                "every backend of the pool is ejected (unhealthy); the first is probed again in {ms} ms"
            ),
            ErrorDetails {
                retry_after_ms: Some(ms),
                ..Default::default()
            },
        ))
    }
}

/// A refusal's retry hint (the shortest is the one given).
fn retry(r: &Refusal) -> u64 {
    r.body.details.retry_after_ms.unwrap_or(u64::MAX)
}
