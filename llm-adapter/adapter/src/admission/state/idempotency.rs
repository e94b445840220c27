//! Idempotency in `submit`: what makes two submissions with the same request id the
//! same request ([`Fingerprint`]), and the join of a live request or the answer from
//! the completion cache.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use super::{Effects, State};
use crate::admission::gates::conflict;
use crate::admission::{Admitted, Submission};
use crate::trace::TraceKind;

/// What makes two submissions with the same request id "the same request".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fingerprint {
    session: Option<String>,
    body_len: usize,
    body_hash: u64,
}

impl Fingerprint {
    pub(super) fn of(sub: &Submission) -> Self {
        let mut h = DefaultHasher::new();
        sub.body.hash(&mut h);
        Self {
            session: sub.session.clone(),
            body_len: sub.body.len(),
            body_hash: h.finish(),
        }
    }
}

impl<W> State<W> {
    /// Idempotency: joins a live request with the same request id, or answers from
    /// the completion cache (`Err` with what was done); otherwise gives the waiter back.
    pub(super) fn idempotent(
        &mut self,
        sub: &Submission,
        fingerprint: Option<&Fingerprint>,
        waiter: W,
        waited: Duration,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> Result<W, Admitted> {
        let (Some(fp), Some(rid)) = (fingerprint, &sub.request_id) else {
            return Ok(waiter);
        };
        if let Some(&id) = self.by_request_id.get(rid)
            && let Some(e) = self.entries.get_mut(&id)
        {
            if e.fingerprint.as_ref() != Some(fp) {
                return Err(fx.refuse_now(waiter, conflict(rid), sub, waited));
            }
            e.joined.push(waiter);
            self.stats.joined.add(1);
            // In the joiner's own span: its caller's trace shows that it joined.
            sub.span.record("id", id);
            let t = now.saturating_duration_since(self.entries[&id].received_at);
            self.emit_sub(sub, TraceKind::Joined, id, t, |_| {});
            return Err(Admitted::Joined);
        }
        if let Some(c) = self.cache.get(rid) {
            if c.fingerprint != *fp {
                return Err(fx.refuse_now(waiter, conflict(rid), sub, waited));
            }
            self.stats.cached.add(1);
            fx.deliveries.reserve_exact(1);
            fx.deliveries.push((waiter, c.outcome.clone()));
            self.emit_sub(sub, TraceKind::Cached, 0, waited, |_| {});
            return Err(Admitted::Cached);
        }
        Ok(waiter)
    }
}
