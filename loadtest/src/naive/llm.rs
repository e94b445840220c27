//! The naive LLM front: the deployed task-per-message shape, for comparison.
//!
//! For every request message it spawns a task; the task waits on one semaphore of the
//! backend's concurrency, then calls the backend and replies. Nothing bounds how many
//! tasks wait, nothing looks at the deadline (the request is served however late), and
//! a caller that gave up is not noticed — the work is done anyway.
//!
//! It runs in-process over the same simulated backend as weir's adapter, so the two
//! fronts differ only by design. The deadline header is *read* here only to hand it to
//! the simulated backend, which counts `started_after_deadline`; it changes nothing in
//! the behaviour.
//!
//! Invariant: `in_flight` is incremented when a task is spawned and decremented exactly
//! once when it ends, by the drop of its `InFlight` guard.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use weir_llm_adapter::backend::{Backend, BackendRequest};
use weir_protocol::llm::headers;

use crate::stats::LatencyHistogram;
use crate::timeliness::unix_ms;

/// Counters of the naive front.
#[derive(Debug, Default)]
pub struct NaiveLlmStats {
    /// Tasks alive (waiting or running).
    pub in_flight: AtomicU64,
    /// Most tasks alive at once.
    pub in_flight_max: AtomicU64,
    /// Queue wait (received → inference started).
    pub queue_wait: LatencyHistogram,
    /// Inference time.
    pub inference: LatencyHistogram,
}

struct InFlight(Arc<NaiveLlmStats>);

impl InFlight {
    fn new(stats: &Arc<NaiveLlmStats>) -> Self {
        let n = stats.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        stats.in_flight_max.fetch_max(n, Ordering::Relaxed);
        Self(stats.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A running naive front. Dropping it stops accepting (tasks already spawned finish).
#[derive(Debug)]
pub struct NaiveLlmFront {
    /// The counters.
    pub stats: Arc<NaiveLlmStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for NaiveLlmFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The deadline header as an `Instant`, if present and valid.
fn deadline_of(msg: &async_nats::Message) -> Option<Instant> {
    let v = msg.headers.as_ref()?.get(headers::DEADLINE_MS)?;
    let at_ms: u64 = v.as_str().trim().parse().ok()?;
    let now_ms = unix_ms();
    let now = Instant::now();
    Some(if at_ms >= now_ms {
        now + Duration::from_millis(at_ms - now_ms)
    } else {
        now.checked_sub(Duration::from_millis(now_ms - at_ms))
            .unwrap_or(now)
    })
}

impl NaiveLlmFront {
    /// Subscribes to `subject` and serves it.
    pub async fn start(
        client: async_nats::Client,
        subject: String,
        backend: Arc<dyn Backend>,
        concurrency: usize,
    ) -> Result<Self, async_nats::SubscribeError> {
        let mut sub = client.subscribe(subject).await?;
        let stats = Arc::new(NaiveLlmStats::default());
        let semaphore = Arc::new(Semaphore::new(concurrency.max(1)));
        let s = stats.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let guard = InFlight::new(&s);
                let (s, semaphore, client, backend) = (
                    s.clone(),
                    semaphore.clone(),
                    client.clone(),
                    backend.clone(),
                );
                tokio::spawn(async move {
                    let _guard = guard;
                    let received = Instant::now();
                    let deadline = deadline_of(&msg);
                    let Ok(_permit) = semaphore.acquire_owned().await else {
                        return;
                    };
                    let started = Instant::now();
                    s.queue_wait.record(started - received);
                    let result = backend
                        .call(BackendRequest {
                            body: msg.payload.clone(),
                            request_id: None,
                            session: None,
                            deadline,
                            max_reply_bytes: usize::MAX,
                            trace: None,
                        })
                        .await;
                    let inference = started.elapsed();
                    s.inference.record(inference);
                    let Some(reply) = msg.reply else { return };
                    let mut h = async_nats::HeaderMap::new();
                    h.insert(
                        headers::QUEUE_MS,
                        format!("{:.3}", (started - received).as_secs_f64() * 1000.0).as_str(),
                    );
                    h.insert(
                        headers::INFERENCE_MS,
                        format!("{:.3}", inference.as_secs_f64() * 1000.0).as_str(),
                    );
                    let body = match result {
                        Ok(r) => r.body,
                        Err(e) => {
                            h.insert(headers::ERROR_CODE, "backend_error");
                            h.insert(headers::NATS_SERVICE_ERROR_CODE, "500");
                            h.insert(headers::NATS_SERVICE_ERROR, e.message());
                            bytes::Bytes::new()
                        }
                    };
                    // As deployed: the publish has no timeout either.
                    let _ = client.publish_with_headers(reply, h, body).await;
                });
            }
        });
        Ok(Self { stats, task })
    }
}
