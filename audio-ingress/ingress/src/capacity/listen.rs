//! The NATS side of the capacity check: subscribes to `<prefix>.announce.*` and
//! `<prefix>.refused.*` on the door's client, decodes each message
//! (`Announcement::decode` + `check_fresh` on the wall clock; `Refusal::decode`), feeds
//! the [`Fleet`](super::Fleet), starts the lease watcher when an announcement names the
//! bucket, and sets the gauges once a second.
//!
//! Invariants: one task; every message is either applied or counted in
//! `weir_ingress_capacity_ignored_total` with its kind; a refusal is applied only to a
//! stream this door holds; the lease watcher is started at most once (the first bucket
//! named; announcements naming another are ignored) and stops with this task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use weir_protocol::capacity::{
    Announcement, Refusal, announce_wildcard, last_token, refused_wildcard,
};

use weir_protocol::StreamId;

use super::{Notice, Shared};
use crate::metrics as m;

/// How often the gauges are set (a gone worker leaves them within this of leaving the
/// admission decision).
const GAUGE_INTERVAL: Duration = Duration::from_millis(250);
/// Wait before re-subscribing after a subscription failed.
const RETRY: Duration = Duration::from_secs(1);

fn ignored(kind: &'static str) {
    metrics::counter!(m::CAPACITY_IGNORED_TOTAL, m::LABEL_KIND => kind).increment(1);
}

/// Runs until aborted.
pub(crate) async fn run(client: async_nats::Client, shared: Arc<Shared>, prefix: String) {
    let mut watcher = None;
    loop {
        let subs = futures::future::try_join(
            client.subscribe(announce_wildcard(&prefix)),
            client.subscribe(refused_wildcard(&prefix)),
        )
        .await;
        let (mut announcements, mut refusals) = match subs {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "capacity: cannot subscribe; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        tracing::info!(prefix, "capacity: listening to the recognition workers");
        let mut gauges = tokio::time::interval(GAUGE_INTERVAL);
        loop {
            tokio::select! {
                msg = announcements.next() => match msg {
                    Some(msg) => {
                        if let Some(bucket) = on_announcement(&shared, &msg.subject, &msg.payload)
                            && watcher.is_none()
                        {
                            watcher = Some(super::lease::watch(
                                client.clone(),
                                bucket,
                                Arc::clone(&shared),
                            ));
                        }
                    }
                    None => break,
                },
                msg = refusals.next() => match msg {
                    Some(msg) => on_refusal(&shared, &msg.subject, &msg.payload),
                    None => break,
                },
                _ = gauges.tick() => set_gauges(&shared),
            }
        }
        tracing::warn!("capacity: subscription ended; re-subscribing");
        tokio::time::sleep(RETRY).await;
    }
}

/// Decodes and applies one announcement; the lease bucket to start watching, if it
/// is the first one named.
fn on_announcement(shared: &Shared, subject: &str, payload: &[u8]) -> Option<String> {
    let ann = match Announcement::decode(subject, payload).and_then(|a| {
        a.check_fresh(weir_service::clock::unix_ms_now())?;
        Ok(a)
    }) {
        Ok(a) => a,
        Err(e) => {
            tracing::debug!(error = %e, worker = last_token(subject), "capacity: announcement ignored");
            ignored(e.kind().into());
            return None;
        }
    };
    let accepted = shared.fleet().accept(ann, Instant::now());
    match accepted {
        Ok(a) => {
            if a.not_owned > 0 {
                metrics::counter!(m::CAPACITY_IGNORED_TOTAL, m::LABEL_KIND => "not_owned")
                    .increment(a.not_owned);
            }
            if a.degraded_sent > 0 {
                metrics::counter!(m::CAPACITY_DEGRADED_EVENTS_TOTAL).increment(a.degraded_sent);
            }
            a.watch_bucket
        }
        Err(kind) => {
            tracing::debug!(
                kind,
                worker = last_token(subject),
                "capacity: announcement ignored"
            );
            ignored(kind);
            None
        }
    }
}

/// Decodes one worker refusal and ends the stream it names when this door holds it.
fn on_refusal(shared: &Shared, subject: &str, payload: &[u8]) {
    let refusal = match Refusal::decode(subject, payload) {
        Ok(r) => r,
        Err(e) => {
            ignored(e.kind().into());
            return;
        }
    };
    metrics::counter!(m::CAPACITY_WORKER_REFUSALS_TOTAL).increment(1);
    let Ok(stream) = StreamId::parse(&refusal.stream) else {
        return ignored("invalid_id");
    };
    let tx = shared.fleet().refusal_sender(&stream, &refusal.worker);
    match tx {
        Ok(tx) => {
            // A full queue holds lag notices the door has not taken yet: the refusal
            // waits for room in a task, at most one second.
            match tx.try_send(Notice::Refused) {
                Ok(()) => {}
                Err(tokio::sync::mpsc::error::TrySendError::Full(n)) => {
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(RETRY, tx.send(n)).await;
                    });
                }
                Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => return,
            }
            tracing::info!(
                stream = refusal.stream,
                worker = refusal.worker,
                max_streams = refusal.max_streams,
                "capacity: the worker refused the stream; ending it"
            );
            metrics::counter!(m::CAPACITY_WORKER_REFUSALS_APPLIED_TOTAL).increment(1);
        }
        Err(kind) => ignored(kind),
    }
}

fn set_gauges(shared: &Shared) {
    let (t, synced) = {
        let fleet = shared.fleet();
        (fleet.totals(Instant::now()), fleet.lease_synced())
    };
    let unsynced = synced == Some(false);
    metrics::gauge!(m::CAPACITY_LEASE_UNSYNCED).set(if unsynced { 1.0 } else { 0.0 });
    metrics::gauge!(m::CAPACITY_WORKERS).set(t.live_workers as f64);
    metrics::gauge!(m::CAPACITY_SLOTS).set(t.slots as f64);
    metrics::gauge!(m::CAPACITY_FREE_SLOTS).set(t.free_slots as f64);
    metrics::gauge!(m::CAPACITY_LAG_P99_SECONDS).set(t.lag_p99_ms as f64 / 1000.0);
}
