//! `ProducerStream`: one stream of the producer core, for Python.
//!
//! Invariants:
//! - `push` is `StreamHandle::try_push`: synchronous, one mutex, never awaits. Every
//!   frame offered ends as its seq (admitted), or an exception: `OverloadError` (not
//!   admitted: `code` is the core's reason; `details["ended"]` says whether the stream
//!   is over), `ClosedError` (after `end()`, or the stream ended for another reason)
//!   or `ConfigError(invalid_frame)` (not bytes-like, empty, odd, too large). The core
//!   counts each refusal with its reason.
//! - The handle lives in a mutex until `end()` takes it: a second `end()` or a push
//!   after `end()` finds it gone and raises `ClosedError`. Dropping the Python object
//!   drops the handle, which ends the stream `producer_gone` (the core's rule).
//! - `end()` runs `finish()` on the core: if its `await` is cancelled the stream still
//!   drains, publishes its `end` and frees its id; only the summary is not returned.
//! - Events and the status are read through a `StreamView`, which outlives the handle
//!   and holds no slot.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView};
use serde_json::{Value, json};
use weir_audio_producer::error::{FrameError, PushError};
use weir_audio_producer::stream::{StreamHandle, StreamView};
use weir_protocol::WireName;
use weir_service::sync::locked;

use super::events::EventCursor;
use crate::errors::{Kind, WeirErr, type_name};
use crate::runtime::{await_bridge, await_core, core};

/// One open stream (`weir.ProducerStream` wraps it).
#[pyclass(module = "weir._weir", name = "ProducerStream", frozen)]
pub struct ProducerStream {
    /// The producer's end; `None` once `end()` took it.
    handle: Mutex<Option<StreamHandle>>,
    view: StreamView,
    events: Arc<tokio::sync::Mutex<EventCursor>>,
}

impl ProducerStream {
    pub(super) fn new(handle: StreamHandle) -> Self {
        let view = handle.view();
        let events = Arc::new(tokio::sync::Mutex::new(EventCursor::new(view.clone())));
        Self {
            handle: Mutex::new(Some(handle)),
            view,
            events,
        }
    }
}

/// The PCM of a bytes-like frame (`bytes`, `bytearray`, `memoryview`).
fn frame_bytes(pcm: &Bound<'_, PyAny>) -> Result<Bytes, WeirErr> {
    if let Ok(b) = pcm.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(b.as_bytes()));
    }
    if let Ok(b) = pcm.cast::<PyByteArray>() {
        return Ok(Bytes::from(b.to_vec()));
    }
    if pcm.cast::<PyMemoryView>().is_ok()
        && let Ok(b) = pcm.call_method0("tobytes")
        && let Ok(b) = b.cast::<PyBytes>()
    {
        return Ok(Bytes::copy_from_slice(b.as_bytes()));
    }
    let ty = type_name(pcm);
    Err(WeirErr::config(
        "invalid_frame",
        format!("a frame is bytes, bytearray or memoryview of s16le PCM, not {ty}"),
    )
    .with("type", ty))
}

/// The exception of a refused frame.
fn push_error(e: PushError, len: usize) -> WeirErr {
    let message = e.to_string();
    match e {
        PushError::Full {
            pending_bytes,
            max_bytes,
        } => WeirErr::new(Kind::Overload, "queue_full", message)
            .with("ended", false)
            .with("pending_bytes", pending_bytes)
            .with("max_bytes", max_bytes),
        PushError::Overloaded(o) => {
            let mut err = WeirErr::new(Kind::Overload, o.reason.as_str(), message);
            if let Ok(Value::Object(report)) = serde_json::to_value(&o) {
                err.details = report;
            }
            err.with("ended", true)
        }
        PushError::Closed(reason) => WeirErr::closed(format!(
            "the stream has ended ({}): no frame is admitted",
            reason.as_str()
        ))
        .with("end_reason", reason.as_str()),
        PushError::InvalidFrame(f) => {
            let err = WeirErr::config("invalid_frame", message).with("len", len as u64);
            match f {
                FrameError::TooLarge { max, .. } => err.with("max_frame_bytes", max as u64),
                FrameError::Empty | FrameError::PartialSample { .. } => err,
            }
        }
    }
}

#[pymethods]
impl ProducerStream {
    /// The stream id.
    #[getter]
    fn id(&self) -> String {
        self.view.id().to_string()
    }

    /// The NATS subject the stream publishes to.
    #[getter]
    fn subject(&self) -> String {
        self.view.subject().to_owned()
    }

    /// The session id it was opened with.
    #[getter]
    fn session_id(&self) -> Option<String> {
        self.view.session_id().map(str::to_owned)
    }

    /// Whether `end()` was called.
    #[getter]
    fn ended(&self) -> bool {
        locked(&self.handle).is_none()
    }

    /// Offers one frame; its seq, or an exception (see the module docs). Never blocks.
    fn push(&self, pcm: &Bound<'_, PyAny>) -> PyResult<u64> {
        let data = frame_bytes(pcm)?;
        let len = data.len();
        let guard = locked(&self.handle);
        let Some(handle) = guard.as_ref() else {
            return Err(WeirErr::closed("the stream was ended (end() was called)")
                .with("end_reason", "producer")
                .into());
        };
        // The direct path hands the packet to the NATS client from here.
        let runtime = core()?;
        let _entered = runtime.enter();
        handle
            .try_push(data)
            .map_err(|e| PyErr::from(push_error(e, len)))
    }

    /// The status and the admin view of the stream, as JSON.
    fn status_json(&self) -> String {
        let status = self.view.status().borrow().clone();
        let snapshot = serde_json::to_value(self.view.snapshot()).unwrap_or(Value::Null);
        json!({
            "state": status.state,
            "end_reason": status.end_reason.map(|r| r.as_str()),
            "overload": status.overload,
            "gaps": status.gaps,
            "end_delivered": status.end_delivered,
            "finished": status.finished,
            "ended": self.ended(),
            "snapshot": snapshot,
        })
        .to_string()
    }

    /// The first event after index `after` (the last one the reader received) as JSON
    /// with its `index`, or `None` once `closed` was received: an awaitable, cancel-safe
    /// (see [`super::events`]).
    fn next_event<'py>(&self, py: Python<'py>, after: u64) -> PyResult<Bound<'py, PyAny>> {
        let events = Arc::clone(&self.events);
        await_bridge(py, async move {
            let mut cursor = events.lock().await;
            Ok(cursor.next(after).await)
        })
    }

    /// Ends the stream (reason `producer`): drains, publishes `end`, waits for the
    /// publisher; an awaitable of the summary JSON. `ClosedError` if already called.
    fn end<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(handle) = locked(&self.handle).take() else {
            return Err(WeirErr::closed("end() was already called on this stream").into());
        };
        await_core(py, async move {
            let summary = handle.finish().await;
            serde_json::to_string(&summary)
                .map_err(|e| WeirErr::internal(format!("stream summary: {e}")))
        })
    }
}
