//! `weir._weir` producer classes (the Rust side of `weir.producer`).

use pyo3::prelude::*;

/// Adds the producer's classes to the module.
pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
