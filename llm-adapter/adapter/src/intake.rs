//! The durable intake (`intake = "jetstream"`): requests wait in a JetStream
//! work-queue stream instead of one replica's memory, and every replica pulls them
//! through one durable consumer.
//!
//! Wire contract (docs/llm-adapter.md, "Durable intake"): a request is a message on
//! `jetstream.subject` with the usual `Weir-*` headers, `Weir-Reply-To` = the subject
//! the answer goes to (JetStream keeps no reply subject) and `Nats-Msg-Id` = the
//! request id (the stream drops a second copy within `jetstream.duplicate_window_ms`).
//! With `jetstream.forward` (the default) a core request on `service.subject` is put
//! into the stream by the replica that receives it, so callers stay unchanged.
//!
//! Invariants a reader must not break:
//! - a replica pulls only as many requests as it has free intake permits (`workers`):
//!   what waits, waits in the stream, where any replica can take it; the consumer's
//!   `max_ack_pending` bounds what all replicas hold together;
//! - a pulled request holds its permit inside its [`Ticket`], which rides in the
//!   waiter; the permit (and the cluster session slot) is released exactly once, when
//!   the ticket is dropped after the answer was published;
//! - every pulled request is settled exactly once: `+ACK` after its answer was
//!   published (and kept, see below), `+TERM` when it is refused before admission
//!   (expired deadline, malformed headers, no reply subject, cluster session cap),
//!   `-NAK` when this replica stops (`shutting_down`: another replica answers it; the
//!   caller sees nothing of it) or a store it needs fails (except on its last delivery:
//!   then it is refused and terminated); a replica that dies settles nothing and the
//!   server redelivers after `ack_wait`;
//! - while a request is held, the keeper task sends `+WPI` (progress) every
//!   `progress_interval`, so a long inference is not redelivered while its replica lives;
//! - a request whose deadline passed in the stream is never started: answered
//!   `deadline_exceeded` and terminated;
//! - nothing from the network panics: bad headers are `invalid_request` + `+TERM`,
//!   counted in `weir_llm_intake_terminated_total{reason}`; a pull error (a missed
//!   heartbeat, a server restart) is counted and the loop goes on.
//!
//! The session cap (`session.pending_cap`) and every `[[limits]]` rule are
//! cluster-wide (a wait-limit waits for a cluster slot, see [`ClusterSlots`]): one KV
//! key per (key, slot index), taken with `create` (only-if-absent) before the local admission, renewed
//! with compare-and-swap by the keeper, deleted (expecting its revision) when the
//! request settles, and expiring after `ack_wait` (the bucket's `max_age`) when its
//! replica died — the same time after which the server redelivers the request, which
//! then takes its own slot over (the value names the request id).
//!
//! Answers are kept in a second KV bucket (`jetstream.reply_bucket`) for the duplicate
//! window, so that a retry the stream dropped as a duplicate is answered with the
//! original's answer by the replica that forwarded it ([`wait_kept_reply`]), and a
//! redelivered request that was already answered is answered from it, not run again:
//! - a unary answer with a request id, a refusal too, is kept *before* its `+ACK`
//!   (`+TERM`), retried while the keeper sends progress for it, for at most `ack_wait`
//!   ([`Ticket::settle`]): an ack lost with a dying node (a leader election) then
//!   always finds the answer kept; shutdown waits for these settlements;
//! - the redelivered copy reads the bucket through its stream leader (not a direct get
//!   a lagging follower may answer), in a task of its own (off the pull loop); a failed
//!   read is retried while the request is held, for at most `ack_wait`, then the
//!   request is handed back for later (`-NAK` after [`STORE_ERROR_DELAY`]) unless it
//!   is the last delivery (`max_deliver`), which runs: at least once rather than never
//!   ([`replay_kept`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer, kv, stream};
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, ErrorCode, ErrorDetails};
use weir_service::nats::kv_stream_config;
use weir_service::ratelimit::LogLimit;

mod kept;

pub(crate) use self::kept::{KeptReply, conflict, fingerprint, wait_kept_reply};
use self::kept::{Replay, encode_reply, replay_kept};
use crate::config::{Config, JetStreamIntake, KeyLimit, Mode, OnBusy};
use crate::metrics as m;
use crate::millis::{unix_ms_now, whole_ms};
use crate::service::header;
use crate::sync::locked;

/// How long one pull request waits on the server for messages.
const PULL_EXPIRES: Duration = Duration::from_millis(1000);
/// Pause after a failed pull request (server gone, consumer deleted) before the next.
const PULL_RETRY: Duration = Duration::from_millis(250);
/// A NAK after a session-store error asks for redelivery after this long (not at once:
/// a KV outage must not burn `max_deliver` in a tight loop).
const STORE_ERROR_DELAY: Duration = Duration::from_secs(1);
/// Pause between two attempts to keep an answer in the reply bucket.
const KEEP_RETRY: Duration = Duration::from_millis(250);

/// Why a pulled request was terminated without admission (`reason` label).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TermReason {
    /// Its deadline had passed before it was pulled.
    Expired,
    /// A malformed header (answered `invalid_request`).
    Invalid,
    /// No valid `Weir-Reply-To`: nothing can be answered.
    NoReply,
    /// No readable header block (none, or one the NATS client could not decode and
    /// delivered without headers, e.g. a value that is not UTF-8): nothing can be
    /// answered.
    NoHeaders,
    /// Its request id has an answer kept for another body or session (answered
    /// `request_id_conflict`; that answer is not sent, nor replaced).
    RequestIdConflict,
    /// The cluster-wide session cap was reached (answered `session_queue_full`).
    SessionCap,
    /// A cluster-wide limit was full: a reject-limit at once, a wait-limit after its
    /// `max_wait` or with `max_waiters` already waiting here (answered
    /// `concurrency_limit_exceeded`).
    KeyLimit,
    /// Its deadline passed while it waited for a cluster-wide wait-limit slot
    /// (answered `deadline_exceeded`).
    WaitExpired,
    /// The cluster slot store failed on its last delivery (`max_deliver`): answered
    /// `queue_full` rather than left unanswered in the stream.
    SlotStore,
}

/// Publishes one acknowledgement to a JetStream message's ack subject, bounded.
async fn send_ack(client: &async_nats::Client, ack: &Subject, kind: AckKind, limit: Duration) {
    let label = match kind {
        AckKind::Ack => "ack",
        AckKind::Nak(_) => "nak",
        AckKind::Progress => "progress",
        AckKind::Term => "term",
        AckKind::Next => "next",
    };
    let sent = tokio::time::timeout(limit, client.publish(ack.clone(), Bytes::from(kind))).await;
    if matches!(sent, Ok(Ok(()))) {
        metrics::counter!(m::INTAKE_ACKS_TOTAL, "kind" => label).increment(1);
    } else {
        metrics::counter!(m::INTAKE_ACK_FAILED_TOTAL).increment(1);
    }
}

/// What the keeper task is told.
enum KeeperMsg {
    /// A request now holds this session slot (renew it until released).
    Slot { ticket: u64, slot: Slot },
    /// The ticket was dropped: delete its slot, if any.
    Release { ticket: u64 },
}

/// One held cluster session slot.
#[derive(Debug, Clone)]
struct Slot {
    key: String,
    value: Bytes,
    revision: u64,
}

/// Shared by the pull loop, the keeper and the tickets.
pub(crate) struct Hub {
    client: async_nats::Client,
    publish_timeout: Duration,
    /// Ack subjects of the requests this replica holds (progress is sent for each).
    held: Mutex<HashMap<u64, Subject>>,
    next_id: AtomicU64,
    keeper: mpsc::UnboundedSender<KeeperMsg>,
    /// The reply bucket (`jetstream.reply_bucket`), where answers are kept.
    replies: Option<kv::Store>,
    /// How long an answer is retried into the reply bucket before its `+ACK` goes
    /// without it (`jetstream.ack_wait_ms`).
    keep_limit: Duration,
    /// Cluster-wide session cap and reject-limits (`None`: none configured, or shadow).
    slots: Option<Arc<ClusterSlots>>,
}

impl Hub {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Subject>> {
        locked(&self.held)
    }
}

/// A pulled request's hold on its stream message, its intake permit and its cluster
/// session slot. Carried in the waiter; settled by the sink ([`Ticket::settle`]);
/// dropping it releases the permit and the slot exactly once.
pub struct Ticket {
    hub: Arc<Hub>,
    id: u64,
    ack: Subject,
    /// Answer with `+TERM` instead of `+ACK` (refused before admission).
    term: bool,
    /// `Weir-Request-Id` (the answer is kept under it).
    request_id: Option<String>,
    /// The request's fingerprint ([`fingerprint`]), kept with its answer.
    fingerprint: String,
    /// The answer to keep before the `+ACK` ([`Ticket::keep_reply`]).
    kept: Option<Bytes>,
    /// This is the request's last delivery (`max_deliver`): a store failure must not
    /// hand it back, the server would not deliver it again.
    last_delivery: bool,
    _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("id", &self.id).finish()
    }
}

/// How a ticket is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// The answer was published (`+ACK`, or `+TERM` for a refusal before admission).
    Answered,
    /// This replica stops: redeliver to another (`-NAK`), no answer published.
    HandOver,
    /// A store this replica needs failed: redeliver after a delay, no answer.
    Retry,
}

impl Ticket {
    /// Marks the request as refused before admission: its answer terminates it
    /// (`+TERM`, never redelivered). Counted by `reason`.
    pub(crate) fn terminate(&mut self, reason: TermReason) {
        if !self.term {
            self.term = true;
            metrics::counter!(m::INTAKE_TERMINATED_TOTAL, "reason" => reason.as_str()).increment(1);
        }
    }

    /// Takes this request's cluster-wide slots: one of the session's `pending_cap`
    /// slots, and one slot of each limit key (`keys`, as admission resolves them, in
    /// the configured order). A full wait-limit gives [`SlotRefusal::MustWait`]: the
    /// caller resumes with [`Self::wait_cluster_slots`] where waiting holds up nothing
    /// else (the intake's admission path must keep reading pulled messages). Slots
    /// taken before a refusal are released when the ticket drops. `Ok` without a
    /// cluster store.
    pub(crate) async fn take_cluster_slots(
        &mut self,
        session: Option<&str>,
        keys: &[Option<String>],
    ) -> Result<(), SlotRefusal> {
        let Some(slots) = self.hub.slots.clone() else {
            return Ok(());
        };
        if let (Some(cap), Some(session)) = (slots.session_cap, session)
            && !self
                .take_slot(&slots, cap, |i| slot_key(session, i))
                .await?
        {
            let cap = cap as u64;
            return Err(SlotRefusal::full(
                TermReason::SessionCap,
                ErrorCode::SessionQueueFull,
                format!("session has {cap} pending requests over all replicas (limit {cap})"),
                ErrorDetails {
                    limit: Some(cap),
                    pending: Some(cap),
                    key: Some(format!("session:{session}")),
                    ..Default::default()
                },
            ));
        }
        self.take_limit_slots(&slots, 0, keys, None).await
    }

    /// Resumes [`Self::take_cluster_slots`] after [`SlotRefusal::MustWait`]`(from)`:
    /// waits for that wait-limit's slot until its `max_wait` or `deadline`, then takes
    /// the remaining rules' slots (waiting as needed).
    pub(crate) async fn wait_cluster_slots(
        &mut self,
        from: usize,
        keys: &[Option<String>],
        deadline: Option<Instant>,
    ) -> Result<(), SlotRefusal> {
        let Some(slots) = self.hub.slots.clone() else {
            return Ok(());
        };
        self.take_limit_slots(&slots, from, keys, Some(deadline))
            .await
    }

    /// Takes one of `cap` slots (`key_of(i)`) and holds it; `false` = all are taken.
    async fn take_slot(
        &self,
        slots: &ClusterSlots,
        cap: usize,
        key_of: impl Fn(usize) -> String,
    ) -> Result<bool, SlotRefusal> {
        let rid = self.request_id.as_deref();
        match slots.acquire(cap, key_of, rid).await {
            Ok(SlotResult::Got(slot)) => {
                self.hold_slot(slot);
                Ok(true)
            }
            Ok(SlotResult::Full) => Ok(false),
            Err(e) => Err(SlotRefusal::Store(e)),
        }
    }

    /// The keeper renews `slot` while this ticket lives and deletes it after.
    fn hold_slot(&self, slot: Slot) {
        let _ = self.hub.keeper.send(KeeperMsg::Slot {
            ticket: self.id,
            slot,
        });
    }

    /// The limit rules' slots from index `from` on; `wait`: `None` = refuse with
    /// `MustWait` at a full wait-limit, `Some(deadline)` = wait for it.
    async fn take_limit_slots(
        &self,
        slots: &ClusterSlots,
        from: usize,
        keys: &[Option<String>],
        wait: Option<Option<Instant>>,
    ) -> Result<(), SlotRefusal> {
        for (gi, (rule, key)) in slots.limits.iter().zip(keys).enumerate().skip(from) {
            let Some(key) = key else {
                continue;
            };
            let (name, limit) = (&rule.name, rule.limit.get());
            if self
                .take_slot(slots, limit, |i| limit_slot_key(name, key, i))
                .await?
            {
                continue;
            }
            match (rule.on_busy, wait) {
                (OnBusy::Wait { .. }, None) => return Err(SlotRefusal::MustWait(gi)),
                (OnBusy::Wait { .. }, Some(deadline)) => {
                    let rid = self.request_id.as_deref();
                    self.hold_slot(slots.wait_for(gi, rule, key, rid, deadline).await?);
                }
                (OnBusy::Reject, _) => {
                    let limit = limit as u64;
                    return Err(SlotRefusal::full(
                        TermReason::KeyLimit,
                        ErrorCode::ConcurrencyLimitExceeded,
                        format!(
                            "limit {name}: {key} has {limit} requests in flight over all replicas (limit {limit})"
                        ),
                        ErrorDetails {
                            limit: Some(limit),
                            in_flight: Some(limit),
                            key: Some(key.clone()),
                            ..Default::default()
                        },
                    ));
                }
            }
        }
        Ok(())
    }

    /// The request id (`Weir-Request-Id`), when valid.
    pub(crate) fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// Whether this is the request's last delivery (`jetstream.max_deliver`).
    pub(crate) fn last_delivery(&self) -> bool {
        self.last_delivery
    }

    /// Keeps the answer (to be published) in the reply bucket under the request id,
    /// for a duplicate the stream dropped and for a redelivery of this request: written
    /// when the ticket is settled, before its `+ACK`.
    pub(crate) fn keep_reply(&mut self, headers: &HeaderMap, body: &[u8]) {
        if self.hub.replies.is_some() && self.request_id.is_some() {
            self.kept = Some(encode_reply(headers, body, &self.fingerprint));
        }
    }

    /// Sends the acknowledgement; the permit and the slot go when `self` drops.
    ///
    /// An answer to keep ([`Self::keep_reply`]) is written to the reply bucket first,
    /// in a task of its own (the worker does not wait): retried every [`KEEP_RETRY`]
    /// until the bucket confirms it or `keep_limit` passed, the request held (the
    /// keeper sends its progress) until then. An `+ACK` can be lost (its node dies in a
    /// leader election) and the request is then redelivered: it must find the answer.
    /// A refusal (`+TERM`) is kept the same way: a retry with its id gets the refusal.
    pub(crate) async fn settle(mut self, how: Settle) {
        if how == Settle::Answered
            && let Some(value) = self.kept.take()
        {
            let kind = if self.term {
                AckKind::Term
            } else {
                AckKind::Ack
            };
            tokio::spawn(async move {
                self.keep(value).await;
                send_ack(&self.hub.client, &self.ack, kind, self.hub.publish_timeout).await;
            });
            return;
        }
        let kind = match how {
            Settle::HandOver => AckKind::Nak(None),
            Settle::Retry => AckKind::Nak(Some(STORE_ERROR_DELAY)),
            Settle::Answered if self.term => AckKind::Term,
            Settle::Answered => AckKind::Ack,
        };
        send_ack(&self.hub.client, &self.ack, kind, self.hub.publish_timeout).await;
    }

    /// Writes `value` under this request's reply key until the bucket confirms it or
    /// `keep_limit` passed (counted `kept`, `retried` per further attempt, `failed`).
    async fn keep(&self, value: Bytes) {
        let (Some(kv), Some(rid)) = (&self.hub.replies, &self.request_id) else {
            return;
        };
        let key = reply_key(rid);
        let until = Instant::now() + self.hub.keep_limit;
        loop {
            let put = tokio::time::timeout(self.hub.publish_timeout, kv.put(&key, value.clone()));
            if matches!(put.await, Ok(Ok(_))) {
                metrics::counter!(m::INTAKE_REPLIES_KEPT_TOTAL, "result" => "kept").increment(1);
                return;
            }
            if Instant::now() + KEEP_RETRY >= until {
                metrics::counter!(m::INTAKE_REPLIES_KEPT_TOTAL, "result" => "failed").increment(1);
                static KEEP_FAILED: LogLimit = LogLimit::new(Duration::from_secs(10));
                if let Some(suppressed) = KEEP_FAILED.allow() {
                    tracing::warn!(
                        request_id = %rid,
                        suppressed,
                        "answer not kept in the reply bucket; a redelivery would run it again"
                    );
                }
                return;
            }
            metrics::counter!(m::INTAKE_REPLIES_KEPT_TOTAL, "result" => "retried").increment(1);
            tokio::time::sleep(KEEP_RETRY).await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.hub.held().remove(&self.id);
        let _ = self.hub.keeper.send(KeeperMsg::Release { ticket: self.id });
        metrics::gauge!(m::INTAKE_HELD).decrement(1.0);
    }
}

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
    kv: kv::Store,
    /// Names this replica in slot values (diagnostics).
    replica: String,
    session_cap: Option<usize>,
    /// The configured limits (same order).
    limits: Vec<KeyLimit>,
    /// Requests waiting here for a wait-limit slot, by (rule index, key).
    waiting: Mutex<HashMap<(usize, String), usize>>,
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
    Store(String),
    /// Asked not to wait, and the wait-limit at this index is full: resume with
    /// [`Ticket::wait_cluster_slots`] off the caller's path.
    MustWait(usize),
}

impl SlotRefusal {
    /// [`SlotRefusal::Full`]: the refusal `code` with its `message` and `details`.
    fn full(reason: TermReason, code: ErrorCode, message: String, details: ErrorDetails) -> Self {
        Self::Full(
            reason,
            Box::new(ErrorBody::new(code, message).with_details(details)),
        )
    }
}

/// What acquiring a session slot gave.
enum SlotResult {
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

/// Lower-case hex of `bytes` (session ids are visible ASCII, KV keys allow less).
fn hex(bytes: &[u8]) -> String {
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

/// The KV key of slot `i` of `key` under the limit named `rule`.
pub(crate) fn limit_slot_key(rule: &str, key: &str, i: usize) -> String {
    format!("k.{}.{}.{i}", hex(rule.as_bytes()), hex(key.as_bytes()))
}

/// The reply bucket's key of a request id.
pub(crate) fn reply_key(request_id: &str) -> String {
    format!("r.{}", hex(request_id.as_bytes()))
}

/// Creates (if absent) and opens a KV bucket: the `KV_<bucket>` stream directly
/// ([`weir_service::nats::kv_stream_config`]), `max_age` = how long an entry lives
/// after its last write.
async fn open_bucket(
    js: &jetstream::Context,
    key: &str,
    bucket: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<kv::Store, String> {
    js.get_or_create_stream(kv_stream_config(bucket, max_age, replicas))
        .await
        .map_err(|e| format!("{key} {bucket}: {e}"))?;
    js.get_key_value(bucket.to_owned())
        .await
        .map_err(|e| format!("{key} {bucket}: {e}"))
}

/// Opens the reply bucket (`jetstream.reply_bucket`), entries kept for the duplicate
/// window; `None` when disabled.
pub(crate) async fn open_reply_bucket(
    client: &async_nats::Client,
    j: &JetStreamIntake,
) -> Result<Option<kv::Store>, String> {
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
    /// Takes a free one of `cap` slots (`key_of(i)`) for `request_id`, or the slot this
    /// very request held on a replica that died (redelivery: the value names the
    /// request id).
    async fn acquire(
        &self,
        cap: usize,
        key_of: impl Fn(usize) -> String,
        request_id: Option<&str>,
    ) -> Result<SlotResult, String> {
        let replica = &self.replica;
        let value = Bytes::from(format!("{}\n{replica}", request_id.unwrap_or("-")));
        let mut taken = Vec::new();
        for i in 0..cap {
            let key = key_of(i);
            match self.kv.create(&key, value.clone()).await {
                Ok(revision) => return Ok(SlotResult::got("acquired", key, value, revision)),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => taken.push(key),
                Err(e) => return Err(format!("slot {key}: {e}")),
            }
        }
        // All taken: one of them may be this request's own, left by a dead replica.
        if let Some(rid) = request_id {
            for key in taken {
                let entry = self
                    .kv
                    .entry(&key)
                    .await
                    .map_err(|e| format!("slot {key}: {e}"))?;
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
    async fn wait_for(
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
            return Err(SlotRefusal::Store("not a wait-limit".into()));
        };
        let name = &rule.name;
        let limit = rule.limit.get() as u64;
        let busy = |message: String, waited: Option<Duration>, waiting: usize| {
            let details = ErrorDetails {
                limit: Some(limit),
                in_flight: Some(limit),
                waiting: Some(waiting as u64),
                waited_ms: waited.map(|w| w.as_millis() as u64),
                key: Some(key.to_owned()),
                ..Default::default()
            };
            let code = ErrorCode::ConcurrencyLimitExceeded;
            SlotRefusal::full(TermReason::KeyLimit, code, message, details)
        };
        let _guard = {
            let mut w = locked(&self.waiting);
            let n = w.entry((gi, key.to_owned())).or_default();
            if *n >= max_waiters {
                let waiting = *n;
                drop(w);
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
            *n += 1;
            WaitingGuard {
                slots: self,
                key: (gi, key.to_owned()),
            }
        };
        let started = Instant::now();
        let until_wait = started + max_wait;
        let until = deadline.map_or(until_wait, |d| d.min(until_wait));
        // Watch first, then retry: a slot freed in between is seen by the retry.
        let pattern = format!("k.{}.{}.*", hex(name.as_bytes()), hex(key.as_bytes()));
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

/// Creates (or opens) the work-queue stream, the durable consumer and, with a session
/// cap, the session bucket.
async fn open(
    js: &jetstream::Context,
    cfg: &Config,
    j: &JetStreamIntake,
) -> Result<(consumer::PullConsumer, Option<ClusterSlots>), String> {
    let max_age = cfg.admission.deadline.max.max(j.duplicate_window);
    let stream = js
        .get_or_create_stream(stream::Config {
            name: j.stream.clone(),
            subjects: vec![j.subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            max_messages: i64::try_from(j.max_messages.get()).unwrap_or(i64::MAX),
            max_bytes: i64::try_from(j.max_bytes.get()).unwrap_or(i64::MAX),
            max_age,
            discard: stream::DiscardPolicy::New,
            duplicate_window: j.duplicate_window,
            storage: if j.file_storage {
                stream::StorageType::File
            } else {
                stream::StorageType::Memory
            },
            num_replicas: j.replicas.get(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("jetstream.stream {}: {e}", j.stream))?;
    let consumer = stream
        .get_or_create_consumer(
            &j.consumer,
            consumer::pull::Config {
                durable_name: Some(j.consumer.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: j.ack_wait,
                max_ack_pending: i64::try_from(j.max_ack_pending.get()).unwrap_or(i64::MAX),
                max_deliver: i64::try_from(j.max_deliver.get()).unwrap_or(i64::MAX),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("jetstream.consumer {}: {e}", j.consumer))?;
    let session_cap = cfg.admission.session.pending_cap.map(|c| c.get());
    let wanted = session_cap.is_some() || !cfg.admission.limits.is_empty();
    let slots = if wanted && cfg.admission.mode == Mode::Enforce {
        let kv = open_bucket(
            js,
            "jetstream.session_bucket",
            &j.session_bucket,
            j.ack_wait,
            j.replicas.get(),
        )
        .await?;
        Some(ClusterSlots {
            kv,
            replica: js_replica_name(),
            session_cap,
            limits: cfg.admission.limits.clone(),
            waiting: Mutex::default(),
        })
    } else {
        None
    };
    Ok((consumer, slots))
}

/// A name for this replica in slot values: process id and a random token.
fn js_replica_name() -> String {
    format!("pid {} {:016x}", std::process::id(), rand::random::<u64>())
}

/// One pulled message, prepared for the edge: its reply subject, the headers with the
/// deadline made absolute, and its ticket.
pub(crate) struct Pulled {
    /// The message as the core edge decodes it (headers rewritten, see [`absolute_deadline`]).
    pub(crate) message: async_nats::Message,
    /// `Weir-Reply-To`.
    pub(crate) reply: Subject,
    /// The hold on the stream message.
    pub(crate) ticket: Ticket,
}

/// What the pull loop hands each message to (the service edge).
pub(crate) trait Admit: Send + Sync + 'static {
    /// Admits one pulled request (or answers it at once); the ticket rides in the waiter.
    fn admit(self: &Arc<Self>, pulled: Pulled) -> impl Future<Output = ()> + Send;
    /// Answers a pulled request at once with `error` (the ticket settles it).
    fn refuse(
        &self,
        pulled: Pulled,
        error: ErrorBody,
        received_at: Instant,
    ) -> impl Future<Output = ()> + Send;
}

/// The running intake: the pull loop and the keeper.
pub(crate) struct IntakeEdge {
    stop: watch::Sender<bool>,
    pull: Option<JoinHandle<()>>,
    keeper: Option<JoinHandle<()>>,
    /// The intake permits (`workers`): all free again = every ticket settled.
    permits: Arc<Semaphore>,
    workers: u32,
    /// The longest a ticket can take to settle once answered: its answer's keep
    /// (`keep_limit`), then the `+ACK` (`publish_timeout`).
    settle_limit: Duration,
}

/// The effective absolute deadline (unix ms) of a request published at `published_ms`:
/// the earlier of `Weir-Deadline-Ms` and `published_ms + Weir-Timeout-Ms` (a relative
/// budget counts from the moment the stream stored the request, so time spent waiting
/// in the stream, and on a replica that died, counts); without either,
/// `published_ms + deadline.default_ms` when a default is configured. `Err` = a
/// malformed header (the edge's decoder answers it, naming the header).
pub(crate) fn absolute_deadline(
    deadline: Option<&str>,
    timeout: Option<&str>,
    published_ms: u64,
    default: Option<Duration>,
) -> Result<Option<u64>, ()> {
    let parse = |name, v: Option<&str>| v.map(|v| h::parse_ms(name, v)).transpose();
    let d = parse(h::DEADLINE_MS, deadline).map_err(|_| ())?;
    let t = parse(h::TIMEOUT_MS, timeout).map_err(|_| ())?;
    let from_timeout = t.map(|t| published_ms.saturating_add(t));
    Ok(match (d, from_timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (None, None) => default.map(|d| published_ms.saturating_add(whole_ms(d))),
        (a, b) => a.or(b),
    })
}

/// Whether `s` can be published to: non-empty dot-separated tokens of visible ASCII,
/// no wildcards.
pub(crate) fn valid_reply_subject(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 1024
        && s.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && t.bytes().all(|b| (b'!'..=b'~').contains(&b))
        })
}

/// Rewrites the deadline headers of `headers` to one absolute `Weir-Deadline-Ms`
/// (`deadline_ms`), removing `Weir-Timeout-Ms`.
pub(crate) fn set_deadline(headers: &HeaderMap, deadline_ms: Option<u64>) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, values) in headers.iter() {
        let n: &str = name.as_ref();
        if n.eq_ignore_ascii_case(h::TIMEOUT_MS) || n.eq_ignore_ascii_case(h::DEADLINE_MS) {
            continue;
        }
        for v in values {
            out.append(name.clone(), v.clone());
        }
    }
    if let Some(d) = deadline_ms {
        crate::service::put_static(&mut out, h::DEADLINE_MS, &d.to_string());
    }
    out
}

impl IntakeEdge {
    /// Opens the stream, the consumer and the session bucket, then starts pulling.
    pub(crate) async fn start<A: Admit>(
        client: &async_nats::Client,
        config: Arc<Config>,
        edge: Arc<A>,
        replies: Option<kv::Store>,
    ) -> Result<Self, String> {
        let Some(j) = config.intake.jetstream().cloned() else {
            return Err("intake is not jetstream".into());
        };
        let js = jetstream::new(client.clone());
        let (consumer, slots) = open(&js, &config, &j).await?;
        let (keeper_tx, keeper_rx) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            client: client.clone(),
            publish_timeout: config.nats.publish_timeout,
            held: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            keeper: keeper_tx,
            replies,
            keep_limit: j.ack_wait,
            slots: slots.map(Arc::new),
        });
        let (stop, stop_rx) = watch::channel(false);
        let keeper = tokio::spawn(keeper(hub.clone(), j.progress_interval, keeper_rx));
        let workers = config.admission.workers.get();
        let settle_limit = j.ack_wait + config.nats.publish_timeout;
        let permits = Arc::new(Semaphore::new(workers));
        let pull = tokio::spawn(pull_loop(PullCtx {
            consumer,
            hub,
            edge,
            permits: permits.clone(),
            config,
            stop: stop_rx,
        }));
        Ok(Self {
            stop,
            pull: Some(pull),
            keeper: Some(keeper),
            permits,
            workers: u32::try_from(workers).unwrap_or(u32::MAX),
            settle_limit,
        })
    }

    /// Stops pulling (requests still in the last pull are handed over with `-NAK`).
    /// Bounded by `wait`.
    pub(crate) async fn stop_pulling(&mut self, wait: Duration) {
        let _ = self.stop.send(true);
        if let Some(p) = self.pull.take()
            && tokio::time::timeout(wait, p).await.is_err()
        {
            tracing::warn!("intake pull loop did not end in time");
        }
    }

    /// Stops the keeper once every held request was settled (their answers kept and
    /// acknowledged), or after the longest a settlement can take (AckWait +
    /// `publish_timeout`; milliseconds unless the reply bucket is failing): no more
    /// progress. Stopping it earlier would let the runtime drop an answer's keep with
    /// its `+ACK`, and the request would be redelivered and run again.
    pub(crate) async fn stop_keeper(&mut self) {
        // Permits in use are held by tickets (the pull loop has stopped).
        let settled =
            tokio::time::timeout(self.settle_limit, self.permits.acquire_many(self.workers)).await;
        if settled.is_err() {
            tracing::warn!(
                "intake requests still unsettled at shutdown; the server redelivers them"
            );
        }
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

struct PullCtx<A> {
    consumer: consumer::PullConsumer,
    hub: Arc<Hub>,
    edge: Arc<A>,
    permits: Arc<Semaphore>,
    config: Arc<Config>,
    stop: watch::Receiver<bool>,
}

async fn pull_loop<A: Admit>(mut ctx: PullCtx<A>) {
    loop {
        if *ctx.stop.borrow() {
            return;
        }
        // Wait for one free permit, then take every other free one: pull exactly as
        // many requests as this replica can start.
        let first = tokio::select! {
            p = ctx.permits.clone().acquire_owned() => p,
            _ = ctx.stop.changed() => return,
        };
        let Ok(first) = first else { return };
        let mut permits = vec![first];
        while let Ok(p) = ctx.permits.clone().try_acquire_owned() {
            permits.push(p);
        }
        let batch = ctx
            .consumer
            .batch()
            .max_messages(permits.len())
            .expires(PULL_EXPIRES)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                metrics::counter!(m::INTAKE_PULL_ERRORS_TOTAL).increment(1);
                static PULL_FAILED: LogLimit = LogLimit::new(Duration::from_secs(10));
                if let Some(suppressed) = PULL_FAILED.allow() {
                    tracing::warn!(error = %e, suppressed, "intake pull request failed; retrying");
                }
                drop(permits);
                tokio::time::sleep(PULL_RETRY).await;
                continue;
            }
        };
        let mut stopping = false;
        loop {
            let item = if stopping {
                // Drain what the server already sent for this pull and hand it over.
                tokio::time::timeout(PULL_EXPIRES * 2, batch.next())
                    .await
                    .ok()
                    .flatten()
            } else {
                tokio::select! {
                    item = batch.next() => item,
                    _ = ctx.stop.changed() => { stopping = true; continue; }
                }
            };
            let Some(item) = item else { break };
            match item {
                Ok(msg) => match permits.pop() {
                    Some(permit) if !stopping && !*ctx.stop.borrow() => {
                        handle(&ctx, msg, permit).await;
                    }
                    // Stopping, or more than asked for (cannot happen): hand it back.
                    permit => {
                        stopping |= permit.is_some();
                        if let Some(ack) = msg.message.reply.clone() {
                            send_ack(&ctx.hub.client, &ack, AckKind::Nak(None), PULL_EXPIRES).await;
                        }
                    }
                },
                Err(e) => {
                    // A missed heartbeat or a status from the server: count it, pull again.
                    metrics::counter!(m::INTAKE_PULL_ERRORS_TOTAL).increment(1);
                    tracing::debug!(error = %e, "intake pull item error");
                    break;
                }
            }
        }
        if stopping {
            return;
        }
    }
}

async fn handle<A: Admit>(ctx: &PullCtx<A>, msg: jetstream::Message, permit: OwnedSemaphorePermit) {
    let received_at = Instant::now();
    metrics::counter!(m::INTAKE_PULLED_TOTAL).increment(1);
    // The stream's timestamp (the server's clock) and the delivery count, from the ack
    // subject; a subject that does not parse is treated as a first delivery now.
    let (delivered, published_ms) = msg.info().map_or_else(
        |_| (1, unix_ms_now()),
        |i| {
            let ms = i.published.unix_timestamp_nanos() / 1_000_000;
            (i.delivered, u64::try_from(ms).unwrap_or(0))
        },
    );
    let message = msg.message;
    let Some(ack) = message.reply.clone() else {
        return;
    };
    if delivered > 1 {
        metrics::counter!(m::INTAKE_REDELIVERED_TOTAL).increment(1);
    }
    let id = ctx.hub.next_id.fetch_add(1, Ordering::Relaxed);
    ctx.hub.held().insert(id, ack.clone());
    metrics::gauge!(m::INTAKE_HELD).increment(1.0);
    // The request id: `Weir-Request-Id`, else `Nats-Msg-Id` (the wire contract makes
    // them the same; a direct publisher may set only the one the stream dedups on).
    let request_id = [h::REQUEST_ID, h::NATS_MSG_ID]
        .into_iter()
        .filter_map(|name| header(message.headers.as_ref(), name))
        .map(str::trim)
        .find(|r| h::parse_id(h::REQUEST_ID, r).is_ok())
        .map(str::to_owned);
    let last_delivery = ctx
        .config
        .intake
        .jetstream()
        .is_none_or(|j| delivered >= i64::try_from(j.max_deliver.get()).unwrap_or(i64::MAX));
    // The stream dedups on `Nats-Msg-Id`: only when it is the request id can no other
    // stored message carry this request id within the duplicate window.
    let deduped =
        header(message.headers.as_ref(), h::NATS_MSG_ID).map(str::trim) == request_id.as_deref();
    let mut ticket = Ticket {
        hub: ctx.hub.clone(),
        id,
        ack,
        term: false,
        request_id,
        fingerprint: fingerprint(
            crate::service::session_of(&message).as_deref(),
            &message.payload,
        ),
        kept: None,
        last_delivery,
        _permit: permit,
    };
    let hm = message.headers.as_ref();
    let reply = header(hm, h::REPLY_TO)
        .map(str::trim)
        .filter(|s| valid_reply_subject(s));
    let Some(reply) = reply.map(Subject::from) else {
        // Without a readable header block (the NATS client delivers a block it cannot
        // decode as none) there is no reply subject either: terminated on this first
        // delivery, never redelivered.
        let reason = match hm {
            None => TermReason::NoHeaders,
            Some(_) => TermReason::NoReply,
        };
        ticket.terminate(reason);
        tracing::debug!(
            reason = reason.as_str(),
            "intake message without a valid Weir-Reply-To: terminated"
        );
        ticket.settle(Settle::Answered).await;
        return;
    };
    // A redelivered request may have been answered by a replica that died (or whose
    // `+ACK` was lost) after its answer was kept: the kept answer is sent again instead
    // of running it twice (the caller may receive the same answer twice). So is a
    // request whose id the stream does not dedup on (`Nats-Msg-Id` absent or another
    // value), on any delivery. A kept answer of another body or session refuses it
    // `request_id_conflict`. The check runs off the pull loop: a bucket in a leader
    // election answers no read for seconds, and the batch's other requests must not
    // wait behind it (nor go without progress).
    if (delivered > 1 || !deduped) && ctx.hub.replies.is_some() && ticket.request_id.is_some() {
        let (hub, edge, config) = (ctx.hub.clone(), ctx.edge.clone(), ctx.config.clone());
        tokio::spawn(async move {
            match replay_kept(&hub, ticket, &reply, delivered).await {
                Replay::Done => {}
                Replay::Run(ticket) => {
                    let pulled = (message, reply, ticket);
                    admit_pulled(&edge, &config, pulled, published_ms, received_at).await;
                }
                Replay::Conflict(mut ticket) => {
                    ticket.terminate(TermReason::RequestIdConflict);
                    let rid = ticket.request_id.clone().unwrap_or_default();
                    let pulled = Pulled {
                        message,
                        reply,
                        ticket,
                    };
                    edge.refuse(pulled, conflict(&rid), received_at).await;
                }
            }
        });
        return;
    }
    let pulled = (message, reply, ticket);
    admit_pulled(&ctx.edge, &ctx.config, pulled, published_ms, received_at).await;
}

/// The rest of a pulled request's way in: its deadline made absolute (refused and
/// terminated when it passed in the stream), then the edge's admission.
async fn admit_pulled<A: Admit>(
    edge: &Arc<A>,
    config: &Config,
    (message, reply, ticket): (async_nats::Message, Subject, Ticket),
    published_ms: u64,
    received_at: Instant,
) {
    let hm = message.headers.as_ref();
    let deadline = absolute_deadline(
        header(hm, h::DEADLINE_MS),
        header(hm, h::TIMEOUT_MS),
        published_ms,
        config.admission.deadline.default,
    );
    let now_ms = unix_ms_now();
    let (message, expired) = match deadline {
        // A malformed deadline header: the decoder refuses it, naming the header.
        Err(()) => (message, false),
        Ok(d) => {
            let mut message = message;
            let headers = set_deadline(message.headers.as_ref().unwrap_or(&HeaderMap::new()), d);
            message.headers = Some(headers);
            (message, d.is_some_and(|d| d <= now_ms))
        }
    };
    let mut pulled = Pulled {
        message,
        reply,
        ticket,
    };
    if expired {
        pulled.ticket.terminate(TermReason::Expired);
        let err = ErrorBody::new(
            ErrorCode::DeadlineExceeded,
            "deadline passed while the request waited in the durable intake; not started",
        )
        .with_details(ErrorDetails {
            budget_ms: Some(0),
            ..Default::default()
        });
        edge.refuse(pulled, err, received_at).await;
        return;
    }
    edge.admit(pulled).await;
}

/// Most KV writes (slot deletes) the keeper has in flight at once.
const KV_WRITES_IN_FLIGHT: usize = 256;

/// Sends progress for every held request and renews their cluster slots every
/// `interval`; deletes a slot when its ticket is released. The
/// writes are pipelined (at most [`KV_WRITES_IN_FLIGHT`]) and the renewals of one tick
/// run concurrently, so that a slow KV store (a leader election, a loaded machine)
/// does not hold back the progress acknowledgements and renewals behind a queue of
/// writes — a late renewal lets a slot expire under its holder.
async fn keeper(hub: Arc<Hub>, interval: Duration, mut rx: mpsc::UnboundedReceiver<KeeperMsg>) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let slots = hub.slots.clone();
    let limit = hub.publish_timeout;
    let mut owned: HashMap<u64, Vec<Slot>> = HashMap::new();
    let mut writes: futures::stream::FuturesUnordered<futures::future::BoxFuture<'static, ()>> =
        futures::stream::FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            biased;
            _ = tick.tick() => {
                let acks: Vec<Subject> = hub.held().values().cloned().collect();
                for ack in &acks {
                    send_ack(&hub.client, ack, AckKind::Progress, limit).await;
                }
                if let Some(s) = &slots {
                    let renewals = owned.values_mut().flatten().map(|slot| {
                        let kv = s.kv.clone();
                        async move {
                            let renewed = tokio::time::timeout(
                                limit,
                                kv.update(&slot.key, slot.value.clone(), slot.revision),
                            )
                            .await;
                            match renewed {
                                Ok(Ok(rev)) => slot.revision = rev,
                                Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                                    // Expired and taken by another request: the limit may be
                                    // exceeded by one until this request settles.
                                    metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => "lost")
                                        .increment(1);
                                    tracing::warn!(key = %slot.key, "cluster slot lost before its request settled");
                                }
                                // Unknown (timeout, leader election): try again next tick.
                                _ => {}
                            }
                        }
                    });
                    futures::future::join_all(renewals).await;
                }
            }
            msg = rx.recv(), if open && writes.len() < KV_WRITES_IN_FLIGHT => match msg {
                None => open = false,
                Some(KeeperMsg::Slot { ticket, slot }) => {
                    owned.entry(ticket).or_default().push(slot);
                }
                Some(KeeperMsg::Release { ticket }) => {
                    if let (Some(held), Some(s)) = (owned.remove(&ticket), &slots) {
                        for slot in held {
                            let kv = s.kv.clone();
                            writes.push(Box::pin(async move {
                                let _ = tokio::time::timeout(
                                    limit,
                                    kv.delete_expect_revision(&slot.key, Some(slot.revision)),
                                )
                                .await;
                            }));
                        }
                    }
                }
            },
            Some(()) = writes.next(), if !writes.is_empty() => {}
            else => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_budget_counts_from_the_stream_timestamp() {
        let published = 1_000_000;
        assert_eq!(
            absolute_deadline(None, Some("500"), published, None),
            Ok(Some(1_000_500))
        );
        assert_eq!(
            absolute_deadline(Some("1000200"), Some("500"), published, None),
            Ok(Some(1_000_200)),
            "the earlier wins"
        );
        assert_eq!(
            absolute_deadline(None, None, published, Some(Duration::from_secs(2))),
            Ok(Some(1_002_000)),
            "the configured default counts from the stream timestamp too"
        );
        assert_eq!(absolute_deadline(None, None, published, None), Ok(None));
        assert_eq!(
            absolute_deadline(None, Some("soon"), published, None),
            Err(())
        );
        assert_eq!(
            absolute_deadline(Some("-1"), None, published, None),
            Err(())
        );
    }

    #[test]
    fn reply_subjects_are_checked_before_publishing() {
        assert!(valid_reply_subject("_INBOX.abc.def"));
        for bad in ["", "a..b", "a.*", "a.>", "a b", ".a", "a.", "é"] {
            assert!(!valid_reply_subject(bad), "{bad:?}");
        }
    }

    #[test]
    fn slot_keys_are_valid_kv_keys_for_any_session_id() {
        let k = slot_key("call 42/ü.*>", 3);
        assert!(k.starts_with("s.") && k.ends_with(".3"), "{k}");
        assert!(
            k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_'),
            "{k}"
        );
        assert_ne!(slot_key("a", 0), slot_key("a", 1));
        assert_ne!(slot_key("ab", 0), slot_key("a", 0));
        assert_eq!(reply_key("a."), "r.612e");
    }

    #[test]
    fn deadline_headers_are_rewritten_to_one_absolute_value() {
        let mut hm = HeaderMap::new();
        hm.insert("Weir-Timeout-Ms", "500");
        hm.insert("weir-deadline-ms", "99");
        hm.insert("Weir-Session-Id", "s");
        let out = set_deadline(&hm, Some(1234));
        assert_eq!(header(Some(&out), h::TIMEOUT_MS), None);
        assert_eq!(header(Some(&out), h::DEADLINE_MS), Some("1234"));
        assert_eq!(header(Some(&out), h::SESSION_ID), Some("s"));
        let none = set_deadline(&hm, None);
        assert_eq!(header(Some(&none), h::DEADLINE_MS), None);
    }
}
