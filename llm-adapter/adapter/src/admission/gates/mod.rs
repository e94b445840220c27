//! The admission gates: each rule a request must pass is one module, behind one
//! interface ([`Gate`]), in the manner of tower's `limit` layers. `State::submit` asks
//! them in this order, which is the order of precedence of their refusals:
//!
//! 1. [`session_cap`]: the per-session pending cap (`session_queue_full`);
//! 2. [`session_order`]: a busy session refuses a request that asked for `reject`
//!    (`concurrency_limit_exceeded`);
//! 3. [`queue_bound`]: the global queue bound (`queue_full`);
//! 4. [`deadline`]: the deadline prediction (`deadline_exceeded`), which also places
//!    the request in EDF order;
//! 5. [`tokens`]: the per-key token budgets (`token_budget_exceeded`), whose check and
//!    reservation are one step (`State::submit`, after the others passed).
//!
//! Once admitted, a request waits at [`session_order`] behind its session's active
//! request, then at each [`key_limits`] gate for a slot of its key (pass, wait or
//! refuse), and [`start_budget`] answers it while queued, or at the start of inference,
//! once less than the start budget is left before its deadline.
//!
//! Invariants a reader must not break:
//! - a check only reads: what a gate holds for a request (a session slot, a key slot,
//!   an EDF place) is taken once every check passed, and a slot is held as a
//!   [`SlotGuard`](super::slots::SlotGuard) owned by the request's entry, so that it is
//!   released exactly once, when the entry is dropped;
//! - every refusal names the rule it is counted under (`None`: a plain deadline, not a
//!   limit) and whether shadow mode only reports it ([`Enforce::UnlessShadow`]); the
//!   queue bound and the deadline checks are enforced in shadow mode too (the queue
//!   bound is the memory bound, deadlines are the caller's).

pub(crate) mod deadline;
pub(crate) mod key_limits;
pub(crate) mod queue_bound;
pub(crate) mod session_cap;
pub(crate) mod session_order;
pub(crate) mod start_budget;
pub(crate) mod tokens;

use std::borrow::Cow;
use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::llm::{ErrorBody, ErrorCode, ErrorDetails};

use super::Submission;
use weir_service::config::whole_ms as millis;

/// Rule names used in traces, would-reject counts and metrics.
pub(crate) const RULE_SESSION_CAP: &str = "session_cap";
/// See [`RULE_SESSION_CAP`].
pub(crate) const RULE_SESSION_ORDER: &str = "session_order";
/// See [`RULE_SESSION_CAP`].
pub(crate) const RULE_QUEUE: &str = "queue";
/// Refused at admission: predicted not to finish before its deadline.
pub(crate) const RULE_PREDICTED: &str = "deadline_predicted";
/// Answered while queued or at the start of inference: its remaining budget fell
/// below the start budget (the estimate, or `deadline.min_start_budget_ms`).
pub(crate) const RULE_START_BUDGET: &str = "start_budget";

/// One admission rule. A check reads the gate's own state and what it is given
/// (`Input`), changes nothing, and either passes — carrying on what it decided
/// (`Pass`: nothing, a place in the queue, whether to wait) — or refuses.
pub(crate) trait Gate {
    /// What the check reads besides the gate's own state.
    type Input<'a>;
    /// What a pass carries on to admission.
    type Pass;

    /// Passes or refuses.
    fn check(&self, input: Self::Input<'_>) -> Result<Self::Pass, Refusal>;
}

/// A new request as the gates see it at admission.
pub(crate) struct Ask<'a> {
    pub(crate) sub: &'a Submission,
    /// The key of each per-key limit (`None`: the rule does not apply).
    pub(crate) keys: &'a [Option<String>],
    pub(crate) now: Instant,
    /// The caller's budget (or the default), capped at `deadline.max`.
    pub(crate) budget: Option<Duration>,
    /// `received_at + budget`.
    pub(crate) deadline: Option<Instant>,
    /// `deadline − reply_margin`: the last moment an answer is still useful.
    pub(crate) answer_by: Option<Instant>,
    /// The service time retry hints are sized with.
    pub(crate) hint: Duration,
    /// Its priority class (`Weir-Priority`, else its keys', else interactive).
    pub(crate) priority: super::priority::Priority,
}

/// `retry_after_ms` for `rounds` service times of `hint` each (at least one, at most a
/// minute).
pub(crate) fn retry_after(hint: Duration, rounds: f64) -> Option<u64> {
    let ms = hint.as_secs_f64() * 1000.0 * rounds.max(1.0);
    Some((ms.ceil() as u64).clamp(1, 60_000))
}

/// A gate's refusal: the answer, the rule it is counted under, and whether shadow mode
/// enforces it.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// The rule (`weir_llm_limit_rejections_total`); `None`: not counted as a limit.
    pub(crate) rule: Option<Cow<'static, str>>,
    /// Whether shadow mode lets the request through.
    pub(crate) enforce: Enforce,
    /// The answer (boxed: a refusal travels through `Result`s).
    pub(crate) body: Box<ErrorBody>,
}

/// Whether shadow mode enforces a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Enforce {
    /// In every mode.
    Always,
    /// Only in enforce mode; shadow mode reports it (a `slot_busy` trace event with
    /// this key, and a would-reject count) and lets the request through.
    UnlessShadow { key: Option<String> },
}

impl Refusal {
    /// A refusal enforced in every mode, counted under `rule`.
    pub(crate) fn always(rule: &'static str, body: ErrorBody) -> Self {
        Self {
            rule: Some(Cow::Borrowed(rule)),
            enforce: Enforce::Always,
            body: Box::new(body),
        }
    }

    /// A limit that shadow mode only reports (traced with `key`).
    pub(crate) fn unless_shadow(
        rule: impl Into<Cow<'static, str>>,
        key: Option<String>,
        body: ErrorBody,
    ) -> Self {
        Self {
            rule: Some(rule.into()),
            enforce: Enforce::UnlessShadow { key },
            body: Box::new(body),
        }
    }

    /// A deadline that passed: no limit counts it.
    pub(crate) fn uncounted(body: ErrorBody) -> Self {
        Self {
            rule: None,
            enforce: Enforce::Always,
            body: Box::new(body),
        }
    }
}

/// Whole milliseconds, rounded up.
pub(crate) fn millis_ceil(d: Duration) -> u64 {
    let ms = millis(d);
    if Duration::from_millis(ms) < d {
        ms.saturating_add(1)
    } else {
        ms
    }
}

/// An error body with its details.
pub(crate) fn refusal(code: ErrorCode, message: String, details: ErrorDetails) -> ErrorBody {
    ErrorBody::new(code, message).with_details(details)
}

/// `deadline_exceeded` for a queued request that is not started: how long it waited,
/// the budget left at `now` and the service-time estimate.
pub(crate) fn not_started(
    message: String,
    waited: Duration,
    deadline: Option<Instant>,
    now: Instant,
    estimate: Option<Duration>,
) -> ErrorBody {
    let details = ErrorDetails {
        waited_ms: Some(millis(waited)),
        budget_ms: deadline.map(|d| millis(d.saturating_duration_since(now))),
        estimate_ms: estimate.map(millis_ceil),
        ..Default::default()
    };
    refusal(ErrorCode::DeadlineExceeded, message, details)
}

/// A refusal whose one detail is how long the request waited.
pub(crate) fn after_wait(code: ErrorCode, message: &str, waited: Duration) -> ErrorBody {
    let details = ErrorDetails {
        waited_ms: Some(millis(waited)),
        ..Default::default()
    };
    refusal(code, message.into(), details)
}

/// The answer of every request offered or queued once shutdown began.
pub(crate) fn shutting_down() -> ErrorBody {
    ErrorBody::new(
        ErrorCode::ShuttingDown,
        "this replica is shutting down; retry on another one",
    )
}

/// A request id reused with a different session or body.
pub(crate) fn conflict(rid: &str) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::RequestIdConflict,
        format!("request id {rid:?} is in use with a different session or body"),
    )
}
