//! The recognition-capacity scenarios: recognisers modelled as GPU wall time
//! ([`crate::gpu`]) with fewer slots than the offered calls.
//!
//! - `asr-shortfall` ([`shortfall`]): `--streams` calls against `--asr-workers` ×
//!   `--asr-slots` at `--asr-rtf`, one run per [`AsrDesign`], each on a fresh
//!   nats-server, the same audio (docs/loadtest.md, "asr-shortfall");
//! - `asr-churn` ([`churn`]): weir-on with the workers as processes; one SIGKILLed,
//!   then one added, timed from the door's `/metrics` and probe streams.
//!
//! Stream ids are chosen, not numbered: [`balanced_ids`] picks the first ids of the
//! form `<prefix><n>` whose partition belongs to each worker in turn, so that every
//! worker is offered the same number of calls (at least its slots at the defaults)
//! whatever FNV-1a does with consecutive numbers.
//!
//! Invariants: a refusal is the door's `503` or a `closed` event with reason
//! `no_capacity` — both counted, never inferred; the share of audio handed in time is
//! over the frames the producers sent on admitted streams, so dropped and late frames
//! both count against it.

pub mod churn;
pub mod shortfall;
mod table;

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::Serialize;
use weir_protocol::{StreamId, partition_of};

use crate::gpu::GpuModel;
use crate::stats::Percentiles;

pub use table::{column_label, rows as table_rows, summary_line};

/// Default offered calls.
pub const DEFAULT_STREAMS: usize = 20;
/// Default seconds of audio per call.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);

/// A design of `asr-shortfall`.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AsrDesign {
    /// Naive ingress; recognisers with an unbounded RAM buffer per stream.
    #[default]
    Naive,
    /// audio-ingress with `capacity.mode = off`; consumer-core workers.
    WeirOff,
    /// audio-ingress with capacity admission (its default); workers with
    /// `max_streams` = slots.
    WeirOn,
}

/// The settings shared by both scenarios.
#[derive(Debug, Clone)]
pub struct AsrSettings {
    /// Recognition workers.
    pub workers: u32,
    /// Each worker's GPU.
    pub model: GpuModel,
    /// Partitions of the audio subject.
    pub partitions: u32,
    /// Seconds of audio per call.
    pub duration: Duration,
}

/// The first `n` ids `<prefix><k>` (k = 0, 1, ...) such that the workers are offered
/// `n / workers` calls each (the first `n mod workers` workers one more); worker `w`
/// owns the partitions `p` with `p mod workers == w`. Ids are taken in `k` order,
/// each for the worker its partition names while that worker's quota is open.
pub fn balanced_ids(prefix: &str, n: usize, partitions: u32, workers: u32) -> Vec<String> {
    let workers = workers.clamp(1, partitions.max(1)) as usize;
    let parts = NonZeroU32::new(partitions).unwrap_or(NonZeroU32::MIN);
    let mut quota: Vec<usize> = (0..workers)
        .map(|w| n / workers + usize::from(w < n % workers))
        .collect();
    let mut ids = Vec::with_capacity(n);
    // Bounded: FNV-1a spreads consecutive ids; 1,000 tries per id is far beyond need.
    for k in 0..(n.max(1) * 1_000) {
        if ids.len() == n {
            break;
        }
        let id = format!("{prefix}{k}");
        let Ok(stream) = StreamId::parse(&id) else {
            continue;
        };
        let w = partition_of(&stream, parts) as usize % workers;
        if quota[w] > 0 {
            quota[w] -= 1;
            ids.push(id);
        }
    }
    ids
}

/// The ids among `<prefix><k>` whose partition belongs to worker `w` (the probes of
/// `asr-churn`), `n` of them.
pub fn ids_of_worker(prefix: &str, n: usize, partitions: u32, workers: u32, w: u32) -> Vec<String> {
    let parts = NonZeroU32::new(partitions).unwrap_or(NonZeroU32::MIN);
    (0..n.max(1) * 1_000)
        .map(|k| format!("{prefix}{k}"))
        .filter(|id| {
            StreamId::parse(id).is_ok_and(|s| partition_of(&s, parts) % workers.max(1) == w)
        })
        .take(n)
        .collect()
}

/// One design's figures in `asr-shortfall` (the report's `asr` object).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AsrReport {
    /// The design.
    pub design: AsrDesign,
    /// Workers × slots, the real-time factor, and what the fleet keeps up with.
    pub workers: u32,
    /// See `workers`.
    pub slots: u32,
    /// See `workers`.
    pub rtf: f64,
    /// `workers × slots / rtf`: streams the GPUs keep up with at real time.
    pub streams_at_real_time: f64,
    /// Partitions of the audio subject.
    pub partitions: u32,
    /// Calls offered (one connection attempt each; no reconnects).
    pub offered: u64,
    /// Calls admitted: connected and not ended later with `no_capacity`.
    pub admitted: u64,
    /// Calls refused: `refused_at_door + refused_later`.
    pub refused: u64,
    /// Connection attempts the door refused with `503` `no_capacity`.
    pub refused_at_door: u64,
    /// Calls the door admitted and ended later with `no_capacity` (a worker refused).
    pub refused_later: u64,
    /// Refused attempts by the refusal's `error.code` (every status).
    pub refusal_codes: BTreeMap<String, u64>,
    /// Refused attempts that carried a `Retry-After`.
    pub refusals_with_retry_after: u64,
    /// Connect → refusal received, client-side.
    pub refusal_ms: Percentiles,
    /// Frames the producers sent on admitted calls.
    pub frames_sent_admitted: u64,
    /// Frames the GPU model started.
    pub frames_handed: u64,
    /// Of those, frames started within `max_frame_age` of their capture.
    pub frames_within_max_age: u64,
    /// `frames_within_max_age / frames_sent_admitted`, percent (`null` when nothing
    /// was sent).
    pub within_max_age_pct: Option<f64>,
    /// Frames dropped because they were too old: the consumers' staleness guard and
    /// their queue's age bound (weir); 0 for the naive recogniser, which drops nothing.
    pub stale_drops: u64,
    /// `stale_drops / admitted`.
    pub stale_drops_per_admitted: f64,
    /// Frames the GPU started later than `max_frame_age` after capture.
    pub handed_late: u64,
    /// Frames the consumers refused (a stream over their `max_streams`).
    pub frames_refused_by_workers: u64,
    /// Age of a frame when the GPU model started it (capture → start).
    pub lag_ms: Percentiles,
    /// The age bound judged against, ms (the consumer core's default).
    pub max_frame_age_ms: u64,
    /// Naive: most frames its RAM buffers held at once (`null` for weir).
    pub naive_buffered_frames_max: Option<u64>,
    /// weir-on: slots the door saw in its fleet view before the calls started
    /// (`null` when not read).
    pub door_slots_seen: Option<f64>,
}

/// The `asr-churn` figures (the report's `churn` object).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChurnReport {
    /// Worker processes at the start, × slots each.
    pub workers: u32,
    /// See `workers`.
    pub slots: u32,
    /// Seconds after the calls started: the kill, the new worker started.
    pub killed_at_s: f64,
    /// See `killed_at_s`.
    pub added_at_s: f64,
    /// Slots in the door's fleet view before the kill, after it settled, at the end.
    pub slots_before: Option<f64>,
    /// See `slots_before`.
    pub slots_after_kill: Option<f64>,
    /// See `slots_before`.
    pub slots_end: Option<f64>,
    /// Kill → the victim's slots left the door's `/metrics` gauge (polled every
    /// 100 ms; the door sets its gauges once a second).
    pub slots_left_view_ms: Option<f64>,
    /// Kill → the first probe on the victim's partitions refused `no_capacity`: the
    /// admission decision's own view (probes every 100 ms).
    pub first_refused_ms: Option<f64>,
    /// Kill → the last probe on the victim's partitions admitted before the new worker.
    pub last_admitted_ms: Option<f64>,
    /// Probe calls on the victim's partitions after the kill: admitted / refused with
    /// `no_capacity` / refused otherwise, before and after its slots left the view.
    pub probes_admitted_before_left: u64,
    /// See `probes_admitted_before_left`.
    pub probes_admitted_after_left: u64,
    /// See `probes_admitted_before_left`.
    pub probes_refused_no_capacity: u64,
    /// See `probes_admitted_before_left`.
    pub probes_refused_other: u64,
    /// New worker started → the first probe admitted on its partitions.
    pub admissions_resumed_ms: Option<f64>,
    /// New worker started → its slots in the door's view.
    pub slots_back_ms: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    use weir_testkit::names::assert_serde_names;

    #[test]
    fn design_names_are_the_serde_names() {
        assert_serde_names::<AsrDesign>();
    }

    #[test]
    fn balanced_ids_give_every_worker_its_share() {
        let parts = NonZeroU32::new(8).unwrap_or(NonZeroU32::MIN);
        let ids = balanced_ids("s", 20, 8, 2);
        assert_eq!(ids.len(), 20);
        let mut per_worker = [0usize; 2];
        for id in &ids {
            let s = StreamId::parse(id).unwrap_or_else(|e| panic!("{e}"));
            per_worker[partition_of(&s, parts) as usize % 2] += 1;
        }
        assert_eq!(per_worker, [10, 10]);
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 20, "distinct");
        assert_eq!(balanced_ids("s", 5, 8, 2).len(), 5, "an odd count too");
        let probes = ids_of_worker("p", 4, 8, 2, 1);
        assert_eq!(probes.len(), 4);
        for id in &probes {
            let s = StreamId::parse(id).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(partition_of(&s, parts) % 2, 1);
        }
    }
}
