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

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use weir_audio_consumer::{EndCause, GapCause, StreamEvent};

/// How a field reads in `repr`: numbers as they are, strings quoted, `None` when absent,
/// PCM by its length.
fn field_repr(value: &Bound<'_, PyAny>) -> String {
    if let Ok(b) = value.cast::<PyBytes>() {
        return format!("<{} bytes>", b.as_bytes().len());
    }
    match value.extract::<String>() {
        Ok(s) => format!("{s:?}"),
        Err(_) => value.to_string(),
    }
}

/// A frozen event class: its fields (read-only attributes, in constructor order), the
/// constructor with `signature`, `__match_args__`, and `==`, `hash` and `repr` over
/// every field.
macro_rules! event_class {
    (
        $(#[$doc:meta])*
        $name:ident $signature:tt {
            $($(#[$field_doc:meta])* $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$doc])*
        #[pyclass(frozen, module = "weir.consumer")]
        pub struct $name {
            $($(#[$field_doc])* #[pyo3(get)] $field: $ty,)*
        }

        #[pymethods]
        impl $name {
            #[new]
            #[pyo3(signature = $signature)]
            fn new($($field: $ty),*) -> Self {
                Self { $($field),* }
            }

            #[classattr]
            fn __match_args__(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
                PyTuple::new(py, [$(stringify!($field)),*])
            }

            fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
                match other.cast::<Self>() {
                    Ok(o) => self.key(py)?.eq(o.get().key(py)?),
                    Err(_) => Ok(false),
                }
            }

            fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
                self.key(py)?.hash()
            }

            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let names = [$(stringify!($field)),*];
                let values = self.key(py)?;
                let fields: Vec<String> =
                    names.iter().zip(values.iter()).map(|(n, v)| format!("{n}={}", field_repr(&v))).collect();
                Ok(format!("{}({})", stringify!($name), fields.join(", ")))
            }
        }

        impl $name {
            fn key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
                ($(&self.$field,)*).into_pyobject(py)
            }
        }
    };
}

event_class! {
    /// `weir.Frame`: one frame of audio, in seq order.
    Frame (pcm, seq, samples, captured_at_ms = None) {
        /// s16le mono 16 kHz PCM.
        pcm: Py<PyBytes>,
        /// Sequence number.
        seq: u64,
        /// Samples in `pcm`.
        samples: u64,
        /// Unix ms at which the ingress accepted the frame, if the producer said.
        captured_at_ms: Option<u64>,
    }
}

event_class! {
    /// `weir.Gap`: frames `first_seq..=last_seq` will not be delivered, and why.
    Gap (first_seq, last_seq, frames, samples, cause, reason = None) {
        /// First missing seq.
        first_seq: u64,
        /// Last missing seq.
        last_seq: u64,
        /// Seqs covered.
        frames: u64,
        /// Samples missing, when known.
        samples: Option<u64>,
        /// `lost`, `declared`, `possibly_lost`, `stale`, `overload` or `handover`.
        cause: String,
        /// For `declared`: the producer's gap reason (`queue_full`, `max_age`, ...).
        reason: Option<String>,
    }
}

event_class! {
    /// `weir.End`: the last event of a stream instance.
    End (cause, reason = None, seq = None, last_seq = None) {
        /// `producer`, `idle`, `overload`, `restarted`, `shutdown` or `handover`.
        cause: String,
        /// For `producer`: its `Weir-End-Reason`; for `overload`: the bound that tripped
        /// (`bytes` or `age`).
        reason: Option<String>,
        /// Seq of the producer's `end` packet, if one arrived.
        seq: Option<u64>,
        /// Last seq of the timeline accepted.
        last_seq: Option<u64>,
    }
}

event_class! {
    /// `weir.LossDeclared`: the producer declared seqs possibly lost; outside the timeline
    /// (it re-labels seqs an earlier `lost` gap covered).
    LossDeclared (first_seq, last_seq, frames, total_frames, reason, reclassified_frames) {
        /// First seq of the declared range.
        first_seq: u64,
        /// Last seq of the declared range.
        last_seq: u64,
        /// Frames the producer says were unconfirmed in that range.
        frames: u64,
        /// The producer's cumulative count for the stream.
        total_frames: u64,
        /// Why (`unconfirmed_at_disconnect`, ...).
        reason: String,
        /// Frames already reported as `lost` that this declaration re-labels.
        reclassified_frames: u64,
    }
}

/// The Python object of `event`.
pub fn to_python(py: Python<'_>, event: StreamEvent) -> PyResult<Py<PyAny>> {
    match event {
        StreamEvent::Frame(f) => Frame {
            pcm: PyBytes::new(py, &f.pcm).unbind(),
            seq: f.seq,
            samples: f.samples,
            captured_at_ms: f.captured_at_ms,
        }
        .into_py_any(py),
        StreamEvent::Gap(g) => Gap {
            first_seq: g.first_seq,
            last_seq: g.last_seq,
            frames: g.frames(),
            samples: g.samples,
            cause: <&str>::from(g.cause).to_owned(),
            reason: match g.cause {
                GapCause::Declared(r) => Some(<&str>::from(r).to_owned()),
                _ => None,
            },
        }
        .into_py_any(py),
        StreamEvent::End(e) => End {
            reason: match &e.cause {
                EndCause::Producer { reason, .. } => reason.map(|r| <&str>::from(r).to_owned()),
                EndCause::Overload(o) => Some(<&str>::from(o.bound).to_owned()),
                _ => None,
            },
            cause: e.cause.as_str().to_owned(),
            seq: e.seq,
            last_seq: e.last_seq,
        }
        .into_py_any(py),
        StreamEvent::LossDeclared(d) => LossDeclared {
            first_seq: d.first_seq,
            last_seq: d.last_seq,
            frames: d.frames,
            total_frames: d.total_frames,
            reason: <&'static str>::from(d.reason).to_owned(),
            reclassified_frames: d.reclassified_frames,
        }
        .into_py_any(py),
    }
}

/// Adds the event classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Frame>()?;
    m.add_class::<Gap>()?;
    m.add_class::<End>()?;
    m.add_class::<LossDeclared>()?;
    Ok(())
}
