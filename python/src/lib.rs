//! `weir._weir`: the native module of the `weir` Python package.
//!
//! The Python package (python/weir/) is a thin, typed asyncio layer over these classes;
//! every piece of protocol logic (order, gaps, staleness, leases, capacity, the
//! producer's bounded queue and confirmation window) is the Rust cores'
//! (`weir-audio-consumer`, `weir-audio-producer`), never re-implemented in Python.
//!
//! Invariants:
//! - [`runtime`]: the cores run on their own runtime, whose threads never take the GIL;
//!   Python futures are completed by one bridge thread. A Python thread that
//!   holds the GIL (a model call) therefore cannot delay NATS I/O, acknowledgements,
//!   lease renewals or capacity announcements.
//! - [`errors`]: every failure reaches Python as a subclass of `weir.WeirError` with a
//!   stable `code`; nothing in this module panics on input from Python or the network.

use pyo3::prelude::*;

mod consumer;
mod errors;
mod nats;
mod producer;
mod runtime;
mod wire;

/// The module `weir._weir`.
#[pymodule]
fn _weir(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(runtime::runtime_threads, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_panic_probe, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(wire::partition_of, m)?)?;
    consumer::register(m)?;
    producer::register(m)?;
    Ok(())
}
