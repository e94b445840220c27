//! The two tokio runtimes of the extension, and the one way Python awaits Rust.
//!
//! - **core** (`weir-core-*` threads): the consumer's and producer's tasks (NATS client,
//!   demultiplexers, handlers' queues, lease driver, capacity announcer, publishers).
//!   Nothing running there takes the GIL: it exchanges data with Python only through
//!   channels and atomics.
//! - **bridge** (`weir-bridge` thread, pyo3-async-runtimes' runtime): the futures
//!   behind Python awaitables. Completing an asyncio future needs the GIL, so a Python
//!   thread holding it (a model call) delays only this runtime, never the core.
//!
//! [`await_core`] runs an operation on the core and hands its result to Python;
//! [`await_bridge`] awaits something cancel-safe (a channel) directly on the bridge, so
//! that a Python `await` cancelled while it waits drops the Rust future and loses
//! nothing. One race remains, and callers close it themselves: when the Rust future has
//! already completed and the cancellation lands before pyo3-async-runtimes sets the
//! result, the result is discarded. So a receive that takes an item out of Rust's hands
//! must not be the only copy: the producer's events are kept until a later call
//! acknowledges them by index, the consumer's batches go to an internal pump task that
//! only `close` cancels.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use futures::FutureExt;

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::runtime::{Builder, Handle, Runtime};

use crate::errors::WeirErr;

/// Worker threads of the core runtime: the consumer's and producer's tasks are I/O
/// bound; two threads keep one stalled task from stalling the rest.
const CORE_THREADS: usize = 2;

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

/// A handle of the core runtime, to spawn on it or enter it.
pub fn core_handle() -> Result<Handle, WeirErr> {
    Ok(core()?.handle().clone())
}

/// Configures the bridge runtime (one thread; it only completes Python futures). Called
/// once at module import, before any awaitable exists.
pub fn init_bridge() {
    let mut builder = Builder::new_multi_thread();
    builder
        .worker_threads(1)
        .thread_name("weir-bridge")
        .enable_all();
    pyo3_async_runtimes::tokio::init(builder);
}

/// Runs `op` on the core runtime and returns a Python awaitable of its result.
///
/// The operation runs to completion even when the Python `await` is cancelled (the
/// bridge only stops waiting for it): operations that create something (a connection,
/// a stream) must release it themselves when their result is not taken.
pub fn await_core<'py, F, T>(py: Python<'py>, op: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, WeirErr>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let task = core()?.spawn(op);
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        Ok(Outcome(match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => Err(WeirErr::internal(format!(
                "a weir task panicked: {}",
                panic_message(e.into_panic().as_ref())
            ))),
            Err(e) => Err(WeirErr::internal(format!("a weir task failed: {e}"))),
        }))
    })
}

/// Awaits `fut` on the bridge runtime: for cancel-safe waits (channel receives), so a
/// Python `await` cancelled while it waits drops it. A result completed just before the
/// cancellation is discarded (see the module doc): hand out items that can be asked for
/// again, or await them only from a task nothing else cancels.
pub fn await_bridge<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, WeirErr>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        Ok(Outcome(match AssertUnwindSafe(fut).catch_unwind().await {
            Ok(result) => result,
            Err(panic) => Err(WeirErr::internal(format!(
                "a weir operation panicked: {}",
                panic_message(panic.as_ref())
            ))),
        }))
    })
}

/// The result of an awaited operation, converted to Python by pyo3-async-runtimes when
/// it completes the asyncio future — on its blocking thread, which may wait for the
/// GIL — so that an error, like a value, becomes a Python object there and never on a
/// runtime worker (a `WeirErr` needs the GIL to become a `weir.errors` exception).
/// A panic is reported as `InternalError` (code `internal`), never as pyo3's
/// `PanicException` (a `BaseException`).
pub struct Outcome<T>(pub Result<T, WeirErr>);

impl<'py, T: IntoPyObject<'py>> IntoPyObject<'py> for Outcome<T> {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, PyErr> {
        match self.0 {
            Ok(value) => value.into_bound_py_any(py),
            Err(e) => Err(e.to_pyerr(py)),
        }
    }
}

/// The text of a panic payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
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
