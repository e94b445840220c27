//! The events of a stream as Python objects: `weir.Frame`, `weir.Gap`, `weir.End`,
//! `weir.LossDeclared` (re-exported by `weir.consumer`).
//!
//! Invariants:
//! - immutable (`frozen`): every attribute is read-only; `==` compares the type and
//!   every field, `hash` agrees with it, `__match_args__` lists the fields in
//!   constructor order so that `match event: case Frame(pcm, seq): ...` works;
//! - built from the consumer core's [`StreamEvent`] with the GIL held, on the thread
//!   that hands a batch to Python (never on a core thread); a frame's PCM is copied
//!   once into a `bytes` object, which every later access shares;
//! - the names (`cause`, `reason`) are the core's stable snake_case names
//!   ([`GapCause`], [`EndCause::as_str`], the wire's gap / end / possible-loss reasons).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use weir_audio_consumer::{EndCause, GapCause, StreamEvent};

/// `weir.Frame`: one frame of audio, in seq order.
#[pyclass(frozen, module = "weir.consumer", name = "Frame")]
pub struct Frame {
    /// s16le mono 16 kHz PCM.
    #[pyo3(get)]
    pcm: Py<PyBytes>,
    /// Sequence number.
    #[pyo3(get)]
    seq: u64,
    /// Samples in `pcm`.
    #[pyo3(get)]
    samples: u64,
    /// Unix ms at which the ingress accepted the frame, if the producer said.
    #[pyo3(get)]
    captured_at_ms: Option<u64>,
}

#[pymethods]
impl Frame {
    #[new]
    #[pyo3(signature = (pcm, seq, samples, captured_at_ms = None))]
    fn new(pcm: Py<PyBytes>, seq: u64, samples: u64, captured_at_ms: Option<u64>) -> Self {
        Self {
            pcm,
            seq,
            samples,
            captured_at_ms,
        }
    }

    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str, &'static str) {
        ("pcm", "seq", "samples", "captured_at_ms")
    }

    fn _key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        (
            self.pcm.clone_ref(py),
            self.seq,
            self.samples,
            self.captured_at_ms,
        )
            .into_pyobject(py)
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        match other.cast::<Self>() {
            Ok(o) => self._key(py)?.eq(o.get()._key(py)?),
            Err(_) => Ok(false),
        }
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self._key(py)?.hash()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Frame(pcm=<{} bytes>, seq={}, samples={}, captured_at_ms={})",
            self.pcm.bind(py).as_bytes().len(),
            self.seq,
            self.samples,
            opt(self.captured_at_ms)
        )
    }
}

/// `weir.Gap`: frames `first_seq..=last_seq` will not be delivered, and why.
#[pyclass(frozen, module = "weir.consumer", name = "Gap")]
pub struct Gap {
    /// First missing seq.
    #[pyo3(get)]
    first_seq: u64,
    /// Last missing seq.
    #[pyo3(get)]
    last_seq: u64,
    /// Seqs covered.
    #[pyo3(get)]
    frames: u64,
    /// Samples missing, when known.
    #[pyo3(get)]
    samples: Option<u64>,
    /// `lost`, `declared`, `possibly_lost`, `stale`, `overload` or `handover`.
    #[pyo3(get)]
    cause: String,
    /// For `declared`: the producer's gap reason (`queue_full`, `max_age`, ...).
    #[pyo3(get)]
    reason: Option<String>,
}

#[pymethods]
impl Gap {
    #[new]
    #[pyo3(signature = (first_seq, last_seq, frames, samples, cause, reason = None))]
    fn new(
        first_seq: u64,
        last_seq: u64,
        frames: u64,
        samples: Option<u64>,
        cause: String,
        reason: Option<String>,
    ) -> Self {
        Self {
            first_seq,
            last_seq,
            frames,
            samples,
            cause,
            reason,
        }
    }

    #[classattr]
    fn __match_args__() -> (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    ) {
        (
            "first_seq",
            "last_seq",
            "frames",
            "samples",
            "cause",
            "reason",
        )
    }

    fn _key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        (
            self.first_seq,
            self.last_seq,
            self.frames,
            self.samples,
            self.cause.as_str(),
            self.reason.as_deref(),
        )
            .into_pyobject(py)
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        match other.cast::<Self>() {
            Ok(o) => self._key(py)?.eq(o.get()._key(py)?),
            Err(_) => Ok(false),
        }
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self._key(py)?.hash()
    }

    fn __repr__(&self) -> String {
        format!(
            "Gap(first_seq={}, last_seq={}, frames={}, samples={}, cause={:?}, reason={})",
            self.first_seq,
            self.last_seq,
            self.frames,
            opt(self.samples),
            self.cause,
            opt_str(self.reason.as_deref())
        )
    }
}

/// `weir.End`: the last event of a stream instance.
#[pyclass(frozen, module = "weir.consumer", name = "End")]
pub struct End {
    /// `producer`, `idle`, `overload`, `restarted`, `shutdown` or `handover`.
    #[pyo3(get)]
    cause: String,
    /// For `producer`: its `Weir-End-Reason`; for `overload`: the bound that tripped
    /// (`bytes` or `age`).
    #[pyo3(get)]
    reason: Option<String>,
    /// Seq of the producer's `end` packet, if one arrived.
    #[pyo3(get)]
    seq: Option<u64>,
    /// Last seq of the timeline accepted.
    #[pyo3(get)]
    last_seq: Option<u64>,
}

#[pymethods]
impl End {
    #[new]
    #[pyo3(signature = (cause, reason = None, seq = None, last_seq = None))]
    fn new(cause: String, reason: Option<String>, seq: Option<u64>, last_seq: Option<u64>) -> Self {
        Self {
            cause,
            reason,
            seq,
            last_seq,
        }
    }

    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str, &'static str) {
        ("cause", "reason", "seq", "last_seq")
    }

    fn _key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        (
            self.cause.as_str(),
            self.reason.as_deref(),
            self.seq,
            self.last_seq,
        )
            .into_pyobject(py)
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        match other.cast::<Self>() {
            Ok(o) => self._key(py)?.eq(o.get()._key(py)?),
            Err(_) => Ok(false),
        }
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self._key(py)?.hash()
    }

    fn __repr__(&self) -> String {
        format!(
            "End(cause={:?}, reason={}, seq={}, last_seq={})",
            self.cause,
            opt_str(self.reason.as_deref()),
            opt(self.seq),
            opt(self.last_seq)
        )
    }
}

/// `weir.LossDeclared`: the producer declared seqs possibly lost; outside the timeline
/// (it re-labels seqs an earlier `lost` gap covered).
#[pyclass(frozen, module = "weir.consumer", name = "LossDeclared")]
pub struct LossDeclared {
    /// First seq of the declared range.
    #[pyo3(get)]
    first_seq: u64,
    /// Last seq of the declared range.
    #[pyo3(get)]
    last_seq: u64,
    /// Frames the producer says were unconfirmed in that range.
    #[pyo3(get)]
    frames: u64,
    /// The producer's cumulative count for the stream.
    #[pyo3(get)]
    total_frames: u64,
    /// Why (`unconfirmed_at_disconnect`, ...).
    #[pyo3(get)]
    reason: String,
    /// Frames already reported as `lost` that this declaration re-labels.
    #[pyo3(get)]
    reclassified_frames: u64,
}

#[pymethods]
impl LossDeclared {
    #[new]
    fn new(
        first_seq: u64,
        last_seq: u64,
        frames: u64,
        total_frames: u64,
        reason: String,
        reclassified_frames: u64,
    ) -> Self {
        Self {
            first_seq,
            last_seq,
            frames,
            total_frames,
            reason,
            reclassified_frames,
        }
    }

    #[classattr]
    fn __match_args__() -> (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    ) {
        (
            "first_seq",
            "last_seq",
            "frames",
            "total_frames",
            "reason",
            "reclassified_frames",
        )
    }

    fn _key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        (
            self.first_seq,
            self.last_seq,
            self.frames,
            self.total_frames,
            self.reason.as_str(),
            self.reclassified_frames,
        )
            .into_pyobject(py)
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        match other.cast::<Self>() {
            Ok(o) => self._key(py)?.eq(o.get()._key(py)?),
            Err(_) => Ok(false),
        }
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self._key(py)?.hash()
    }

    fn __repr__(&self) -> String {
        format!(
            "LossDeclared(first_seq={}, last_seq={}, frames={}, total_frames={}, reason={:?}, reclassified_frames={})",
            self.first_seq,
            self.last_seq,
            self.frames,
            self.total_frames,
            self.reason,
            self.reclassified_frames
        )
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "None".to_owned(), |v| v.to_string())
}

fn opt_str(v: Option<&str>) -> String {
    v.map_or_else(|| "None".to_owned(), |v| format!("{v:?}"))
}

/// The Python object of `event`.
pub fn to_python(py: Python<'_>, event: StreamEvent) -> PyResult<Py<PyAny>> {
    Ok(match event {
        StreamEvent::Frame(f) => Py::new(
            py,
            Frame {
                pcm: PyBytes::new(py, &f.pcm).unbind(),
                seq: f.seq,
                samples: f.samples,
                captured_at_ms: f.captured_at_ms,
            },
        )?
        .into_any(),
        StreamEvent::Gap(g) => {
            let (cause, reason) = match g.cause {
                GapCause::Lost => ("lost", None),
                GapCause::Declared(r) => ("declared", Some(<&'static str>::from(r).to_owned())),
                GapCause::PossiblyLost => ("possibly_lost", None),
                GapCause::Stale => ("stale", None),
                GapCause::Overload => ("overload", None),
                GapCause::Handover => ("handover", None),
            };
            Py::new(
                py,
                Gap {
                    first_seq: g.first_seq,
                    last_seq: g.last_seq,
                    frames: g.frames(),
                    samples: g.samples,
                    cause: cause.to_owned(),
                    reason,
                },
            )?
            .into_any()
        }
        StreamEvent::End(e) => {
            let reason = match &e.cause {
                EndCause::Producer { reason, .. } => {
                    reason.map(|r| <&'static str>::from(r).to_owned())
                }
                EndCause::Overload(o) => Some(
                    match o.bound {
                        weir_audio_consumer::OverloadBound::Bytes => "bytes",
                        weir_audio_consumer::OverloadBound::Age => "age",
                    }
                    .to_owned(),
                ),
                _ => None,
            };
            Py::new(
                py,
                End {
                    cause: e.cause.as_str().to_owned(),
                    reason,
                    seq: e.seq,
                    last_seq: e.last_seq,
                },
            )?
            .into_any()
        }
        StreamEvent::LossDeclared(d) => Py::new(
            py,
            LossDeclared {
                first_seq: d.first_seq,
                last_seq: d.last_seq,
                frames: d.frames,
                total_frames: d.total_frames,
                reason: <&'static str>::from(d.reason).to_owned(),
                reclassified_frames: d.reclassified_frames,
            },
        )?
        .into_any(),
    })
}

/// Adds the event classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Frame>()?;
    m.add_class::<Gap>()?;
    m.add_class::<End>()?;
    m.add_class::<LossDeclared>()?;
    Ok(())
}
