//! Per-key token budgets (`limits[].tokens_per_minute`): a token bucket per key of a
//! limit, holding at most `tokens_per_minute` tokens and refilled continuously at
//! `tokens_per_minute / 60` per second.
//!
//! - **Reserve at admission.** A request costs its `max_tokens` (or
//!   `max_completion_tokens`, else the limit's `default_max_tokens`) plus its prompt
//!   estimate (the text bytes of `messages` / `prompt` divided by 4; the whole body when
//!   it cannot be read; [`super::super::usage`]). It passes when its key's bucket holds
//!   the cost, and the cost is taken out at once; otherwise it is refused
//!   `token_budget_exceeded` with `retry_after_ms` = when the bucket will hold it at
//!   the refill rate. A cost larger than the whole budget passes only on a full bucket
//!   (which it then leaves in debt), so no request is refused forever.
//! - **Reconcile at the end** ([`TokenBudgets::settle`]): the reservation is replaced
//!   by what the request used — the backend's reported `usage` (clamped to
//!   [`USAGE_CLAMP`] × the reservation), else the whole reservation for an answered
//!   request, the prompt estimate for one that failed or was cancelled after it
//!   started, nothing for one that never started. The difference goes back into the
//!   bucket (or is taken out of it).
//!
//! Invariants a reader must not break:
//! - the check and the reservation happen in one state transition under the admission
//!   lock ([`super::super::state`]), so concurrent requests cannot both see the same
//!   tokens: over any interval of length T, the tokens one key holds or has used
//!   (reserved, less what was refunded) are at most `tokens_per_minute + T ×
//!   tokens_per_minute / 60`, plus at most one request's cost beyond a full budget;
//! - a bucket's level stays within `[−tokens_per_minute, tokens_per_minute]`, whatever
//!   a backend reports: a debt (usage above the reservation) delays the key by at most
//!   two minutes;
//! - a reservation is settled exactly once: it is owned by the request's entry and
//!   taken out of it when the entry is retired;
//! - at most `max_token_keys` buckets per limit: a bucket back at its full level with
//!   no reservation outstanding is dropped when met (it means nothing), and a new key
//!   beyond the bound evicts the least recently used bucket without reservations (or,
//!   if all have some — fewer `max_token_keys` than requests in flight — the least
//!   recently used one; its settlements then go to the key's new bucket, if any, still
//!   within the level bounds).
//!   An evicted key starts again with a full budget: the bound trades memory for that.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::llm::{ErrorCode, ErrorDetails};

use super::{Gate, Refusal, refusal};
use crate::admission::usage::{RequestCost, Usage};
use crate::config::{KeyLimit, TokenBudget};
pub(crate) use weir_protocol::admin::TokenBudgetStats;

/// One tracked key of a token budget (`/v1/limits`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenKeyView {
    /// The limit's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// Whole tokens available now (negative: in debt after a usage above its reservation).
    pub available: f64,
    /// The budget, tokens per minute.
    pub tokens_per_minute: u64,
    /// Reservations not settled yet (requests queued or running).
    pub outstanding: u32,
}

/// A reported usage is charged at most this many times the reservation.
pub(crate) const USAGE_CLAMP: u64 = 4;

/// Most idle buckets dropped per reservation (the rest are dropped later).
const DROP_IDLE_PER_RESERVE: usize = 4;

/// The refusal rule of limit `name`'s token budget (`weir_llm_limit_reject_total`).
pub(crate) fn rule_name(name: &str) -> String {
    format!("{name}.tokens")
}

/// One key's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Tokens available at `at` (negative: in debt).
    level: f64,
    /// When `level` was computed.
    at: Instant,
    /// Reservations not settled yet.
    outstanding: u32,
    /// Its place in the least-recently-used order.
    touched: (Instant, u64),
}

/// One limit's budget: its buckets by key, and its totals.
#[derive(Debug)]
struct Budget {
    name: String,
    cfg: TokenBudget,
    buckets: HashMap<String, Bucket>,
    /// Keys by last use, oldest first.
    lru: BTreeSet<((Instant, u64), String)>,
    seq: u64,
    totals: TokenBudgetStats,
}

impl Budget {
    fn capacity(&self) -> f64 {
        self.cfg.tokens_per_minute.get() as f64
    }

    /// Tokens per second.
    fn rate(&self) -> f64 {
        self.capacity() / 60.0
    }

    /// The level of `b` at `now` (refilled, at most full).
    fn level(&self, b: &Bucket, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(b.at).as_secs_f64();
        (b.level + dt * self.rate()).min(self.capacity())
    }

    fn touch(&mut self, key: &str, now: Instant) {
        self.seq += 1;
        let mark = (now, self.seq);
        if let Some(b) = self.buckets.get_mut(key) {
            let old = std::mem::replace(&mut b.touched, mark);
            self.lru.remove(&(old, key.to_owned()));
            self.lru.insert((mark, key.to_owned()));
        }
    }

    fn forget(&mut self, key: &str) {
        if let Some(b) = self.buckets.remove(key) {
            self.lru.remove(&(b.touched, key.to_owned()));
        }
    }

    /// Drops up to [`DROP_IDLE_PER_RESERVE`] of the oldest buckets that are full with
    /// nothing outstanding (they mean nothing); stops at the first one that is not.
    fn drop_idle(&mut self, now: Instant) {
        for _ in 0..DROP_IDLE_PER_RESERVE {
            let Some((_, key)) = self.lru.first() else {
                return;
            };
            let idle = self
                .buckets
                .get(key)
                .is_none_or(|b| b.outstanding == 0 && self.level(b, now) >= self.capacity());
            if !idle {
                return;
            }
            let key = key.clone();
            self.forget(&key);
        }
    }

    /// Makes room for one more bucket: the least recently used one without
    /// reservations goes, else the least recently used one.
    fn evict_one(&mut self) {
        let victim = (self.lru.iter())
            .find(|(_, k)| self.buckets.get(k).is_none_or(|b| b.outstanding == 0))
            .or_else(|| self.lru.first())
            .map(|(_, k)| k.clone());
        if let Some(k) = victim {
            self.forget(&k);
            self.totals.evicted += 1;
        }
    }

    /// Adds `delta` tokens to `key`'s bucket at `now`, within ±capacity.
    fn add(&mut self, key: &str, delta: f64, now: Instant) {
        let cap = self.capacity();
        let level = match self.buckets.get(key) {
            Some(b) => self.level(b, now),
            None => return,
        };
        if let Some(b) = self.buckets.get_mut(key) {
            b.level = (level + delta).clamp(-cap, cap);
            b.at = now;
        }
    }
}

/// Every limit's token budget (index = the limit's index; `None`: the limit has none).
#[derive(Debug)]
pub(crate) struct TokenBudgets {
    budgets: Vec<Option<Budget>>,
}

/// A request at the token budgets: its keys (one per limit) and its cost.
#[derive(Debug, Clone)]
pub(crate) struct TokenAsk<'a> {
    pub(crate) keys: &'a [Option<String>],
    pub(crate) cost: RequestCost,
    pub(crate) now: Instant,
}

/// Tokens held for one request at each budget its keys fall under. Settled once
/// ([`TokenBudgets::settle`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// `(limit index, key, tokens reserved)`.
    held: Vec<(usize, String, u64)>,
    /// The prompt estimate (charged for a request that failed after starting).
    prompt: u64,
}

/// How a request ended, for [`TokenBudgets::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Never started (refused in the queue, cancelled, deadline, shutdown): nothing
    /// used.
    NotStarted,
    /// Started and answered: the usage the backend reported, if readable.
    Answered(Option<Usage>),
    /// Started and failed (backend error, timeout, cancel, deadline): a usage if one
    /// is known, else the prompt estimate is charged (the admission passes `None`
    /// today: a failed call's reply body is not kept).
    Failed(Option<Usage>),
}

impl TokenBudgets {
    pub(crate) fn new(limits: &[KeyLimit]) -> Self {
        let budgets = limits
            .iter()
            .map(|l| {
                l.tokens.map(|cfg| Budget {
                    name: l.name.clone(),
                    cfg,
                    buckets: HashMap::new(),
                    lru: BTreeSet::new(),
                    seq: 0,
                    totals: TokenBudgetStats {
                        tokens_per_minute: cfg.tokens_per_minute.get(),
                        ..Default::default()
                    },
                })
            })
            .collect();
        Self { budgets }
    }

    /// Whether a request with these keys falls under any budget (only then is its
    /// body read for a cost).
    pub(crate) fn applies(&self, keys: &[Option<String>]) -> bool {
        self.budgets
            .iter()
            .zip(keys)
            .any(|(b, k)| b.is_some() && k.is_some())
    }

    /// The cost of `ask` at budget `b`.
    fn cost(b: &Budget, cost: &RequestCost) -> u64 {
        (cost.max_tokens)
            .unwrap_or(b.cfg.default_max_tokens)
            .saturating_add(cost.prompt)
    }

    /// Takes the cost out of every budget the request falls under (the check passed,
    /// or shadow mode). Under the admission lock, in the same transition as the check.
    pub(crate) fn reserve(&mut self, ask: &TokenAsk<'_>) -> Reservation {
        let now = ask.now;
        let mut held = Vec::new();
        for (gi, (b, key)) in self.budgets.iter_mut().zip(ask.keys).enumerate() {
            let (Some(b), Some(key)) = (b.as_mut(), key) else {
                continue;
            };
            let cost = Self::cost(b, &ask.cost);
            b.drop_idle(now);
            if !b.buckets.contains_key(key) {
                while b.buckets.len() >= b.cfg.max_keys.get() {
                    b.evict_one();
                }
                let full = Bucket {
                    level: b.capacity(),
                    at: now,
                    outstanding: 0,
                    touched: (now, 0),
                };
                b.buckets.insert(key.clone(), full);
            }
            b.touch(key, now);
            b.add(key, -(cost as f64), now);
            if let Some(bucket) = b.buckets.get_mut(key) {
                bucket.outstanding += 1;
            }
            b.totals.reserved = b.totals.reserved.saturating_add(cost);
            b.totals.outstanding = b.totals.outstanding.saturating_add(cost);
            held.push((gi, key.clone(), cost));
        }
        Reservation {
            held,
            prompt: ask.cost.prompt,
        }
    }

    /// Replaces reservation `r` by what the request used ([`Ended`]); see the module
    /// rules.
    pub(crate) fn settle(&mut self, r: Reservation, ended: Ended, now: Instant) {
        for (gi, key, reserved) in r.held {
            let Some(Some(b)) = self.budgets.get_mut(gi) else {
                continue;
            };
            let t = &mut b.totals;
            t.outstanding = t.outstanding.saturating_sub(reserved);
            let clamp = reserved.saturating_mul(USAGE_CLAMP);
            let used = match ended {
                Ended::NotStarted => 0,
                Ended::Answered(Some(u)) | Ended::Failed(Some(u)) => {
                    t.usage_reported += 1;
                    if u.total > clamp {
                        t.usage_clamped += 1;
                    }
                    u.total.min(clamp)
                }
                Ended::Answered(None) => {
                    t.usage_missing += 1;
                    reserved
                }
                Ended::Failed(None) => r.prompt.min(reserved),
            };
            t.used = t.used.saturating_add(used);
            t.refunded = t.refunded.saturating_add(reserved.saturating_sub(used));
            t.overcharged = t.overcharged.saturating_add(used.saturating_sub(reserved));
            if let Some(bucket) = b.buckets.get_mut(&key) {
                bucket.outstanding = bucket.outstanding.saturating_sub(1);
                b.add(&key, reserved as f64 - used as f64, now);
            }
        }
    }

    /// Each budget's totals, by limit name, with its keys now.
    pub(crate) fn stats(&self) -> BTreeMap<String, TokenBudgetStats> {
        (self.budgets.iter().flatten())
            .map(|b| {
                let mut t = b.totals.clone();
                t.keys = b.buckets.len() as u64;
                (b.name.clone(), t)
            })
            .collect()
    }

    /// The tracked keys of every budget.
    pub(crate) fn keys(&self, now: Instant) -> Vec<TokenKeyView> {
        let mut out = Vec::new();
        for b in self.budgets.iter().flatten() {
            for (k, bucket) in &b.buckets {
                out.push(TokenKeyView {
                    rule: b.name.clone(),
                    key: k.clone(),
                    available: b.level(bucket, now).floor(),
                    tokens_per_minute: b.cfg.tokens_per_minute.get(),
                    outstanding: bucket.outstanding,
                });
            }
        }
        out
    }
}

#[cfg(test)]
impl TokenBudgets {
    /// Per budget (by limit index): the tokens and the reservations outstanding, as
    /// the totals and the buckets count them.
    pub(crate) fn outstanding(&self) -> Vec<(usize, u64, u64)> {
        (self.budgets.iter().enumerate())
            .filter_map(|(gi, b)| b.as_ref().map(|b| (gi, b)))
            .map(|(gi, b)| {
                let held: u64 = b.buckets.values().map(|x| u64::from(x.outstanding)).sum();
                (gi, b.totals.outstanding, held)
            })
            .collect()
    }
}

impl Reservation {
    /// The tokens held at the budget of limit `gate`.
    #[cfg(test)]
    pub(crate) fn at(&self, gate: usize) -> Option<u64> {
        self.held.iter().find(|h| h.0 == gate).map(|h| h.2)
    }
}

impl Gate for TokenBudgets {
    type Input<'a> = &'a TokenAsk<'a>;
    type Pass = ();

    /// Passes when every budget the request falls under holds its cost now (a cost
    /// above a whole budget: when that budget is full); the first that does not
    /// refuses, with when it will.
    fn check(&self, ask: &TokenAsk<'_>) -> Result<(), Refusal> {
        for (b, key) in self.budgets.iter().zip(ask.keys) {
            let (Some(b), Some(key)) = (b, key) else {
                continue;
            };
            let cost = Self::cost(b, &ask.cost);
            let Some(bucket) = b.buckets.get(key) else {
                continue; // an untracked key has a full budget
            };
            let level = b.level(bucket, ask.now);
            let need = (cost as f64).min(b.capacity());
            if level >= need {
                continue;
            }
            let wait = Duration::from_secs_f64(((need - level) / b.rate()).max(0.0));
            let retry_ms = super::millis_ceil(wait).max(1);
            let tpm = b.cfg.tokens_per_minute.get();
            let message = format!(
                "limit {:?}: token budget of {key:?} exhausted ({cost} tokens asked, {} left of {tpm} per minute)",
                b.name,
                level.max(0.0).floor() as u64,
            );
            let details = ErrorDetails {
                limit: Some(tpm),
                retry_after_ms: Some(retry_ms),
                key: Some(key.clone()),
                tokens_requested: Some(cost),
                tokens_available: Some(level.max(0.0).floor() as u64),
                ..Default::default()
            };
            let body = refusal(ErrorCode::TokenBudgetExceeded, message, details);
            return Err(Refusal::unless_shadow(
                rule_name(&b.name),
                Some(key.clone()),
                body,
            ));
        }
        Ok(())
    }
}

impl TokenBudgets {
    /// Counts a refusal of the budget of limit `rule` (its [`rule_name`]).
    pub(crate) fn refused(&mut self, rule: &str) {
        for b in self.budgets.iter_mut().flatten() {
            if rule_name(&b.name) == rule {
                b.totals.refused += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
