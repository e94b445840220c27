//! The start budget: a queued request is answered `deadline_exceeded` as soon as less
//! than the start budget is left before its `answer_by` (`deadline − reply_margin`),
//! and is never started then. The budget is `deadline.min_start_budget_ms` if set,
//! otherwise the backend's service-time estimate (the adaptive start budget, from
//! which probes are exempt).
//!
//! Invariants:
//! - a request is never started once its deadline has passed: the start check runs
//!   under the same lock that marks it Running;
//! - a queued request is answered by its `answer_by` (its deadline timer is never
//!   later), and under the adaptive start budget as soon as less than the estimate is
//!   left — so every refusal leaves before the deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Gate, RULE_START_BUDGET, Refusal, millis_ceil, not_started};
use crate::admission::AdmissionConfig;
use weir_service::config::whole_ms as millis;

/// The start budget.
pub(crate) struct StartBudget {
    cfg: Arc<AdmissionConfig>,
}

/// A queued request with a deadline, looked at `now`.
pub(crate) struct Queued {
    pub(crate) deadline: Instant,
    /// `deadline − reply_margin`.
    pub(crate) answer_by: Instant,
    pub(crate) probe: bool,
    /// Since receipt.
    pub(crate) waited: Duration,
    pub(crate) now: Instant,
    /// The service-time estimate.
    pub(crate) estimate: Option<Duration>,
}

/// What a queued request's deadline timer finds.
pub(crate) enum AtTimer {
    /// Answer it.
    Refuse(Refusal),
    /// The estimate came down since the timer was set: look again later.
    Rearm,
}

impl StartBudget {
    pub(crate) fn new(cfg: Arc<AdmissionConfig>) -> Self {
        Self { cfg }
    }

    /// Whether the start budget follows the estimate (`min_start_budget_ms` unset).
    pub(crate) fn adaptive(&self) -> bool {
        self.cfg.deadline.min_start_budget.is_none()
    }

    /// When a queued request must be looked at again: just after `answer_by −
    /// estimate` under the adaptive start budget (probes and cold start: `answer_by`).
    /// The extra millisecond makes the timer agree with the start check (`left <
    /// estimate` refuses): a worker free at exactly `answer_by − estimate` starts it.
    pub(crate) fn timer_at(
        &self,
        answer_by: Instant,
        probe: bool,
        estimate: Option<Duration>,
    ) -> Instant {
        match estimate {
            Some(est) if self.adaptive() && !probe => answer_by
                .checked_sub(est)
                .map_or(answer_by, |t| (t + Duration::from_millis(1)).min(answer_by)),
            _ => answer_by,
        }
    }

    /// A queued request's deadline timer fired.
    pub(crate) fn at_timer(&self, q: &Queued) -> AtTimer {
        let (d, by, now) = (q.deadline, q.answer_by, q.now);
        let left = by.saturating_duration_since(now);
        let margin = millis(self.cfg.deadline.reply_margin);
        let (rule, message) = if by <= now {
            let message = if d <= now {
                "deadline passed while queued; not started".to_owned()
            } else {
                format!(
                    "still queued within the reply margin ({margin} ms) of the deadline; not started"
                )
            };
            (None, message)
        } else if let Some(est) = q.estimate.filter(|_| self.adaptive() && !q.probe)
            && left < est
        {
            let message = format!(
                "still queued with {} ms left (reply margin {margin} ms), less than the service-time estimate ({} ms); not started",
                millis(d.saturating_duration_since(now)),
                millis_ceil(est)
            );
            (Some(RULE_START_BUDGET), message)
        } else {
            return AtTimer::Rearm;
        };
        let body = not_started(message, q.waited, Some(d), now, q.estimate);
        AtTimer::Refuse(match rule {
            Some(rule) => Refusal::always(rule, body),
            None => Refusal::uncounted(body),
        })
    }
}

impl Gate for StartBudget {
    type Input<'a> = &'a Queued;
    type Pass = ();

    /// The check at the start of inference.
    fn check(&self, q: &Queued) -> Result<(), Refusal> {
        let (d, by, now) = (q.deadline, q.answer_by, q.now);
        let left = by.saturating_duration_since(now);
        let margin = millis(self.cfg.deadline.reply_margin);
        let (min, what) = match self.cfg.deadline.min_start_budget {
            Some(m) => (Some(m), "deadline.min_start_budget_ms"),
            None if q.probe => (None, ""),
            None => (q.estimate, "the service-time estimate"),
        };
        let message = if d <= now {
            "deadline passed while queued; not started".to_owned()
        } else if by <= now {
            format!(
                "{} ms left, within the reply margin ({margin} ms); not started",
                millis(d - now)
            )
        } else if let Some(min) = min
            && left < min
        {
            format!(
                "{} ms left (reply margin {margin} ms), below {what} ({} ms); not started",
                millis(d - now),
                millis_ceil(min)
            )
        } else {
            return Ok(());
        };
        let body = not_started(message, q.waited, Some(d), now, q.estimate);
        Err(if by > now {
            Refusal::always(RULE_START_BUDGET, body)
        } else {
            Refusal::uncounted(body)
        })
    }
}
