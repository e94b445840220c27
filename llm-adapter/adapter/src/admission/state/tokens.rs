//! The token budgets' two transitions ([`crate::admission::gates::tokens`]): a new
//! request's check and reservation, in the same `submit` transition (one lock), and
//! its settlement when its entry is retired (exactly once, with what it used).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use weir_protocol::llm::ErrorBody;

use super::{Entry, State};
use crate::admission::Submission;
use crate::admission::gates::Gate;
use crate::admission::gates::tokens::{Ended, Reservation, TokenAsk, TokenKeyView};
use crate::admission::usage::{RequestCost, reported_usage};
use crate::backend::BackendReply;

impl<W> State<W> {
    /// Checks the token budgets `sub` falls under and takes its cost out of them:
    /// `None` when no budget applies, the refusal (counted) when one is short.
    pub(super) fn reserve_tokens(
        &mut self,
        sub: &Submission,
        keys: &[Option<String>],
        now: Instant,
        waited: Duration,
    ) -> Result<Option<Reservation>, Box<ErrorBody>> {
        if !self.tokens.applies(keys) {
            return Ok(None);
        }
        let ask = TokenAsk {
            keys,
            cost: RequestCost::of(&sub.body),
            now,
        };
        let verdict = self.tokens.check(&ask);
        let rule = verdict.as_ref().err().and_then(|r| r.rule.clone());
        if let Err(body) = self.verdict(verdict, (), sub, waited) {
            if let Some(rule) = rule {
                self.tokens.refused(&rule);
            }
            return Err(body);
        }
        Ok(Some(self.tokens.reserve(&ask)))
    }

    /// Settles the reservation of retired entry `e` with what it used. A streamed
    /// reply's body is the stream's tail (kept to read its `usage`): it is emptied
    /// here, whatever the budgets, so the caller's `end` carries no body.
    pub(super) fn settle_tokens(
        &mut self,
        e: &mut Entry<W>,
        result: &mut Result<BackendReply, ErrorBody>,
        now: Instant,
    ) {
        let tail = match (&e.stream, result.as_mut()) {
            (Some(_), Ok(reply)) => std::mem::take(&mut reply.body),
            _ => Bytes::new(),
        };
        let Some(r) = e.tokens.take() else {
            return;
        };
        let ended = match (e.started_at, &*result) {
            // A request moved off a stalled backend and answered while queued again:
            // its first call consumed its prompt.
            (None, _) if e.failed_over => Ended::Failed(None),
            (None, _) => Ended::NotStarted,
            (Some(_), Ok(_)) if e.stream.is_some() => Ended::Answered(reported_usage(&tail)),
            (Some(_), Ok(reply)) => Ended::Answered(reported_usage(&reply.body)),
            (Some(_), Err(_)) => Ended::Failed(None),
        };
        self.tokens.settle(r, ended, now);
    }

    /// The token budgets' invariant: what they count as outstanding is what the live
    /// entries hold (tests; every bucket of a holder is still tracked while the key
    /// bound is not reached).
    #[cfg(test)]
    pub(super) fn check_token_invariants(&self) {
        for (gate, tokens, reservations) in self.tokens.outstanding() {
            let held = self
                .entries
                .values()
                .filter_map(|e| e.tokens.as_ref()?.at(gate));
            let (n, sum) = held.fold((0u64, 0u64), |(n, s), t| (n + 1, s + t));
            assert_eq!(tokens, sum, "outstanding tokens of limit {gate}");
            assert!(
                reservations <= n,
                "outstanding reservations of limit {gate}"
            );
        }
    }

    /// The `top` tracked keys of the token budgets with the fewest tokens left.
    pub(crate) fn token_keys(&self, top: usize, now: Instant) -> Vec<TokenKeyView> {
        let mut keys = self.tokens.keys(now);
        keys.sort_by(|a, b| {
            (a.available / a.tokens_per_minute as f64)
                .total_cmp(&(b.available / b.tokens_per_minute as f64))
                .then_with(|| a.key.cmp(&b.key))
        });
        keys.truncate(top);
        keys
    }
}
