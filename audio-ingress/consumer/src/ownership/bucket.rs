//! The lease bucket's operations: keys, creating and opening the bucket, the watcher,
//! reading a key through the stream leader, and the compare-and-swap of a renewal or
//! takeover.
//!
//! Invariants: every operation is bounded by the caller's timeout; a key's revision is
//! its fencing token, so a write is only ever a compare-and-swap from a known revision
//! (or a create when absent); the watcher is re-created with history whenever it
//! fails, so the driver's view is complete again.

use super::*;

/// The key of partition `p`.
pub(super) fn key(p: u32) -> String {
    format!("p.{p}")
}

pub(super) fn partition_of(key: &str) -> Option<u32> {
    key.strip_prefix("p.")?.parse().ok()
}

/// Creates the bucket's stream if absent and opens it.
pub(super) async fn open_bucket(
    client: &async_nats::Client,
    lease: &LeaseSettings,
) -> Result<(stream::Stream, kv::Store), OperationError> {
    let js = jetstream::new(client.clone());
    let config = kv_stream_config(&lease.bucket, lease.timing.ttl, lease.replicas);
    let stream = js.get_or_create_stream(config).await.map_err(|e| {
        OperationError::with_source(
            ConsumerErrorKind::Lease,
            format!(
                "lease bucket {:?}: cannot create or open stream KV_{}",
                lease.bucket, lease.bucket
            ),
            e,
        )
    })?;
    let kv = js.get_key_value(lease.bucket.clone()).await.map_err(|e| {
        OperationError::with_source(
            ConsumerErrorKind::Lease,
            format!("lease bucket {:?}: cannot open it", lease.bucket),
            e,
        )
    })?;
    Ok((stream, kv))
}

/// Forwards every change of the bucket to the driver, re-creating the watcher (with
/// history, so the view is complete again) whenever it fails or ends. Ends when the
/// driver is gone.
pub(super) async fn run_watcher(
    kv: kv::Store,
    tx: tokio::sync::mpsc::Sender<kv::Entry>,
    bound: Duration,
) {
    loop {
        match tokio::time::timeout(bound, kv.watch_with_history(">")).await {
            Ok(Ok(mut watch)) => {
                while let Some(item) = watch.next().await {
                    match item {
                        Ok(entry) => {
                            if tx.send(entry).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "lease watcher error; re-creating it");
                            break;
                        }
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot create the lease watcher"),
            Err(_) => tracing::warn!("lease watcher creation timed out"),
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}

/// Reads the key of partition `p` through the bucket stream's leader: `Some(revision)`
/// when its latest write names `me`, `None` when it names another worker or was
/// deleted.
pub(super) async fn read_own(
    leader: &stream::Stream,
    bucket: &str,
    p: u32,
    me: &str,
) -> Result<Option<u64>, stream::LastRawMessageError> {
    let subject = format!("$KV.{bucket}.{}", key(p));
    let msg = leader.get_last_raw_message_by_subject(&subject).await?;
    let deleted = msg.headers.get("KV-Operation").is_some();
    Ok((!deleted && msg.payload.as_ref() == me.as_bytes()).then_some(msg.sequence))
}

/// Compare-and-swap of partition `p` from `revision` to a write naming `me`. For a
/// renewal, a `WrongLastRevision` is checked against the key once (see the module
/// docs).
pub(super) async fn update(
    kv: &kv::Store,
    leader: &stream::Stream,
    p: u32,
    me: &str,
    revision: u64,
    renewal: bool,
) -> OpResult {
    match kv.update(key(p), me.to_owned().into(), revision).await {
        Ok(rev) => OpResult::Ok(rev),
        Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
            if !renewal {
                return OpResult::Conflict;
            }
            // Read through the stream's leader (a direct get may be answered by a
            // replica that lags it, and right after an election may not be answered
            // at all). Only a read that shows another owner, or a delete, is a
            // conflict; our own id at an older revision, or no answer, is unknown and
            // the renewal is retried.
            match read_own(leader, &kv.name, p, me).await {
                Ok(None) => OpResult::Conflict,
                Ok(Some(seq)) if seq > revision => OpResult::Adopt(seq),
                Ok(Some(_)) | Err(_) => OpResult::Timeout,
            }
        }
        Err(e) if e.kind() == kv::UpdateErrorKind::TimedOut => OpResult::Timeout,
        Err(e) => OpResult::Error(e.to_string()),
    }
}
