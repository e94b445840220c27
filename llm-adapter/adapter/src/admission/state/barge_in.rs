//! Session interrupt (barge-in): every queued and running request of one session is
//! cancelled in one transition, for a session cancel (`Weir-Cancel-Session`) or for a
//! request that supersedes its session's earlier ones (`Weir-Supersede: session`).
//!
//! Invariants a reader must not break:
//! - one transition under the state lock: a request of the session is either cancelled
//!   here or was admitted after it (never half-cancelled);
//! - a queued request is retired here (answered `cancelled` once, through
//!   [`State::retire`]); a running one is only told to abort, and its worker answers it
//!   when the backend call has been dropped. Each running one hands back a receiver
//!   that resolves once it is retired and its answer delivered, so that the caller of
//!   the cancel acknowledges only after the backend call was dropped and no chunk of a
//!   stream can follow (abort before acknowledgement);
//! - a supersede spares the requests with its own request id (a retry of the
//!   superseding request joins the first copy instead of cancelling it);
//! - queued requests are retired newest first, so the session's active request (under
//!   session ordering) is the last one to go and no cancelled request is promoted on
//!   the way;
//! - the scan is over the entries (at most `queue_capacity + workers`), only on a
//!   cancel or supersede, never per ordinary request.

use tokio::sync::oneshot;
use tokio::time::Instant;
use weir_protocol::llm::ErrorCode;

use super::{Effects, Stage, State};
use crate::admission::AbortReason;
use crate::admission::gates::after_wait;

/// What a session cancel or a supersede cancelled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionCancel {
    /// Queued requests answered `cancelled`.
    pub queued: usize,
    /// Running requests aborted at the backend (answered `cancelled` by their worker).
    pub running: usize,
    /// The request ids of the queued ones, oldest first (requests without an id are
    /// only counted).
    pub queued_ids: Vec<String>,
    /// The request ids of the running ones, oldest first.
    pub running_ids: Vec<String>,
    /// Running requests not yet answered when the wait for them ended
    /// ([`crate::admission::SETTLE_WAIT`]); 0 unless a backend call would not drop.
    pub unsettled: usize,
}

impl SessionCancel {
    /// Requests cancelled: queued + running.
    pub fn total(&self) -> usize {
        self.queued + self.running
    }

    /// Every cancelled request id, running ones first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.running_ids
            .iter()
            .chain(&self.queued_ids)
            .map(String::as_str)
    }
}

impl AbortReason {
    /// The answer of a queued request of the interrupted session.
    fn queued_message(&self) -> String {
        match self {
            Self::Cancelled => "cancelled while queued (session cancel)".to_owned(),
            Self::Superseded { by: Some(by) } => {
                format!("superseded by request {by} of the same session while queued")
            }
            Self::Superseded { by: None } => {
                "superseded by a later request of the same session while queued".to_owned()
            }
        }
    }

    /// Whether a request with `request_id` is spared: a superseding request's retry
    /// (same request id) does not cancel the first copy, it joins it.
    fn spares(&self, request_id: Option<&str>) -> bool {
        matches!(self, Self::Superseded { by: Some(by) } if request_id == Some(by.as_str()))
    }
}

impl<W> State<W> {
    /// Cancels every queued and running request of `session`: queued ones are answered
    /// `cancelled` now, running ones are told to abort. Returns what was cancelled and
    /// one receiver per running request that resolves once it has been answered.
    pub(crate) fn cancel_session(
        &mut self,
        session: &str,
        why: &AbortReason,
        now: Instant,
        fx: &mut Effects<W>,
    ) -> (SessionCancel, Vec<oneshot::Receiver<()>>) {
        let mut ids: Vec<u64> = self
            .entries
            .values()
            .filter(|e| e.session.as_deref() == Some(session))
            .filter(|e| !why.spares(e.request_id.as_deref()))
            .map(|e| e.id)
            .collect();
        ids.sort_unstable();
        let mut done = SessionCancel::default();
        let mut settled = Vec::new();
        for &id in &ids {
            let Some(e) = self.entries.get_mut(&id) else {
                continue;
            };
            if e.stage != Stage::Running {
                continue;
            }
            // Already told to abort (an earlier cancel, shutdown): still waited for.
            if let Some(tx) = e.abort.take() {
                let _ = tx.send(why.clone());
            }
            let (tx, rx) = oneshot::channel();
            e.on_settled.push(tx);
            settled.push(rx);
            done.running += 1;
            done.running_ids.extend(e.request_id.clone());
        }
        let message = why.queued_message();
        for &id in ids.iter().rev() {
            let Some(e) = self.entries.get(&id) else {
                continue;
            };
            if e.stage == Stage::Running {
                continue;
            }
            done.queued += 1;
            done.queued_ids.extend(e.request_id.clone());
            let waited = now.saturating_duration_since(e.received_at);
            let err = after_wait(ErrorCode::Cancelled, &message, waited);
            self.retire(id, Err(err), now, fx);
        }
        done.queued_ids.reverse();
        self.run(now, fx);
        (done, settled)
    }

    /// A receiver that resolves once the running request with `request_id` has been
    /// answered (`None` if there is none).
    pub(crate) fn on_settled(&mut self, request_id: &str) -> Option<oneshot::Receiver<()>> {
        let id = *self.by_request_id.get(request_id)?;
        let e = self.entries.get_mut(&id)?;
        if e.stage != Stage::Running {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        e.on_settled.push(tx);
        Some(rx)
    }
}
