//! Per-key concurrency limits (`[[limits]]`): for each configured limit, at most
//! `limit` admitted requests of one key hold a slot at a time. A request passes the
//! limits in their configured order (narrow key first); at a busy key it waits in
//! strict FIFO order (`on_busy = "wait"`, up to `max_waiters`, for at most `max_wait`)
//! or is refused `concurrency_limit_exceeded`.
//!
//! Invariants:
//! - strict FIFO per key: a key's waiters are non-empty only while its slots are all
//!   taken (in enforce mode), and a freed slot is granted to the head waiter before
//!   anyone else ([`KeyLimits::grant`]);
//! - a slot is held as a [`SlotGuard`] owned by the request's entry and released when
//!   the guard is dropped, exactly once;
//! - in shadow mode every request takes its slot; the check only says what enforce mode
//!   would have done.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use weir_protocol::llm::{ErrorCode, ErrorDetails};

use super::{Gate, Refusal, refusal, retry_after};
use crate::admission::slots::{SlotGuard, SlotTable};
use crate::admission::{AdmissionConfig, Submission};
use crate::config::{KeyLimit, KeySource, OnBusy};
use weir_service::config::whole_ms as millis;

/// One limit's slots and waiters, by key.
#[derive(Default)]
pub(crate) struct KeyGate {
    pub(crate) slots: SlotTable,
    pub(crate) waiters: HashMap<String, VecDeque<u64>>,
}

/// Every per-key limit, in the configured order.
pub(crate) struct KeyLimits {
    limits: Vec<KeyLimit>,
    gates: Vec<KeyGate>,
}

/// A request at one limit's key.
pub(crate) struct KeyAsk<'a> {
    /// The limit's index.
    pub(crate) gate: usize,
    pub(crate) key: &'a str,
    /// The service time retry hints are sized with.
    pub(crate) hint: Duration,
}

/// A pass at a key limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyPass {
    /// A slot is free: take it.
    Free,
    /// Wait in line for a slot, at most this long.
    Wait(Duration),
}

impl KeyLimits {
    pub(crate) fn new(limits: &[KeyLimit]) -> Self {
        Self {
            limits: limits.to_vec(),
            gates: limits.iter().map(|_| KeyGate::default()).collect(),
        }
    }

    /// How many limits there are.
    pub(crate) fn len(&self) -> usize {
        self.gates.len()
    }

    /// The configuration of limit `gate`.
    pub(crate) fn limit(&self, gate: usize) -> &KeyLimit {
        &self.limits[gate]
    }

    /// Every limit with its slots and waiters (limits view, invariants).
    pub(crate) fn gates(&self) -> impl Iterator<Item = (&KeyLimit, &KeyGate)> {
        self.limits.iter().zip(&self.gates)
    }

    /// Takes a slot of `key` at limit `gate` (the check passed, or shadow mode).
    pub(crate) fn acquire(&self, gate: usize, key: &str) -> SlotGuard {
        self.gates[gate].slots.acquire(key)
    }

    /// Puts request `id` in line for a slot of `key` at limit `gate`.
    pub(crate) fn wait(&mut self, gate: usize, key: &str, id: u64) {
        self.gates[gate]
            .waiters
            .entry(key.to_owned())
            .or_default()
            .push_back(id);
    }

    /// Request `id` leaves the line of `key` at limit `gate` (answered while waiting).
    pub(crate) fn leave(&mut self, gate: usize, key: &str, id: u64) {
        let g = &mut self.gates[gate];
        if let Some(q) = g.waiters.get_mut(key) {
            if let Some(pos) = q.iter().position(|x| *x == id) {
                q.remove(pos);
            }
            if q.is_empty() {
                g.waiters.remove(key);
            }
        }
    }

    /// Grants a free slot of `key` at limit `gate` to the head of its line: the waiter
    /// and its slot, or `None` when no slot is free or nobody waits.
    pub(crate) fn grant(&mut self, gate: usize, key: &str) -> Option<(u64, SlotGuard)> {
        let limit = self.limits[gate].limit.get();
        let g = &mut self.gates[gate];
        if g.slots.in_use(key) >= limit {
            return None;
        }
        let queue = g.waiters.get_mut(key)?;
        let head = queue.pop_front();
        if queue.is_empty() {
            g.waiters.remove(key);
        }
        Some((head?, g.slots.acquire(key)))
    }

    /// The refusal of a request that waited `waited` at `key` of limit `gate` without
    /// getting a slot (`max_wait`); it is still in line.
    pub(crate) fn wait_expired(&self, ask: &KeyAsk<'_>, waited: Duration) -> Refusal {
        let limit = &self.limits[ask.gate];
        let g = &self.gates[ask.gate];
        let in_use = g.slots.in_use(ask.key);
        let waiting = g.waiters.get(ask.key).map_or(0, VecDeque::len);
        let name = &limit.name;
        let body = refusal(
            ErrorCode::ConcurrencyLimitExceeded,
            format!(
                "limit {name:?}: no slot within max_wait ({} ms)",
                millis(waited)
            ),
            ErrorDetails {
                limit: Some(limit.limit.get() as u64),
                in_flight: Some(in_use as u64),
                waiting: Some(waiting.saturating_sub(1) as u64),
                waited_ms: Some(millis(waited)),
                retry_after_ms: retry_after(ask.hint, waiting as f64 / limit.limit.get() as f64),
                key: Some(ask.key.to_owned()),
                ..Default::default()
            },
        );
        Refusal::unless_shadow(name.clone(), Some(ask.key.to_owned()), body)
    }

    /// The key limits' term of the start prediction, in seconds (`e` s per call): for
    /// each key, the holders and waiters ahead of a new request, `limit` at a time.
    pub(crate) fn predicted_wait(&self, keys: &[Option<String>], e: f64) -> f64 {
        let mut wait = 0.0f64;
        for (gi, key) in keys.iter().enumerate() {
            let (Some(key), Some(limit)) = (key, self.limits.get(gi)) else {
                continue;
            };
            let l = limit.limit.get();
            let g = &self.gates[gi];
            let waiting = g.waiters.get(key).map_or(0, VecDeque::len);
            let held = g.slots.in_use(key);
            if held + waiting >= l {
                wait = wait.max((held + waiting + 1 - l) as f64 / l as f64 * e);
            }
        }
        wait
    }

    /// Total acquisitions and releases of every limit's slots.
    pub(crate) fn slot_totals(&self) -> (u64, u64) {
        self.gates.iter().fold((0, 0), |(a, r), g| {
            let (ga, gr) = g.slots.totals();
            (a + ga, r + gr)
        })
    }
}

impl Gate for KeyLimits {
    type Input<'a> = &'a KeyAsk<'a>;
    type Pass = KeyPass;

    /// Free, wait, or refuse. `over` counts the waiters (and, in shadow mode, the
    /// holders beyond the limit): enforce mode never holds more than the limit, so
    /// there it is the number of waiters.
    fn check(&self, ask: &KeyAsk<'_>) -> Result<KeyPass, Refusal> {
        let limit = &self.limits[ask.gate];
        let g = &self.gates[ask.gate];
        let l = limit.limit.get();
        let waiting = g.waiters.get(ask.key).map_or(0, VecDeque::len);
        let in_use = g.slots.in_use(ask.key);
        if waiting == 0 && in_use < l {
            return Ok(KeyPass::Free);
        }
        let over = in_use.saturating_sub(l) + waiting;
        let name = &limit.name;
        let message = match limit.on_busy {
            OnBusy::Wait {
                max_wait,
                max_waiters,
            } if over < max_waiters => return Ok(KeyPass::Wait(max_wait)),
            OnBusy::Reject => format!("limit {name:?}: {in_use} in flight (limit {})", limit.limit),
            OnBusy::Wait { .. } => format!(
                "limit {name:?}: {in_use} in flight and {waiting} waiting (max waiters reached)"
            ),
        };
        let details = ErrorDetails {
            limit: Some(l as u64),
            in_flight: Some(in_use as u64),
            waiting: Some(waiting as u64),
            retry_after_ms: retry_after(ask.hint, waiting as f64 / l as f64 + 1.0),
            key: Some(ask.key.to_owned()),
            ..Default::default()
        };
        let body = refusal(ErrorCode::ConcurrencyLimitExceeded, message, details);
        Err(Refusal::unless_shadow(
            name.clone(),
            Some(ask.key.to_owned()),
            body,
        ))
    }
}

/// Longest key value taken from a request body.
pub(crate) const MAX_KEY_VALUE_LEN: usize = 256;

/// Why a submission's keys cannot be resolved: answered `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A body value used as a key is too long.
    #[error("body value at {pointer} is longer than {MAX_KEY_VALUE_LEN} bytes")]
    TooLong {
        /// The limit's JSON pointer.
        pointer: String,
    },
}

/// The key of each configured limit for this submission (`None`: rule not applied).
pub(crate) fn resolve_keys(
    cfg: &AdmissionConfig,
    sub: &Submission,
) -> Result<Vec<Option<String>>, KeyError> {
    let mut body: Option<Option<serde_json::Value>> = None;
    let mut keys = Vec::with_capacity(cfg.limits.len());
    for limit in &cfg.limits {
        let key = match &limit.key {
            KeySource::Client => sub.client_key.as_ref().map(|k| format!("client:{k}")),
            KeySource::Session => sub.session.as_ref().map(|s| format!("session:{s}")),
            KeySource::Service => Some("service".to_owned()),
            KeySource::Body(ptr) => {
                let doc = body.get_or_insert_with(|| serde_json::from_slice(&sub.body).ok());
                match doc.as_ref().and_then(|d| d.pointer(ptr)) {
                    Some(serde_json::Value::String(s)) => Some(s.clone()),
                    Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                        Some(v.to_string())
                    }
                    _ => None,
                }
                .map(|v| {
                    if v.len() > MAX_KEY_VALUE_LEN {
                        Err(KeyError::TooLong {
                            pointer: ptr.clone(),
                        })
                    } else {
                        Ok(format!("body:{ptr}={v}"))
                    }
                })
                .transpose()?
            }
        };
        keys.push(key);
    }
    Ok(keys)
}
