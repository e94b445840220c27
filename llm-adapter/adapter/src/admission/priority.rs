//! Priority classes (`Weir-Priority: interactive | batch`, or `limits[].priority` for
//! the requests a limit's key matches), inside the deadline order (EDF):
//!
//! - **interactive goes first within its slack**: a batch request's order key is its
//!   deadline-derived key plus `priority.batch_delay_ms`, fixed at admission, so an
//!   interactive request due less than the delay after the batch request's own
//!   deadline goes ahead of it; the admission prediction
//!   reads the same order (what is ahead of a new request depends on its class), and an
//!   interactive request never goes behind a batch request to spare its slack
//!   (`gates/deadline.rs`: batch requests are never blockers of interactive ones);
//! - **batch ages**: its key does not move, so newer interactive requests (due later
//!   than it) sort after it: a batch request is never starved by requests arriving
//!   more than `deadline + delay − their budget` after it;
//! - **batch is refused first under overload**: when the queue bound is full, or an
//!   interactive request's prediction fails only because of batch requests queued
//!   ahead of it, the batch request with the latest order key is answered at once
//!   (`queue_full` or `deadline_exceeded`, with `retry_after_ms`, its message saying it
//!   was displaced by interactive work) and the interactive request is admitted
//!   (`state/priority.rs`).
//!
//! Invariants kept: a displaced request is answered exactly once, through
//! `State::retire`, like every other; nothing is handed to a backend after its deadline
//! (the start check is unchanged); a batch request's deadline timer is its own
//! deadline's, not its order key's. Under `queue_order = "fifo"` the classes do not
//! reorder anything; a full queue still displaces batch first.
//!
//! Metrics keep to the two classes (label `class`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use weir_protocol::WireName;
use weir_protocol::admin::PriorityClassStats;
pub use weir_protocol::llm::Priority;
use weir_service::metrics::{LatencyHistogram, Series};

use crate::config::KeyLimit;
use crate::metrics as m;

/// `priority.batch_delay_ms` by default: two seconds, a voice turn's whole budget. A
/// batch request goes ahead of an interactive request that arrives once it has waited
/// `its budget + delay − that one's budget`: with a delay of at least the interactive
/// budget, never while it lives, so an interactive turn of up to 2 s never waits
/// behind batch work that arrived before it, even when both carry the same deadline
/// (measured in `priority_tests.rs`, equal 2 s budgets at 0.5× + 1.5×: interactive p99
/// 1.85 s with no delay, 954 ms with 1 s, 96 ms with 2 s — as with no batch at all
/// but for the calls it finds running). Batch still ages against interactive requests
/// with longer budgets, and it gets all the capacity they leave.
pub const DEFAULT_BATCH_DELAY: Duration = Duration::from_millis(2_000);

/// `[priority]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityConfig {
    /// Added to a batch request's due instant for its place in the EDF order.
    pub batch_delay: Duration,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        Self {
            batch_delay: DEFAULT_BATCH_DELAY,
        }
    }
}

/// The class of a request: its header, else the class of the first limit (narrow key
/// first) whose key it has and that sets one, else `interactive`.
pub(crate) fn class_of(
    header: Option<Priority>,
    limits: &[KeyLimit],
    keys: &[Option<String>],
) -> Priority {
    header
        .or_else(|| {
            (limits.iter().zip(keys))
                .filter(|(_, k)| k.is_some())
                .find_map(|(l, _)| l.priority)
        })
        .unwrap_or_default()
}

/// Index of a class in [`PriorityStats`].
fn index(p: Priority) -> usize {
    match p {
        Priority::Interactive => 0,
        Priority::Batch => 1,
    }
}

/// One class's counters.
#[derive(Default)]
struct ClassStats {
    admitted: AtomicU64,
    refused: AtomicU64,
    displaced: AtomicU64,
    queue_wait: LatencyHistogram,
}

/// Per-class counters and queue-wait histograms (`/v1/stats` `priority`, the
/// `weir_llm_priority_*` metrics).
#[derive(Default)]
pub(crate) struct PriorityStats {
    classes: [ClassStats; 2],
}

impl PriorityStats {
    fn of(&self, p: Priority) -> &ClassStats {
        &self.classes[index(p)]
    }

    pub(crate) fn admitted(&self, p: Priority) {
        self.of(p).admitted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refused(&self, p: Priority) {
        self.of(p).refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn displaced(&self, p: Priority) {
        self.of(p).displaced.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn started(&self, p: Priority, queue_wait: Duration) {
        self.of(p).queue_wait.record(queue_wait);
    }

    /// The `/v1/stats` view, by class name; publishes the counters.
    pub(crate) fn snapshot(&self) -> std::collections::BTreeMap<String, PriorityClassStats> {
        Priority::ALL
            .iter()
            .map(|p| {
                let c = self.of(*p);
                let s = PriorityClassStats {
                    admitted: c.admitted.load(Ordering::Relaxed),
                    refused: c.refused.load(Ordering::Relaxed),
                    displaced: c.displaced.load(Ordering::Relaxed),
                    queue_wait_ms: c.queue_wait.percentiles(),
                };
                let class = p.as_str();
                metrics::counter!(m::PRIORITY_ADMITTED_TOTAL, "class" => class)
                    .absolute(s.admitted);
                metrics::counter!(m::PRIORITY_REFUSED_TOTAL, "class" => class).absolute(s.refused);
                metrics::counter!(m::PRIORITY_DISPLACED_TOTAL, "class" => class)
                    .absolute(s.displaced);
                (class.to_owned(), s)
            })
            .collect()
    }

    /// Appends the per-class queue-wait histograms in the Prometheus text format.
    pub(crate) fn render_histograms(&self, out: &mut String) {
        Series::render_header(
            m::PRIORITY_QUEUE_WAIT_SECONDS,
            "Time from receipt to the start of inference, by priority class.",
            out,
        );
        for p in Priority::ALL {
            let series =
                m::latency_series(m::PRIORITY_QUEUE_WAIT_SECONDS, Some(("class", p.as_str())));
            self.of(*p).queue_wait.render_samples(&series, out);
        }
    }
}
