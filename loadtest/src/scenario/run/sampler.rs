//! The sampler of a run: a [`Sample`] every 100 ms (the ingress's stats and memory,
//! the producers' and the fleet's counts, the LLM side, whether the fault is active),
//! and a progress line on stderr once per second. Bounded: it stops when told to, or
//! after a hard cap of samples.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::fleet::Fleet;
use crate::ingress::IngressProcess;
use crate::llm::LlmRun;
use crate::producers::ProducerCounters;
use crate::sample::{self, IngressSample, Sample};

/// What the sampler reads, and where it keeps the samples.
pub(super) struct SamplerInputs {
    pub(super) ingress: Arc<IngressProcess>,
    pub(super) fleet: Arc<Fleet>,
    pub(super) counters: Arc<ProducerCounters>,
    pub(super) llm: Option<Arc<LlmRun>>,
    pub(super) fault_active: Arc<AtomicBool>,
    pub(super) samples: Arc<Mutex<Vec<Sample>>>,
    pub(super) start: Instant,
    pub(super) label: String,
    pub(super) total: Duration,
    pub(super) quiet: bool,
}

/// Captures a sample every 100 ms until told to stop (or a hard cap of samples), and
/// prints a progress line on stderr once per second.
pub(super) async fn sampler(s: SamplerInputs, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut tick = crate::scenario::ticker(sample::PERIOD);
    // Hard cap: the run's duration plus 2 minutes of drain and grace.
    let cap =
        ((s.total + Duration::from_secs(120)).as_millis() / sample::PERIOD.as_millis()) as usize;
    let mut oldest: (Option<f64>, Option<f64>) = (None, None);
    for n in 0..cap {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let stats = s.ingress.stats().await.ok();
        let mut ingress = stats.as_ref().map(IngressSample::from);
        // weir's ingress lists its stream instances: what it holds for live ones apart
        // from what the NATS client holds for ended ones. Read once per
        // `STREAMS_EVERY` samples (the list of every stream is not free for the ingress
        // to render, and its CPU is what the run measures), carried between reads.
        if let Some(i) = ingress.as_mut().filter(|i| i.unconfirmed_bytes.is_some()) {
            if n % sample::STREAMS_EVERY == 0
                && let Ok(streams) = s.ingress.streams().await
            {
                let (live, ended) = sample::oldest_by_liveness(&streams);
                oldest = (Some(live), Some(ended));
            }
            (i.oldest_live_ms, i.oldest_ended_ms) = oldest;
        }
        let fault = s.fault_active.load(Ordering::Relaxed);
        let x = Sample {
            t_s: s.start.elapsed().as_secs_f64(),
            ingress,
            rss_bytes: s.ingress.rss_bytes(),
            frames_sent: s.counters.frames_sent.load(Ordering::Relaxed),
            frames_received: s.fleet.frames_received(),
            latency_window_ms: s.fleet.take_window_latency(),
            llm_in_flight: s.llm.as_ref().map(|l| {
                l.observe();
                l.in_flight()
            }),
            fault_active: fault,
        };
        if !s.quiet && n % 10 == 9 {
            let line = progress_line(&s.label, s.total, &x);
            crate::scenario::progress(&line);
        }
        if let Ok(mut v) = s.samples.lock() {
            v.push(x);
        }
    }
    crate::scenario::clear_progress(s.quiet);
}

fn progress_line(label: &str, total: Duration, x: &Sample) -> String {
    let (pending, tasks, oldest) = x
        .ingress
        .as_ref()
        .map(|i| {
            (
                format!("{:.0} KiB", i.pending_bytes as f64 / 1024.0),
                i.tasks_alive.to_string(),
                format!("{:.0} ms", i.oldest_frame_age_ms),
            )
        })
        .unwrap_or_else(|| ("?".into(), "?".into(), "?".into()));
    format!(
        "[{label}] {:>5.1}/{:.0} s  sent {}  received {}  pending {pending}  oldest {oldest}  tasks {tasks}  rss {:.1} MiB{}",
        x.t_s,
        total.as_secs_f64(),
        x.frames_sent,
        x.frames_received,
        x.rss_bytes.unwrap_or(0) as f64 / (1024.0 * 1024.0),
        if x.fault_active { "  FAULT" } else { "" }
    )
}
