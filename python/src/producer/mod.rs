//! `weir._weir` producer classes (the Rust side of `weir.producer`): the producer core
//! (`weir_audio_producer::Ingress` on an async-nats client) behind `Producer` and
//! `ProducerStream`.
//!
//! Invariants:
//! - The core runs on the core runtime ([`crate::runtime::core`]): the NATS client,
//!   every stream's publisher task and the confirmation window are spawned there
//!   (opening a stream enters that runtime), and none of them takes the GIL. Python
//!   only calls in (`push`, `open`, `stats`) and awaits results.
//! - `push` is synchronous and never blocks: it is `StreamHandle::try_push` (one mutex,
//!   no await), in the core runtime's context. It returns the frame's seq or raises:
//!   nothing is dropped silently ([`stream`]).
//! - The configuration is the ingress's stream keys, validated once at `connect`
//!   ([`config`]); the NATS keys are every weir binary's `[nats]` keys
//!   ([`crate::nats`]).
//! - Nothing here re-implements the core's logic (queue, window, confirmation, gaps,
//!   overload): the events a stream reports are read from the core's `StreamStatus`
//!   watch ([`events`]).
//! - A cancelled Python `await` leaves nothing behind: `connect`, `end` and `close` run
//!   to completion on the core (a connection whose `Producer` is not taken is dropped
//!   there; an `end` or `close` still ends its streams, which release their ids when
//!   their `end` is out); `next_event` is cancel-safe (no event is lost).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyString;
use serde_json::{Value, json};
use weir_audio_producer::error::OpenError;
use weir_audio_producer::jetstream::NatsSink;
use weir_audio_producer::stream::Ingress;
use weir_service::nats::{ConnectErrorKind, NatsConfig};

use crate::errors::{Kind, WeirErr, type_name};
use crate::runtime::{await_core, core};

mod config;
mod events;
mod stream;

pub use stream::ProducerStream;

/// Bound on the last flush of the NATS client at `close`.
const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest `grace_s` of `close` (anything above is a typo).
const MAX_GRACE_S: f64 = 3600.0;

/// Adds the producer's classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Producer>()?;
    m.add_class::<ProducerStream>()?;
    m.add_function(wrap_pyfunction!(producer_config_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(producer_config_keys, m)?)?;
    Ok(())
}

/// `weir._weir.producer_config_defaults()`: every producer config key with its default,
/// as a JSON object.
#[pyfunction]
fn producer_config_defaults() -> String {
    serde_json::to_string(&config::Keys::default()).unwrap_or_else(|_| "{}".to_owned())
}

/// `weir._weir.producer_config_keys()`: the producer core's key table (`KEYS`) and
/// `max_streams`, as a JSON list of `{"name", "range", "help"}`.
#[pyfunction]
fn producer_config_keys() -> String {
    let mut v: Vec<Value> = weir_audio_producer::config::KEYS
        .iter()
        .map(|k| json!({"name": k.name, "range": k.range.to_string(), "help": k.help}))
        .collect();
    v.push(json!({
        "name": "max_streams",
        "range": format!("1..={}", config::MAX_MAX_STREAMS),
        "help": "concurrent streams (including those still delivering their `end`); above: RefusedError(max_streams)",
    }));
    Value::Array(v).to_string()
}

/// What a `Producer` shares with its streams' operations.
struct Inner {
    ingress: Ingress<NatsSink>,
    client: async_nats::Client,
    config: config::ProducerConfig,
    /// Set by `close` (synchronously, before its awaitable starts): no stream opens
    /// after it.
    closed: AtomicBool,
}

/// The producer core on one NATS connection (`weir.Producer` wraps it).
#[pyclass(module = "weir._weir", name = "Producer", frozen)]
pub struct Producer {
    inner: Arc<Inner>,
}

/// Connects and builds the core (on the core runtime).
async fn connect(nats: NatsConfig, config: config::ProducerConfig) -> Result<Producer, WeirErr> {
    let client = weir_audio_producer::nats::connect(&nats)
        .await
        .map_err(|e| match e.kind() {
            ConnectErrorKind::Options => {
                WeirErr::config("invalid_config", format!("nats options: {e}"))
            }
            ConnectErrorKind::Url => {
                WeirErr::config("invalid_config", format!("nats servers: {e}"))
                    .with("key", "servers")
            }
            ConnectErrorKind::Connect => {
                WeirErr::new(Kind::Connect, "connect_failed", e.to_string())
            }
        })?;
    let sink = NatsSink::for_config(client.clone(), &config.stream)
        .await
        .map_err(|e| {
            WeirErr::new(
                Kind::Connect,
                "jetstream_unavailable",
                format!("creating the JetStream stream: {e}"),
            )
        })?;
    let ingress = Ingress::with_max_streams(sink, config.stream.clone(), config.max_streams);
    Ok(Producer {
        inner: Arc::new(Inner {
            ingress,
            client,
            config,
            closed: AtomicBool::new(false),
        }),
    })
}

/// A `str` argument, or `ConfigError(code)` naming `what`.
fn str_arg(obj: &Bound<'_, PyAny>, code: &str, what: &str) -> Result<String, WeirErr> {
    obj.cast::<PyString>()
        .ok()
        .and_then(|s| s.to_str().ok().map(str::to_owned))
        .ok_or_else(|| {
            WeirErr::config(
                code,
                format!("{what} must be a str, not {}", type_name(obj)),
            )
        })
}

fn open_error(e: OpenError, id: &str) -> WeirErr {
    let message = e.to_string();
    match e {
        OpenError::InvalidId(_) => {
            WeirErr::config("invalid_stream_id", message).with("stream_id", id)
        }
        OpenError::InvalidSession(_) => WeirErr::config("invalid_session_id", message),
        OpenError::AlreadyActive(_) => {
            WeirErr::new(Kind::Refused, "already_active", message).with("stream_id", id)
        }
        OpenError::TooManyStreams { limit } => {
            WeirErr::new(Kind::Refused, "max_streams", message).with("limit", limit as u64)
        }
        OpenError::ShuttingDown => WeirErr::closed("the producer is closed"),
        OpenError::NoRuntime => WeirErr::internal(message),
    }
}

impl Inner {
    /// The stats as JSON: the core's `/v1/stats` snapshot, its streams, `closed`.
    fn stats_json(&self) -> String {
        let stats = self.ingress.stats();
        let mut v = serde_json::to_value(&stats).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            let streams = serde_json::to_value(self.ingress.streams()).unwrap_or(Value::Null);
            m.insert("streams".into(), streams);
            m.insert(
                "closed".into(),
                Value::Bool(self.closed.load(Ordering::Acquire)),
            );
        }
        v.to_string()
    }
}

#[pymethods]
impl Producer {
    /// `connect(nats_json, config_json)`: validates both (a `ConfigError` naming the
    /// key, before any connection), connects and returns an awaitable of the
    /// `Producer`.
    #[staticmethod]
    fn connect<'py>(
        py: Python<'py>,
        nats_json: &Bound<'py, PyAny>,
        config_json: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let nats_json = str_arg(nats_json, "invalid_config", "nats options (JSON)")?;
        let config_json = str_arg(config_json, "invalid_config", "producer options (JSON)")?;
        let nats = crate::nats::config_from_json(&nats_json)?;
        let config = config::from_json(&config_json)?;
        await_core(py, connect(nats, config))
    }

    /// Opens a stream (synchronous; spawns its publisher on the core runtime).
    #[pyo3(signature = (stream_id, session_id=None))]
    fn open(
        &self,
        stream_id: &Bound<'_, PyAny>,
        session_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<ProducerStream> {
        let id = str_arg(stream_id, "invalid_stream_id", "stream_id")?;
        let session = session_id
            .filter(|s| !s.is_none())
            .map(|s| str_arg(s, "invalid_session_id", "session_id"))
            .transpose()?;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(WeirErr::closed("the producer is closed").into());
        }
        let runtime = core()?;
        let _entered = runtime.enter();
        let handle = self
            .inner
            .ingress
            .open(&id, session)
            .map_err(|e| open_error(e, &id))?;
        Ok(ProducerStream::new(handle))
    }

    /// The stats as JSON (`weir.Producer.stats` parses it).
    fn stats_json(&self) -> PyResult<String> {
        let runtime = core()?;
        let _entered = runtime.enter();
        Ok(self.inner.stats_json())
    }

    /// The validated configuration (every key, defaults filled in) as JSON.
    fn config_json(&self) -> String {
        self.inner.config.keys.to_string()
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Whether the NATS client is connected now.
    #[getter]
    fn nats_connected(&self) -> bool {
        self.inner.client.connection_state() == async_nats::connection::State::Connected
    }

    /// `close(grace_s)`: no stream opens from now on; every open stream ends (reason
    /// `shutdown`: queues drain within half the grace, the `end`s go out within the
    /// rest), the client is flushed; an awaitable of the stats JSON. A second call
    /// waits for the first one's streams (as long) and returns the stats.
    fn close<'py>(
        &self,
        py: Python<'py>,
        grace_s: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // A bool is an int to Python; `close(True)` is a mistake, not one second.
        let not_bool = !grace_s.is_instance_of::<pyo3::types::PyBool>();
        let grace: f64 = not_bool
            .then(|| grace_s.extract().ok())
            .flatten()
            .ok_or_else(|| {
                WeirErr::config("invalid_config", "grace_s must be a number of seconds")
                    .with("key", "grace_s")
            })?;
        if !(0.0..=MAX_GRACE_S).contains(&grace) {
            return Err(WeirErr::config(
                "invalid_config",
                format!("grace_s = {grace}: 0..={MAX_GRACE_S} seconds"),
            )
            .with("key", "grace_s")
            .into());
        }
        let first = !self.inner.closed.swap(true, Ordering::AcqRel);
        let inner = Arc::clone(&self.inner);
        await_core(py, async move {
            let grace = Duration::from_secs_f64(grace);
            if first {
                inner.ingress.shutdown(grace).await;
                let _ = tokio::time::timeout(CLOSE_FLUSH_TIMEOUT, inner.client.flush()).await;
            } else {
                // A second close waits (as long) for the first one's streams.
                let bound = grace + inner.config.stream.publish_timeout() + CLOSE_FLUSH_TIMEOUT;
                let _ = tokio::time::timeout(bound, inner.ingress.wait_idle()).await;
            }
            Ok(inner.stats_json())
        })
    }
}
