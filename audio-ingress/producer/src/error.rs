//! The producer core's error types. Each has a `kind()` that callers match on; the
//! `Display` text is for humans and names the offending limit or value. (A refused
//! [`StreamConfig`](crate::StreamConfig) value is the one configuration error of every
//! weir component, `weir_service::config::ConfigError`.)
//!
//! - [`OpenError`]: a stream could not be opened (bad id, already active, too many
//!   streams, shutting down).
//! - [`PushError`]: a frame was not admitted (transiently full, stream overloaded or
//!   closed, invalid frame).

use weir_protocol::StreamIdError;
use weir_protocol::WireName;
use weir_protocol::audio::extension::{EndReason, Overload};

/// A stream could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(
    name(OpenErrorKind),
    derive(Hash, strum::IntoStaticStr, strum::VariantArray)
)]
#[strum_discriminants(strum(serialize_all = "snake_case"))]
#[strum_discriminants(
    doc = "Machine-readable kind of an [`OpenError`]: its variant. Its wire \
    name is the metric label of the refusal."
)]
pub enum OpenError {
    /// The stream id is not a safe subject token.
    #[error("invalid stream id: {0}")]
    InvalidId(#[from] StreamIdError),
    /// The session id is too long or contains control characters.
    #[error("invalid session id: {0}")]
    InvalidSession(String),
    /// A stream with this id is open (or still delivering its `end`).
    #[error("stream {0:?} is already active")]
    AlreadyActive(String),
    /// `max_streams` streams are open.
    #[error("{limit} streams are active (max_streams); retry later")]
    #[strum_discriminants(strum(serialize = "max_streams"))]
    TooManyStreams {
        /// The configured cap.
        limit: usize,
    },
    /// The ingress is shutting down and admits no new stream.
    #[error("the ingress is shutting down")]
    ShuttingDown,
    /// Opening a stream spawns its publisher task, which needs a tokio runtime.
    #[error("no tokio runtime: streams must be opened from within a runtime")]
    NoRuntime,
}

impl OpenError {
    /// The kind.
    pub fn kind(&self) -> OpenErrorKind {
        self.into()
    }

    /// The metric label for this refusal.
    pub fn as_label(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// Why a frame is not a valid PCM frame for this stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Zero bytes.
    #[error("empty frame")]
    Empty,
    /// An odd number of bytes is not a whole number of s16le samples.
    #[error("frame of {len} bytes is not a whole number of 16-bit samples")]
    PartialSample {
        /// The frame length.
        len: usize,
    },
    /// Larger than `max_frame_bytes`.
    #[error("frame of {len} bytes exceeds max_frame_bytes = {max}")]
    TooLarge {
        /// The frame length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
}

/// A frame was not admitted. The frame got no sequence number; it is counted as
/// `rejected` with a reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(PushErrorKind), derive(Hash))]
#[strum_discriminants(doc = "Machine-readable kind of a [`PushError`]: its variant.")]
pub enum PushError {
    /// `close` policy: the byte budget is full right now. Not yet an overload: the
    /// stream overloads when it stays full for `max_wait`. (`try_push` only; `push`
    /// waits instead.)
    #[error("queue full: {pending_bytes} of {max_bytes} bytes pending")]
    Full {
        /// Bytes pending in this stream.
        pending_bytes: u64,
        /// The byte budget.
        max_bytes: u64,
    },
    /// The stream was ended by the `close` policy; this report is also on its `end`.
    #[error("stream overloaded ({:?}): {} frames dropped", .0.reason, .0.dropped_frames)]
    Overloaded(Overload),
    /// The stream is ending or has ended for another reason.
    #[error("stream closed ({})", .0.as_str())]
    Closed(EndReason),
    /// The frame itself is invalid; nothing else changed.
    #[error("invalid frame: {0}")]
    InvalidFrame(#[from] FrameError),
}

impl PushError {
    /// The kind.
    pub fn kind(&self) -> PushErrorKind {
        self.into()
    }
}
