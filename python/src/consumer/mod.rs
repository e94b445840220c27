//! `weir._weir` consumer classes (the Rust side of `weir.consumer`).

use pyo3::prelude::*;

/// Adds the consumer's classes to the module.
pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
