//! The extension's runtime, and the one way Python awaits Rust.
//!
//! - **core** (`weir-core-*` threads, a tokio runtime): the consumer's and producer's
//!   tasks (NATS client, demultiplexers, handlers' queues, lease driver, capacity
//!   announcer, publishers) and the futures behind Python awaitables. Nothing running
//!   there takes the GIL: it exchanges data with Python only through channels and
//!   atomics, and a Python object it drops is released later by PyO3's reference pool.
//! - **bridge** (one `weir-bridge` thread): completes asyncio futures. It is the only
//!   thread of the extension that takes the GIL on its own, so a Python thread holding
//!   the GIL (a model call) delays only the delivery of results, never the core.
//!
//! [`await_core`] runs an operation on the core to completion and hands its result to
//! Python; [`await_bridge`] awaits a cancel-safe future (a channel receive): a Python
//! `await` cancelled while it waits drops the Rust future, so nothing is lost. One race
//! remains, and callers close it themselves: a result completed just before the
//! cancellation is discarded (the asyncio future is done; it cannot take it). So a
//! receive that takes an item out of Rust's hands must not be the only copy: the
//! producer's events are kept until a later call acknowledges them by index, the
//! consumer's batches go to an internal pump task that only `close` cancels.
//!
//! Interpreter exit: `weir` registers [`_shutdown`] with `atexit`. It stops the bridge
//! and waits for it (the GIL released) before the interpreter finalizes, so no thread of
//! the extension takes the GIL once finalization starts — a thread that did would crash
//! the process. Results completed after that are dropped (their loop is gone anyway).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

use futures::FutureExt;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use tokio::runtime::{Builder, Runtime};
use tokio::sync::oneshot;
use weir_service::sync::locked;

use crate::errors::WeirErr;

/// Worker threads of the core runtime. One: its tasks are I/O bound and never block,
/// and one thread saves the cross-thread wake-ups of a frame's way through the
/// demultiplexer, its handler and the hub. Measured with the throughput benchmark
/// (python/bench, 1,000 streams × 50 frames/s, release): the core's CPU per frame went
/// from ~3.9 µs with two threads to ~2.9 µs with one, the whole consumer's from 8.5 to
/// 7.0 µs. At 50,000 frames/s that thread is ~15 % busy.
const CORE_THREADS: usize = 1;

static CORE: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The core runtime (created on first use).
pub fn core() -> Result<&'static Runtime, WeirErr> {
    CORE.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(CORE_THREADS)
            .thread_name("weir-core")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| WeirErr::internal(format!("cannot start the weir-core runtime: {e}")))
}

/// Runs `op` on the core runtime and returns a Python awaitable of its result.
///
/// The operation runs to completion even when the Python `await` is cancelled (only the
/// wait for it stops): operations that create something (a connection, a stream) must
/// release it themselves when their result is not taken.
pub fn await_core<'py, F, T>(py: Python<'py>, op: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, WeirErr>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let task = core()?.spawn(op);
    await_bridge(py, async move {
        match task.await {
            Ok(result) => result,
            // Resumed here, the panic is reported by `await_bridge` (an `InternalError`).
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(WeirErr::internal(format!("a weir task failed: {e}"))),
        }
    })
}

/// Awaits `fut` (on the core runtime) from Python: for cancel-safe waits (channel
/// receives). A Python `await` cancelled while it waits drops `fut`; a result completed
/// just before the cancellation is discarded (see the module doc): hand out items that
/// can be asked for again, or await them only from a task nothing else cancels.
///
/// Returns an asyncio future of the running loop, completed by the bridge thread with
/// what `fut` (spawned on the core) returns; `fut` is dropped as soon as the asyncio
/// future is done otherwise (cancelled, or garbage-collected).
pub fn await_bridge<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, WeirErr>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    static ASYNCIO: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let asyncio = ASYNCIO.get_or_try_init(py, || py.import("asyncio").map(Bound::unbind))?;
    let event_loop = asyncio.bind(py).call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let (cancel_tx, cancel_rx) = oneshot::channel();
    future.call_method1(
        "add_done_callback",
        (CancelOnDone {
            tx: Mutex::new(Some(cancel_tx)),
        },),
    )?;
    let target = future.clone().unbind();
    let event_loop = event_loop.unbind();
    core()?.spawn(async move {
        let outcome = tokio::select! {
            result = AssertUnwindSafe(fut).catch_unwind() => match result {
                Ok(result) => result,
                Err(panic) => Err(WeirErr::internal(format!(
                    "a weir operation panicked: {}",
                    panic_message(panic.as_ref())
                ))),
            },
            // Done without us (cancelled), or its callback is gone: nobody waits.
            _ = cancel_rx => return,
        };
        submit(Completion {
            future: target,
            event_loop,
            outcome: Box::new(move |py| match outcome {
                Ok(value) => value.into_py_any(py),
                Err(e) => Err(e.to_pyerr(py)),
            }),
        });
    });
    Ok(future)
}

/// The done-callback of a bridged asyncio future: tells its Rust side to stop.
#[pyclass(frozen)]
struct CancelOnDone {
    tx: Mutex<Option<oneshot::Sender<()>>>,
}

#[pymethods]
impl CancelOnDone {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        if let Some(tx) = locked(&self.tx).take() {
            let _ = tx.send(());
        }
    }
}

/// Makes the Python value (or exception) of a result, with the GIL: on the bridge
/// thread, which may wait for the GIL, never on the core (a `WeirErr` needs the GIL to
/// become a `weir.errors` exception). A panic is reported as `InternalError` (code
/// `internal`), never as pyo3's `PanicException` (a `BaseException`).
type MakeOutcome = Box<dyn for<'py> FnOnce(Python<'py>) -> PyResult<Py<PyAny>> + Send>;

/// One result on its way to its asyncio future.
struct Completion {
    future: Py<PyAny>,
    event_loop: Py<PyAny>,
    outcome: MakeOutcome,
}

/// The bridge thread and the way to it; `tx` is `None` once [`_shutdown`] ran.
struct Bridge {
    tx: Mutex<Option<mpsc::Sender<Completion>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

static BRIDGE: OnceLock<Bridge> = OnceLock::new();

fn bridge_thread() -> &'static Bridge {
    BRIDGE.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("weir-bridge".into())
            .spawn(move || complete(rx))
            .ok();
        Bridge {
            tx: Mutex::new(thread.is_some().then_some(tx)),
            thread: Mutex::new(thread),
        }
    })
}

/// Hands a result to the bridge thread (dropped when it has stopped: interpreter exit).
/// Called from the core: a channel send, never the GIL.
fn submit(completion: Completion) {
    let bridge = bridge_thread();
    let tx = locked(&bridge.tx);
    if let Some(tx) = tx.as_ref() {
        let _ = tx.send(completion);
    }
}

/// Most results delivered under one hold of the GIL.
const BATCH: usize = 256;

/// The bridge thread: takes the GIL once per batch of results and schedules each
/// future's completion on its loop (`call_soon_threadsafe`). Ends when [`_shutdown`]
/// dropped the sender and the queue is empty, or when the interpreter can no longer be
/// attached to.
fn complete(rx: mpsc::Receiver<Completion>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH
            && let Ok(more) = rx.try_recv()
        {
            batch.push(more);
        }
        let delivered = Python::try_attach(|py| {
            for completion in batch.drain(..) {
                deliver(py, completion);
            }
        });
        if delivered.is_none() {
            return;
        }
    }
}

fn deliver(py: Python<'_>, completion: Completion) {
    static COMPLETE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let Ok(complete) = COMPLETE.get_or_try_init(py, || {
        wrap_pyfunction!(_complete, py).map(|f| f.into_any().unbind())
    }) else {
        return;
    };
    let (ok, value) = match (completion.outcome)(py) {
        Ok(value) => (true, value),
        Err(e) => (false, e.into_value(py).into_any()),
    };
    // A closed loop (its `asyncio.run` returned) refuses: nobody waits any more.
    let _ = completion.event_loop.bind(py).call_method1(
        "call_soon_threadsafe",
        (complete, completion.future, ok, value),
    );
}

/// Sets a bridged future's result or exception, on its loop's thread, unless it is
/// already done (cancelled meanwhile).
#[pyfunction]
fn _complete(future: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if future.call_method0("done")?.is_truthy()? {
        return Ok(());
    }
    let method = if ok { "set_result" } else { "set_exception" };
    future.call_method1(method, (value,))?;
    Ok(())
}

/// `weir._weir._shutdown()`, registered with `atexit` by `weir`: stops the bridge thread
/// and waits for it with the GIL released, so that no thread of the extension takes
/// the GIL while the interpreter finalizes. Idempotent.
#[pyfunction]
pub fn _shutdown(py: Python<'_>) {
    let Some(bridge) = BRIDGE.get() else {
        return;
    };
    drop(locked(&bridge.tx).take());
    if let Some(thread) = locked(&bridge.thread).take() {
        py.detach(|| {
            let _ = thread.join();
        });
    }
}

/// The text of a panic payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    let text = payload.downcast_ref::<&str>().copied();
    let text = text.or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    text.unwrap_or("(no message)").to_owned()
}

/// `weir._weir.runtime_threads()`: the names of the extension's runtimes and their
/// thread counts, for diagnostics and the GIL test.
#[pyfunction]
pub fn runtime_threads(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("core", CORE_THREADS)?;
    d.set_item("bridge", 1)?;
    Ok(d)
}

/// `weir._weir._panic_probe(awaited)`: panics on purpose, for the test that shows what
/// a panic inside weir becomes in Python — awaited (`True`): `weir.errors.InternalError`
/// (code `internal`) from the awaitable; called (`False`): PyO3's `PanicException`
/// raised by the call. Nothing else calls it.
#[pyfunction]
#[allow(clippy::panic)]
pub fn _panic_probe(py: Python<'_>, awaited: bool) -> PyResult<Bound<'_, PyAny>> {
    if awaited {
        await_bridge(py, async {
            if std::hint::black_box(true) {
                panic!("panic probe (awaited)");
            }
            Ok(())
        })
    } else {
        panic!("panic probe (called)")
    }
}
