//! A pulled request's hold on the stream: the [`Ticket`] that rides in its waiter
//! (its ack subject, intake permit and cluster slots) and the [`Hub`] the pull loop,
//! the keeper and the tickets share.
//!
//! Invariants: a ticket is settled at most once ([`Ticket::settle`] consumes it), and
//! dropping it releases its intake permit and its cluster slots exactly once (the
//! keeper deletes the slots on `Release`); an answer to keep is written to the reply
//! bucket before the `+ACK` that would let the stream forget the request.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{AckKind, kv};
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::{ErrorCode, ErrorDetails};
use weir_service::ratelimit::LogLimit;
use weir_service::sync::locked;

use super::cluster::{ClusterSlots, SlotResult, limit_full, limit_slot_key, slot_key};
use super::kept::encode_reply;
use super::{KEEP_RETRY, STORE_ERROR_DELAY, SlotRefusal, TermReason, reply_key, send_ack};
use crate::config::OnBusy;
use crate::metrics as m;

/// What the keeper task is told.
pub(super) enum KeeperMsg {
    /// A request now holds this session slot (renew it until released).
    Slot { ticket: u64, slot: Slot },
    /// The ticket was dropped: delete its slot, if any.
    Release { ticket: u64 },
}

/// One held cluster session slot.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) key: String,
    pub(super) value: Bytes,
    pub(super) revision: u64,
}

/// Shared by the pull loop, the keeper and the tickets.
pub(crate) struct Hub {
    pub(super) client: async_nats::Client,
    pub(super) publish_timeout: Duration,
    /// Ack subjects of the requests this replica holds (progress is sent for each).
    pub(super) held: Mutex<HashMap<u64, Subject>>,
    pub(super) next_id: AtomicU64,
    pub(super) keeper: mpsc::UnboundedSender<KeeperMsg>,
    /// The reply bucket (`jetstream.reply_bucket`), where answers are kept.
    pub(super) replies: Option<kv::Store>,
    /// How long an answer is retried into the reply bucket before its `+ACK` goes
    /// without it (`jetstream.ack_wait_ms`).
    pub(super) keep_limit: Duration,
    /// Cluster-wide session cap and reject-limits (`None`: none configured, or shadow).
    pub(super) slots: Option<Arc<ClusterSlots>>,
}

impl Hub {
    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Subject>> {
        locked(&self.held)
    }
}

/// A pulled request's hold on its stream message, its intake permit and its cluster
/// session slot. Carried in the waiter; settled by the sink ([`Ticket::settle`]);
/// dropping it releases the permit and the slot exactly once.
pub struct Ticket {
    pub(super) hub: Arc<Hub>,
    pub(super) id: u64,
    pub(super) ack: Subject,
    /// Answer with `+TERM` instead of `+ACK` (refused before admission).
    pub(super) term: bool,
    /// `Weir-Request-Id` (the answer is kept under it).
    pub(super) request_id: Option<String>,
    /// The request's fingerprint ([`fingerprint`]), kept with its answer.
    pub(super) fingerprint: String,
    /// The answer to keep before the `+ACK` ([`Ticket::keep_reply`]).
    pub(super) kept: Option<Bytes>,
    /// This is the request's last delivery (`max_deliver`): a store failure must not
    /// hand it back, the server would not deliver it again.
    pub(super) last_delivery: bool,
    pub(super) _permit: OwnedSemaphorePermit,
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
                    let message = format!(
                        "limit {name}: {key} has {limit} requests in flight over all replicas (limit {limit})"
                    );
                    return Err(limit_full(key, limit as u64, message, None, None));
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
        let kind = match how {
            Settle::HandOver => AckKind::Nak(None),
            Settle::Retry => AckKind::Nak(Some(STORE_ERROR_DELAY)),
            Settle::Answered if self.term => AckKind::Term,
            Settle::Answered => AckKind::Ack,
        };
        if how == Settle::Answered
            && let Some(value) = self.kept.take()
        {
            tokio::spawn(async move {
                self.keep(value).await;
                send_ack(&self.hub.client, &self.ack, kind, self.hub.publish_timeout).await;
            });
            return;
        }
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
