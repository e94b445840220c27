//! Failures, as the Python exceptions of `weir.errors`.
//!
//! Rust code builds a [`WeirErr`] (plain data: a [`Kind`] that picks the Python class, a
//! stable snake_case `code` — the wire error code where there is one — a message and
//! JSON details). It becomes a `PyErr` only at the boundary to Python: in a method
//! called from Python, or on the bridge runtime (`crate::runtime`), which may wait for
//! the GIL. Core tasks never convert, so they never wait for the GIL.
//!
//! The classes are defined in Python (python/weir/errors.py), because some have two
//! bases (`ConfigError` is also a `ValueError`, `ConnectError` a `ConnectionError`).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Which `weir.errors` class a failure raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ConfigError` (also a `ValueError`): an invalid option, stream id, session id,
    /// frame or argument. Nothing was changed.
    Config,
    /// `ConnectError` (also a `ConnectionError`): NATS could not be reached or refused.
    Connect,
    /// `ClosedError`: the object was closed, or the stream already ended.
    Closed,
    /// `OverloadError`: a frame was not admitted (the stream's bound, its rate, or the
    /// stream is over); `code` is the producer core's reason.
    Overload,
    /// `RefusedError`: a stream was not opened (already active, too many streams).
    Refused,
    /// `InternalError`: a bug (a task that panicked); the message says where.
    Internal,
}

impl Kind {
    /// The class name in `weir.errors`: the variant's name + `Error`.
    pub fn class(self) -> String {
        format!("{self:?}Error")
    }
}

/// A failure on its way to Python.
#[derive(Debug, Clone)]
pub struct WeirErr {
    /// The class.
    pub kind: Kind,
    /// Stable snake_case code (`invalid_config`, `queue_full`, `closed`, ...).
    pub code: String,
    /// What happened, for a person.
    pub message: String,
    /// Numbers and names that go with it (`limit`, `retry_after_ms`, ...).
    pub details: Map<String, Value>,
}

impl WeirErr {
    /// A failure of `kind` with `code`.
    pub fn new(kind: Kind, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            code: code.into(),
            message: message.into(),
            details: Map::new(),
        }
    }

    /// Adds one detail.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.details.insert(key.to_owned(), value.into());
        self
    }

    /// `ConfigError` with `code`.
    pub fn config(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(Kind::Config, code, message)
    }

    /// `ClosedError`, code `closed`.
    pub fn closed(message: impl Into<String>) -> Self {
        Self::new(Kind::Closed, "closed", message)
    }

    /// `InternalError`, code `internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Kind::Internal, "internal", message)
    }

    /// The Python exception (needs the GIL).
    pub fn to_pyerr(&self, py: Python<'_>) -> PyErr {
        match self.build(py) {
            Ok(err) => err,
            // weir.errors missing means a broken installation: still say what failed.
            Err(e) => PyRuntimeError::new_err(format!(
                "{} [{}] (weir.errors unavailable: {e})",
                self.message, self.code
            )),
        }
    }

    fn build(&self, py: Python<'_>) -> PyResult<PyErr> {
        let class = py.import("weir.errors")?.getattr(self.kind.class())?;
        let details = PyDict::new(py);
        if !self.details.is_empty() {
            let text = Value::Object(self.details.clone()).to_string();
            let parsed = py.import("json")?.call_method1("loads", (text,))?;
            details.update(parsed.cast::<pyo3::types::PyMapping>()?)?;
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("code", &self.code)?;
        kwargs.set_item("details", details)?;
        let value = class.call((&self.message,), Some(&kwargs))?;
        Ok(PyErr::from_value(value))
    }
}

/// The keyword arguments `json` (a JSON object) as a `T` whose every key has a default.
/// A refusal is a `ConfigError(invalid_config)`; when one key alone is refused (serde's
/// message for a whole object does not say which), `details["key"]` names it.
pub fn keys_from_json<T: DeserializeOwned>(json: &str, what: &str) -> Result<T, WeirErr> {
    let whole = |e: serde_json::Error| WeirErr::config("invalid_config", format!("{what}: {e}"));
    let given: Map<String, Value> = serde_json::from_str(json).map_err(whole)?;
    for (key, value) in &given {
        let one = Value::Object(Map::from_iter([(key.clone(), value.clone())]));
        if let Err(e) = serde_json::from_value::<T>(one) {
            return Err(
                WeirErr::config("invalid_config", format!("config key `{key}`: {e}"))
                    .with("key", key.as_str()),
            );
        }
    }
    serde_json::from_value(Value::Object(given)).map_err(whole)
}

/// The Python type name of `obj`, for a message that says what was passed instead.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

impl From<WeirErr> for PyErr {
    /// Takes the GIL: only at the boundary (a Python call or the bridge runtime).
    fn from(e: WeirErr) -> PyErr {
        Python::attach(|py| e.to_pyerr(py))
    }
}
