//! Counters and latency histograms of one admission core, and their serialisable
//! snapshot ([`StatsSnapshot`]) used by the load test and `/v1/stats`.
//!
//! Latencies (queue wait, inference by outcome, time to first token, refusals) are
//! [`LatencyHistogram`]s: lock-free relaxed atomics per request, read as percentiles for
//! the snapshot and, but for refusals, rendered as the Prometheus histograms of
//! `/metrics` from the same counts.
//!
//! Accounting rule: every submission is answered exactly once, so
//! `offered = completed + Σ refused + in progress`, where `refused` counts every
//! non-`ok` answer by code (admission refusals, deadline, cancel, backend errors...).
//! Joins and cached answers are submissions too and are counted by their answer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_protocol::llm::ErrorCode;
use weir_service::metrics::{LatencyHistogram, Series};

use super::Outcome;
use super::estimator::EstimateView;
use crate::metrics as m;

/// Percentiles of a latency histogram, in milliseconds (the shared admin type).
pub use weir_protocol::admin::Percentiles;

/// A point-in-time copy of the counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSnapshot {
    /// Submissions received (every attempt).
    pub offered: u64,
    /// Submissions that entered the queue (new inferences).
    pub admitted: u64,
    /// Submissions that joined a queued or running request with the same id.
    pub joined: u64,
    /// Submissions answered from the completion cache.
    pub cached: u64,
    /// Answers `ok`.
    pub completed: u64,
    /// Answers other than `ok`, by error code.
    pub refused: BTreeMap<String, u64>,
    /// Backend calls started.
    pub started: u64,
    /// Backend calls started after the request's deadline (must be 0).
    pub started_after_deadline: u64,
    /// Requests admitted and not yet started, now.
    pub queued_now: u64,
    /// Backend calls in progress, now.
    pub running_now: u64,
    /// Shadow mode: refusals that were counted but not enforced, by rule.
    pub would_reject: BTreeMap<String, u64>,
    /// Receipt → start of inference, for started requests.
    pub queue_wait_ms: Percentiles,
    /// Backend call duration.
    pub inference_ms: Percentiles,
    /// Total time spent in backend calls, milliseconds.
    pub backend_busy_ms: f64,
    /// Time spent in backend calls that answered `ok` (within the deadline), milliseconds.
    pub backend_useful_ms: f64,
    /// Slots taken and given back (session cap + per-key limits); equal when idle.
    pub slots_acquired: u64,
    /// See `slots_acquired`.
    pub slots_released: u64,
    /// Receipt → answer, for answers other than `ok` given without a backend call
    /// (refusals at admission, in the queue, at the start of inference).
    #[serde(default)]
    pub refusal_ms: Percentiles,
    /// The backend's service-time estimate (what admission predicts with).
    #[serde(default)]
    pub service_estimate: Option<EstimateView>,
    /// The idempotency cache: size now, bound, evictions.
    #[serde(default)]
    pub cache: CacheSnapshot,
    /// The NATS client's own drops (slow consumer) and disconnects; filled in by
    /// [`crate::AdapterView::stats`].
    #[serde(default)]
    pub nats: crate::nats_events::NatsEventsSnapshot,
    /// Streamed replies: started, chunks and bytes sent, time to first token, aborts.
    #[serde(default)]
    pub stream: StreamSnapshot,
}

/// Streamed replies in a [`StatsSnapshot`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamSnapshot {
    /// Streamed replies that reached a worker.
    pub started: u64,
    /// `chunk` messages published.
    pub chunks: u64,
    /// Body bytes published in chunks.
    pub bytes: u64,
    /// Start of inference → first chunk published.
    pub ttft_ms: Percentiles,
    /// Streams aborted because of the caller, by reason (`caller_gone`,
    /// `caller_stalled`, `publish_timeout`).
    pub aborted: BTreeMap<String, u64>,
}

/// The idempotency (completion) cache in a [`StatsSnapshot`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheSnapshot {
    /// Replies held now.
    pub entries: u64,
    /// Bytes held now (body + headers + key + a fixed per-entry overhead).
    pub bytes: u64,
    /// `idempotency.max_bytes`.
    pub max_bytes: u64,
    /// Replies evicted (oldest first) to stay within `max_bytes`.
    pub evicted_max_bytes: u64,
    /// Replies evicted (oldest first) to stay within `max_entries`.
    pub evicted_max_entries: u64,
    /// Replies not stored because one alone exceeds `max_bytes`.
    pub too_large: u64,
}

/// Why a reply left the cache before its window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheEviction {
    /// `idempotency.max_bytes`.
    MaxBytes,
    /// `idempotency.max_entries`.
    MaxEntries,
}

impl StatsSnapshot {
    /// Σ refused.
    pub fn refused_total(&self) -> u64 {
        self.refused.values().sum()
    }

    /// `refused[code]`, 0 when absent.
    pub fn refused_of(&self, code: ErrorCode) -> u64 {
        self.refused.get(code.as_str()).copied().unwrap_or(0)
    }

    /// Share of backend time spent on calls that answered `ok` (1.0 when idle).
    pub fn useful_backend_share(&self) -> f64 {
        if self.backend_busy_ms > 0.0 {
            self.backend_useful_ms / self.backend_busy_ms
        } else {
            1.0
        }
    }
}

/// The latency histograms.
struct Latencies {
    /// `weir_llm_queue_wait_seconds`, `queue_wait_ms`.
    queue_wait: LatencyHistogram,
    /// `weir_llm_time_to_first_token_seconds`, `stream.ttft_ms`.
    ttft: LatencyHistogram,
    /// `weir_llm_inference_seconds{outcome}` (index 0 = `ok`, then [`ErrorCode::ALL`]
    /// order); `inference_ms` over all, `backend_busy_ms` and `backend_useful_ms` are
    /// their sums.
    inference: Vec<LatencyHistogram>,
    /// `refusal_ms` (no Prometheus series).
    refusal: LatencyHistogram,
}

/// The `outcome` label of `Latencies::inference[i]`.
fn outcome_name(i: usize) -> &'static str {
    i.checked_sub(1)
        .and_then(|i| ErrorCode::ALL.get(i))
        .map_or("ok", |c| c.as_str())
}

/// Metric handles registered once at start, from the recorder installed at that time.
/// Counters are set from the atomics below when stats are read (`absolute`), so a
/// request costs no metrics-facade call at all.
struct Handles {
    offered: metrics::Counter,
    admitted: metrics::Counter,
    joined: metrics::Counter,
    cached: metrics::Counter,
    started: metrics::Counter,
    started_after_deadline: metrics::Counter,
    streams: metrics::Counter,
    stream_chunks: metrics::Counter,
    stream_bytes: metrics::Counter,
    /// Index 0 = `ok`, then [`ErrorCode::ALL`] order.
    answered: Vec<metrics::Counter>,
    limit_reject: HashMap<String, metrics::Counter>,
    would_reject: HashMap<String, metrics::Counter>,
    queue_depth: metrics::Gauge,
    running: metrics::Gauge,
    estimate: metrics::Gauge,
    estimate_samples: metrics::Gauge,
    cache_entries: metrics::Gauge,
    cache_bytes: metrics::Gauge,
    cache_evicted_bytes: metrics::Counter,
    cache_evicted_entries: metrics::Counter,
    cache_too_large: metrics::Counter,
}

fn outcome_index(outcome: &str) -> usize {
    ErrorCode::ALL
        .iter()
        .position(|c| c.as_str() == outcome)
        .map_or(0, |i| i + 1)
}

impl Handles {
    fn new(rules: &[String], backend: &'static str) -> Self {
        let outcomes: Vec<&'static str> = std::iter::once("ok")
            .chain(ErrorCode::ALL.iter().map(|c| c.as_str()))
            .collect();
        Self {
            offered: metrics::counter!(m::OFFERED_TOTAL),
            admitted: metrics::counter!(m::ADMITTED_TOTAL),
            joined: metrics::counter!(m::JOINED_TOTAL),
            cached: metrics::counter!(m::CACHED_TOTAL),
            started: metrics::counter!(m::INFERENCE_STARTED_TOTAL),
            started_after_deadline: metrics::counter!(m::STARTED_AFTER_DEADLINE_TOTAL),
            streams: metrics::counter!(m::STREAMS_TOTAL),
            stream_chunks: metrics::counter!(m::STREAM_CHUNKS_TOTAL),
            stream_bytes: metrics::counter!(m::STREAM_BYTES_TOTAL),
            answered: outcomes
                .iter()
                .map(|o| metrics::counter!(m::ANSWERED_TOTAL, "outcome" => *o))
                .collect(),
            limit_reject: rules
                .iter()
                .map(|r| {
                    (
                        r.clone(),
                        metrics::counter!(m::LIMIT_REJECT_TOTAL, "rule" => r.clone()),
                    )
                })
                .collect(),
            would_reject: rules
                .iter()
                .map(|r| {
                    (
                        r.clone(),
                        metrics::counter!(m::WOULD_REJECT_TOTAL, "rule" => r.clone()),
                    )
                })
                .collect(),
            queue_depth: metrics::gauge!(m::QUEUE_DEPTH),
            running: metrics::gauge!(m::RUNNING),
            estimate: metrics::gauge!(m::SERVICE_ESTIMATE_SECONDS, "backend" => backend),
            estimate_samples: metrics::gauge!(m::SERVICE_ESTIMATE_SAMPLES, "backend" => backend),
            cache_entries: metrics::gauge!(m::CACHE_ENTRIES),
            cache_bytes: metrics::gauge!(m::CACHE_BYTES),
            cache_evicted_bytes: metrics::counter!(m::CACHE_EVICTED_TOTAL, "reason" => "max_bytes"),
            cache_evicted_entries: metrics::counter!(m::CACHE_EVICTED_TOTAL, "reason" => "max_entries"),
            cache_too_large: metrics::counter!(m::CACHE_TOO_LARGE_TOTAL),
        }
    }
}

/// The live counters.
pub(crate) struct Stats {
    handles: Handles,
    offered: AtomicU64,
    admitted: AtomicU64,
    joined: AtomicU64,
    cached: AtomicU64,
    completed: AtomicU64,
    started: AtomicU64,
    started_after_deadline: AtomicU64,
    refused: [AtomicU64; ErrorCode::ALL.len()],
    would_reject: Mutex<BTreeMap<String, u64>>,
    latencies: Latencies,
    cache_entries: AtomicU64,
    cache_bytes: AtomicU64,
    cache_max_bytes: AtomicU64,
    cache_evicted_bytes: AtomicU64,
    cache_evicted_entries: AtomicU64,
    cache_too_large: AtomicU64,
    streams: AtomicU64,
    stream_chunks: AtomicU64,
    stream_bytes: AtomicU64,
    stream_aborted: Mutex<BTreeMap<&'static str, u64>>,
}

impl Stats {
    /// `rules`: every rule name a refusal can be counted under.
    pub(crate) fn new(rules: &[String], backend: &'static str) -> Self {
        Self {
            handles: Handles::new(rules, backend),
            offered: AtomicU64::new(0),
            admitted: AtomicU64::new(0),
            joined: AtomicU64::new(0),
            cached: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            started: AtomicU64::new(0),
            started_after_deadline: AtomicU64::new(0),
            refused: std::array::from_fn(|_| AtomicU64::new(0)),
            would_reject: Mutex::new(BTreeMap::new()),
            latencies: Latencies {
                queue_wait: LatencyHistogram::new(),
                ttft: LatencyHistogram::new(),
                inference: (0..=ErrorCode::ALL.len())
                    .map(|_| LatencyHistogram::new())
                    .collect(),
                refusal: LatencyHistogram::new(),
            },
            cache_entries: AtomicU64::new(0),
            cache_bytes: AtomicU64::new(0),
            cache_max_bytes: AtomicU64::new(0),
            cache_evicted_bytes: AtomicU64::new(0),
            cache_evicted_entries: AtomicU64::new(0),
            cache_too_large: AtomicU64::new(0),
            streams: AtomicU64::new(0),
            stream_chunks: AtomicU64::new(0),
            stream_bytes: AtomicU64::new(0),
            stream_aborted: Mutex::new(BTreeMap::new()),
        }
    }

    pub(crate) fn cache_bounds(&self, max_bytes: usize) {
        self.cache_max_bytes
            .store(max_bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn cache_now(&self, entries: usize, bytes: usize) {
        self.cache_entries.store(entries as u64, Ordering::Relaxed);
        self.cache_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn cache_evicted(&self, reason: CacheEviction) {
        match reason {
            CacheEviction::MaxBytes => &self.cache_evicted_bytes,
            CacheEviction::MaxEntries => &self.cache_evicted_entries,
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn cache_too_large(&self) {
        self.cache_too_large.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn offered(&self) {
        self.offered.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn admitted(&self) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn joined(&self) {
        self.joined.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn cached(&self) {
        self.cached.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn would_reject(&self, rule: &str) {
        let mut w = self.would_reject.lock().unwrap_or_else(|p| p.into_inner());
        *w.entry(rule.to_owned()).or_insert(0) += 1;
        match self.handles.would_reject.get(rule) {
            Some(c) => c.increment(1),
            None => {
                metrics::counter!(m::WOULD_REJECT_TOTAL, "rule" => rule.to_owned()).increment(1)
            }
        }
    }

    pub(crate) fn limit_reject(&self, rule: &str) {
        match self.handles.limit_reject.get(rule) {
            Some(c) => c.increment(1),
            None => {
                metrics::counter!(m::LIMIT_REJECT_TOTAL, "rule" => rule.to_owned()).increment(1)
            }
        }
    }

    pub(crate) fn started(&self, queue_wait: Duration, after_deadline: bool) {
        self.started.fetch_add(1, Ordering::Relaxed);
        if after_deadline {
            self.started_after_deadline.fetch_add(1, Ordering::Relaxed);
        }
        self.latencies.queue_wait.record(queue_wait);
    }

    pub(crate) fn inference_done(&self, took: Duration, outcome: &'static str) {
        if let Some(h) = self.latencies.inference.get(outcome_index(outcome)) {
            h.record(took);
        }
    }

    /// A streamed reply reached a worker.
    pub(crate) fn stream_started(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    /// One `chunk` message of `bytes` body bytes was published.
    pub(crate) fn stream_chunk(&self, bytes: usize) {
        self.stream_chunks.fetch_add(1, Ordering::Relaxed);
        self.stream_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The first chunk of a stream was published `ttft` after inference started.
    pub(crate) fn stream_ttft(&self, ttft: Duration) {
        self.latencies.ttft.record(ttft);
    }

    /// A stream was aborted because of its caller.
    pub(crate) fn stream_aborted(&self, reason: &'static str) {
        metrics::counter!(m::STREAM_ABORTED_TOTAL, "reason" => reason).increment(1);
        *self
            .stream_aborted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(reason)
            .or_default() += 1;
    }

    /// Counts one answer (one waiter).
    pub(crate) fn answered(&self, outcome: &Outcome) {
        match &outcome.result {
            Ok(_) => {
                self.completed.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if let Some(i) = ErrorCode::ALL.iter().position(|c| *c == e.code) {
                    self.refused[i].fetch_add(1, Ordering::Relaxed);
                }
                if outcome.inference_time.is_none() {
                    self.latencies.refusal.record(outcome.queue_time);
                }
            }
        }
    }

    /// Appends the latency histograms in the Prometheus text format.
    pub(crate) fn render_histograms(&self, out: &mut String) {
        let l = &self.latencies;
        Series::render_header(
            m::QUEUE_WAIT_SECONDS,
            "Time from receipt to the start of inference, for started requests.",
            out,
        );
        l.queue_wait
            .render_samples(&m::latency_series(m::QUEUE_WAIT_SECONDS, None), out);
        Series::render_header(
            m::INFERENCE_SECONDS,
            "Backend call duration by outcome.",
            out,
        );
        for (i, h) in l.inference.iter().enumerate() {
            let label = Some(("outcome", outcome_name(i)));
            h.render_samples(&m::latency_series(m::INFERENCE_SECONDS, label), out);
        }
        Series::render_header(
            m::TTFT_SECONDS,
            "Streamed replies: start of inference to the first chunk published.",
            out,
        );
        l.ttft
            .render_samples(&m::latency_series(m::TTFT_SECONDS, None), out);
    }

    /// Publishes the counters and the queue gauges to the metrics recorder. Called when
    /// stats are read (every scrape): per-request work stays at plain atomic adds.
    pub(crate) fn publish(&self, queued: usize, running: usize, estimate: &EstimateView) {
        let h = &self.handles;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        h.offered.absolute(get(&self.offered));
        h.admitted.absolute(get(&self.admitted));
        h.joined.absolute(get(&self.joined));
        h.cached.absolute(get(&self.cached));
        h.started.absolute(get(&self.started));
        h.started_after_deadline
            .absolute(get(&self.started_after_deadline));
        if let Some(ok) = h.answered.first() {
            ok.absolute(get(&self.completed));
        }
        for (c, n) in h.answered.iter().skip(1).zip(&self.refused) {
            c.absolute(get(n));
        }
        h.queue_depth.set(queued as f64);
        h.running.set(running as f64);
        // No estimate yet: NaN would break dashboards' arithmetic; 0 with 0 samples.
        h.estimate
            .set(estimate.service_time_ms.map_or(0.0, |ms| ms / 1000.0));
        h.estimate_samples.set(estimate.samples as f64);
        h.cache_entries.set(get(&self.cache_entries) as f64);
        h.cache_bytes.set(get(&self.cache_bytes) as f64);
        h.cache_evicted_bytes
            .absolute(get(&self.cache_evicted_bytes));
        h.cache_evicted_entries
            .absolute(get(&self.cache_evicted_entries));
        h.cache_too_large.absolute(get(&self.cache_too_large));
        h.streams.absolute(get(&self.streams));
        h.stream_chunks.absolute(get(&self.stream_chunks));
        h.stream_bytes.absolute(get(&self.stream_bytes));
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let refused = ErrorCode::ALL
            .iter()
            .zip(&self.refused)
            .filter_map(|(c, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then(|| (c.as_str().to_owned(), n))
            })
            .collect();
        let l = &self.latencies;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let busy_ms: f64 = l.inference.iter().map(|h| ms(h.sum())).sum();
        let useful_ms = l.inference.first().map_or(0.0, |ok| ms(ok.sum()));
        StatsSnapshot {
            offered: self.offered.load(Ordering::Relaxed),
            admitted: self.admitted.load(Ordering::Relaxed),
            joined: self.joined.load(Ordering::Relaxed),
            cached: self.cached.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            refused,
            started: self.started.load(Ordering::Relaxed),
            started_after_deadline: self.started_after_deadline.load(Ordering::Relaxed),
            queued_now: 0,
            running_now: 0,
            would_reject: self
                .would_reject
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            queue_wait_ms: l.queue_wait.percentiles(),
            inference_ms: LatencyHistogram::merged_percentiles(&l.inference),
            backend_busy_ms: busy_ms,
            backend_useful_ms: useful_ms,
            slots_acquired: 0,
            slots_released: 0,
            refusal_ms: l.refusal.percentiles(),
            service_estimate: None,
            cache: CacheSnapshot {
                entries: self.cache_entries.load(Ordering::Relaxed),
                bytes: self.cache_bytes.load(Ordering::Relaxed),
                max_bytes: self.cache_max_bytes.load(Ordering::Relaxed),
                evicted_max_bytes: self.cache_evicted_bytes.load(Ordering::Relaxed),
                evicted_max_entries: self.cache_evicted_entries.load(Ordering::Relaxed),
                too_large: self.cache_too_large.load(Ordering::Relaxed),
            },
            nats: Default::default(),
            stream: StreamSnapshot {
                started: self.streams.load(Ordering::Relaxed),
                chunks: self.stream_chunks.load(Ordering::Relaxed),
                bytes: self.stream_bytes.load(Ordering::Relaxed),
                ttft_ms: l.ttft.percentiles(),
                aborted: self
                    .stream_aborted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), *v))
                    .collect(),
            },
        }
    }
}
