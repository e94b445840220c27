//! The keeper task: progress (`+WPI`) for every held request, renewal of the held
//! cluster slots, and their deletion when a ticket is released.
//!
//! Invariant: a slot is renewed only by compare-and-swap on its last revision, and
//! deleted only expecting it: a slot that expired and was taken by another request is
//! never touched.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream::{AckKind, kv};
use futures::StreamExt;
use tokio::sync::mpsc;

use super::send_ack;
use super::ticket::{Hub, KeeperMsg, Slot};
use crate::metrics as m;

/// Most KV writes (slot deletes) the keeper has in flight at once.
const KV_WRITES_IN_FLIGHT: usize = 256;

/// Sends progress for every held request and renews their cluster slots every
/// `interval`; deletes a slot when its ticket is released. The
/// writes are pipelined (at most [`KV_WRITES_IN_FLIGHT`]) and the renewals of one tick
/// run concurrently, so that a slow KV store (a leader election, a loaded machine)
/// does not hold back the progress acknowledgements and renewals behind a queue of
/// writes — a late renewal lets a slot expire under its holder.
pub(super) async fn keeper(
    hub: Arc<Hub>,
    interval: Duration,
    mut rx: mpsc::UnboundedReceiver<KeeperMsg>,
) {
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
