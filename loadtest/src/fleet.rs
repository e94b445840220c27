//! The simulated recognition fleet: shard consumers built on weir's consumer core
//! (`weir_audio_consumer`), with a configurable cost per frame, pausable.
//!
//! `workers` consumers (one NATS connection each, as separate ASR processes would
//! have) share the partitions of the audio subject statically: partition `p` belongs
//! to worker `p mod workers`. The consumer core gives each stream its own ordered
//! handler, detects sequence holes (lost in transit), refuses out-of-order packets,
//! reaps streams that go silent without `end`, and bounds each stream's queue (policy
//! `gap` here, so that a recogniser that stalled keeps its timeline when it resumes).
//!
//! The consumers run the consumer core's staleness guard (`max_frame_age_ms`) at the
//! product default ([`DEFAULT_MAX_FRAME_AGE`], 1 s): a frame whose capture time is older
//! than that when the consumer receives it is dropped *before* the recogniser, declared
//! to it as a `stale` gap and counted by the consumer core (`stale_frames`). The load
//! test reports those frames (`frames.stale_dropped_by_consumer`); they are received,
//! never hidden, and never timed as delivered.
//!
//! The handler — the "recogniser" — busy-waits `cost_per_frame` per frame (or, with a
//! GPU model, waits its turn on the worker's serial GPU timeline, [`crate::gpu`]) and records
//! the end-to-end latency (the frame's capture time → handled here) per sampling window
//! and for the whole run. On entry, before any pause or work, it also records the
//! frame's timeliness ([`crate::timeliness`]): whether the consumer received it later
//! than `max_age` + one confirmation round after capture (`delivered_late`), and the
//! latency capture → handed to the handler. Only frames handed to the recogniser are
//! timed (stale frames and frames the consumer's own bound dropped never reach it).
//! While the fleet is paused, every handler waits before its next frame, as a stalled
//! GPU worker would; frames then queue in the consumer (bounded) and in the NATS client
//! (bounded by `subscription_capacity`).
//!
//! Invariants: all accounting comes from the consumer core's own counters (so the load
//! test measures the real consumer, not a stand-in); the fleet adds only latency and
//! the pause switch. Dropping the fleet aborts its consumers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
pub use weir_audio_consumer::DEFAULT_MAX_FRAME_AGE;
use weir_audio_consumer::{
    Consumer, ConsumerConfig, ConsumerError, ConsumerPolicy, StreamEvent, StreamHandler, StreamInfo,
};

use crate::gpu::{AsrMeter, GpuModel, GpuTimeline};
use crate::scenario::run::SUBJECT_TEMPLATE;
use crate::stats::{LatencyHistogram, Percentiles};
use crate::timeliness::{Timeliness, TimelinessSummary, unix_ms, unix_us};

/// The consumers' staleness guard, at the product default.
const MAX_FRAME_AGE_MS: u64 = DEFAULT_MAX_FRAME_AGE.as_millis() as u64;
/// Messages the NATS client buffers per subscription before dropping.
const SUBSCRIPTION_CAPACITY: usize = 65_536;

/// Fleet settings.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Number of partitions of the template.
    pub partitions: u32,
    /// Number of workers (consumers), at least 1 and at most `partitions`.
    pub workers: u32,
    /// CPU spent per frame (busy wait) to simulate recognition work.
    pub cost_per_frame: Duration,
    /// A stream silent this long without `end` is reaped.
    pub idle_timeout: Duration,
    /// Per-stream bound of the consumer's queue, bytes.
    pub max_pending_bytes: usize,
    /// Per-stream bound of the consumer's queue, age.
    pub max_pending_age: Duration,
    /// A frame received later than this after capture counts as `delivered_late`
    /// (the ingress's `max_age` + one confirmation round, [`crate::timeliness::late_after`]).
    pub late_after: Duration,
    /// The recognisers as GPU wall time ([`crate::gpu`]) instead of CPU: one serial
    /// timeline per worker; `None` burns `cost_per_frame` instead.
    pub asr: Option<FleetAsr>,
}

/// The GPU model of the fleet's workers (the `asr-shortfall` scenario).
#[derive(Debug, Clone)]
pub struct FleetAsr {
    /// Slots and real-time factor of each worker.
    pub model: GpuModel,
    /// The consumers' `max_streams` (`None`: the consumer core's default).
    pub max_streams: Option<usize>,
    /// Where every worker's handlers record the lag of the frames they start.
    pub meter: Arc<AsrMeter>,
}

#[derive(Debug)]
struct Shared {
    paused: watch::Receiver<bool>,
    cost: Duration,
    latency_total: LatencyHistogram,
    latency_window: Mutex<LatencyHistogram>,
    timeliness: Mutex<Timeliness>,
}

/// The handler of one stream: a simulated recogniser.
struct Recogniser {
    shared: Arc<Shared>,
    /// The worker's GPU timeline and the meter, when the fleet models a GPU.
    gpu: Option<(Arc<GpuTimeline>, Arc<AsrMeter>)>,
}

impl StreamHandler for Recogniser {
    async fn on_event(&mut self, event: StreamEvent) {
        let StreamEvent::Frame(frame) = event else {
            return;
        };
        // Handed to the handler now; received by the consumer `received_at` ago.
        let handed_us = unix_us();
        let received_us = handed_us
            .saturating_sub(u64::try_from(frame.received_at.elapsed().as_micros()).unwrap_or(0));
        if let Ok(mut t) = self.shared.timeliness.lock() {
            t.record(frame.captured_at_ms, received_us, handed_us);
        }
        let mut paused = self.shared.paused.clone();
        // Bounded by the scenario, which always resumes (and by the fleet's drop).
        while *paused.borrow_and_update() {
            if paused.changed().await.is_err() {
                return;
            }
        }
        match &self.gpu {
            Some((timeline, meter)) => meter.run_frame(timeline, frame.captured_at_ms).await,
            None => spin(self.shared.cost),
        }
        if let Some(at) = frame.captured_at_ms {
            let d = Duration::from_millis(unix_ms().saturating_sub(at));
            self.shared.latency_total.record(d);
            if let Ok(w) = self.shared.latency_window.lock() {
                w.record(d);
            }
        }
    }
}

/// What the fleet saw, cumulatively (sums over its consumers). It serializes as the
/// report's `consumer` section, in this order; the fields marked `skip` go into the
/// frame accounting instead.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FleetSnapshot {
    /// Stream instances started.
    pub streams_seen: u64,
    /// Streams reaped after the idle timeout without an `end`.
    pub streams_reaped_without_end: u64,
    /// Streams by `Weir-End-Reason` of their end (`none` = no header; `missing` = no
    /// end arrived), over the streams the consumers still retain.
    pub ends_by_reason: BTreeMap<String, u64>,
    /// Seqs that never arrived and that no declaration covers (undeclared sequence
    /// holes), plus the leading seqs before the first packet a consumer saw of a
    /// stream.
    pub lost_frames: u64,
    /// Seqs that never arrived inside a range the ingress declared possibly lost
    /// (`Weir-Possibly-Lost`): declared holes. Disjoint from `lost_frames`.
    pub possibly_lost_frames: u64,
    /// Packets that carried a `Weir-Possibly-Lost` declaration.
    pub possible_loss_declarations: u64,
    /// Hole ranges the consumers forgot (per-stream memory of 16) before a declaration
    /// could cover them: they stay in `lost_frames`.
    pub holes_forgotten: u64,
    /// Declared ranges the consumers forgot: a hole found later inside one counts as
    /// `lost_frames`.
    pub declarations_forgotten: u64,
    /// The staleness guard the consumers ran with, ms (`None`: off).
    pub max_frame_age_ms: Option<u64>,
    /// Frames the staleness guard dropped before the recogniser (older than
    /// `max_frame_age` at receipt), declared to it as `stale` gaps.
    pub stale_frames: u64,
    /// Packets refused as duplicate or out of order (stream order broken).
    pub out_of_order_refused: u64,
    /// Gap packets received.
    pub gap_packets: u64,
    /// Frames declared missing by gap packets.
    pub gap_frames: u64,
    /// Frames dropped by the consumers' own bound (recogniser behind).
    pub dropped_by_consumer: u64,
    /// Slow-consumer events of the consumers' NATS clients.
    pub slow_consumer_events: u64,
    /// End-to-end latency (ingress accept → handled), whole run.
    pub latency_ms: Percentiles,
    /// Distinct frames received in order (accepted by the consumers' sequence check),
    /// fresh and stale.
    #[serde(skip)]
    pub frames_received: u64,
    /// Frames whose recogniser call completed.
    #[serde(skip)]
    pub frames_handled: u64,
    /// Frames of streams the consumers refused (over their `max_streams` cap): counted
    /// by the consumer, never handed to a recogniser.
    #[serde(skip)]
    pub frames_refused: u64,
    /// Frames queued in the consumers now.
    #[serde(skip)]
    pub pending_frames: u64,
    /// Late deliveries and latency capture → handed to the handler.
    #[serde(skip)]
    pub timeliness: TimelinessSummary,
}

/// A running fleet.
#[derive(Debug)]
pub struct Fleet {
    consumers: Vec<Consumer>,
    shared: Arc<Shared>,
    pause: watch::Sender<bool>,
}

impl Fleet {
    /// Starts the consumers; returns once every subscription is confirmed by the
    /// server (so no frame published afterwards is missed).
    pub async fn start(nats_url: &str, config: &FleetConfig) -> Result<Self, ConsumerError> {
        let (pause, paused) = watch::channel(false);
        let shared = Arc::new(Shared {
            paused,
            cost: config.cost_per_frame,
            latency_total: LatencyHistogram::new(),
            latency_window: Mutex::new(LatencyHistogram::new()),
            timeliness: Mutex::new(Timeliness::new(config.late_after)),
        });
        let workers = config.workers.clamp(1, config.partitions.max(1));
        let mut consumers = Vec::new();
        for w in 0..workers {
            let owned: Vec<u32> = (0..config.partitions)
                .filter(|p| p % workers == w)
                .collect();
            let mut cc = ConsumerConfig::partitioned(SUBJECT_TEMPLATE, config.partitions, owned);
            cc.idle_timeout_ms = config.idle_timeout.as_millis() as u64;
            cc.subscription_capacity = SUBSCRIPTION_CAPACITY;
            cc.max_pending_bytes = config.max_pending_bytes;
            cc.max_pending_age_ms = config.max_pending_age.as_millis() as u64;
            cc.policy = ConsumerPolicy::Gap;
            cc.max_frame_age_ms = MAX_FRAME_AGE_MS;
            if let Some(n) = config.asr.as_ref().and_then(|a| a.max_streams) {
                cc.max_streams = n;
            }
            let gpu = config
                .asr
                .as_ref()
                .map(|a| (Arc::new(GpuTimeline::new(a.model)), a.meter.clone()));
            let settings = cc.validate()?;
            // Default ping interval on purpose: a short one would make the fleet itself
            // disconnect (and lose what is in flight) while the server is SIGSTOPped.
            // A short connection timeout makes reconnecting after a restart quick.
            let options =
                async_nats::ConnectOptions::new().connection_timeout(Duration::from_millis(500));
            let s = shared.clone();
            let factory = move |_: &StreamInfo| Recogniser {
                shared: s.clone(),
                gpu: gpu.clone(),
            };
            consumers.push(Consumer::connect_with(options, nats_url, settings, factory).await?);
        }
        Ok(Self {
            consumers,
            shared,
            pause,
        })
    }

    /// Stalls every recogniser before its next frame.
    pub fn pause(&self) {
        let _ = self.pause.send(true);
    }

    /// Resumes the recognisers.
    pub fn resume(&self) {
        let _ = self.pause.send(false);
    }

    /// End-to-end latency of the frames handled since the previous call.
    pub fn take_window_latency(&self) -> Percentiles {
        self.shared
            .latency_window
            .lock()
            .map(|mut h| std::mem::take(&mut *h).percentiles())
            .unwrap_or_default()
    }

    /// Distinct frames received in order so far, fresh and stale (cheap enough for
    /// every sample).
    pub fn frames_received(&self) -> u64 {
        self.consumers
            .iter()
            .map(|c| {
                let k = c.totals().counters;
                k.frames + k.stale_frames
            })
            .sum()
    }

    /// Streams the consumers follow now: neither ended nor reaped (cheap enough to poll
    /// while draining).
    pub fn streams_active(&self) -> u64 {
        self.consumers
            .iter()
            .map(|c| c.totals().streams_active)
            .sum()
    }

    /// A cumulative snapshot.
    pub fn snapshot(&self) -> FleetSnapshot {
        let mut s = FleetSnapshot {
            max_frame_age_ms: Some(MAX_FRAME_AGE_MS),
            ..FleetSnapshot::default()
        };
        for c in &self.consumers {
            let st = c.stats();
            let t = &st.totals;
            let k = &t.counters;
            s.frames_received += k.frames + k.stale_frames;
            s.stale_frames += k.stale_frames;
            s.frames_handled += k.frames_delivered;
            s.lost_frames += k.lost_frames + k.leading_missing;
            s.possibly_lost_frames += k.possibly_lost_frames;
            s.possible_loss_declarations += k.possible_loss_declarations;
            s.holes_forgotten += k.holes_forgotten;
            s.declarations_forgotten += k.declarations_forgotten;
            s.frames_refused += t.frames_refused;
            s.out_of_order_refused += k.stale_packets;
            s.gap_packets += k.declared_gaps;
            s.gap_frames += k.declared_gap_frames;
            s.dropped_by_consumer +=
                k.frames_dropped_overload + k.frames_dropped_closed + k.frames_dropped_handler_gone;
            s.streams_reaped_without_end += t.streams_reaped;
            s.streams_seen += t.streams_started;
            s.slow_consumer_events += t.slow_consumer_events;
            s.pending_frames += t.pending_frames as u64;
            for stream in &st.streams {
                let reason = match (&stream.end_seen, &stream.end_reason) {
                    (true, Some(r)) => r.clone(),
                    (true, None) => "none".to_owned(),
                    (false, _) => "missing".to_owned(),
                };
                *s.ends_by_reason.entry(reason).or_default() += 1;
            }
        }
        s.latency_ms = self.shared.latency_total.percentiles();
        s.timeliness = self
            .shared
            .timeliness
            .lock()
            .map(|t| t.summary())
            .unwrap_or_default();
        s
    }

    /// Stops every consumer (bounded grace) and returns the final snapshot.
    pub async fn stop(self) -> FleetSnapshot {
        self.resume();
        let snapshot = self.snapshot();
        for c in self.consumers {
            let _ = c.shutdown(Duration::from_millis(500)).await;
        }
        snapshot
    }
}

/// Busy-waits for `cost` (simulated recognition work). Zero costs nothing.
fn spin(cost: Duration) {
    if cost.is_zero() {
        return;
    }
    let until = std::time::Instant::now() + cost;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}
