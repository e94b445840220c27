//! Session interrupt (barge-in) at the edge: a cancel of a whole session
//! (`Weir-Cancel-Session` on the cancel subject, or on the inference subject like
//! `Weir-Cancel`) and requests that supersede their session's earlier ones
//! (`Weir-Supersede: session`).
//!
//! Invariants:
//! - a malformed `Weir-Supersede` (any value but `session`, any case) or one without a
//!   session is `invalid_request` and cancels nothing: it is checked before anything
//!   is cancelled;
//! - the session cancel's answer ([`SessionCancelReply`]) and a superseding request's
//!   admission come after the cancelled requests were answered and their backend calls
//!   dropped (`Admission::cancel_session`, `Admission::supersede`), so no chunk of a
//!   cancelled stream follows the acknowledgement;
//! - the wait for the aborted requests' answers holds the endpoint task (no task is
//!   spawned per message); it is bounded by [`crate::admission::SETTLE_WAIT`] and is
//!   normally well under a millisecond (an abort drops the backend call at once);
//! - a superseding request cancels its session's earlier requests even when it is then
//!   refused itself (its answer still carries `Weir-Superseded`);
//! - only this replica's requests of the session are cancelled (a session spread over
//!   replicas is cancelled on each one that receives the cancel).

use async_nats::HeaderMap;
use async_nats::service::Request;
use tokio::time::Instant;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, ErrorCode, SessionCancelReply, Supersede};

use super::decode::{Known, invalid};
use super::edge::Edge;
use super::reply::{NatsWaiter, put_static};
use crate::admission::{SessionCancel, Submission};
use crate::intake::TermReason;

impl Edge {
    /// Answers a session cancel: every queued and running request of the session is
    /// cancelled, then the reply says which.
    pub(super) async fn handle_cancel_session(&self, req: &Request, session: &str) {
        let session = session.trim();
        if let Err(e) = h::parse_id(h::CANCEL_SESSION, session) {
            return self.reply_invalid(req, &e).await;
        }
        let r = self.admission.cancel_session(session).await;
        if r.unsettled > 0 {
            tracing::warn!(
                unsettled = r.unsettled,
                "session cancel: running requests not answered within the settle wait"
            );
        }
        self.reply_json(req, &session_reply(session, r)).await;
    }

    /// `Weir-Supersede: session` on a decoded request: cancels the session's earlier
    /// requests and notes what on `waiter` (its reply headers). `None` = refused here
    /// (`invalid_request`, nothing cancelled) and answered.
    pub(super) async fn supersede(
        &self,
        known: &Known<'_>,
        sub: &Submission,
        mut waiter: NatsWaiter,
        received_at: Instant,
    ) -> Option<NatsWaiter> {
        match wants_supersede(known, sub) {
            Ok(false) => {}
            // `wants_supersede` checked that it has a session.
            Ok(true) => {
                let (session, by) = (sub.session.as_deref(), sub.request_id.as_deref());
                let r = self.admission.supersede(session.unwrap_or_default(), by);
                waiter.superseded = Some(Box::new(r.await));
            }
            Err(e) => {
                if let Some(t) = &mut waiter.intake {
                    t.terminate(TermReason::Invalid);
                }
                self.admission.answer_now(waiter, *e, received_at).await;
                return None;
            }
        }
        Some(waiter)
    }
}

/// The cancel endpoint's answer to a session cancel.
pub(super) fn session_reply(session: &str, r: SessionCancel) -> SessionCancelReply {
    let result = if r.total() > 0 {
        "cancelled"
    } else {
        "not_found"
    };
    SessionCancelReply {
        session: session.to_owned(),
        result: result.to_owned(),
        cancelled: r.total() as u64,
        queued: r.queued as u64,
        running: r.running as u64,
        queued_ids: r.queued_ids,
        running_ids: r.running_ids,
    }
}

/// Whether a decoded request supersedes its session (`Weir-Supersede: session`);
/// `invalid_request` for any other value or without a session.
pub(super) fn wants_supersede(known: &Known<'_>, sub: &Submission) -> Result<bool, Box<ErrorBody>> {
    let Some(v) = known.supersede else {
        return Ok(false);
    };
    Supersede::parse(v).map_err(|e| Box::new(invalid(&e)))?;
    if sub.session.is_none() {
        return Err(Box::new(ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!(
                "header {}: `session` needs the request's session ({})",
                h::SUPERSEDE,
                h::SESSION_ID
            ),
        )));
    }
    Ok(true)
}

/// The reply headers of a superseding request: [`h::SUPERSEDED`] (the count) and
/// [`h::SUPERSEDED_IDS`] (the ids, space-separated, as many as fit in
/// [`h::MAX_SUPERSEDED_IDS_LEN`] bytes).
pub(super) fn put_superseded(headers: &mut HeaderMap, r: &SessionCancel) {
    put_static(headers, h::SUPERSEDED, &r.total().to_string());
    let mut ids = String::new();
    for id in r.ids() {
        let sep = usize::from(!ids.is_empty());
        if ids.len() + sep + id.len() > h::MAX_SUPERSEDED_IDS_LEN {
            break;
        }
        if sep == 1 {
            ids.push(' ');
        }
        ids.push_str(id);
    }
    if !ids.is_empty() {
        put_static(headers, h::SUPERSEDED_IDS, &ids);
    }
}
