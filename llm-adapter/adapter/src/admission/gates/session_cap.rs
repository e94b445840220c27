//! The per-session pending cap (`session.pending_cap`): at most `cap` admitted,
//! unsettled requests per session; one more is refused `session_queue_full`.
//!
//! Invariant: a session's count is the number of its entries holding a
//! [`SlotGuard`] from [`SessionCap::acquire`]; the guard is dropped when the entry
//! retires, so the count goes down exactly once per admitted request.

use std::num::NonZeroUsize;

use weir_protocol::llm::{ErrorCode, ErrorDetails};

use super::{Ask, Gate, RULE_SESSION_CAP, Refusal, refusal, retry_after};
use crate::admission::slots::{SlotGuard, SlotTable};

/// The per-session pending cap and the slots it counts.
pub(crate) struct SessionCap {
    cap: Option<NonZeroUsize>,
    slots: SlotTable,
}

impl SessionCap {
    pub(crate) fn new(cap: Option<NonZeroUsize>) -> Self {
        Self {
            cap,
            slots: SlotTable::default(),
        }
    }

    /// Takes a slot of `session` for an admitted request (`None` without a session or
    /// a cap).
    pub(crate) fn acquire(&self, session: Option<&str>) -> Option<SlotGuard> {
        match (session, self.cap) {
            (Some(s), Some(_)) => Some(self.slots.acquire(s)),
            _ => None,
        }
    }

    /// The slots (limits view, totals, invariants).
    pub(crate) fn slots(&self) -> &SlotTable {
        &self.slots
    }
}

impl Gate for SessionCap {
    type Input<'a> = &'a Ask<'a>;
    type Pass = ();

    fn check(&self, ask: &Ask<'_>) -> Result<(), Refusal> {
        let (Some(s), Some(cap)) = (&ask.sub.session, self.cap) else {
            return Ok(());
        };
        let pending = self.slots.in_use(s);
        if pending < cap.get() {
            return Ok(());
        }
        let key = format!("session:{s}");
        let body = refusal(
            ErrorCode::SessionQueueFull,
            format!("session has {pending} pending requests (limit {cap})"),
            ErrorDetails {
                limit: Some(cap.get() as u64),
                pending: Some(pending as u64),
                retry_after_ms: retry_after(ask.hint, 1.0),
                key: Some(key.clone()),
                ..Default::default()
            },
        );
        Err(Refusal::unless_shadow(RULE_SESSION_CAP, Some(key), body))
    }
}
