//! Cluster-wide limits as KV slot leases ([`ClusterSlots`]), and the KV buckets the
//! durable intake opens (the session bucket for the slots, the reply bucket).
//!
//! Invariants: a slot is taken only with `create` (only-if-absent) or, for this very
//! request's slot left by a dead replica, with a compare-and-swap; a waiter is counted
//! in `waiting` by a guard that uncounts it exactly once; a store failure is an
//! [`IntakeError`], never a refusal of the request (the caller hands it back).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::StreamExt;
use tokio::time::Instant;
use weir_protocol::llm::{ErrorBody, ErrorCode, ErrorDetails};
use weir_service::nats::kv_stream_config;
use weir_service::sync::locked;

use super::ticket::Slot;
use super::{IntakeError, IntakeErrorKind, TermReason};
use crate::config::{JetStreamIntake, KeyLimit, OnBusy};
use crate::metrics as m;

/// Cluster-wide limits as slot leases in one KV bucket: the session cap (slot keys
/// `s.<hex session>.<i>` for `i` in `0..pending_cap`) and every `[[limits]]` rule
/// (`k.<hex rule name>.<hex key>.<i>` for `i` in `0..limit`).
///
/// A rule with `on_busy = "wait"` whose slots are all taken waits for one *before* the
/// local admission ([`ClusterSlots::wait_for`]): woken by a KV watch on the key's
/// slots (a slot's delete) and polling every [`CLUSTER_WAIT_POLL`] besides (an expiry
/// by `max_age` is silent on nats-server 2.9), until `max_wait` or the request's
/// deadline. The wait holds the request's intake permit, as a local wait does; at most
/// `max_waiters` requests of one key wait *on this replica*. Across replicas the
/// order is not FIFO: whichever waiter's `create` lands first takes a freed slot.
pub(crate) struct ClusterSlots {
    pub(super) kv: kv::Store,
    /// Names this replica in slot values (diagnostics).
    pub(super) replica: String,
    pub(super) session_cap: Option<usize>,
    /// The configured limits (same order).
    pub(super) limits: Vec<KeyLimit>,
    /// Requests waiting here for a wait-limit slot, by (rule index, key).
    pub(super) waiting: Mutex<HashMap<(usize, String), usize>>,
}

/// How often a request waiting for a cluster-wide slot retries besides the watch.
const CLUSTER_WAIT_POLL: Duration = Duration::from_millis(250);

/// One request counted in [`ClusterSlots::waiting`]; uncounted exactly once, by `Drop`.
struct WaitingGuard<'a> {
    slots: &'a ClusterSlots,
    key: (usize, String),
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        let mut w = locked(&self.slots.waiting);
        if let Some(n) = w.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                w.remove(&self.key);
            }
        }
    }
}

/// Why [`Ticket::take_cluster_slots`] refused.
pub(crate) enum SlotRefusal {
    /// A cluster-wide limit is full: answer this, terminate.
    Full(TermReason, Box<ErrorBody>),
    /// The KV store failed: hand the request back for later.
    Store(IntakeError),
    /// Asked not to wait, and the wait-limit at this index is full: resume with
    /// [`Ticket::wait_cluster_slots`] off the caller's path.
    MustWait(usize),
}

impl SlotRefusal {
    /// [`SlotRefusal::Full`]: the refusal `code` with its `message` and `details`.
    pub(super) fn full(
        reason: TermReason,
        code: ErrorCode,
        message: String,
        details: ErrorDetails,
    ) -> Self {
        Self::Full(
            reason,
            Box::new(ErrorBody::new(code, message).with_details(details)),
        )
    }
}

/// `concurrency_limit_exceeded`: the `limit` slots of `key` of a cluster-wide limit are
/// all taken (`waiting` here, after waiting `waited`).
pub(super) fn limit_full(
    key: &str,
    limit: u64,
    message: String,
    waiting: Option<usize>,
    waited: Option<Duration>,
) -> SlotRefusal {
    let details = ErrorDetails {
        limit: Some(limit),
        in_flight: Some(limit),
        waiting: waiting.map(|w| w as u64),
        waited_ms: waited.map(|w| w.as_millis() as u64),
        key: Some(key.to_owned()),
        ..Default::default()
    };
    let code = ErrorCode::ConcurrencyLimitExceeded;
    SlotRefusal::full(TermReason::KeyLimit, code, message, details)
}

/// What acquiring a session slot gave.
pub(super) enum SlotResult {
    Got(Slot),
    Full,
}

impl SlotResult {
    /// A slot taken (`result`: `acquired`, or `taken_over` from this request's dead
    /// replica), counted.
    fn got(result: &'static str, key: String, value: Bytes, revision: u64) -> Self {
        metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => result).increment(1);
        Self::Got(Slot {
            key,
            value,
            revision,
        })
    }
}

/// A failed read or write of slot `key`.
fn slot_failed(key: &str, e: impl std::error::Error + Send + Sync + 'static) -> IntakeError {
    IntakeError::with_source(IntakeErrorKind::Slot, format!("slot {key}"), e)
}

/// Lower-case hex of `bytes` (session ids are visible ASCII, KV keys allow less).
pub(super) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The KV key of slot `i` of `session`.
pub(crate) fn slot_key(session: &str, i: usize) -> String {
    format!("s.{}.{i}", hex(session.as_bytes()))
}

/// The KV key of slot `i` of `key` under the limit named `rule` (`*`: a watch of all).
pub(crate) fn limit_slot_key(rule: &str, key: &str, i: impl std::fmt::Display) -> String {
    format!("k.{}.{}.{i}", hex(rule.as_bytes()), hex(key.as_bytes()))
}

/// The reply bucket's key of a request id.
pub(crate) fn reply_key(request_id: &str) -> String {
    format!("r.{}", hex(request_id.as_bytes()))
}

/// Creates (if absent) and opens a KV bucket: the `KV_<bucket>` stream directly
/// ([`weir_service::nats::kv_stream_config`]), `max_age` = how long an entry lives
/// after its last write.
pub(super) async fn open_bucket(
    js: &jetstream::Context,
    key: &str,
    bucket: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<kv::Store, IntakeError> {
    let failed = |e: weir_service::error::Source| {
        IntakeError::with_source(IntakeErrorKind::Bucket, format!("{key} {bucket}"), e)
    };
    js.get_or_create_stream(kv_stream_config(bucket, max_age, replicas))
        .await
        .map_err(|e| failed(e.into()))?;
    js.get_key_value(bucket.to_owned())
        .await
        .map_err(|e| failed(e.into()))
}

/// Opens the reply bucket (`jetstream.reply_bucket`), entries kept for the duplicate
/// window; `None` when disabled.
pub(crate) async fn open_reply_bucket(
    client: &async_nats::Client,
    j: &JetStreamIntake,
) -> Result<Option<kv::Store>, IntakeError> {
    let Some(bucket) = &j.reply_bucket else {
        return Ok(None);
    };
    let js = jetstream::new(client.clone());
    open_bucket(
        &js,
        "jetstream.reply_bucket",
        bucket,
        j.duplicate_window,
        j.replicas.get(),
    )
    .await
    .map(Some)
}

impl ClusterSlots {
    /// Counts a request waiting here for a slot of `key` under limit `gi`; `Err` with
    /// how many already wait when `max_waiters` do.
    fn enter_wait(
        &self,
        gi: usize,
        key: &str,
        max_waiters: usize,
    ) -> Result<WaitingGuard<'_>, usize> {
        let mut w = locked(&self.waiting);
        let n = w.entry((gi, key.to_owned())).or_default();
        if *n >= max_waiters {
            return Err(*n);
        }
        *n += 1;
        Ok(WaitingGuard {
            slots: self,
            key: (gi, key.to_owned()),
        })
    }

    /// Takes a free one of `cap` slots (`key_of(i)`) for `request_id`, or the slot this
    /// very request held on a replica that died (redelivery: the value names the
    /// request id).
    pub(super) async fn acquire(
        &self,
        cap: usize,
        key_of: impl Fn(usize) -> String,
        request_id: Option<&str>,
    ) -> Result<SlotResult, IntakeError> {
        let replica = &self.replica;
        let value = Bytes::from(format!("{}\n{replica}", request_id.unwrap_or("-")));
        let mut taken = Vec::new();
        for i in 0..cap {
            let key = key_of(i);
            match self.kv.create(&key, value.clone()).await {
                Ok(revision) => return Ok(SlotResult::got("acquired", key, value, revision)),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => taken.push(key),
                Err(e) => return Err(slot_failed(&key, e)),
            }
        }
        // All taken: one of them may be this request's own, left by a dead replica.
        if let Some(rid) = request_id {
            for key in taken {
                let entry = self
                    .kv
                    .entry(&key)
                    .await
                    .map_err(|e| slot_failed(&key, e))?;
                let Some(entry) = entry else { continue };
                let owner = entry.value.split(|b| *b == b'\n').next().unwrap_or(&[]);
                if entry.operation == kv::Operation::Put
                    && owner == rid.as_bytes()
                    && let Ok(revision) = self.kv.update(&key, value.clone(), entry.revision).await
                {
                    return Ok(SlotResult::got("taken_over", key, value, revision));
                }
            }
        }
        metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => "full").increment(1);
        Ok(SlotResult::Full)
    }

    /// Waits for a slot of `key` under the wait-limit `rule` (index `gi`), all of whose
    /// slots were just found taken: see the type's docs. Refuses with
    /// `concurrency_limit_exceeded` when `max_waiters` already wait here or `max_wait`
    /// runs out, with `deadline_exceeded` when the deadline comes first.
    pub(super) async fn wait_for(
        &self,
        gi: usize,
        rule: &KeyLimit,
        key: &str,
        request_id: Option<&str>,
        deadline: Option<Instant>,
    ) -> Result<Slot, SlotRefusal> {
        let OnBusy::Wait {
            max_wait,
            max_waiters,
        } = rule.on_busy
        else {
            let e = IntakeError::new(IntakeErrorKind::Slot, "not a wait-limit");
            return Err(SlotRefusal::Store(e));
        };
        let name = &rule.name;
        let limit = rule.limit.get() as u64;
        let busy =
            |message, waited, waiting| limit_full(key, limit, message, Some(waiting), waited);
        let _guard = match self.enter_wait(gi, key, max_waiters) {
            Ok(guard) => guard,
            Err(waiting) => {
                metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => "wait_refused")
                    .increment(1);
                return Err(busy(
                    format!(
                        "limit {name}: {key} has {limit} requests in flight over all replicas \
                         and {waiting} waiting on this replica (max_waiters {max_waiters})"
                    ),
                    None,
                    waiting,
                ));
            }
        };
        let started = Instant::now();
        let until_wait = started + max_wait;
        let until = deadline.map_or(until_wait, |d| d.min(until_wait));
        // Watch first, then retry: a slot freed in between is seen by the retry.
        let pattern = limit_slot_key(name, key, "*");
        let mut watch = tokio::time::timeout_at(until, self.kv.watch(&pattern))
            .await
            .ok()
            .and_then(Result::ok);
        loop {
            if let SlotResult::Got(slot) = self
                .acquire(
                    rule.limit.get(),
                    |i| limit_slot_key(name, key, i),
                    request_id,
                )
                .await
                .map_err(SlotRefusal::Store)?
            {
                metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => "waited").increment(1);
                return Ok(slot);
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            let next = (now + CLUSTER_WAIT_POLL).min(until);
            match watch.as_mut() {
                Some(w) => {
                    // Any change of the key's slots (a delete frees one) wakes the
                    // retry; a watch that ended leaves the polling.
                    match tokio::time::timeout_at(next, w.next()).await {
                        Ok(Some(Ok(_))) | Err(_) => {}
                        Ok(Some(Err(_)) | None) => watch = None,
                    }
                }
                None => tokio::time::sleep_until(next).await,
            }
        }
        let waited = started.elapsed();
        metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => "wait_timeout").increment(1);
        let waiting = locked(&self.waiting)
            .get(&(gi, key.to_owned()))
            .map_or(0, |n| n.saturating_sub(1));
        if deadline.is_some_and(|d| d < until_wait) {
            return Err(SlotRefusal::full(
                TermReason::WaitExpired,
                ErrorCode::DeadlineExceeded,
                format!(
                    "deadline passed after {} ms waiting for a slot of limit {name} ({key}) over all replicas",
                    waited.as_millis()
                ),
                ErrorDetails {
                    waited_ms: Some(waited.as_millis() as u64),
                    key: Some(key.to_owned()),
                    ..Default::default()
                },
            ));
        }
        Err(busy(
            format!(
                "limit {name}: no slot within max_wait ({} ms) over all replicas",
                max_wait.as_millis()
            ),
            Some(waited),
            waiting,
        ))
    }
}
