//! The bot's audio towards the carrier: a bounded, paced queue between the NATS
//! subscription (16 kHz mono s16le PCM in messages of any size, possibly seconds of
//! audio in one burst) and the carrier's WebSocket, and the ledger of marks sent to the
//! carrier and not yet played back. Pure logic: every method that depends on time takes
//! `now: Instant`; nothing here reads a clock, sleeps or allocates per popped frame
//! beyond the frame it returns.
//!
//! The door drives it like this: on each NATS message `push_audio` (then `push_mark`
//! for a `Weir-Mark` header); then, and whenever the timer set to [`OutQueue::next_due`]
//! fires, `expire(now)` and `pop_due(now)` until it returns `None`, sending each
//! [`Due::Frame`] as a media message and each [`Due::Mark`] as a mark message (and
//! [`Marks::sent`]); a carrier's mark echo goes to [`Marks::played`]; a barge-in is
//! [`OutQueue::clear`] plus [`Marks::cleared`] plus the carrier's `clear` message.
//!
//! Invariants a reader must not break:
//! - **Bounded memory.** The queue never holds more than `max_bytes` of audio, charged
//!   in whole 20 ms frames (640 bytes): a partial tail is charged as the frame it will
//!   become, so padding it never crosses the bound. It holds at most
//!   [`MAX_QUEUED_MARKS`] marks of at most [`MAX_MARK_NAME_BYTES`] each; the ledger at
//!   most its `max_outstanding` names.
//! - **Nothing is dropped silently.** Every sample given to `push_audio` is either
//!   queued, or refused and reported ([`Dropped`] with [`DropReason::QueueFull`], or an
//!   [`OutboundError`] with nothing changed); every queued frame is popped, or dropped
//!   and reported by `expire` ([`DropReason::MaxAge`]) or `clear` ([`Cleared`]).
//!   Counts: `frames` are 20 ms frames, a partial one counting as one; `ms` is the
//!   audio's duration rounded up to a whole millisecond (exactly `20 × frames` when
//!   the audio is whole frames).
//! - **A full queue refuses the new audio.** A push is all or nothing: if its frames do
//!   not fit beside what is queued, the whole push is refused, and what is queued keeps
//!   playing without a hole. A push that could not fit even into an empty queue is an
//!   error ([`OutboundError::TooLarge`]), not an overload: no amount of draining
//!   would admit it.
//! - **Age is measured from push.** A frame's age starts when its first sample was
//!   pushed; `expire` drops, from the front, every frame (and a partial tail) older
//!   than `max_age`, so after it nothing queued is older than `max_age`.
//! - **Pacing.** Within a run of continuous audio, frame `k` is due at
//!   `run_start + k × 20 ms − lead`, where `run_start` is when the run's first frame
//!   became available. A frame is popped only when due; a late door gets the frames it
//!   missed at once (the schedule does not slip with the door's timer). The run
//!   continues while audio keeps arriving before what was sent has finished playing
//!   (`run_start + sent × 20 ms`); when the queue ran dry and that point passed (an
//!   underrun), the next frame starts a new run at the time it became available, so an
//!   underrun is never followed by a catch-up burst. `clear` ends the run.
//! - **Partial tails.** Samples short of a whole frame wait for the next push; they are
//!   padded with silence to a whole frame when a mark follows them (`push_mark`) or on
//!   `flush_tail` (the end of a reply). They are never popped as a short frame.
//! - **Marks are ordered with the audio.** A mark is due as soon as every frame queued
//!   before it has left the queue (popped, or dropped by `expire`: its audio will never
//!   play, which `expire` reported, and the carrier echoes it right after what it did
//!   play). Marks pushed back to back come out in the order pushed.
//! - **`clear` is total and at once.** It empties frames, tail and marks, and reports
//!   exactly what was dropped, with the queued marks' names in order.

mod marks;
mod queue;

use std::time::Duration;

pub use marks::{MAX_OUTSTANDING_MARKS, Marks, UnknownMark};
pub use queue::OutQueue;

/// Samples in one 20 ms frame at 16 kHz.
pub const FRAME_SAMPLES: usize = 320;
/// Bytes of one 20 ms frame of 16 kHz s16le PCM.
pub const FRAME_BYTES: usize = FRAME_SAMPLES * 2;
/// The duration of one frame.
pub const FRAME_DURATION: Duration = Duration::from_millis(20);
/// Samples per millisecond at 16 kHz.
const SAMPLES_PER_MS: u64 = 16;
/// The most marks an [`OutQueue`] holds at once; one more is refused
/// ([`OutboundError::TooManyMarks`]).
pub const MAX_QUEUED_MARKS: usize = 1_024;
/// The longest mark name accepted, in bytes (UTF-8).
pub const MAX_MARK_NAME_BYTES: usize = 256;

/// Limits and pacing of an [`OutQueue`]. Check it once with [`OutboundConfig::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutboundConfig {
    /// The most 16 kHz PCM queued, in bytes, charged in whole frames of
    /// [`FRAME_BYTES`]. Default 160,000 (5 s).
    pub max_bytes: usize,
    /// A frame not sent within `max_age` of its push is dropped by
    /// [`OutQueue::expire`]. Default 10 s: twice what a full default queue needs at real
    /// time, so only a door (or carrier socket) that fell 5 s behind loses audio.
    pub max_age: Duration,
    /// How far ahead of real time frames are sent, so the carrier's jitter buffer never
    /// runs dry between two sends. Default 40 ms.
    pub lead: Duration,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        Self {
            max_bytes: 160_000,
            max_age: Duration::from_secs(10),
            lead: Duration::from_millis(40),
        }
    }
}

impl OutboundConfig {
    /// The queue's capacity in whole frames.
    pub fn max_frames(&self) -> usize {
        self.max_bytes / FRAME_BYTES
    }

    /// Checks the limits make sense together: `max_bytes` holds at least one frame;
    /// `lead` is below `max_age`; `max_age` is at least the time a full queue takes to
    /// play (else audio queued within the bound would expire waiting for its turn).
    pub fn validate(&self) -> Result<(), OutboundError> {
        let invalid =
            |key: &'static str, reason: String| Err(OutboundError::InvalidConfig { key, reason });
        if self.max_bytes < FRAME_BYTES {
            return invalid(
                "max_bytes",
                format!(
                    "{} bytes do not hold one {FRAME_BYTES}-byte frame",
                    self.max_bytes
                ),
            );
        }
        if self.lead >= self.max_age {
            return invalid(
                "lead",
                format!("{:?} is not below max_age {:?}", self.lead, self.max_age),
            );
        }
        let full_queue = frames_duration(self.max_frames() as u64);
        if self.max_age < full_queue {
            return invalid(
                "max_age",
                format!(
                    "{:?} is shorter than a full queue plays ({full_queue:?} for max_bytes {})",
                    self.max_age, self.max_bytes
                ),
            );
        }
        Ok(())
    }
}

/// What [`OutQueue::pop_due`] hands the door, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// 20 ms of 16 kHz audio: exactly [`FRAME_SAMPLES`] samples.
    Frame(Vec<i16>),
    /// A mark: every frame queued before it has been handed out (or dropped by age).
    Mark(String),
}

/// Why audio was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum DropReason {
    /// The queue was full: the new audio was refused.
    QueueFull,
    /// Frames waited longer than `max_age`.
    MaxAge,
    /// A barge-in (`clear`) dropped what the caller had not heard.
    Cleared,
}

impl DropReason {
    /// Stable snake_case code, as in the door's `overload` event: `queue_full`,
    /// `max_age`, `cleared`.
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// Audio dropped, with why. `frames` counts 20 ms frames (a partial one as one); `ms`
/// is the duration rounded up to a whole millisecond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// 20 ms frames dropped (a partial frame counts as one).
    pub frames: u64,
    /// Milliseconds of audio dropped (rounded up).
    pub ms: u64,
    /// Why.
    pub reason: DropReason,
}

impl Dropped {
    /// `samples` of 16 kHz audio dropped for `reason`.
    pub(crate) fn of_samples(samples: u64, reason: DropReason) -> Self {
        Self {
            frames: samples.div_ceil(FRAME_SAMPLES as u64),
            ms: samples.div_ceil(SAMPLES_PER_MS),
            reason,
        }
    }
}

/// What [`OutQueue::clear`] dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cleared {
    /// 20 ms frames dropped (a partial tail counts as one).
    pub frames: u64,
    /// Milliseconds of audio dropped (rounded up).
    pub ms: u64,
    /// The names of the marks that were queued, in order (never sent to the carrier).
    pub queued_marks: Vec<String>,
}

/// A push or a configuration refused. Nothing in the queue changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(name(OutboundErrorKind), derive(Hash, strum::IntoStaticStr))]
#[strum_discriminants(strum(serialize_all = "snake_case"))]
#[strum_discriminants(doc = "Machine-readable kind of an [`OutboundError`]: its variant.")]
pub enum OutboundError {
    /// The PCM is not whole 16-bit samples.
    #[error("audio of {len} bytes is not whole 16-bit samples")]
    OddLength {
        /// The payload's length in bytes.
        len: usize,
    },
    /// One push larger than the queue can ever hold (charged in whole frames).
    #[error("audio of {bytes} bytes ({charged} in whole frames) exceeds the queue's {max_bytes}")]
    TooLarge {
        /// The payload's length in bytes.
        bytes: usize,
        /// Its charge in whole frames.
        charged: usize,
        /// The queue's bound.
        max_bytes: usize,
    },
    /// [`MAX_QUEUED_MARKS`] marks are already queued.
    #[error("{max} marks already queued")]
    TooManyMarks {
        /// The bound.
        max: usize,
    },
    /// A mark name that is empty or longer than [`MAX_MARK_NAME_BYTES`].
    #[error("mark name of {len} bytes (1 to {max} accepted)")]
    InvalidMarkName {
        /// The name's length in bytes.
        len: usize,
        /// [`MAX_MARK_NAME_BYTES`].
        max: usize,
    },
    /// [`OutboundConfig::validate`] refused a setting.
    #[error("invalid outbound config `{key}`: {reason}")]
    InvalidConfig {
        /// The setting.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl OutboundError {
    /// The kind, for callers that match without the details.
    pub fn kind(&self) -> OutboundErrorKind {
        self.into()
    }

    /// Stable snake_case code: `odd_length`, `too_large`, `too_many_marks`,
    /// `invalid_mark_name`, `invalid_config`.
    pub fn code(&self) -> &'static str {
        self.kind().into()
    }
}

/// The duration of `frames` 20 ms frames.
pub(crate) fn frames_duration(frames: u64) -> Duration {
    Duration::from_millis(frames.saturating_mul(20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid_and_holds_five_seconds() {
        let cfg = OutboundConfig::default();
        assert_eq!(cfg.validate(), Ok(()));
        assert_eq!(cfg.max_frames(), 250);
    }

    #[test]
    fn validate_names_the_bad_key() {
        let key = |cfg: OutboundConfig| match cfg.validate() {
            Err(OutboundError::InvalidConfig { key, .. }) => key,
            other => panic!("expected invalid_config, got {other:?}"),
        };
        let base = OutboundConfig::default();
        assert_eq!(
            key(OutboundConfig {
                max_bytes: 639,
                ..base
            }),
            "max_bytes"
        );
        assert_eq!(
            key(OutboundConfig {
                lead: Duration::from_secs(10),
                ..base
            }),
            "lead"
        );
        assert_eq!(
            key(OutboundConfig {
                max_age: Duration::from_secs(4),
                ..base
            }),
            "max_age"
        );
        let err = OutboundConfig {
            max_bytes: 0,
            ..base
        }
        .validate();
        assert_eq!(err.map_err(|e| e.code()), Err("invalid_config"));
    }

    #[test]
    fn drop_counts_round_partial_frames_up() {
        let d = Dropped::of_samples(320 * 3, DropReason::QueueFull);
        assert_eq!((d.frames, d.ms), (3, 60));
        let d = Dropped::of_samples(321, DropReason::MaxAge);
        assert_eq!((d.frames, d.ms), (2, 21));
        let d = Dropped::of_samples(1, DropReason::MaxAge);
        assert_eq!((d.frames, d.ms), (1, 1));
        assert_eq!(DropReason::QueueFull.code(), "queue_full");
        assert_eq!(DropReason::MaxAge.code(), "max_age");
        assert_eq!(DropReason::Cleared.code(), "cleared");
    }
}
