//! The consumer-wide cap on live stream instances (`max_streams`).
//!
//! Every stream id seen on a subscription would otherwise start a handler task, a map
//! entry and a queue, and only the idle timeout would remove them: a producer (or an
//! attacker) inventing ids could grow the worker without bound. A [`StreamSlot`] is
//! taken before a stream instance is opened and released by `Drop` exactly once, when
//! the last of its holders is gone — the demultiplexer's entry *and* the handler task
//! (which may still be draining its queue after the entry left the map). One set of
//! slots is shared by every subscription of a consumer, so the cap is per worker, not
//! per partition.
//!
//! The same type bounds the memory of refused ids (a refused stream is remembered so
//! that it stays refused until its `end` or the idle timeout, see `demux.rs`).

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fixed number of slots; cheap to share.
#[derive(Debug)]
pub(crate) struct StreamSlots {
    taken: AtomicUsize,
    max: NonZeroUsize,
}

impl StreamSlots {
    /// `max` slots, all free.
    pub(crate) fn new(max: NonZeroUsize) -> Arc<Self> {
        Arc::new(Self {
            taken: AtomicUsize::new(0),
            max,
        })
    }

    /// Takes a slot, or `None` when all `max` are taken. Never waits.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<StreamSlot> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max.get()).then_some(n + 1)
            })
            .ok()
            .map(|_| StreamSlot {
                slots: self.clone(),
            })
    }

    /// Slots taken now.
    pub(crate) fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }

    /// The cap.
    pub(crate) fn max(&self) -> usize {
        self.max.get()
    }
}

/// One taken slot; freed when dropped.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    slots: Arc<StreamSlots>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.slots.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_released_once_by_drop() {
        let slots = StreamSlots::new(NonZeroUsize::new(2).expect("non-zero"));
        let a = slots.try_acquire().expect("first");
        let b = Arc::new(slots.try_acquire().expect("second"));
        assert!(slots.try_acquire().is_none(), "third is over the cap");
        let b2 = b.clone();
        drop(b);
        assert_eq!(slots.taken(), 2, "still held by the other clone");
        drop(b2);
        assert_eq!(slots.taken(), 1);
        drop(a);
        assert_eq!(slots.taken(), 0);
        assert!(slots.try_acquire().is_some());
    }
}
