//! The LLM side of a run: a request generator ([`generator`]) against a front — weir's
//! LLM adapter (bounded design) or the naive task-per-message front
//! ([`crate::naive::llm`]) — over the same simulated backend
//! (`weir_llm_adapter::backend::sim`; latency uniform in 0.5–1.5 × the mean by default,
//! fixed, or log-normal with the mean's median and a p99 of 3 × that; the capacity is
//! `workers / mean latency` requests per second).
//!
//! The adapter runs with its **defaults**: only `workers` (the backend's parallelism),
//! the load test's subject and `trace.log = false` are set — no queue sizing.
//!
//! Offered load = `factor × capacity`. Sessions = max(streams, 10): each audio stream
//! is a conversation whose transcripts become requests.
//!
//! `started_after_deadline` is taken from the simulated backend, which counts calls
//! that start after their deadline independently of the front in front of it.

pub mod generator;
pub mod pool;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weir_llm_adapter::backend::Backend;
use weir_llm_adapter::backend::sim::SimBackend;
use weir_llm_adapter::config::{Latency, SimConfig};

use crate::error::{Error, ErrorKind, nats};
use crate::ingress::Design;
use crate::naive::llm::NaiveLlmFront;
use crate::report::LlmReport;
use generator::{GeneratorConfig, GeneratorCounters};
use pool::{RoundRobin, Sims, StallWatch};

/// Request subject of the LLM front.
pub const LLM_SUBJECT: &str = "weir.llm.generate";

/// Shape of the simulated inference time around `LlmSettings::latency`
/// (`--llm-latency-shape`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LatencyShape {
    /// Uniform in 0.5–1.5 × the latency (mean = the latency).
    #[default]
    Uniform,
    /// Always the latency.
    Fixed,
    /// Log-normal with the latency as median and 3 × it as p99.
    #[value(name = "lognormal")]
    LogNormal,
}

/// Settings of the LLM side.
#[derive(Debug, Clone)]
pub struct LlmSettings {
    /// Concurrency of each backend (simulated GPU slots).
    pub workers: usize,
    /// Simulated backends (`--llm-backends`): weir's adapter serves them as a pool
    /// (`[[backends]]`), the naive front in turn.
    pub backends: usize,
    /// Sessions the requests go round (`--llm-sessions`; 0 = none); `None` = the
    /// stream count, at least 10.
    pub sessions: Option<usize>,
    /// Simulated inference time (the mean, or the median for log-normal).
    pub latency: Duration,
    /// Distribution of the inference time.
    pub shape: LatencyShape,
    /// Deadline given to every request.
    pub deadline: Duration,
    /// Streamed replies (`--stream`): the backend streams tokens instead of sleeping
    /// `latency`.
    pub stream: Option<StreamLoad>,
}

/// How the simulated backend streams (`--stream`): the adapter's own `[backend.sim]`
/// streaming settings.
pub use weir_llm_adapter::config::SimStream as StreamLoad;

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            workers: 4,
            backends: 1,
            sessions: None,
            latency: Duration::from_millis(100),
            shape: LatencyShape::Uniform,
            deadline: Duration::from_secs(2),
            stream: None,
        }
    }
}

/// z of the 99th percentile of the standard normal.
const Z99: f64 = 2.326;

impl LlmSettings {
    /// Mean inference time.
    pub fn mean_latency(&self) -> Duration {
        match self.sim_latency() {
            Latency::Fixed(d) => d,
            Latency::Uniform { min, max } => (min + max) / 2,
            Latency::LogNormal { median, .. } => {
                let sigma = 3.0f64.ln() / Z99;
                median.mul_f64((sigma * sigma / 2.0).exp())
            }
        }
    }

    /// Requests per second the backends can complete together.
    pub fn capacity(&self) -> f64 {
        self.backend_capacity() * self.backends.max(1) as f64
    }

    /// Requests per second one backend can complete.
    pub fn backend_capacity(&self) -> f64 {
        self.workers as f64 / self.mean_latency().as_secs_f64().max(1e-6)
    }

    fn sim_latency(&self) -> Latency {
        // Streaming: the first token, then the rest at the rate; a unary call (the naive
        // front) takes as long as a whole stream.
        if let Some(s) = &self.stream {
            let rest = f64::from(s.tokens.saturating_sub(1)) / s.tokens_per_second.max(1e-6);
            return Latency::Fixed(s.first_token + Duration::from_secs_f64(rest));
        }
        match self.shape {
            LatencyShape::Uniform => {
                let half = self.latency / 2;
                Latency::Uniform {
                    min: half,
                    max: self.latency + half,
                }
            }
            LatencyShape::Fixed => Latency::Fixed(self.latency),
            LatencyShape::LogNormal => Latency::LogNormal {
                median: self.latency,
                p99: self.latency * 3,
            },
        }
    }
}

/// The adapter's configuration for a run: the backend's concurrency as workers (with
/// several backends: one `[[backends]]` member each, `sim-0`, `sim-1`, …, with that many
/// slots) and the load test's subject; everything else (queue 256, per-session cap 5
/// with ordering, predictive admission, adaptive start budget, 20 ms reply margin, the
/// pool's health keys) at its documented default — the defaults are what is measured.
fn adapter_config(settings: &LlmSettings) -> String {
    let mut toml = String::new();
    if settings.backends > 1 {
        for i in 0..settings.backends {
            toml.push_str(&format!(
                "[[backends]]\nname = \"sim-{i}\"\nkind = \"sim\"\nslots = {}\n",
                settings.workers
            ));
        }
    } else {
        toml.push_str(&format!("workers = {}\n", settings.workers));
    }
    toml.push_str(&format!(
        "[service]\nsubject = \"{LLM_SUBJECT}\"\n[trace]\nlog = false\n"
    ));
    toml
}

/// The report of a scenario that does not drive the LLM side.
pub fn not_run() -> LlmReport {
    not_run_because("not run in this scenario")
}

/// The report when the LLM side could not run, with the reason.
pub fn not_run_because(reason: &str) -> LlmReport {
    LlmReport {
        enabled: false,
        front: reason.to_owned(),
        ..Default::default()
    }
}

enum Front {
    Naive(NaiveLlmFront),
    Adapter(Box<weir_llm_adapter::AdapterHandle>),
}

/// A running LLM side.
pub struct LlmRun {
    /// `None` only after [`LlmRun::stop`] took it.
    front: Option<Front>,
    sims: Sims,
    /// Requests one backend completes per second (for the stall's report).
    backend_capacity: f64,
    stall: Mutex<StallWatch>,
    counters: Arc<GeneratorCounters>,
    stop: Arc<AtomicBool>,
    generator: tokio::task::JoinHandle<()>,
    factor: f64,
    in_flight_max: AtomicU64,
    /// Callers asked for streamed replies.
    streamed: bool,
}

async fn connect(url: &str) -> Result<async_nats::Client, Error> {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .connect(url)
        .await
        .map_err(|e| nats("cannot connect to NATS", e))
}

impl LlmRun {
    /// Starts the front for `design` and the generator at `factor × capacity`.
    pub async fn start(
        nats_url: &str,
        design: Design,
        streams: usize,
        factor: f64,
        settings: &LlmSettings,
    ) -> Result<Self, Error> {
        let mut sim_cfg = SimConfig {
            latency: settings.sim_latency(),
            error_rate: 0.0,
            seed: 7,
            ..SimConfig::default()
        };
        if let Some(s) = settings.stream {
            sim_cfg.stream = s;
        }
        let (mut backends, mut handles) = (Vec::new(), Vec::new());
        for i in 0..settings.backends.max(1) {
            let sim = SimBackend::new(SimConfig {
                seed: sim_cfg.seed + i as u64,
                ..sim_cfg
            });
            handles.push(sim.handle());
            backends.push(Arc::new(sim) as Arc<dyn Backend>);
        }
        let front_client = connect(nats_url).await?;
        let front = match design {
            Design::Naive => Front::Naive(
                NaiveLlmFront::start(
                    front_client.clone(),
                    LLM_SUBJECT.into(),
                    naive_backend(backends),
                    settings.workers * settings.backends.max(1),
                )
                .await
                .map_err(|e| nats("naive LLM front", e))?,
            ),
            Design::Bounded => {
                let config = weir_llm_adapter::Config::from_toml_str(&adapter_config(settings))
                    .map_err(|e| Error::with_source(ErrorKind::Usage, "LLM adapter config", e))?;
                Front::Adapter(Box::new(
                    weir_llm_adapter::start_pool(
                        front_client.clone(),
                        weir_llm_adapter::AdapterEvents::new(),
                        config,
                        backends,
                    )
                    .await
                    .map_err(|e| nats("LLM adapter", e))?,
                ))
            }
        };
        // Make sure the front's subscription is registered before requests flow.
        front_client
            .flush()
            .await
            .map_err(|e| nats("cannot flush the LLM front's connection", e))?;
        let client = connect(nats_url).await?;
        let counters = Arc::new(GeneratorCounters::default());
        let stop = Arc::new(AtomicBool::new(false));
        // The naive front cannot stream; its callers wait for the whole reply.
        let streamed = settings.stream.is_some() && design == Design::Bounded;
        let generator = tokio::spawn(generator::run(
            client,
            GeneratorConfig {
                subject: LLM_SUBJECT.into(),
                rate: factor * settings.capacity(),
                sessions: settings.sessions.unwrap_or(streams.max(10)),
                deadline: settings.deadline,
                stream: streamed,
                max_tokens: settings.stream.map_or(32, |s| s.tokens),
            },
            counters.clone(),
            stop.clone(),
        ));
        Ok(Self {
            front: Some(front),
            sims: Sims(handles),
            backend_capacity: settings.backend_capacity(),
            stall: Mutex::new(StallWatch::default()),
            counters,
            stop,
            generator,
            factor,
            in_flight_max: AtomicU64::new(0),
            streamed,
        })
    }

    /// Stops sending new requests (outstanding ones finish or time out).
    pub fn stop_offering(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether no request is waiting for its reply.
    pub fn idle(&self) -> bool {
        self.counters.outstanding.load(Ordering::Relaxed) == 0
    }

    /// Pauses (`true`) or resumes the simulated backends.
    pub fn pause_backend(&self, paused: bool) {
        self.sims.pause(None, paused);
    }

    /// Stalls (`true`) or resumes backend `member` alone (`backend-stall`): it accepts
    /// calls and answers none.
    pub fn stall_backend(&self, member: usize, stalled: bool) {
        let now = Instant::now();
        if let Ok(mut w) = self.stall.lock() {
            if stalled {
                w.start(member, now);
            } else {
                w.end(now, self.in_deadline());
            }
        }
        self.sims.pause(Some(member), stalled);
    }

    /// Looks whether the stalled backend has been ejected (the sampler's 100 ms reads).
    pub fn observe(&self) {
        let Some(Front::Adapter(a)) = &self.front else {
            return;
        };
        let Ok(mut w) = self.stall.lock() else {
            return;
        };
        if !w.waiting_for_ejection() {
            return;
        }
        let ejected = a
            .backends()
            .get(w.member)
            .is_some_and(|b| b.health != "healthy");
        if ejected {
            w.ejected(Instant::now(), self.in_deadline());
        }
    }

    fn in_deadline(&self) -> u64 {
        self.counters.completed_in_deadline.load(Ordering::Relaxed)
    }

    /// Requests held by the front now (queued + running); also tracks the maximum.
    pub fn in_flight(&self) -> u64 {
        let n = match &self.front {
            Some(Front::Naive(f)) => f.stats.in_flight.load(Ordering::Relaxed),
            Some(Front::Adapter(a)) => {
                let s = a.stats();
                s.queued_now + s.running_now
            }
            None => 0,
        };
        self.in_flight_max.fetch_max(n, Ordering::Relaxed);
        n
    }

    /// The report so far; `wall` is the run's length for goodput.
    pub fn report(&self, wall: Duration) -> LlmReport {
        let Some(front) = &self.front else {
            return not_run_because("stopped");
        };
        let c = self.counters.snapshot();
        let (backend_calls, started_after_deadline) = self.sims.started();
        let backends = self.sims.0.len();
        let stall = self
            .stall
            .lock()
            .ok()
            .and_then(|w| w.report(self.backend_capacity * backends.saturating_sub(1) as f64));
        let (front, queue_wait_ms, inference_ms, in_flight_max) = match front {
            Front::Naive(f) => {
                let s = &f.stats;
                (
                    "naive (task per message + semaphore)".to_owned(),
                    s.queue_wait.percentiles(),
                    s.inference.percentiles(),
                    s.in_flight_max.load(Ordering::Relaxed),
                )
            }
            Front::Adapter(a) => {
                let s = a.stats();
                (
                    "weir-llm-adapter (bounded queue, fixed workers, deadlines)".to_owned(),
                    s.queue_wait_ms,
                    s.inference_ms,
                    self.in_flight_max
                        .load(Ordering::Relaxed)
                        .max(s.queued_now + s.running_now),
                )
            }
        };
        LlmReport {
            streamed: self.streamed,
            ttft_ms: c.ttft,
            enabled: true,
            front,
            offered: c.offered,
            skipped: c.skipped,
            completed: c.completed,
            refused: c.refused.values().sum(),
            refused_by_code: c.refused,
            caller_timeouts: c.caller_timeouts,
            answered_after_deadline: c.answered_after_deadline,
            refused_after_waiting: c.refused_after_waiting,
            refusal_ms: c.refusal_ms,
            started_after_deadline,
            completed_in_deadline: c.completed_in_deadline,
            backend_calls,
            backends,
            stall,
            affinity: self.counters.affinity(),
            goodput_per_s: c.completed_in_deadline as f64 / wall.as_secs_f64().max(0.001),
            queue_wait_ms,
            inference_ms,
            in_flight_max,
            load_factor: self.factor,
        }
    }

    /// Stops the generator (bounded wait) and the front.
    pub async fn stop(mut self) {
        self.stop_offering();
        self.sims.pause(None, false);
        if tokio::time::timeout(Duration::from_secs(5), &mut self.generator)
            .await
            .is_err()
        {
            self.generator.abort();
        }
        match self.front.take() {
            Some(Front::Naive(f)) => drop(f),
            Some(Front::Adapter(a)) => {
                let _ = tokio::time::timeout(Duration::from_secs(5), a.shutdown()).await;
            }
            None => {}
        }
    }
}

impl Drop for LlmRun {
    /// An interrupted run (error, Ctrl-C): the generator stops at once; the front goes
    /// with its value.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.generator.abort();
        self.sims.pause(None, false);
    }
}

/// The naive front's backend: the one backend, or several in turn.
fn naive_backend(mut backends: Vec<Arc<dyn Backend>>) -> Arc<dyn Backend> {
    if backends.len() == 1 {
        return backends.remove(0);
    }
    Arc::new(RoundRobin::new(backends))
}
