//! Per-session ordering (`session.ordering`): one request of a session is active (at a
//! key gate, ready or running), the others wait behind it in FIFO order. A request that
//! asked for `reject` (`Weir-Admission: reject`) is refused at once while its session
//! is busy.
//!
//! Invariants: a session is kept only while it has an active request; its FIFO holds
//! only requests at the session stage; when the active request retires, the head of the
//! FIFO becomes active (and goes on to the key gates), so a session never has a waiting
//! request and no active one.

use std::collections::{HashMap, VecDeque};

use weir_protocol::llm::{AdmissionPolicy, ErrorCode, ErrorDetails};

use super::{Ask, Gate, RULE_SESSION_ORDER, Refusal, refusal, retry_after};

/// The order of one session.
#[derive(Default)]
pub(crate) struct Order {
    pub(crate) active: Option<u64>,
    pub(crate) fifo: VecDeque<u64>,
}

/// Per-session ordering.
pub(crate) struct SessionOrder {
    enabled: bool,
    sessions: HashMap<String, Order>,
}

impl SessionOrder {
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            sessions: HashMap::new(),
        }
    }

    /// An admitted request of `session` enters: it becomes the active request, or waits
    /// behind it (`true`).
    pub(crate) fn enter(&mut self, session: Option<&str>, id: u64) -> bool {
        let (true, Some(s)) = (self.enabled, session) else {
            return false;
        };
        let order = self.sessions.entry(s.to_owned()).or_default();
        if order.active.is_some() {
            order.fifo.push_back(id);
            true
        } else {
            order.active = Some(id);
            false
        }
    }

    /// A request waiting behind its session leaves (answered while waiting).
    pub(crate) fn leave_waiting(&mut self, session: Option<&str>, id: u64) {
        if let Some(s) = session
            && let Some(order) = self.sessions.get_mut(s)
            && let Some(pos) = order.fifo.iter().position(|x| *x == id)
        {
            order.fifo.remove(pos);
        }
    }

    /// Request `id` of `session` retired: if it was the active one, the next request of
    /// the session becomes active and is returned.
    pub(crate) fn release(&mut self, session: Option<&str>, id: u64) -> Option<u64> {
        if !self.enabled {
            return None;
        }
        let s = session?;
        let order = self.sessions.get_mut(s)?;
        let mut next = None;
        if order.active == Some(id) {
            order.active = order.fifo.pop_front();
            next = order.active;
        }
        if order.active.is_none() && order.fifo.is_empty() {
            self.sessions.remove(s);
        }
        next
    }

    /// The active request of `session` and how many wait behind it (ordering on and
    /// the session busy).
    pub(crate) fn busy(&self, session: Option<&str>) -> Option<(u64, usize)> {
        if !self.enabled {
            return None;
        }
        let o = self.sessions.get(session?)?;
        o.active.map(|a| (a, o.fifo.len()))
    }

    /// Every session with its order (limits view, invariants).
    pub(crate) fn sessions(&self) -> impl Iterator<Item = (&String, &Order)> {
        self.sessions.iter()
    }
}

impl Gate for SessionOrder {
    type Input<'a> = &'a Ask<'a>;
    type Pass = ();

    fn check(&self, ask: &Ask<'_>) -> Result<(), Refusal> {
        if ask.sub.policy != AdmissionPolicy::Reject {
            return Ok(());
        }
        let Some((_, waiting)) = self.busy(ask.sub.session.as_deref()) else {
            return Ok(());
        };
        let s = ask.sub.session.as_deref().unwrap_or_default();
        let waiting = waiting as u64;
        let body = refusal(
            ErrorCode::ConcurrencyLimitExceeded,
            "session is busy and the request asked for `reject`".into(),
            ErrorDetails {
                limit: Some(1),
                in_flight: Some(1),
                waiting: Some(waiting),
                retry_after_ms: retry_after(ask.hint, waiting as f64 + 1.0),
                key: Some(format!("session:{s}")),
                ..Default::default()
            },
        );
        Err(Refusal::unless_shadow(RULE_SESSION_ORDER, None, body))
    }
}
