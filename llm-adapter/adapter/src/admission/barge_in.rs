//! Session interrupt (barge-in) on the admission core: a cancel of every request of a
//! session ([`Admission::cancel_session`]) and a supersede ([`Admission::supersede`]),
//! both one transition of the state machine (`state/barge_in.rs`) followed by a bounded
//! wait until the running requests they aborted are answered.
//!
//! Invariant: these return (and so the edge acknowledges, or admits the superseding
//! request) only after every running request they aborted had its backend call dropped
//! and its answer delivered, or after [`SETTLE_WAIT`] (then counted in
//! [`SessionCancel::unsettled`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::state::Interrupt;
use super::{Admission, SessionCancel, Sink};
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

/// Counts the requests a session cancel or a supersede cancelled, by stage (the
/// metric; `/v1/stats` through `stats`).
fn count_cancelled(r: &SessionCancel, by: &'static str, stats: &super::stats::Interrupts) {
    stats
        .cancelled_queued
        .fetch_add(r.queued as u64, Ordering::Relaxed);
    stats
        .cancelled_running
        .fetch_add(r.running as u64, Ordering::Relaxed);
    for (stage, n) in [("queued", r.queued), ("running", r.running)] {
        if n > 0 {
            metrics::counter!(m::INTERRUPTED_TOTAL, "by" => by, "stage" => stage)
                .increment(n as u64);
        }
    }
}

impl<S: Sink> Admission<S> {
    /// Cancels every queued and running request of `session` (`Weir-Cancel-Session`):
    /// queued ones are answered `cancelled` at once, running ones are aborted at the
    /// backend and answered `cancelled`; returns when they are (at most
    /// [`SETTLE_WAIT`]).
    pub async fn cancel_session(&self, session: &str) -> SessionCancel {
        let r = self.interrupt(session, Interrupt::Cancel).await;
        let result = if r.total() > 0 {
            "cancelled"
        } else {
            "not_found"
        };
        metrics::counter!(m::SESSION_CANCEL_TOTAL, "result" => result).increment(1);
        let stats = &self.inner.stats.interrupts;
        stats.session_cancels.fetch_add(1, Ordering::Relaxed);
        count_cancelled(&r, "session_cancel", stats);
        r
    }

    /// Supersedes every queued and running request of `session` for a new request of
    /// it (`Weir-Supersede: session`, `by` = its request id): they are cancelled like
    /// [`Admission::cancel_session`] does, their answers saying that they were
    /// superseded (and by which request). Submit the new request after this returns:
    /// the session's running requests have been answered, so it does not queue behind
    /// them under session ordering nor count against the session cap.
    pub async fn supersede(&self, session: &str, by: Option<&str>) -> SessionCancel {
        let by = by.map(str::to_owned);
        let r = self.interrupt(session, Interrupt::Supersede { by }).await;
        let result = if r.total() > 0 {
            "superseded"
        } else {
            "nothing"
        };
        metrics::counter!(m::SUPERSEDE_TOTAL, "result" => result).increment(1);
        let stats = &self.inner.stats.interrupts;
        stats.supersedes.fetch_add(1, Ordering::Relaxed);
        count_cancelled(&r, "supersede", stats);
        r
    }

    async fn interrupt(&self, session: &str, why: Interrupt) -> SessionCancel {
        let (mut r, rx) = self
            .inner
            .step(|st, now, fx| st.cancel_session(session, &why, now, fx))
            .await;
        r.unsettled = settled(rx).await;
        r
    }
}
