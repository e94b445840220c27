//! `asr-shortfall`: one run per design, the same calls against the same GPU fleet.
//!
//! Order of events, each step bounded in time:
//! 1. a fresh nats-server on a free loopback port (unless `--nats-url`);
//! 2. the recognisers subscribe: weir's fleet on the consumer core ([`crate::fleet`],
//!    GPU handlers) or the naive recognisers ([`crate::naive::asr`]);
//! 3. the ingress process starts: `audio-ingress serve` (weir-off with
//!    `--set capacity.mode=off`) or `loadtest naive-ingress`; weir-on waits (at most
//!    [`VIEW_WAIT`]) until the door's `/metrics` shows the fleet's slots;
//! 4. the producers start (ids from [`super::balanced_ids`], no reconnects),
//!    a sample every 100 ms and a progress line every second;
//! 5. after the producers, a drain until the recognisers are idle (at most
//!    [`DRAIN_MAX`]: the naive buffers can hold seconds of audio);
//! 6. everything is stopped (also on drop) and the figures are made.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{AsrDesign, AsrReport, AsrSettings, balanced_ids, churn};
use crate::error::{Error, nats};
use crate::fleet::{DEFAULT_MAX_FRAME_AGE, Fleet, FleetAsr, FleetConfig, FleetSnapshot};
use crate::gpu::{AsrCounts, AsrMeter};
use crate::ingress::{Design, IngressProcess};
use crate::naive::asr::NaiveAsr;
use crate::producers::{self, ProducerConfig, ProducerCounters, ProducerSnapshot, Transport};
use crate::report::{ConsumerReport, ProducerReport, RunReport};
use crate::sample::Sample;
use crate::scenario::run::{
    Env, RunNats, RunOutput, SUBJECT_TEMPLATE, ScenarioIngress, spawn_ingress,
};
use crate::timeliness::DEFAULT_MAX_AGE;

/// Longest drain after the producers stopped.
pub const DRAIN_MAX: Duration = Duration::from_secs(30);
/// Longest wait for the door to see the fleet (weir-on).
pub const VIEW_WAIT: Duration = Duration::from_secs(5);

/// The recognisers of one design.
enum Recognisers {
    Weir(Fleet),
    Naive(NaiveAsr),
}

impl Recognisers {
    /// Frames received and not yet started by the GPU.
    fn backlog(&self) -> u64 {
        match self {
            Self::Weir(f) => f.snapshot().pending_frames,
            Self::Naive(n) => n.buffered_frames(),
        }
    }
}

/// The ingress of `design`.
pub(crate) fn ingress_of(design: AsrDesign) -> ScenarioIngress {
    let weir = |sets| ScenarioIngress::Weir {
        max_streams: 1000,
        config: String::new(),
        sets,
    };
    match design {
        AsrDesign::Naive => ScenarioIngress::Naive { floor: None },
        AsrDesign::WeirOff => weir(&["capacity.mode=off"]),
        AsrDesign::WeirOn => weir(&[]),
    }
}

async fn start_recognisers(
    design: AsrDesign,
    settings: &AsrSettings,
    nats_url: &str,
    meter: &Arc<AsrMeter>,
) -> Result<Recognisers, Error> {
    if design == AsrDesign::Naive {
        let n = NaiveAsr::start(
            nats_url,
            SUBJECT_TEMPLATE,
            settings.partitions,
            settings.workers,
            settings.model,
            meter.clone(),
        )
        .await?;
        return Ok(Recognisers::Naive(n));
    }
    let config = FleetConfig {
        partitions: settings.partitions,
        workers: settings.workers,
        cost_per_frame: Duration::ZERO,
        idle_timeout: Duration::from_secs(2),
        max_pending_bytes: weir_audio_consumer::DEFAULT_MAX_PENDING_BYTES,
        max_pending_age: weir_audio_consumer::DEFAULT_MAX_PENDING_AGE,
        late_after: crate::timeliness::late_after(DEFAULT_MAX_AGE),
        asr: Some(FleetAsr {
            model: settings.model,
            max_streams: (design == AsrDesign::WeirOn).then_some(settings.model.slots as usize),
            meter: meter.clone(),
        }),
    };
    Fleet::start(nats_url, &config)
        .await
        .map(Recognisers::Weir)
        .map_err(|e| nats("cannot start the recognition fleet", e))
}

/// One design (the three run one after the other, each on a fresh nats-server).
pub async fn run_design(
    env: &Env,
    settings: &AsrSettings,
    streams: usize,
    design: AsrDesign,
) -> Result<RunOutput, Error> {
    let label = format!("asr-shortfall {streams} {design}");
    crate::scenario::run::settle(env, &label).await;
    let nats = RunNats::start(env).await?;
    let meter = Arc::new(AsrMeter::new(DEFAULT_MAX_FRAME_AGE));
    let recognisers = start_recognisers(design, settings, &nats.url, &meter).await?;
    let (ingress, dir) =
        spawn_ingress(env, ingress_of(design), &nats.url, settings.partitions).await?;
    let mut notes = Vec::new();
    // With capacity admission on, the calls wait (at most VIEW_WAIT) for the door to
    // show the fleet's slots.
    let door_slots_seen = if design == AsrDesign::WeirOn {
        let fleet_slots = f64::from(settings.workers * settings.model.slots);
        churn::wait_for_fleet(&ingress, fleet_slots, VIEW_WAIT, &mut notes).await
    } else {
        None
    };

    let start = Instant::now();
    let counters = Arc::new(ProducerCounters::default());
    let spread = Duration::from_millis((streams as u64).clamp(20, 1000));
    let producer_set = producers::start(
        calls(
            &ingress,
            settings,
            ("s", streams),
            settings.duration,
            spread,
        ),
        streams as u64,
        counters.clone(),
    );
    // Sending, sampled every 100 ms (bounded by the producers' deadline).
    let deadline =
        start + settings.duration + spread + producers::END_GRACE + Duration::from_secs(5);
    let mut samples = Vec::new();
    let mut tick = crate::scenario::ticker(crate::sample::PERIOD);
    let (_, late) = crate::scenario::join_ticking(producer_set, deadline, &mut tick, || {
        samples.push(sample(start, &counters, &meter));
        if !env.quiet && samples.len() % 10 == 0 {
            let line = progress(
                &label,
                start,
                settings.duration,
                &counters,
                &meter,
                &recognisers,
            );
            crate::scenario::progress(&line);
        }
    })
    .await;
    if late {
        notes.push("some producers had not finished in time and were aborted".into());
    }
    // Drains until the recognisers' backlog is zero and nothing new was handed over
    // for 300 ms, at most DRAIN_MAX, sampling on.
    let deadline = Instant::now() + DRAIN_MAX;
    crate::scenario::until_stable(deadline, crate::sample::PERIOD, 3, async || {
        samples.push(sample(start, &counters, &meter));
        (meter.handed(), recognisers.backlog() == 0)
    })
    .await;
    if recognisers.backlog() > 0 {
        notes.push(format!(
            "the recognisers still held {} frames {} s after the calls ended",
            recognisers.backlog(),
            DRAIN_MAX.as_secs()
        ));
    }
    crate::scenario::clear_progress(env.quiet);
    let wall = start.elapsed();
    let (fleet, naive_max) = match recognisers {
        Recognisers::Weir(f) => (Some(f.stop().await), None),
        Recognisers::Naive(n) => (None, Some(n.snapshot().buffered_frames_max)),
    };
    ingress.stop().await;
    nats.stop().await;
    drop(dir);
    let p = counters.snapshot();
    let mut asr = figures(design, settings, &p, &meter.counts(), fleet.as_ref());
    asr.naive_buffered_frames_max = naive_max;
    asr.door_slots_seen = door_slots_seen;
    let report = RunReport {
        scenario: "asr-shortfall".into(),
        streams,
        design: match design {
            AsrDesign::Naive => Design::Naive,
            _ => Design::Bounded,
        },
        duration_s: settings.duration.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        consumer: ConsumerReport {
            fleet: fleet.unwrap_or_default(),
            ..Default::default()
        },
        producers: ProducerReport {
            nominal_frames: producers::nominal_frames(streams, settings.duration),
            counters: p,
        },
        llm: crate::llm::not_run(),
        asr: Some(asr),
        notes,
        ..RunReport::default()
    };
    Ok(RunOutput { report, samples })
}

/// The calls: `n` WebSocket streams for `duration`, started over `spread`, their ids
/// (`<prefix><k>`) balanced over the partitions and workers; no vanishing, no reconnect.
pub(super) fn calls(
    ingress: &IngressProcess,
    settings: &AsrSettings,
    (prefix, n): (&str, usize),
    duration: Duration,
    spread: Duration,
) -> ProducerConfig {
    let ids = balanced_ids(prefix, n, settings.partitions, settings.workers);
    ProducerConfig {
        ws_addr: ingress.ws_addr(),
        duration,
        vanish_share: 0.0,
        reconnect: false,
        reconnect_delay: Duration::from_millis(500),
        start_spread: spread,
        transport: Transport::Ws,
        ids: Arc::new(ids),
    }
}

/// A 100 ms sample: frames sent and started, and the lag of the frames started since
/// the previous one (`latency_window_ms`).
fn sample(start: Instant, counters: &ProducerCounters, meter: &AsrMeter) -> Sample {
    Sample {
        t_s: start.elapsed().as_secs_f64(),
        frames_sent: counters
            .frames_sent
            .load(std::sync::atomic::Ordering::Relaxed),
        frames_received: meter.handed(),
        latency_window_ms: meter.take_window(),
        ..Sample::default()
    }
}

fn progress(
    label: &str,
    start: Instant,
    total: Duration,
    counters: &ProducerCounters,
    meter: &AsrMeter,
    recognisers: &Recognisers,
) -> String {
    let p = counters.snapshot();
    let c = meter.counts();
    format!(
        "[{label}] {:>5.1}/{:.0} s  connected {}  refused {}  sent {}  handed {}  lag p99 {:.0} ms  \
         backlog {}",
        start.elapsed().as_secs_f64(),
        total.as_secs_f64(),
        p.connects,
        p.refused + p.ended_no_capacity,
        p.frames_sent,
        c.handed,
        c.lag_ms.p99,
        recognisers.backlog()
    )
}

/// The design's figures from the producers' and the recognisers' counts (pure).
pub fn figures(
    design: AsrDesign,
    settings: &AsrSettings,
    p: &ProducerSnapshot,
    c: &AsrCounts,
    fleet: Option<&FleetSnapshot>,
) -> AsrReport {
    let refused_at_door = p.refusal_codes.get("no_capacity").copied().unwrap_or(0);
    let offered = p.connects + p.refused + p.connect_errors;
    let admitted = p.connects.saturating_sub(p.ended_no_capacity);
    let sent = p
        .frames_sent
        .saturating_sub(p.frames_sent_ended_no_capacity);
    let stale_drops = fleet.map_or(0, |f| f.stale_frames + f.dropped_by_consumer);
    AsrReport {
        design,
        workers: settings.workers,
        slots: settings.model.slots,
        rtf: settings.model.rtf,
        streams_at_real_time: f64::from(settings.workers) * settings.model.streams_at_real_time(),
        partitions: settings.partitions,
        offered,
        admitted,
        refused: refused_at_door + p.ended_no_capacity,
        refused_at_door,
        refused_later: p.ended_no_capacity,
        refusal_codes: p.refusal_codes.clone(),
        refusals_with_retry_after: p.refusals_with_retry_after,
        refusal_ms: p.refusal_ms,
        frames_sent_admitted: sent,
        frames_handed: c.handed,
        frames_within_max_age: c.within_max_age,
        within_max_age_pct: (sent > 0).then(|| 100.0 * c.within_max_age as f64 / sent as f64),
        stale_drops,
        stale_drops_per_admitted: if admitted == 0 {
            0.0
        } else {
            stale_drops as f64 / admitted as f64
        },
        handed_late: c.handed.saturating_sub(c.within_max_age + c.untimed),
        frames_refused_by_workers: fleet.map_or(0, |f| f.frames_refused),
        lag_ms: c.lag_ms,
        max_frame_age_ms: DEFAULT_MAX_FRAME_AGE.as_millis() as u64,
        naive_buffered_frames_max: None,
        door_slots_seen: None,
    }
}
