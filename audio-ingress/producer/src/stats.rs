//! Accounting of every frame, per stream and in aggregate, and the JSON snapshots built
//! from it (`/v1/stats`, `/v1/streams`).
//!
//! Invariant (checked by tests): for every stream and in aggregate,
//!
//! ```text
//! offered     = admitted + rejected      (rejected: never got a sequence number)
//! admitted    = published + possibly_lost + dropped + pending
//! handed_over = published + possibly_lost + unconfirmed
//! ```
//!
//! where `rejected` and `dropped` are split by [`DropReason`], and every dropped frame
//! of the `gap` policy is also covered by a gap marker. `published` means *confirmed by
//! the server* (see [`crate::confirm`]); `pending` includes the frames handed to the NATS
//! client and not yet confirmed (`unconfirmed`); `possibly_lost` are frames that were
//! unconfirmed when the connection dropped, declared to consumers with the
//! `Weir-Possibly-Lost` header. Counters are plain relaxed
//! atomics: a snapshot taken while frames move may be off by the frames in motion, a
//! snapshot of a quiet stream is exact.
//!
//! Metrics: nothing on the per-frame path calls the `metrics` facade. The per-frame
//! counters and the pending gauges are published from these atomics at scrape time
//! ([`Global::publish_metrics`], called by the admin server before it renders
//! `/metrics`), and the queue wait is one [`weir_service::metrics::LatencyHistogram`]
//! fed a batch at a time ([`Global::record_waits`]): `/v1/stats` reads its percentiles
//! ([`Global::queue_wait`]) and `/metrics` its buckets ([`Global::render_histograms`]),
//! both from the same counts, without a lock. Events
//! that are rare per frame (overloads, ends, gaps, stream opens) still increment their
//! handles directly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge};
use serde::Serialize;
use weir_protocol::WireName;
use weir_protocol::audio::extension::{EndReason, OverloadReason};
use weir_service::metrics::{LatencyHistogram, Series};

use crate::metrics as m;

/// Why an offered frame was not published. The first three are refusals (the frame
/// was never admitted and has no sequence number); the rest are drops of admitted
/// frames (their sequence numbers are missing downstream, covered by a gap marker in
/// the `gap` policy or followed by an `end` in `close`).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Refused: the byte budget was full (`close` policy, `try_push`).
    QueueFull,
    /// Refused: the stream was overloaded, ending or ended.
    Closed,
    /// Refused: not a valid PCM frame.
    Invalid,
    /// Dropped: oldest frame evicted to make room (`gap` policy).
    Evicted,
    /// Dropped: older than `max_age` before it could be published (`gap` policy).
    MaxAge,
    /// Dropped: pending when the stream overloaded (`close` policy).
    Overload,
    /// Dropped: NATS did not take it within `publish_timeout` (`gap` policy).
    PublishTimeout,
    /// Dropped: the NATS client returned an error for it.
    PublishError,
    /// Dropped: still pending when the shutdown grace period ran out.
    Shutdown,
    /// Dropped: the stream's byte budget was held by frames the server had not
    /// confirmed yet (`gap` policy; covered by a gap marker).
    Unconfirmed,
    /// Dropped: over the stream's rate bound (`max_rate`, `gap` policy; covered by a
    /// gap marker).
    Rate,
    /// Never received: offered by a producer whose connection dropped, declared when
    /// it resumed the stream (a `resume` gap marker, or in `close` a `resume`
    /// possible-loss declaration).
    Resume,
    /// Never received: the producer's source lost it (a telephony carrier's missing or
    /// late chunks), declared by the door (a `source` gap marker or possible-loss
    /// declaration).
    Source,
}

impl DropReason {
    /// Whether the frame was refused at admission (no sequence number).
    pub fn is_refusal(self) -> bool {
        matches!(self, Self::QueueFull | Self::Closed | Self::Invalid)
    }
}

/// Why shadow mode would have refused or dropped a frame.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WouldReject {
    /// Over the byte budget.
    Bytes,
    /// Older than the age budget.
    Age,
    /// A publish timed out.
    PublishTimeout,
}

const N_DROP: usize = DropReason::ALL.len();
const N_END: usize = EndReason::ALL.len();

/// One handle per variant of a [`WireName`] enum, in `ALL` (declaration) order, so that
/// `variant as usize` is its index.
fn per_variant<T: WireName, const N: usize>(
    counter: impl Fn(&'static str) -> Counter,
) -> [Counter; N] {
    std::array::from_fn(|i| counter(T::ALL[i].as_str()))
}

/// Frame counters of one stream (also used, summed, for the aggregate); of `u64`s, a
/// consistent-enough copy of them ([`CountersSnapshot`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters<T = AtomicU64> {
    /// Frames offered.
    pub(crate) offered: T,
    /// Frames admitted (given a sequence number).
    pub(crate) admitted: T,
    /// Frames handed to the NATS client.
    pub(crate) handed_over: T,
    /// Frames the server confirmed (with the window off: handed over).
    pub(crate) published: T,
    /// Frames unconfirmed when the connection dropped (declared, not published).
    pub(crate) possibly_lost: T,
    /// Frames not published, by [`DropReason`] (index = position in `DropReason::ALL`).
    pub(crate) dropped: [T; N_DROP],
    /// Samples in admitted frames that were dropped.
    pub(crate) dropped_samples: T,
    /// Shadow mode: frames the budget would have refused or dropped.
    pub(crate) would_reject: T,
    /// Gap markers handed to NATS.
    pub(crate) gaps: T,
    /// Frames covered by those markers.
    pub(crate) gap_frames: T,
}

/// A copy of [`Counters`].
pub type CountersSnapshot = Counters<u64>;

fn add(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl CountersSnapshot {
    /// Frames for one reason.
    pub fn dropped(&self, r: DropReason) -> u64 {
        self.dropped[r as usize]
    }
}

/// The tests' sums of the counters.
#[cfg(test)]
impl CountersSnapshot {
    /// Refused frames (all refusal reasons).
    pub fn rejected_total(&self) -> u64 {
        self.dropped_where(true)
    }
    /// Admitted frames that were dropped (all drop reasons).
    pub fn dropped_admitted_total(&self) -> u64 {
        self.dropped_where(false)
    }
    fn dropped_where(&self, refusal: bool) -> u64 {
        let reasons = DropReason::ALL.iter().filter(|r| r.is_refusal() == refusal);
        reasons.map(|r| self.dropped(*r)).sum()
    }
}

impl Counters {
    /// A copy of the counters.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            offered: get(&self.offered),
            admitted: get(&self.admitted),
            handed_over: get(&self.handed_over),
            published: get(&self.published),
            possibly_lost: get(&self.possibly_lost),
            dropped: self.dropped.each_ref().map(get),
            dropped_samples: get(&self.dropped_samples),
            would_reject: get(&self.would_reject),
            gaps: get(&self.gaps),
            gap_frames: get(&self.gap_frames),
        }
    }
}

/// Metric handles resolved once, when the [`Global`] is created (under whatever
/// recorder is current then: global in the binary, local in tests).
struct Handles {
    offered: Counter,
    handed_over: Counter,
    published: Counter,
    possibly_lost: Counter,
    dropped: [Counter; N_DROP],
    would_reject: [Counter; WouldReject::ALL.len()],
    overloads: [Counter; OverloadReason::ALL.len()],
    gaps: Counter,
    gap_frames: Counter,
    ends: [Counter; N_END],
    pending_bytes: Gauge,
    pending_frames: Gauge,
    oldest_age: Gauge,
    active_streams: Gauge,
    streams_total: Counter,
}

impl Default for Handles {
    fn default() -> Self {
        let dropped = std::array::from_fn(|i| {
            let r = DropReason::ALL[i];
            let outcome = if r.is_refusal() {
                "rejected"
            } else {
                "dropped"
            };
            metrics::counter!(m::FRAMES_TOTAL, m::LABEL_OUTCOME => outcome, m::LABEL_REASON => r.as_str())
        });
        Self {
            offered: metrics::counter!(m::FRAMES_OFFERED_TOTAL),
            handed_over: metrics::counter!(m::FRAMES_HANDED_OVER_TOTAL),
            published: metrics::counter!(m::FRAMES_TOTAL, m::LABEL_OUTCOME => "published", m::LABEL_REASON => "none"),
            possibly_lost: metrics::counter!(m::FRAMES_TOTAL, m::LABEL_OUTCOME => "possibly_lost", m::LABEL_REASON => "unconfirmed_at_disconnect"),
            dropped,
            would_reject: per_variant::<WouldReject, _>(
                |r| metrics::counter!(m::WOULD_REJECT_TOTAL, m::LABEL_REASON => r),
            ),
            overloads: per_variant::<OverloadReason, _>(
                |r| metrics::counter!(m::OVERLOADS_TOTAL, m::LABEL_REASON => r),
            ),
            gaps: metrics::counter!(m::GAPS_TOTAL),
            gap_frames: metrics::counter!(m::GAP_FRAMES_TOTAL),
            ends: per_variant::<EndReason, _>(
                |r| metrics::counter!(m::ENDS_TOTAL, m::LABEL_REASON => r),
            ),
            pending_bytes: metrics::gauge!(m::PENDING_BYTES),
            pending_frames: metrics::gauge!(m::PENDING_FRAMES),
            oldest_age: metrics::gauge!(m::OLDEST_FRAME_AGE_SECONDS),
            active_streams: metrics::gauge!(m::ACTIVE_STREAMS),
            streams_total: metrics::counter!(m::STREAMS_TOTAL),
        }
    }
}

/// Counter readers: `name => field;` writes `pub fn name(&self) -> u64` reading the
/// atomic `field`.
macro_rules! counts {
    ($($(#[$doc:meta])* $name:ident => $field:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> u64 {
                get(&self.$field)
            }
        )*
    };
}

/// Aggregate accounting shared by every stream of one ingress.
#[derive(Default)]
pub struct Global {
    /// Summed frame counters.
    pub counters: Counters,
    pending_bytes: AtomicU64,
    pending_frames: AtomicU64,
    admitted_bytes: AtomicU64,
    overloads: AtomicU64,
    ends: [AtomicU64; N_END],
    control_lost: AtomicU64,
    control_republished: AtomicU64,
    admission_rejects: AtomicU64,
    streams_total: AtomicU64,
    active_streams: AtomicU64,
    /// Queue waits since start: the `/v1/stats` percentiles and the `/metrics` buckets.
    queue_wait: LatencyHistogram,
    h: Handles,
}

impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Global")
            .field("counters", &self.counters.snapshot())
            .field("pending_bytes", &get(&self.pending_bytes))
            .finish_non_exhaustive()
    }
}

/// Highest queue wait recorded (60 s); longer waits are clamped (as before the
/// histogram resolved an hour: `/v1/stats` keeps its 60 s ceiling).
const QUEUE_WAIT_MAX_US: u64 = 60_000_000;

/// The queue-wait histogram in `/metrics`.
const QUEUE_WAIT_SERIES: Series = Series {
    name: m::QUEUE_WAIT_SECONDS,
    label: None,
    buckets: m::QUEUE_WAIT_BUCKETS,
};

impl Global {
    /// New, all zero. Resolves metric handles under the current recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes/frames reserved (admitted). Paired with [`Self::release`] by
    /// `queue::Reservation`, never called directly elsewhere.
    pub(crate) fn reserve(&self, bytes: u64) {
        add(&self.admitted_bytes, bytes);
        add(&self.pending_bytes, bytes);
        add(&self.pending_frames, 1);
    }

    /// Bytes/frames released (published or dropped).
    pub(crate) fn release(&self, bytes: u64, frames: u64) {
        self.pending_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.pending_frames.fetch_sub(frames, Ordering::Relaxed);
    }

    pub(crate) fn stream_opened(&self) {
        add(&self.streams_total, 1);
        add(&self.active_streams, 1);
        self.h.streams_total.increment(1);
        self.h.active_streams.increment(1.0);
    }

    pub(crate) fn stream_closed(&self) {
        self.active_streams.fetch_sub(1, Ordering::Relaxed);
        self.h.active_streams.decrement(1.0);
    }

    /// A stream open refused, by `label`: an [`OpenError`](crate::OpenError)'s, or a
    /// front door's own (not ready, a refused token).
    pub fn admission_rejected(&self, label: &'static str) {
        add(&self.admission_rejects, 1);
        metrics::counter!(m::ADMISSION_REJECTS_TOTAL, m::LABEL_REASON => label).increment(1);
    }

    pub(crate) fn overloaded(&self, reason: OverloadReason) {
        add(&self.overloads, 1);
        self.h.overloads[reason as usize].increment(1);
    }

    pub(crate) fn end_published(&self, reason: EndReason) {
        add(&self.ends[reason as usize], 1);
        self.h.ends[reason as usize].increment(1);
    }

    pub(crate) fn control_republished(&self, packet: &'static str) {
        add(&self.control_republished, 1);
        metrics::counter!(m::CONTROL_REPUBLISHED_TOTAL, m::LABEL_PACKET => packet).increment(1);
    }

    pub(crate) fn control_lost(&self, packet: &'static str) {
        add(&self.control_lost, 1);
        metrics::counter!(m::CONTROL_LOST_TOTAL, m::LABEL_PACKET => packet).increment(1);
    }

    /// Sets the sampled oldest-frame-age gauge.
    pub(crate) fn set_oldest_age(&self, age: Duration) {
        self.h.oldest_age.set(age.as_secs_f64());
    }

    /// `end` packets handed to NATS, by reason.
    pub fn ends(&self, reason: EndReason) -> u64 {
        get(&self.ends[reason as usize])
    }

    counts! {
        /// Pending bytes over all streams.
        pending_bytes => pending_bytes;
        /// Pending frames over all streams.
        pending_frames => pending_frames;
        /// Bytes of PCM admitted since start (the offered rate that sizes the confirmation
        /// window).
        admitted_bytes => admitted_bytes;
        /// `end` packets and gap markers published again after a reconnect (see
        /// `publisher`).
        control_packets_republished => control_republished;
        /// Overloads so far.
        overloads => overloads;
        /// End or gap packets that could not be handed to NATS in time.
        control_packets_lost => control_lost;
        /// Streams open now.
        active_streams => active_streams;
        /// Streams opened since start.
        streams_total => streams_total;
        /// Stream opens refused.
        admission_rejects => admission_rejects;
    }

    /// Merges a batch of queue waits into the cumulative histogram and empties it.
    pub fn record_waits(&self, waits: &mut WaitBatch) {
        self.queue_wait.record_us(&waits.0);
        waits.0.clear();
    }

    /// Queue-wait summary since start, in milliseconds.
    pub fn queue_wait(&self) -> QueueWaitMs {
        self.queue_wait.percentiles()
    }

    /// Publishes the per-frame counters and the pending gauges to the `metrics`
    /// recorder from this ingress's atomics (the admin server calls it before each
    /// `/metrics` render). Cheap: a few dozen relaxed loads.
    pub fn publish_metrics(&self) {
        let c = self.counters.snapshot();
        self.h.offered.absolute(c.offered);
        self.h.handed_over.absolute(c.handed_over);
        self.h.published.absolute(c.published);
        self.h.possibly_lost.absolute(c.possibly_lost);
        for (h, n) in self.h.dropped.iter().zip(c.dropped) {
            h.absolute(n);
        }
        self.h.gaps.absolute(c.gaps);
        self.h.gap_frames.absolute(c.gap_frames);
        self.h.pending_bytes.set(self.pending_bytes() as f64);
        self.h.pending_frames.set(self.pending_frames() as f64);
    }

    /// Appends the queue-wait histogram (`weir_ingress_queue_wait_seconds`) in the
    /// Prometheus text format. Waits reach it a batch at a time ([`WaitBatch`]), as they
    /// reach `/v1/stats`.
    pub fn render_histograms(&self, out: &mut String) {
        Series::render_header(
            m::QUEUE_WAIT_SECONDS,
            "Time from admission to the frame being handed to the NATS client.",
            out,
        );
        self.queue_wait.render_samples(&QUEUE_WAIT_SERIES, out);
    }
}

/// Queue waits (µs) not yet merged into the shared histogram. Kept by each publisher;
/// flushed when full, when the publisher goes idle and when it exits, so `/v1/stats`
/// lags by at most one batch per busy stream.
#[derive(Debug, Default)]
pub struct WaitBatch(Vec<u64>);

impl WaitBatch {
    /// Waits per batch.
    pub const CAPACITY: usize = 64;
}

/// Updates a stream's counters and the aggregate together (so the two can never
/// disagree) and emits the matching metrics.
#[derive(Clone, Copy)]
pub(crate) struct Account<'a> {
    pub stream: &'a Counters,
    pub global: &'a Global,
}

impl Account<'_> {
    /// Adds `n` to a counter of the stream and the same counter of the aggregate.
    fn both(&self, counter: impl Fn(&Counters) -> &AtomicU64, n: u64) {
        add(counter(self.stream), n);
        add(counter(&self.global.counters), n);
    }

    pub fn offered(&self) {
        self.both(|c| &c.offered, 1);
    }

    pub fn admitted(&self) {
        self.both(|c| &c.admitted, 1);
    }

    /// `n` frames offered and admitted at once (a resume's declared loss: they took
    /// seqs, then count as dropped).
    pub fn offered_and_admitted(&self, n: u64) {
        self.both(|c| &c.offered, n);
        self.both(|c| &c.admitted, n);
    }

    /// A frame handed to the NATS client after waiting `wait` since admission (the
    /// queue wait: enqueue → handed to NATS).
    ///
    /// The wait goes into `waits`, a batch the caller hands to [`Global::record_waits`],
    /// which feeds the one histogram behind `/v1/stats` and the Prometheus buckets: a
    /// few atomic adds per batch instead of per frame.
    pub fn handed_over(&self, wait: Duration, waits: &mut WaitBatch) {
        self.both(|c| &c.handed_over, 1);
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX).max(1);
        waits.0.push(us.min(QUEUE_WAIT_MAX_US));
        if waits.0.len() >= WaitBatch::CAPACITY {
            self.global.record_waits(waits);
        }
    }

    /// `frames` handed-over frames the server confirmed.
    pub fn published(&self, frames: u64) {
        self.both(|c| &c.published, frames);
    }

    /// `frames` handed-over frames that were unconfirmed when the connection dropped.
    pub fn possibly_lost(&self, frames: u64) {
        self.both(|c| &c.possibly_lost, frames);
    }

    /// `frames` frames (with `samples` samples) not published, for `reason`.
    pub fn dropped(&self, reason: DropReason, frames: u64, samples: u64) {
        if frames == 0 {
            return;
        }
        let i = reason as usize;
        self.both(|c| &c.dropped[i], frames);
        if !reason.is_refusal() {
            self.both(|c| &c.dropped_samples, samples);
        }
    }

    pub fn would_reject(&self, reason: WouldReject) {
        self.both(|c| &c.would_reject, 1);
        // The handles are in `WouldReject::ALL` order, the declaration order.
        self.global.h.would_reject[reason as usize].increment(1);
    }

    pub fn gap_published(&self, frames: u64) {
        self.both(|c| &c.gaps, 1);
        self.both(|c| &c.gap_frames, frames);
    }
}

/// Queue wait summary (the `queue_wait_ms` object of `/v1/stats`): the shared admin type.
pub use weir_protocol::admin::Percentiles as QueueWaitMs;

/// The `frames` object of `/v1/stats`: the shared admin type.
pub use weir_protocol::admin::FrameStats as FramesStats;

/// The top-level keys of the `/v1/stats` JSON that other components (the load test)
/// rely on; pinned in docs/contracts.md. [`StatsSnapshot`] serialises every one.
pub const STATS_CONTRACT_KEYS: &[&str] = &[
    "active_streams",
    "streams_total",
    "pending_bytes",
    "pending_frames",
    "pending_bytes_limit_per_stream",
    "oldest_frame_age_ms",
    "queue_wait_ms",
    "frames",
    "admission_rejects",
    "overloads",
    "gaps",
    "tasks_alive",
    "nats_connected",
    "window",
];

/// The `/v1/stats` snapshot (schema pinned in docs/contracts.md): the shared admin
/// type, which the load test reads. The ingress fills every optional field.
pub use weir_protocol::admin::IngressStats as StatsSnapshot;

/// The `frames` object from a counters snapshot: every reason is present (zero
/// included).
pub fn frames_from_counters(c: &CountersSnapshot) -> FramesStats {
    FramesStats {
        offered: c.offered,
        admitted: c.admitted,
        handed_over: Some(c.handed_over),
        published: c.published,
        unconfirmed: c
            .handed_over
            .saturating_sub(c.published)
            .saturating_sub(c.possibly_lost),
        possibly_lost: c.possibly_lost,
        dropped: DropReason::ALL
            .iter()
            .map(|r| (r.as_str().to_owned(), c.dropped(*r)))
            .collect(),
        would_reject: c.would_reject,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use weir_testkit::names::assert_serde_names;

    #[test]
    fn wire_names_are_the_serde_names() {
        assert_serde_names::<DropReason>();
        assert_serde_names::<WouldReject>();
        assert_serde_names::<crate::config::Policy>();
        assert_serde_names::<crate::config::Delivery>();
        let refusals: Vec<_> = crate::error::OpenErrorKind::ALL
            .iter()
            .map(|k| k.as_str())
            .collect();
        let want = [
            "invalid_id",
            "invalid_session",
            "already_active",
            "max_streams",
            "shutting_down",
            "no_runtime",
        ];
        assert_eq!(refusals, want);
    }

    #[test]
    fn account_updates_stream_and_global_together() {
        let g = Global::new();
        let s = Counters::default();
        let a = Account {
            stream: &s,
            global: &g,
        };
        a.offered();
        a.admitted();
        let mut waits = WaitBatch::default();
        a.handed_over(Duration::from_millis(3), &mut waits);
        a.published(1);
        assert_eq!(g.queue_wait().count, 0, "batched");
        g.record_waits(&mut waits);
        a.offered();
        a.dropped(DropReason::QueueFull, 1, 320);
        a.offered();
        a.admitted();
        a.dropped(DropReason::Evicted, 1, 320);
        let snap = s.snapshot();
        assert_eq!(snap, g.counters.snapshot());
        assert_eq!(snap.offered, snap.admitted + snap.rejected_total());
        assert_eq!(
            snap.admitted,
            snap.published + snap.dropped_admitted_total()
        );
        assert_eq!(snap.dropped_samples, 320, "refusals carry no samples");
        let qw = g.queue_wait();
        assert_eq!(qw.count, 1);
        assert!((qw.p50 - 3.0).abs() < 0.1, "{qw:?}");
    }

    /// Every `le` bound of the queue-wait histogram is a bucket edge of the latency
    /// histogram, so `/metrics` counts exactly the samples `<= le`.
    #[test]
    fn the_queue_wait_buckets_render_exactly() {
        assert!(QUEUE_WAIT_SERIES.is_exact());
    }

    #[test]
    fn stats_json_has_the_contract_shape() {
        let snap = StatsSnapshot {
            frames: frames_from_counters(&CountersSnapshot::default()),
            ..Default::default()
        };
        let v = serde_json::to_value(&snap).expect("json");
        for k in STATS_CONTRACT_KEYS {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        for k in ["count", "p50", "p95", "p99", "max"] {
            assert!(
                v["queue_wait_ms"].get(k).is_some(),
                "missing queue_wait_ms.{k}"
            );
        }
        for k in [
            "offered",
            "admitted",
            "handed_over",
            "published",
            "unconfirmed",
            "possibly_lost",
            "dropped",
            "would_reject",
        ] {
            assert!(v["frames"].get(k).is_some(), "missing frames.{k}");
        }
        assert_eq!(v["frames"]["dropped"]["evicted"], 0);
        assert_eq!(v.as_object().map(|o| o.len()), Some(14));
    }
}
