//! The read-only watch of the lease bucket the announcements name (JetStream KV
//! `KV_<bucket>`, keys `p.<n>`, value the owner's worker id): each partition's owner
//! for the [`Fleet`](super::Fleet).
//!
//! Invariants: read-only (no write, no bucket creation: a missing bucket is retried);
//! the watcher is re-created with history whenever it fails or ends, and the view is
//! marked incomplete (owners cleared) until its history is delivered again, so a
//! decision never rests on a half-read bucket; only keys `p.<n>` with `n` below the
//! partition count and values that are safe worker ids are applied (others counted
//! `bad_lease_key`): the view holds at most one owner per partition. Every call is
//! bounded by [`CALL_TIMEOUT`]; the task stops when its handle ([`watch`]) drops.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use tokio_util::task::AbortOnDropHandle;
use weir_protocol::capacity::is_valid_id;

use super::Shared;
use crate::metrics as m;

/// Bound on opening the bucket and creating a watcher.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait before re-creating a failed watcher.
const RETRY: Duration = Duration::from_secs(1);

/// Watches `bucket` into `shared`'s fleet view until the returned handle drops.
pub(crate) fn watch(
    client: async_nats::Client,
    bucket: String,
    shared: Arc<Shared>,
) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(run(client, bucket, shared)))
}

async fn run(client: async_nats::Client, bucket: String, shared: Arc<Shared>) {
    let js = jetstream::new(client);
    loop {
        shared.fleet().set_lease_synced(false);
        match tokio::time::timeout(CALL_TIMEOUT, open(&js, &bucket)).await {
            Ok(Ok((mut watch, empty))) => {
                tracing::info!(bucket, "capacity: watching the lease bucket");
                if empty {
                    shared.fleet().set_lease_synced(true);
                }
                while let Some(entry) = watch.next().await {
                    match entry {
                        Ok(e) => apply(&shared, &e),
                        Err(e) => {
                            tracing::warn!(bucket, error = %e, "capacity: lease watcher failed; re-creating it");
                            break;
                        }
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(bucket, error = %e, "capacity: cannot watch the lease bucket")
            }
            Err(_) => tracing::warn!(bucket, "capacity: opening the lease bucket timed out"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// The bucket's watcher with history, and whether the bucket held no value when
/// opened (no history to wait for).
async fn open(
    js: &jetstream::Context,
    bucket: &str,
) -> Result<(kv::Watch, bool), Box<dyn std::error::Error + Send + Sync>> {
    let store = js.get_key_value(bucket).await?;
    let empty = store.status().await?.values() == 0;
    let watch = store.watch_with_history(">").await?;
    Ok((watch, empty))
}

fn apply(shared: &Shared, e: &kv::Entry) {
    let mut fleet = shared.fleet();
    let partitions = fleet.settings().partitions.get();
    let partition = e
        .key
        .strip_prefix("p.")
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|p| *p < partitions);
    let owner = match e.operation {
        kv::Operation::Put => std::str::from_utf8(&e.value)
            .ok()
            .filter(|v| is_valid_id(v))
            .map(|v| Some(v.to_owned())),
        kv::Operation::Delete | kv::Operation::Purge => Some(None),
    };
    match (partition, owner) {
        (Some(p), Some(owner)) => fleet.set_owner(p, owner),
        _ => {
            metrics::counter!(m::CAPACITY_IGNORED_TOTAL, m::LABEL_KIND => "bad_lease_key")
                .increment(1);
        }
    }
    if e.delta == 0 || e.seen_current {
        fleet.set_lease_synced(true);
    }
}
