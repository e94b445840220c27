//! The reorder window over a stream's carrier chunk numbers (`media.chunk`: the
//! per-track media counter; Twilio's `sequenceNumber` also counts non-media messages,
//! so it cannot show a missing chunk).
//!
//! Invariants a reader must not break:
//! - outputs come in strictly increasing chunk order: every chunk number from the
//!   first pushed up to the highest released is accounted for exactly once, either as
//!   an [`Out::Chunk`] or inside an [`Out::Gap`] — never out of order, never twice;
//! - a missing chunk becomes a gap when a chunk `window` numbers ahead of it is held,
//!   or when the oldest held chunk has waited `hold` (by the [`Instant`]s passed in;
//!   there is no clock inside, so tests drive time explicitly);
//! - a chunk arriving after its number was declared a gap is dropped and counted
//!   ([`Pushed::Late`]); a number already held or released is a [`ReorderError::Repeat`];
//!   one more than `history` behind is [`ReorderError::Backwards`]; one more than
//!   `max_jump` ahead is [`ReorderError::Jump`]. Refused chunks change nothing;
//! - memory is bounded: at most `max_jump + 1` slots are held, `history` outcomes
//!   remembered.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The window's limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReorderConfig {
    /// How far ahead of a missing chunk a held chunk may be before the missing one is
    /// declared a gap (3 = 60 ms of 20 ms chunks).
    pub window: u64,
    /// The longest wall time a chunk waits for a missing one before it.
    pub hold: Duration,
    /// A chunk further ahead of the next expected one than this is refused (250).
    pub max_jump: u64,
    /// How far behind the next expected chunk a repeat or late chunk is still
    /// recognised (64); further behind is `Backwards`.
    pub history: u64,
    /// The number the carrier documents for a stream's first chunk (both carriers: 1).
    /// A first chunk pushed at most `window` after it makes the window wait for the
    /// ones before it (the first chunks may be reordered too); any other first chunk
    /// starts the stream where it is. `None`: the first chunk pushed starts it.
    pub first: Option<u64>,
}

impl Default for ReorderConfig {
    fn default() -> Self {
        Self {
            window: 3,
            hold: Duration::from_millis(60),
            max_jump: 250,
            history: 64,
            first: Some(1),
        }
    }
}

/// What the window releases, in chunk order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out<T> {
    /// Chunk `chunk`, with what was pushed for it.
    Chunk {
        /// The chunk number.
        chunk: u64,
        /// The pushed item.
        item: T,
    },
    /// Chunks `first .. first + chunks` never came (in time): declared lost.
    Gap {
        /// The first missing chunk number.
        first: u64,
        /// How many consecutive chunks are missing (≥ 1).
        chunks: u64,
    },
}

/// What became of a pushed chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Held for release in order (possibly released by the next `pop`).
    Held,
    /// Its number was already declared a gap (or is before the stream's first chunk):
    /// dropped and counted.
    Late,
}

/// A chunk refused; the window is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case", prefix = "sequence_")]
pub enum ReorderError {
    /// The chunk number is already held or was already released.
    #[error("chunk {chunk} was already received")]
    Repeat {
        /// The chunk number.
        chunk: u64,
    },
    /// The chunk number is more than `history` behind the next expected one.
    #[error("chunk {chunk} is too far behind the next expected chunk {next}")]
    Backwards {
        /// The chunk number.
        chunk: u64,
        /// The next chunk number expected.
        next: u64,
    },
    /// The chunk number is more than `max_jump` ahead of the next expected one.
    #[error("chunk {chunk} is too far ahead of the next expected chunk {next}")]
    Jump {
        /// The chunk number.
        chunk: u64,
        /// The next chunk number expected.
        next: u64,
    },
}

impl ReorderError {
    /// A stable snake_case code: `sequence_repeat`, `sequence_backwards`,
    /// `sequence_jump`.
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// Counters since the window was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReorderStats {
    /// Chunks that arrived after a higher one and were put back in order.
    pub reordered: u64,
    /// Chunks dropped because their number was already declared a gap.
    pub late: u64,
    /// Gap outputs.
    pub gaps: u64,
    /// Chunk numbers inside gap outputs.
    pub gap_chunks: u64,
}

/// The reorder window of one stream; generic over what a chunk carries.
#[derive(Debug)]
pub struct Reorder<T> {
    cfg: ReorderConfig,
    /// The next chunk number to release; `None` until the first push.
    next: Option<u64>,
    /// `slots[i]` is chunk `next + i`: held (with its arrival) or missing. Empty, or
    /// its last slot is held.
    slots: VecDeque<Option<(T, Instant)>>,
    /// How many slots are held.
    held: usize,
    /// The outcome of the last released numbers, oldest first, ending at `next - 1`:
    /// `true` = released as a chunk, `false` = declared a gap. At most `history` long.
    past: VecDeque<bool>,
    /// The highest chunk number pushed and held so far.
    highest: Option<u64>,
    stats: ReorderStats,
}

impl<T> Reorder<T> {
    /// An empty window; the first chunk pushed sets where the stream starts (see
    /// [`ReorderConfig::first`]).
    pub fn new(cfg: ReorderConfig) -> Self {
        Self {
            cfg,
            next: None,
            slots: VecDeque::new(),
            held: 0,
            past: VecDeque::new(),
            highest: None,
            stats: ReorderStats::default(),
        }
    }

    /// Offers chunk `chunk`, arrived at `now`.
    pub fn push(&mut self, chunk: u64, item: T, now: Instant) -> Result<Pushed, ReorderError> {
        // u64::MAX has no successor: refused so `next` never overflows.
        if chunk == u64::MAX {
            return Err(ReorderError::Jump {
                chunk,
                next: self.next.unwrap_or(chunk),
            });
        }
        let start = match self.cfg.first {
            Some(f) if chunk >= f && chunk - f <= self.cfg.window => f,
            _ => chunk,
        };
        let next = *self.next.get_or_insert(start);
        if chunk < next {
            let behind = next - chunk;
            if behind > self.cfg.history {
                return Err(ReorderError::Backwards { chunk, next });
            }
            // Within `history`: a remembered outcome, or before the stream's start.
            let recorded = self.past.len() as u64;
            if behind <= recorded && self.past[(recorded - behind) as usize] {
                return Err(ReorderError::Repeat { chunk });
            }
            self.stats.late += 1;
            return Ok(Pushed::Late);
        }
        let offset = chunk - next;
        if offset > self.cfg.max_jump {
            return Err(ReorderError::Jump { chunk, next });
        }
        // offset <= max_jump and the slots never outgrow max_jump + 1.
        let index = offset as usize;
        if self.slots.get(index).is_some_and(Option::is_some) {
            return Err(ReorderError::Repeat { chunk });
        }
        if index >= self.slots.len() {
            self.slots.resize_with(index + 1, || None);
        }
        self.slots[index] = Some((item, now));
        self.held += 1;
        match self.highest {
            Some(high) if high > chunk => self.stats.reordered += 1,
            _ => self.highest = Some(chunk),
        }
        Ok(Pushed::Held)
    }

    /// The next output that is ready at `now`, in chunk order: the next chunk if held;
    /// else, when chunks after a missing one are held, a gap for the missing chunks
    /// that a held chunk `window` ahead (or the oldest held chunk's `hold`) has given
    /// up on. `None` when nothing is ready.
    pub fn pop(&mut self, now: Instant) -> Option<Out<T>> {
        self.release(Some(now))
    }

    /// When `pop` may next release something because of time: the oldest held chunk's
    /// arrival plus `hold` (in the past if the next chunk is already releasable).
    /// `None` when nothing is held.
    pub fn deadline(&self) -> Option<Instant> {
        if let Some(Some((_, arrived))) = self.slots.front() {
            return Some(*arrived);
        }
        self.oldest_arrival()
            .and_then(|t| t.checked_add(self.cfg.hold))
    }

    /// At the end of the stream: everything held, in order, with gaps between; the
    /// window is empty afterwards (and keeps its position and history). The iterator
    /// owns the outputs: it does not borrow the window.
    pub fn finish(&mut self) -> impl Iterator<Item = Out<T>> + use<T> {
        std::iter::from_fn(|| self.release(None))
            .collect::<Vec<_>>()
            .into_iter()
    }

    /// Counters since creation.
    pub fn stats(&self) -> ReorderStats {
        self.stats
    }

    /// How many chunks are held.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The next chunk number to release (`None` before the first push).
    pub fn next_chunk(&self) -> Option<u64> {
        self.next
    }

    /// [`Self::pop`] at `now`; `None`: at the end of the stream, when no missing chunk
    /// is waited for any more.
    fn release(&mut self, now: Option<Instant>) -> Option<Out<T>> {
        let next = self.next?;
        if self.held == 0 {
            return None;
        }
        if let Some(Some(_)) = self.slots.front() {
            let (item, _) = self.slots.pop_front().flatten()?;
            self.held -= 1;
            self.advance(next, 1, true);
            return Some(Out::Chunk { chunk: next, item });
        }
        // The front is missing and something after it is held.
        let first_held = self.slots.iter().position(Option::is_some)? as u64;
        let last_held = self.slots.len() as u64 - 1;
        // Missing slot m gives up when a chunk `window` ahead is held: m <= last - window.
        let by_window = (last_held + 1)
            .saturating_sub(self.cfg.window)
            .min(first_held);
        let timed_out = now.is_none_or(|now| {
            self.oldest_arrival()
                .is_some_and(|t| now.saturating_duration_since(t) >= self.cfg.hold)
        });
        let chunks = if timed_out { first_held } else { by_window };
        if chunks == 0 {
            return None;
        }
        self.slots.drain(..chunks as usize);
        self.advance(next, chunks, false);
        self.stats.gaps += 1;
        self.stats.gap_chunks += chunks;
        Some(Out::Gap {
            first: next,
            chunks,
        })
    }

    fn oldest_arrival(&self) -> Option<Instant> {
        self.slots.iter().flatten().map(|(_, t)| *t).min()
    }

    /// Records `count` numbers from `from` as released (`chunk`) or declared gaps.
    fn advance(&mut self, from: u64, count: u64, chunk: bool) {
        self.next = Some(from + count);
        let history = self.cfg.history as usize;
        let remembered = count.min(self.cfg.history) as usize;
        for _ in 0..remembered {
            self.past.push_back(chunk);
        }
        while self.past.len() > history {
            self.past.pop_front();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests unwrap what they construct
mod tests;
