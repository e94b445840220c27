//! weir LLM adapter: a bounded NATS front for an inference backend.
//!
//! A NATS micro service (`$SRV.PING|INFO|STATS`) that admits requests into a bounded
//! queue served by a fixed number of workers, enforces per-session caps and ordering,
//! per-key concurrency limits, idempotency by request id, cancellation and deadlines,
//! and refuses explicitly (machine-readable codes and numbers) whatever it cannot take.
//! See `docs/llm-adapter.md` for the operator's reference.
//!
//! # Running it in-process (the load test does this)
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use weir_llm_adapter::{Config, backend::sim::SimBackend};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = async_nats::connect("nats://127.0.0.1:4222").await?;
//! // Validated config: TOML text (every key optional; see docs/llm-adapter.md).
//! let config = Config::from_toml_str(
//!     "workers = 4\nqueue_capacity = 32\n[service]\nsubject = \"llm.infer\"",
//! )?;
//! let sim = SimBackend::fixed(Duration::from_millis(20)); // or SimBackend::new(SimConfig)
//! let sim_handle = sim.handle();                          // Clone; pause()/resume()/stats()
//! let adapter = weir_llm_adapter::start(client, config, Arc::new(sim)).await?;
//!
//! sim_handle.pause();                                     // backend stalls ...
//! sim_handle.resume();                                    // ... and continues
//! let stats = adapter.stats();                            // serde-serialisable snapshot
//! println!("{}", serde_json::to_string(&stats)?);
//! let report = adapter.shutdown().await;                  // graceful, bounded
//! # let _ = report; Ok(()) }
//! ```
//!
//! [`AdapterView::stats`] (also on the [`AdapterHandle`]) returns a [`StatsSnapshot`]
//! (`/v1/stats`; its fields are documented on [`weir_protocol::admin::AdapterStats`]).
//! Every submission is answered exactly once, so
//! `offered = completed + Σ refused + in progress`.
//!
//! Callers use [`client::LlmClient`] (or any NATS client: the wire contract is headers
//! + body, see [`weir_protocol::llm`]).
//!
//! # Layout
//! - [`config`]: TOML + `WEIR_LLM_*` → validated [`Config`];
//! - [`admission`]: the pure core (queue, workers, limits, deadlines), paused-clock tested;
//! - [`service`]: the NATS micro edge; [`backend`]: sim, OpenAI-compatible HTTP, NATS;
//! - [`client`]: the Rust client; [`admin`]: HTTP `/metrics` `/healthz` `/readyz`
//!   `/v1/capabilities` `/v1/limits` `/v1/stats`; [`metrics`]: every metric name;
//!   [`trace`]: per-request trace events, the `llm_request` span and the W3C trace
//!   context passed on to the backend.

#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod backend;
pub mod config;
mod intake;
pub mod metrics;
pub mod nats_events;
pub mod service;
pub mod stream;
pub mod trace;

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

pub use admission::{LimitsView, Percentiles, ShutdownReport, StatsSnapshot};
pub use config::Config;
pub use nats_events::{AdapterEvents, NatsEventsSnapshot};

use crate::admission::Admission;
use crate::backend::Backend;
use crate::config::AdapterNats;
use crate::service::{NatsSink, ServiceEdge};
use crate::trace::Tracer;

/// Why the adapter could not start: the one error shape (`weir_service::Error`), the
/// cause (NATS, I/O) kept as `source()`.
pub type StartError = weir_service::Error<StartErrorKind>;

/// Machine-readable kind of a [`StartError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StartErrorKind {
    /// Connecting to NATS failed.
    Connect,
    /// Registering the NATS service or its endpoints failed.
    Service,
    /// The backend could not be built.
    Backend,
}

/// Connects to NATS with the configured authentication, TLS and timeouts. Connection
/// events are logged and reflected in the `weir_llm_nats_connected` gauge; the counts of
/// [`AdapterEvents`] go nowhere (use [`connect_with_events`] and [`start_pool`]).
pub async fn connect(cfg: &AdapterNats) -> Result<async_nats::Client, StartError> {
    connect_with_events(cfg, &AdapterEvents::new()).await
}

/// [`connect`], counting the client's events (slow-consumer drops, disconnects) into
/// `events`; pass the same `events` to [`start_pool`] so that `/v1/stats` and
/// the metrics show them.
pub async fn connect_with_events(
    cfg: &AdapterNats,
    events: &AdapterEvents,
) -> Result<async_nats::Client, StartError> {
    let connect_error = |e: weir_service::nats::ConnectError| e.map_kind(StartErrorKind::Connect);
    let opts = events.attach(
        weir_service::nats::options(&cfg.client)
            .await
            .map_err(connect_error)?,
    );
    // With the first connection retried, this waits up to one connection timeout, so
    // that with a server up the service's subscriptions are in place on return
    // (callers may send requests right away); with none, `/readyz` says 503 until it
    // connects.
    let client = weir_service::nats::connect(&cfg.client, opts)
        .await
        .map_err(connect_error)?;
    // Not connected yet when the first connection is retried in the background: the
    // gauge must say so (the not-ready alert reads it), not 1.
    let connected = client.connection_state() == async_nats::connection::State::Connected;
    ::metrics::gauge!(metrics::NATS_CONNECTED).set(f64::from(u8::from(connected)));
    Ok(client)
}

/// A read-only view of a running adapter, cheap to clone (the admin server holds one).
#[derive(Clone)]
pub struct AdapterView {
    admission: Admission<NatsSink>,
    client: async_nats::Client,
    config: Arc<Config>,
    events: AdapterEvents,
}

impl AdapterView {
    /// Counters and histograms (see the crate docs for the fields), with the NATS
    /// client's drops and disconnects.
    pub fn stats(&self) -> StatsSnapshot {
        let mut s = self.admission.stats();
        s.nats = self.events.snapshot_with(&self.client);
        s
    }

    /// Each backend of the pool (one, `default`, for a single `[backend]`): slots,
    /// estimate, health, ejections, spills, failovers.
    pub fn backends(&self) -> Vec<admission::BackendView> {
        self.admission.backends()
    }

    /// The busiest keys and sessions.
    pub fn limits(&self, top: usize) -> LimitsView {
        self.admission.limits_view(top)
    }

    /// Appends the latency histograms in the Prometheus text format (to `/metrics`).
    pub fn render_histograms(&self, out: &mut String) {
        self.admission.render_histograms(out);
    }

    /// Every limit (`null` when disabled), subjects and header names, and the live
    /// service-time estimate (`estimator.current`).
    pub fn capabilities(&self) -> serde_json::Value {
        service::capabilities(&self.config, &self.admission)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether the NATS connection is up.
    pub fn nats_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Ready to take requests: connected and not shutting down.
    pub fn is_ready(&self) -> bool {
        self.nats_connected() && !self.admission.is_shutting_down()
    }
}

/// A running adapter. Dropping it without [`AdapterHandle::shutdown`] leaves its tasks
/// running until the runtime ends.
pub struct AdapterHandle {
    view: AdapterView,
    edge: ServiceEdge,
    trace_task: Option<JoinHandle<()>>,
}

/// The read-only view's methods (`stats`, `limits`, `capabilities`, ...) on the handle.
impl std::ops::Deref for AdapterHandle {
    type Target = AdapterView;

    fn deref(&self) -> &AdapterView {
        &self.view
    }
}

impl AdapterHandle {
    /// A cloneable read-only view (for the admin server).
    pub fn view(&self) -> AdapterView {
        self.view.clone()
    }

    /// Graceful shutdown: new requests are answered `shutting_down`, queued ones are
    /// answered `shutting_down` at once, the service unsubscribes (replicas in the queue
    /// group take new requests), running requests finish within `shutdown_grace_ms` and
    /// are aborted after it; pending replies are flushed. With the durable intake the
    /// replica first stops pulling, and every request it cannot finish (queued, or
    /// aborted at the end of the grace) goes back to the stream unanswered (`-NAK`) for
    /// another replica.
    pub async fn shutdown(mut self) -> ShutdownReport {
        let admission = self.view.admission.clone();
        self.edge.stop_intake(Duration::from_secs(3)).await;
        admission.stop_admitting().await;
        self.edge.stop(Duration::from_secs(2)).await;
        let report = admission.shutdown().await;
        self.edge.stop_acks().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), self.view.client.flush()).await;
        if let Some(t) = self.trace_task.take() {
            t.abort();
        }
        report
    }
}

/// Starts the adapter on an existing connection: the admission core (workers, timers),
/// the NATS service and its endpoints, and the trace publisher if configured. The
/// client's own drops are not counted (`nats` in the stats stays 0) unless the client
/// was made with [`AdapterEvents::attach`]: then use [`start_pool`].
pub async fn start(
    client: async_nats::Client,
    config: Config,
    backend: Arc<dyn Backend>,
) -> Result<AdapterHandle, StartError> {
    start_pool(client, AdapterEvents::new(), config, vec![backend]).await
}

/// [`start`] over a backend pool, with the counters the client's event callback writes
/// to (`events`: [`connect_with_events`] or [`AdapterEvents::attach`]): `backends[i]`
/// serves member `i` of `config.backends` (the single `[backend]` when that is empty),
/// e.g. from [`backend::pool_from_config`].
pub async fn start_pool(
    client: async_nats::Client,
    events: AdapterEvents,
    config: Config,
    backends: Vec<Arc<dyn Backend>>,
) -> Result<AdapterHandle, StartError> {
    if backends.is_empty() {
        return Err(StartError::new(
            StartErrorKind::Backend,
            "no backend given for the pool",
        ));
    }
    let config = Arc::new(config);
    let (tracer, trace_task) = match &config.trace.subject {
        Some(subject) => {
            let (tracer, rx) = Tracer::with_channel(config.trace.log, config.trace.buffer.get());
            let task = tokio::spawn(trace::publish_events(
                client.clone(),
                subject.clone(),
                rx,
                config.nats.publish_timeout,
            ));
            (tracer, Some(task))
        }
        None => (Tracer::logging(config.trace.log), None),
    };
    let sink = Arc::new(NatsSink::new(client.clone(), config.nats.publish_timeout));
    let mut admission_cfg = config.admission.clone();
    admission_cfg.max_reply_bytes = sink.max_reply_bytes();
    let admission = Admission::start_pool(admission_cfg, backends, sink, tracer);
    let edge = match ServiceEdge::start(&client, config.clone(), admission.clone(), events.clone())
        .await
    {
        Ok(edge) => edge,
        Err(e) => {
            admission.shutdown().await;
            if let Some(t) = trace_task {
                t.abort();
            }
            return Err(StartError::new(StartErrorKind::Service, e.to_string()));
        }
    };
    Ok(AdapterHandle {
        view: AdapterView {
            admission,
            client,
            config,
            events,
        },
        edge,
        trace_task,
    })
}
