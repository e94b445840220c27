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

use weir_protocol::WireName;
use weir_protocol::llm::ErrorCode;
use weir_service::metrics::{LatencyHistogram, Series};
use weir_service::sync::locked;

use super::Outcome;
use super::estimator::EstimateView;
use crate::metrics as m;

/// Percentiles of a latency histogram, in milliseconds (the shared admin type).
pub use weir_protocol::admin::Percentiles;

/// The `/v1/stats` snapshot and its parts: the shared admin types.
use weir_protocol::admin::TokenBudgetStats;
pub use weir_protocol::admin::{
    AdapterStats as StatsSnapshot, CacheStats as CacheSnapshot, StreamStats as StreamSnapshot,
};

/// Why a reply left the cache before its window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheEviction {
    /// `idempotency.max_bytes`.
    MaxBytes,
    /// `idempotency.max_entries`.
    MaxEntries,
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

/// The index of `outcome` (`ok` or an error code) in `Stats::answered` and
/// `Latencies::inference`.
fn outcome_index(outcome: &str) -> usize {
    ErrorCode::ALL
        .iter()
        .position(|c| c.as_str() == outcome)
        .map_or(0, |i| i + 1)
}

/// Session interrupts counted for `/v1/stats` (their metrics carry labels and are
/// counted where they happen).
#[derive(Debug, Default)]
pub(crate) struct Interrupts {
    pub(crate) session_cancels: AtomicU64,
    pub(crate) supersedes: AtomicU64,
    pub(crate) cancelled_queued: AtomicU64,
    pub(crate) cancelled_running: AtomicU64,
}

impl Interrupts {
    /// The counts at 0, with their labelled metrics registered (at 0: a dashboard
    /// panel reads them before the first interrupt).
    fn registered() -> Self {
        for result in ["cancelled", "not_found"] {
            metrics::counter!(m::SESSION_CANCEL_TOTAL, "result" => result).absolute(0);
        }
        for result in ["superseded", "nothing"] {
            metrics::counter!(m::SUPERSEDE_TOTAL, "result" => result).absolute(0);
        }
        for by in ["session_cancel", "supersede"] {
            for stage in ["queued", "running"] {
                metrics::counter!(m::INTERRUPTED_TOTAL, "by" => by, "stage" => stage).absolute(0);
            }
        }
        Self::default()
    }

    fn snapshot(&self) -> weir_protocol::admin::InterruptStats {
        let get = |n: &AtomicU64| n.load(Ordering::Relaxed);
        weir_protocol::admin::InterruptStats {
            session_cancels: get(&self.session_cancels),
            supersedes: get(&self.supersedes),
            cancelled_queued: get(&self.cancelled_queued),
            cancelled_running: get(&self.cancelled_running),
        }
    }
}

/// A counter kept as a plain atomic (a request pays one relaxed add, no metrics-facade
/// call) and set on its handle, registered once at start from the recorder installed
/// then, when stats are read (`absolute`).
pub(crate) struct Tally {
    n: AtomicU64,
    handle: metrics::Counter,
}

impl Tally {
    fn new(handle: metrics::Counter) -> Self {
        Self {
            n: AtomicU64::new(0),
            handle,
        }
    }

    pub(crate) fn add(&self, n: u64) {
        self.n.fetch_add(n, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }

    fn publish(&self) {
        self.handle.absolute(self.get());
    }
}

/// The counter of `rule` in `handles`, or a new handle for a rule not known at start.
fn rule_counter(handles: &HashMap<String, metrics::Counter>, name: &'static str, rule: &str) {
    match handles.get(rule) {
        Some(c) => c.increment(1),
        None => metrics::counter!(name, "rule" => rule.to_owned()).increment(1),
    }
}

/// The live counters.
pub(crate) struct Stats {
    pub(crate) offered: Tally,
    pub(crate) admitted: Tally,
    pub(crate) joined: Tally,
    pub(crate) cached: Tally,
    started: Tally,
    started_after_deadline: Tally,
    /// Answers by outcome: index 0 = `ok` (`completed`), then [`ErrorCode::ALL`] order
    /// (`refused`).
    answered: Vec<Tally>,
    would_reject: Mutex<BTreeMap<String, u64>>,
    limit_reject_handles: HashMap<String, metrics::Counter>,
    would_reject_handles: HashMap<String, metrics::Counter>,
    latencies: Latencies,
    queue_depth: metrics::Gauge,
    running: metrics::Gauge,
    estimate: metrics::Gauge,
    estimate_samples: metrics::Gauge,
    /// Replies the idempotency cache holds now, and their gauge.
    cache_entries: (AtomicU64, metrics::Gauge),
    /// Bytes the idempotency cache holds now, and their gauge.
    cache_bytes: (AtomicU64, metrics::Gauge),
    cache_max_bytes: AtomicU64,
    cache_evicted_bytes: Tally,
    cache_evicted_entries: Tally,
    pub(crate) cache_too_large: Tally,
    pub(crate) streams: Tally,
    /// Per priority class (`admission/priority.rs`).
    pub(crate) priority: super::priority::PriorityStats,
    /// Session cancels and supersedes (`admission/barge_in.rs`).
    pub(crate) interrupts: Interrupts,
    stream_chunks: Tally,
    stream_bytes: Tally,
    stream_aborted: Mutex<BTreeMap<&'static str, u64>>,
}

impl Stats {
    /// `rules`: every rule name a refusal can be counted under.
    pub(crate) fn new(rules: &[String], backend: &'static str) -> Self {
        let by_rule = |name: &'static str| {
            rules
                .iter()
                .map(|r| (r.clone(), metrics::counter!(name, "rule" => r.clone())))
                .collect()
        };
        let evicted =
            |reason| Tally::new(metrics::counter!(m::CACHE_EVICTED_TOTAL, "reason" => reason));
        Self {
            offered: Tally::new(metrics::counter!(m::OFFERED_TOTAL)),
            admitted: Tally::new(metrics::counter!(m::ADMITTED_TOTAL)),
            joined: Tally::new(metrics::counter!(m::JOINED_TOTAL)),
            cached: Tally::new(metrics::counter!(m::CACHED_TOTAL)),
            started: Tally::new(metrics::counter!(m::INFERENCE_STARTED_TOTAL)),
            started_after_deadline: Tally::new(metrics::counter!(m::STARTED_AFTER_DEADLINE_TOTAL)),
            answered: (0..=ErrorCode::ALL.len())
                .map(|i| {
                    Tally::new(metrics::counter!(m::ANSWERED_TOTAL, "outcome" => outcome_name(i)))
                })
                .collect(),
            would_reject: Mutex::new(BTreeMap::new()),
            limit_reject_handles: by_rule(m::LIMIT_REJECT_TOTAL),
            would_reject_handles: by_rule(m::WOULD_REJECT_TOTAL),
            latencies: Latencies {
                queue_wait: LatencyHistogram::new(),
                ttft: LatencyHistogram::new(),
                inference: (0..=ErrorCode::ALL.len())
                    .map(|_| LatencyHistogram::new())
                    .collect(),
                refusal: LatencyHistogram::new(),
            },
            queue_depth: metrics::gauge!(m::QUEUE_DEPTH),
            running: metrics::gauge!(m::RUNNING),
            estimate: metrics::gauge!(m::SERVICE_ESTIMATE_SECONDS, "backend" => backend),
            estimate_samples: metrics::gauge!(m::SERVICE_ESTIMATE_SAMPLES, "backend" => backend),
            cache_entries: (AtomicU64::new(0), metrics::gauge!(m::CACHE_ENTRIES)),
            cache_bytes: (AtomicU64::new(0), metrics::gauge!(m::CACHE_BYTES)),
            cache_max_bytes: AtomicU64::new(0),
            cache_evicted_bytes: evicted("max_bytes"),
            cache_evicted_entries: evicted("max_entries"),
            cache_too_large: Tally::new(metrics::counter!(m::CACHE_TOO_LARGE_TOTAL)),
            streams: Tally::new(metrics::counter!(m::STREAMS_TOTAL)),
            stream_chunks: Tally::new(metrics::counter!(m::STREAM_CHUNKS_TOTAL)),
            stream_bytes: Tally::new(metrics::counter!(m::STREAM_BYTES_TOTAL)),
            stream_aborted: Mutex::new(BTreeMap::new()),
            priority: Default::default(),
            interrupts: Interrupts::registered(),
        }
    }

    pub(crate) fn cache_bounds(&self, max_bytes: usize) {
        self.cache_max_bytes
            .store(max_bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn cache_now(&self, entries: usize, bytes: usize) {
        self.cache_entries
            .0
            .store(entries as u64, Ordering::Relaxed);
        self.cache_bytes.0.store(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn cache_evicted(&self, reason: CacheEviction) {
        match reason {
            CacheEviction::MaxBytes => &self.cache_evicted_bytes,
            CacheEviction::MaxEntries => &self.cache_evicted_entries,
        }
        .add(1);
    }

    pub(crate) fn would_reject(&self, rule: &str) {
        let mut w = locked(&self.would_reject);
        *w.entry(rule.to_owned()).or_insert(0) += 1;
        rule_counter(&self.would_reject_handles, m::WOULD_REJECT_TOTAL, rule);
    }

    pub(crate) fn limit_reject(&self, rule: &str) {
        rule_counter(&self.limit_reject_handles, m::LIMIT_REJECT_TOTAL, rule);
    }

    /// Inference started; a `retry` (the same request started again on another backend
    /// after a failover) counts neither as a start nor as a queue wait again.
    pub(crate) fn started(&self, queue_wait: Duration, after_deadline: bool, retry: bool) {
        self.started_after_deadline.add(u64::from(after_deadline));
        if retry {
            return;
        }
        self.started.add(1);
        self.latencies.queue_wait.record(queue_wait);
    }

    pub(crate) fn inference_done(&self, took: Duration, outcome: &'static str) {
        if let Some(h) = self.latencies.inference.get(outcome_index(outcome)) {
            h.record(took);
        }
    }

    /// One `chunk` message of `bytes` body bytes was published.
    pub(crate) fn stream_chunk(&self, bytes: usize) {
        self.stream_chunks.add(1);
        self.stream_bytes.add(bytes as u64);
    }

    /// The first chunk of a stream was published `ttft` after inference started.
    pub(crate) fn stream_ttft(&self, ttft: Duration) {
        self.latencies.ttft.record(ttft);
    }

    /// A stream was aborted because of its caller.
    pub(crate) fn stream_aborted(&self, reason: &'static str) {
        metrics::counter!(m::STREAM_ABORTED_TOTAL, "reason" => reason).increment(1);
        *locked(&self.stream_aborted).entry(reason).or_default() += 1;
    }

    /// Counts one answer (one waiter).
    pub(crate) fn answered(&self, outcome: &Outcome) {
        if let Some(t) = self.answered.get(outcome_index(outcome.code())) {
            t.add(1);
        }
        if outcome.result.is_err() && outcome.inference_time.is_none() {
            self.latencies.refusal.record(outcome.queue_time);
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
        self.priority.render_histograms(out);
    }

    /// Publishes the token budgets' totals (label `rule` = the limit name): read with
    /// the stats, like every counter here.
    pub(crate) fn publish_tokens(&self, tokens: &BTreeMap<String, TokenBudgetStats>) {
        for (rule, t) in tokens {
            let r = || rule.clone();
            for (name, v) in [
                (m::TOKENS_RESERVED_TOTAL, t.reserved),
                (m::TOKENS_USED_TOTAL, t.used),
                (m::TOKENS_REFUNDED_TOTAL, t.refunded),
                (m::TOKENS_OVERCHARGED_TOTAL, t.overcharged),
                (m::TOKENS_REFUSED_TOTAL, t.refused),
                (m::TOKEN_KEYS_EVICTED_TOTAL, t.evicted),
            ] {
                metrics::counter!(name, "rule" => r()).absolute(v);
            }
            for (usage, v) in [
                ("reported", t.usage_reported),
                ("clamped", t.usage_clamped),
                ("missing", t.usage_missing),
            ] {
                metrics::counter!(m::TOKENS_USAGE_TOTAL, "rule" => r(), "usage" => usage)
                    .absolute(v);
            }
            metrics::gauge!(m::TOKEN_KEYS, "rule" => r()).set(t.keys as f64);
        }
    }

    /// Publishes the counters and the queue gauges to the metrics recorder. Called when
    /// stats are read (every scrape): per-request work stays at plain atomic adds.
    pub(crate) fn publish(&self, queued: usize, running: usize, estimate: &EstimateView) {
        for t in [
            &self.offered,
            &self.admitted,
            &self.joined,
            &self.cached,
            &self.started,
            &self.started_after_deadline,
            &self.cache_evicted_bytes,
            &self.cache_evicted_entries,
            &self.cache_too_large,
            &self.streams,
            &self.stream_chunks,
            &self.stream_bytes,
        ]
        .into_iter()
        .chain(&self.answered)
        {
            t.publish();
        }
        self.queue_depth.set(queued as f64);
        self.running.set(running as f64);
        // No estimate yet: NaN would break dashboards' arithmetic; 0 with 0 samples.
        self.estimate
            .set(estimate.service_time_ms.map_or(0.0, |ms| ms / 1000.0));
        self.estimate_samples.set(estimate.samples as f64);
        for (n, gauge) in [&self.cache_entries, &self.cache_bytes] {
            gauge.set(n.load(Ordering::Relaxed) as f64);
        }
    }

    /// The counters and histograms (not the state's figures: `queued_now`, slots,
    /// tokens, the estimate, `nats`).
    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        let refused = ErrorCode::ALL
            .iter()
            .zip(self.answered.iter().skip(1))
            .filter_map(|(c, n)| {
                let n = n.get();
                (n > 0).then(|| (c.as_str().to_owned(), n))
            })
            .collect();
        let l = &self.latencies;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let busy_ms: f64 = l.inference.iter().map(|h| ms(h.sum())).sum();
        let useful_ms = l.inference.first().map_or(0.0, |ok| ms(ok.sum()));
        StatsSnapshot {
            offered: self.offered.get(),
            admitted: self.admitted.get(),
            joined: self.joined.get(),
            cached: self.cached.get(),
            completed: self.answered.first().map_or(0, Tally::get),
            refused,
            started: self.started.get(),
            started_after_deadline: self.started_after_deadline.get(),
            would_reject: locked(&self.would_reject).clone(),
            queue_wait_ms: l.queue_wait.percentiles(),
            inference_ms: LatencyHistogram::merged_percentiles(&l.inference),
            backend_busy_ms: busy_ms,
            backend_useful_ms: useful_ms,
            refusal_ms: l.refusal.percentiles(),
            cache: CacheSnapshot {
                entries: self.cache_entries.0.load(Ordering::Relaxed),
                bytes: self.cache_bytes.0.load(Ordering::Relaxed),
                max_bytes: self.cache_max_bytes.load(Ordering::Relaxed),
                evicted_max_bytes: self.cache_evicted_bytes.get(),
                evicted_max_entries: self.cache_evicted_entries.get(),
                too_large: self.cache_too_large.get(),
            },
            stream: StreamSnapshot {
                started: self.streams.get(),
                chunks: self.stream_chunks.get(),
                bytes: self.stream_bytes.get(),
                ttft_ms: l.ttft.percentiles(),
                aborted: locked(&self.stream_aborted)
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), *v))
                    .collect(),
            },
            priority: self.priority.snapshot(),
            interrupts: self.interrupts.snapshot(),
            ..StatsSnapshot::default()
        }
    }
}
