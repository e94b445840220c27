//! What the state tells as it decides: the trace events of an entry or of a submission
//! that has none yet, and the refusal counts (enforced, or only reported in shadow
//! mode). Reads the state; changes nothing of it.

use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::llm::ErrorBody;

use super::{Entry, State};
use crate::admission::Submission;
use crate::admission::gates::{Enforce, Refusal};
use crate::trace::{TraceEvent, TraceKind};

impl<W> State<W> {
    pub(super) fn emit(
        &self,
        kind: TraceKind,
        e: &Entry<W>,
        now: Instant,
        fill: impl FnOnce(&mut TraceEvent),
    ) {
        self.tracer.emit(&e.span, || {
            let mut ev = TraceEvent::new(kind, e.id, now.saturating_duration_since(e.received_at));
            ev.request_id = e.request_id.clone();
            ev.session = e.session.clone();
            fill(&mut ev);
            ev
        });
    }

    /// An event of a submission that has no entry (yet): `id` 0 unless it joined one.
    pub(super) fn emit_sub(
        &self,
        sub: &Submission,
        kind: TraceKind,
        id: u64,
        since_received: Duration,
        fill: impl FnOnce(&mut TraceEvent),
    ) {
        self.tracer.emit(&sub.span, || {
            let mut ev = TraceEvent::new(kind, id, since_received);
            ev.request_id = sub.request_id.clone();
            ev.session = sub.session.clone();
            fill(&mut ev);
            ev
        });
    }

    /// A slot event of `rule` (and its `key`) for `e`.
    pub(super) fn emit_slot(
        &self,
        kind: TraceKind,
        e: &Entry<W>,
        now: Instant,
        rule: &str,
        key: Option<&str>,
    ) {
        self.emit(kind, e, now, |ev| {
            ev.rule = Some(rule.to_owned());
            ev.key = key.map(str::to_owned);
        });
    }

    /// Counts a refusal that is enforced under its rule.
    pub(super) fn count(&self, r: &Refusal) {
        if let Some(rule) = &r.rule {
            self.stats.limit_reject(rule);
        }
    }

    /// A gate's verdict on a new request: its pass, `shadow_pass` when shadow mode lets
    /// a refusal through (emits `slot_busy` and counts a would-reject), or the refusal
    /// to answer (counted).
    pub(super) fn verdict<P>(
        &self,
        verdict: Result<P, Refusal>,
        shadow_pass: P,
        sub: &Submission,
        waited: Duration,
    ) -> Result<P, Box<ErrorBody>> {
        let r = match verdict {
            Ok(pass) => return Ok(pass),
            Err(r) => r,
        };
        let Enforce::UnlessShadow { key } = &r.enforce else {
            self.count(&r);
            return Err(r.body);
        };
        let shadow = self.shadow();
        let rule = r.rule.as_deref().unwrap_or_default();
        self.emit_sub(sub, TraceKind::SlotBusy, 0, waited, |ev| {
            ev.rule = Some(rule.to_owned());
            ev.key = key.clone();
            ev.shadow = shadow;
        });
        if shadow {
            self.stats.would_reject(rule);
            Ok(shadow_pass)
        } else {
            self.stats.limit_reject(rule);
            Err(r.body)
        }
    }
}
