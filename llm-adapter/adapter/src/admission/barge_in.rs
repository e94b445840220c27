//! Session interrupt (barge-in) on the admission core: a cancel of every request of a
//! session ([`Admission::cancel_session`]) and a supersede ([`Admission::supersede`]),
//! both one transition of the state machine (`state/barge_in.rs`) followed by a bounded
//! wait until the running requests they aborted are answered.
//!
//! Invariant: these return (and so the edge acknowledges, or admits the superseding
//! request) only after every running request they aborted had its backend call dropped
//! and its answer delivered, or after [`SETTLE_WAIT`] (then counted in
//! [`SessionCancel::unsettled`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{AbortReason, Admission, SessionCancel, Sink};
use crate::metrics as m;

/// Longest a cancel waits for the running requests it aborted to be answered before it
/// reports them as `unsettled` and acknowledges anyway. An abort drops the backend call
/// at once; the wait covers the worker's answer publish (bounded by the sink).
pub const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// Waits (at most [`SETTLE_WAIT`]) until every receiver resolved; returns how many did
/// not.
pub(super) async fn settled(receivers: Vec<oneshot::Receiver<()>>) -> usize {
    let until = Instant::now() + SETTLE_WAIT;
    let mut unsettled = 0;
    for rx in receivers {
        // `Err(RecvError)` is the sender dropped: settled.
        if tokio::time::timeout_at(until, rx).await.is_err() {
            unsettled += 1;
        }
    }
    unsettled
}

impl<S: Sink> Admission<S> {
    /// Cancels every queued and running request of `session` (`Weir-Cancel-Session`):
    /// queued ones are answered `cancelled` at once, running ones are aborted at the
    /// backend and answered `cancelled`; returns when they are (at most
    /// [`SETTLE_WAIT`]).
    pub async fn cancel_session(&self, session: &str) -> SessionCancel {
        let results = (m::SESSION_CANCEL_TOTAL, "cancelled", "not_found");
        let calls = &self.inner.stats.interrupts.session_cancels;
        let why = AbortReason::Cancelled;
        self.interrupt(session, why, results, calls, "session_cancel")
            .await
    }

    /// Supersedes every queued and running request of `session` for a new request of
    /// it (`Weir-Supersede: session`, `by` = its request id): they are cancelled like
    /// [`Admission::cancel_session`] does, their answers saying that they were
    /// superseded (and by which request). Submit the new request after this returns:
    /// the session's running requests have been answered, so it does not queue behind
    /// them under session ordering nor count against the session cap.
    pub async fn supersede(&self, session: &str, by: Option<&str>) -> SessionCancel {
        let why = AbortReason::Superseded {
            by: by.map(str::to_owned),
        };
        let results = (m::SUPERSEDE_TOTAL, "superseded", "nothing");
        let calls = &self.inner.stats.interrupts.supersedes;
        self.interrupt(session, why, results, calls, "supersede")
            .await
    }

    /// Runs the interrupt, waits for it to settle, and counts it: in `calls`, in the
    /// `results` metric (labels: something interrupted, nothing), and the requests it
    /// cancelled by stage (labelled `by`; `/v1/stats` through `interrupts`).
    async fn interrupt(
        &self,
        session: &str,
        why: AbortReason,
        (metric, hit, miss): (&'static str, &'static str, &'static str),
        calls: &AtomicU64,
        by: &'static str,
    ) -> SessionCancel {
        let (mut r, rx) = self
            .inner
            .step(|st, now, fx| st.cancel_session(session, &why, now, fx))
            .await;
        r.unsettled = settled(rx).await;
        let result = if r.total() > 0 { hit } else { miss };
        metrics::counter!(metric, "result" => result).increment(1);
        calls.fetch_add(1, Ordering::Relaxed);
        let interrupts = &self.inner.stats.interrupts;
        for (stage, n, total) in [
            ("queued", r.queued, &interrupts.cancelled_queued),
            ("running", r.running, &interrupts.cancelled_running),
        ] {
            total.fetch_add(n as u64, Ordering::Relaxed);
            if n > 0 {
                metrics::counter!(m::INTERRUPTED_TOTAL, "by" => by, "stage" => stage)
                    .increment(n as u64);
            }
        }
        r
    }
}
