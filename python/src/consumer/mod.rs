//! `weir._weir` consumer classes (the Rust side of `weir.consumer`).
//!
//! - [`PyConsumer`] (`_Consumer`): one `weir_audio_consumer::Consumer` running on the
//!   core runtime, with a [`hub::Hub`] as its handler factory. Python takes events in
//!   batches (`poll_batch`, `next_batch`) and acks them (`ack_many`); see
//!   python/weir/consumer.py for the pump that dispatches them to per-stream iterators.
//! - [`StreamLink`] (`_StreamLink`): a new stream instance's identity and the Python
//!   side's handle on its handler's wait; dropping it releases the wait.
//! - [`events`]: `Frame`, `Gap`, `End`, `LossDeclared`.
//!
//! Invariants:
//! - `nats.retry_initial_connect = true` is refused (`ConfigError`; when it is absent
//!   the first connection must succeed): `connect` returns only
//!   once the server confirmed the subscriptions (or the lease bucket), which a client
//!   still retrying in the background cannot give;
//! - configuration is the core's own [`ConsumerConfig`] (serde names, unknown keys
//!   refused) validated by the core; NATS options are the `[nats]` keys of every weir
//!   binary ([`crate::nats`]); both are checked before anything connects, and every
//!   refusal is a `ConfigError` naming the key;
//! - a consumer whose Python object is dropped without `close()` (including a connect
//!   whose `await` was cancelled: its result is never taken) is shut down on the core
//!   runtime: its subscriptions and leases do not outlive it. The Python pump holds
//!   this object, so `weir.Consumer` calls `discard()` from its finalizer (the pump
//!   then ends and this object is dropped);
//! - after `close()` / `abort()` / `discard()` every handler's wait is released and the
//!   batch calls return `None` once the hub is drained: the Python pump ends;
//! - one shutdown per consumer: the first `close()` starts it as a task of its own on
//!   the core (a cancelled or timed-out `await` does not stop it); every `close()`,
//!   concurrent or later, awaits that same shutdown and gets the same final stats;
//!   `close()` after `abort()` returns the stats snapshot taken at the abort;
//! - `stats_json` never fails: the live stats, the snapshot taken when the shutdown
//!   started (while it runs), the final stats, or the snapshot taken at the abort.

mod events;
mod hub;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::PyList;
use tokio::sync::{mpsc, watch};
use weir_audio_consumer::{Consumer, ConsumerConfig, ConsumerError, ConsumerErrorKind};

use crate::errors::{Kind, WeirErr, keys_from_json};
use crate::runtime;
use hub::{Hub, HubMsg, Link};

/// Largest batch handed to Python at once (messages).
const MAX_BATCH: usize = 4_096;
/// Longest accepted `close()` grace period.
const MAX_GRACE_S: f64 = 3_600.0;

/// Adds the consumer's classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConsumer>()?;
    m.add_class::<StreamLink>()?;
    events::register(m)?;
    Ok(())
}

/// A core error as a Python one.
fn consumer_err(e: ConsumerError) -> WeirErr {
    let code = match e.kind() {
        ConsumerErrorKind::Config => {
            let err = WeirErr::config("invalid_config", e.to_string());
            return match e.config_key() {
                Some(k) => err.with("key", k),
                None => err,
            };
        }
        ConsumerErrorKind::Connect => "connect_failed",
        ConsumerErrorKind::Subscribe => "subscribe_failed",
        ConsumerErrorKind::Lease => "lease_bucket_failed",
    };
    WeirErr::new(Kind::Connect, code, error_chain(&e))
}

/// `e` and its sources, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    for cause in std::iter::successors(e.source(), |c| c.source()) {
        let s = cause.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
    }
    text
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, WeirErr> {
    serde_json::to_string(value).map_err(|e| WeirErr::internal(format!("cannot serialise: {e}")))
}

/// Moves the messages waiting in `rx` into `msgs`, up to `limit` in all.
fn take_ready(rx: &mut mpsc::Receiver<HubMsg>, msgs: &mut Vec<HubMsg>, limit: usize) {
    while msgs.len() < limit
        && let Ok(m) = rx.try_recv()
    {
        msgs.push(m);
    }
}

/// The running core consumer and what is left of it once closed.
struct State {
    /// `None` once closed, aborted or discarded.
    consumer: Option<Consumer>,
    /// The stats (JSON) once `consumer` is gone: the snapshot taken when the shutdown
    /// started, then its final stats; or the snapshot taken at `abort()`.
    stats: Option<String>,
    /// The shutdown started by the first `close()`: its final stats once it finished.
    shutdown: Option<watch::Receiver<Option<String>>>,
}

/// What the Python object and its awaitables share.
struct Inner {
    state: Mutex<State>,
    hub: Arc<Hub>,
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<HubMsg>>>,
    /// To the acker task on the core (see [`acker`]).
    acks: mpsc::UnboundedSender<Vec<Arc<Link>>>,
}

/// The acker task: applies the acks Python sends in batches (one wake of this task per
/// batch; it wakes the handlers from inside the core runtime, which is cheaper than
/// waking each from the Python thread). Unbounded in type only: each live stream has at
/// most one event awaiting its ack, so at most `live streams` acks are ever pending.
/// Ends when the consumer's Python object is gone.
async fn acker(mut rx: mpsc::UnboundedReceiver<Vec<Arc<Link>>>) {
    while let Some(batch) = rx.recv().await {
        for link in batch {
            link.ack();
        }
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        weir_service::sync::locked(&self.state)
    }

    /// Runs `f` on the running consumer, or says it is closed.
    fn with<T>(&self, f: impl FnOnce(&Consumer) -> T) -> Result<T, WeirErr> {
        match &self.state().consumer {
            Some(c) => Ok(f(c)),
            None => Err(WeirErr::closed("the consumer is closed")),
        }
    }

    /// Shuts the consumer down on the core runtime without waiting and without grace
    /// (leases released, subscriptions dropped), and closes the hub: for a consumer
    /// nobody will close (a cancelled connect, a collected `weir.Consumer`).
    fn discard(&self) {
        self.hub.begin_close();
        let consumer = self.state().consumer.take();
        if let Some(consumer) = consumer
            && let Ok(core) = runtime::core()
        {
            core.spawn(async move {
                let _ = consumer.shutdown(Duration::ZERO).await;
            });
        }
        self.hub.close();
    }
}

impl Drop for Inner {
    /// Dropped without `close()`/`abort()`: see [`Inner::discard`].
    fn drop(&mut self) {
        self.discard();
    }
}

/// `weir._weir._Consumer`: see the module docs; used through `weir.Consumer`.
#[pyclass(frozen, module = "weir._weir", name = "_Consumer")]
pub struct PyConsumer {
    inner: Arc<Inner>,
}

/// A batch of hub messages on its way to Python: a flat list of pairs, `instance,
/// event` for an event, `-1, _StreamLink` for a new stream and `instance, None` for a
/// handler that ended without an `End` (flat: no tuple per event; the pump reads it
/// with `zip(it, it)`).
struct Batch(Vec<HubMsg>);

impl<'py> IntoPyObject<'py> for Batch {
    type Target = PyList;
    type Output = Bound<'py, PyList>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut items: Vec<Py<PyAny>> = Vec::with_capacity(self.0.len() * 2);
        for msg in self.0 {
            match msg {
                HubMsg::Open(info, link) => {
                    let link = StreamLink {
                        stream: info.stream,
                        partition: info.partition,
                        instance: info.instance,
                        subject: info.subject,
                        session_id: info.session_id,
                        link,
                    };
                    items.push((-1i64).into_py_any(py)?);
                    items.push(link.into_py_any(py)?);
                }
                HubMsg::Event(instance, event) => {
                    items.push(instance.into_py_any(py)?);
                    items.push(events::to_python(py, event)?);
                }
                HubMsg::Gone(instance) => {
                    items.push(instance.into_py_any(py)?);
                    items.push(py.None());
                }
            }
        }
        PyList::new(py, items)
    }
}

#[pymethods]
impl PyConsumer {
    /// Validates `nats_json` (the `[nats]` keys) and `config_json` (the consumer
    /// core's keys), then connects and subscribes on the core runtime; an awaitable of
    /// the `_Consumer`. A cancelled await shuts the consumer down once it is up.
    #[staticmethod]
    fn connect<'py>(
        py: Python<'py>,
        nats_json: &str,
        config_json: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let nats = crate::nats::config_from_json(nats_json)?;
        // Asked for explicitly (the `[nats]` default is the binaries' own, not ours).
        let retry = serde_json::from_str::<serde_json::Value>(nats_json)
            .ok()
            .and_then(|v| {
                v.get("retry_initial_connect")
                    .and_then(serde_json::Value::as_bool)
            })
            .unwrap_or(false);
        if retry {
            // The consumer returns once its subscriptions (or lease bucket) are
            // confirmed: a client still trying in the background would start it deaf.
            return Err(WeirErr::config(
                "invalid_config",
                "nats.retry_initial_connect is not supported by the consumer: connect() \
                 returns once subscribed; retry a ConnectError instead",
            )
            .with("key", "nats.retry_initial_connect")
            .into());
        }
        let config: ConsumerConfig = keys_from_json(config_json, "consumer options")?;
        let max_streams = config.max_streams;
        let patience = Duration::from_millis(config.max_pending_age_ms);
        let settings = config.validate().map_err(consumer_err)?;
        runtime::await_core(py, async move {
            let options = weir_service::nats::options(&nats).await.map_err(|e| {
                WeirErr::config(
                    "invalid_config",
                    format!("nats options: {}", error_chain(&e)),
                )
            })?;
            let url = nats.urls.join(",");
            let (hub, rx) = Hub::new(max_streams, patience);
            let (acks, acks_rx) = mpsc::unbounded_channel();
            tokio::spawn(acker(acks_rx));
            let consumer = Consumer::connect_with(options, &url, settings, hub.factory())
                .await
                .map_err(consumer_err)?;
            Ok(PyConsumer {
                inner: Arc::new(Inner {
                    state: Mutex::new(State {
                        consumer: Some(consumer),
                        stats: None,
                        shutdown: None,
                    }),
                    hub,
                    rx: Arc::new(tokio::sync::Mutex::new(rx)),
                    acks,
                }),
            })
        })
    }

    /// The messages waiting now (at most `limit`), without waiting: a list (maybe
    /// empty), or `None` once the consumer is closed and everything was taken.
    #[pyo3(signature = (limit = MAX_BATCH))]
    fn poll_batch<'py>(
        &self,
        py: Python<'py>,
        limit: usize,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        let limit = limit.clamp(1, MAX_BATCH);
        let Ok(mut rx) = self.inner.rx.try_lock() else {
            // A `next_batch` is pending: nothing to take here.
            return Ok(Some(PyList::empty(py)));
        };
        let mut msgs = Vec::new();
        take_ready(&mut rx, &mut msgs, limit);
        drop(rx);
        if msgs.is_empty() && self.inner.hub.is_closed() {
            return Ok(None);
        }
        Batch(msgs).into_pyobject(py).map(Some)
    }

    /// Awaits the next messages (at least one, at most `limit`): an awaitable of a
    /// list, or of `None` once the consumer is closed and everything was taken.
    /// Cancel-safe: a cancelled await takes nothing.
    #[pyo3(signature = (limit = MAX_BATCH))]
    fn next_batch<'py>(&self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyAny>> {
        let limit = limit.clamp(1, MAX_BATCH);
        let rx = self.inner.rx.clone();
        let mut closed = self.inner.hub.closed();
        runtime::await_bridge(py, async move {
            let mut rx = rx.lock().await;
            let mut msgs = Vec::new();
            tokio::select! {
                biased;
                n = rx.recv_many(&mut msgs, limit) => {
                    if n == 0 {
                        return Ok(None);
                    }
                }
                _ = closed.wait_for(|c| *c) => {
                    take_ready(&mut rx, &mut msgs, limit);
                    if msgs.is_empty() {
                        return Ok(None);
                    }
                }
            }
            Ok(Some(Batch(msgs)))
        })
    }

    /// Acks each link's last event (the Python iterators asked for their next one);
    /// applied on the core by the acker task.
    fn ack_many(&self, links: &Bound<'_, PyList>) -> PyResult<()> {
        let mut arcs: Vec<Arc<Link>> = Vec::with_capacity(links.len());
        for item in links.iter() {
            let link = item.cast::<StreamLink>().map_err(|_| {
                WeirErr::config("invalid_argument", "ack_many: a list of _StreamLink")
            })?;
            arcs.push(link.get().link.clone());
        }
        if !arcs.is_empty() {
            // Fails only once the acker is gone (the consumer is being dropped).
            let _ = self.inner.acks.send(arcs);
        }
        Ok(())
    }

    /// The stats snapshot as JSON (the core's `ConsumerStats`); while `close()` runs,
    /// the snapshot taken when it started; after it, the final stats; after
    /// `abort()`, the snapshot taken then.
    fn stats_json(&self, py: Python<'_>) -> PyResult<String> {
        Ok(py.detach(|| {
            let state = self.inner.state();
            match (&state.consumer, &state.stats) {
                (Some(c), _) => json(&c.stats()),
                (None, Some(s)) => Ok(s.clone()),
                (None, None) => Err(WeirErr::closed("the consumer was discarded")),
            }
        })?)
    }

    /// What the next capacity announcement would say, as JSON.
    fn capacity_json(&self, py: Python<'_>) -> PyResult<String> {
        Ok(py.detach(|| self.inner.with(|c| json(&c.capacity())))??)
    }

    /// The partitions delivered now.
    fn owned(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        Ok(py.detach(|| self.inner.with(Consumer::owned_now))?)
    }

    /// Every partition's lease as this worker sees it, as JSON (empty with static
    /// ownership).
    fn leases_json(&self, py: Python<'_>) -> PyResult<String> {
        Ok(py.detach(|| self.inner.with(|c| json(&c.leases())))??)
    }

    /// Whether `close()` or `abort()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.state().consumer.is_none()
    }

    /// Graceful shutdown on the core (last announcement, unsubscribe, every stream
    /// ends with `shutdown`, handlers get `grace_s` to finish, leases released); an
    /// awaitable of the final stats JSON. The first call starts the shutdown as a
    /// task of its own (cancelling the await does not stop it); every call awaits that
    /// same shutdown and returns the same stats (`grace_s` of later calls is ignored).
    /// After `abort()`: the snapshot taken at the abort. Cancel-safe.
    fn close<'py>(&self, py: Python<'py>, grace_s: f64) -> PyResult<Bound<'py, PyAny>> {
        if !grace_s.is_finite() || !(0.0..=MAX_GRACE_S).contains(&grace_s) {
            return Err(WeirErr::config(
                "invalid_config",
                format!("grace_s: {grace_s}; allowed 0..={MAX_GRACE_S} seconds"),
            )
            .with("key", "grace_s")
            .into());
        }
        let mut done = {
            let mut state = self.inner.state();
            let running = state.shutdown.clone();
            match (running, state.consumer.take()) {
                (Some(rx), _) => rx,
                (None, Some(consumer)) => {
                    state.stats = Some(json(&consumer.stats())?);
                    let (tx, rx) = watch::channel(None);
                    state.shutdown = Some(rx.clone());
                    self.inner.hub.begin_close();
                    let inner = self.inner.clone();
                    let grace = Duration::from_secs_f64(grace_s);
                    runtime::core()?.spawn(async move {
                        let stats = consumer.shutdown(grace).await;
                        inner.hub.close();
                        let text = json(&stats).unwrap_or_else(|_| "{}".to_owned());
                        inner.state().stats = Some(text.clone());
                        tx.send_replace(Some(text));
                    });
                    rx
                }
                (None, None) => {
                    let closed = || WeirErr::closed("the consumer was discarded");
                    let text = state.stats.clone().ok_or_else(closed)?;
                    return runtime::await_bridge(py, async move { Ok(text) });
                }
            }
        };
        runtime::await_bridge(py, async move {
            match done.wait_for(Option::is_some).await {
                Ok(text) => Ok(text.clone().unwrap_or_default()),
                Err(_) => Err(WeirErr::internal(
                    "the consumer's shutdown task ended early",
                )),
            }
        })
    }

    /// A crash: no drain, no end to the streams, no lease released, no last
    /// announcement (for failover drills). Idempotent; the stats snapshot taken here
    /// is what `stats_json` and `close()` return from then on.
    fn abort(&self) {
        self.inner.hub.begin_close();
        let mut state = self.inner.state();
        let taken = state.consumer.take();
        if let Some(c) = &taken {
            state.stats = json(&c.stats()).ok();
        }
        drop(state);
        if let Some(consumer) = taken {
            // Aborting tasks needs no runtime context; it is immediate.
            consumer.abort();
        }
        self.inner.hub.close();
    }

    /// Shuts down without grace and without waiting (leases released, subscriptions
    /// dropped): what `weir.Consumer` does when it is collected without `close()`.
    /// Idempotent; a no-op once closing or aborted.
    fn discard(&self) {
        self.inner.discard();
    }
}

/// `weir._weir._StreamLink`: a new stream instance (its identity: the core's
/// `StreamInfo`) and the handle on its handler's wait. Dropping it (its `weir.Stream`
/// was collected) releases the wait.
#[pyclass(frozen, module = "weir._weir", name = "_StreamLink")]
pub struct StreamLink {
    #[pyo3(get)]
    stream: String,
    #[pyo3(get)]
    partition: u32,
    #[pyo3(get)]
    instance: u64,
    #[pyo3(get)]
    subject: String,
    #[pyo3(get)]
    session_id: Option<String>,
    link: Arc<Link>,
}

#[pymethods]
impl StreamLink {
    /// Asks for the next event (acks the last one).
    fn ack(&self) {
        self.link.ack();
    }

    /// Stops the handler's wait for good (the stream is no longer read).
    fn release(&self) {
        self.link.release();
    }
}

impl Drop for StreamLink {
    fn drop(&mut self) {
        self.link.release();
    }
}
