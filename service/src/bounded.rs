//! A FIFO bounded by bytes and by the age of what it holds, generic over its item: the
//! storage and accounting under both per-stream queues (the ingress's `FrameQueue`, the
//! consumer's `StreamQueue`). It keeps the items in order with their running byte and
//! frame totals and answers "how old is the oldest" and "would this fit"; what happens
//! over the bound (refuse, evict into a gap marker, overload the stream) is the
//! caller's policy ([`WhenFull`], with the budget in [`QueueLimits`]: one declaration
//! for both queues), applied with the items this queue hands back.
//!
//! Pure and synchronous: whatever looks at time takes `now` (a tokio [`Instant`], so a
//! paused clock drives it); nothing spawns, sleeps or locks, and nothing allocates but
//! the deque's own growth. Every method is generic, so it is compiled (and inlined) in
//! the caller's crate: no dynamic dispatch on the per-frame path.
//!
//! Invariants a change must not break:
//! - [`BoundedQueue::bytes`] is the sum of the queued items' [`Charged::charge`] and
//!   [`BoundedQueue::frames`] the sum of their [`Charged::frames`], after every call.
//!   Both are read when an item enters and when it leaves, so they must not change
//!   while it is queued: the queue lends items out only by shared reference.
//! - Order is kept: items leave the front in the order they were pushed to the back;
//!   [`BoundedQueue::push_front`] puts one back ahead of all others.
//! - Nothing is removed without being returned to the caller (pop, evict and drain all
//!   hand the items back), so the caller counts every drop: drops are never silent.
//!   Only dropping the queue itself drops what it holds (each item's own `Drop` runs).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

mod policy;

pub use policy::{QueueLimits, WhenFull};

/// What a [`BoundedQueue`] needs to know of its item.
pub trait Charged {
    /// Bytes the item counts against the byte bound (fixed while it is queued).
    fn charge(&self) -> usize;
    /// When it was enqueued: its age counts against the age bound.
    fn enqueued_at(&self) -> Instant;
    /// Frames it stands for (a control item: 0).
    fn frames(&self) -> usize {
        1
    }
}

/// A FIFO of `T` with its byte and frame totals. See the module docs for the invariants.
#[derive(Debug)]
pub struct BoundedQueue<T> {
    items: VecDeque<T>,
    bytes: usize,
    frames: usize,
}

impl<T> Default for BoundedQueue<T> {
    fn default() -> Self {
        Self {
            items: VecDeque::new(),
            bytes: 0,
            frames: 0,
        }
    }
}

impl<T: Charged> BoundedQueue<T> {
    /// Items queued.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The sum of the queued items' charges.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The sum of the queued items' frames.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Whether `charge` more bytes stay within `max_bytes`.
    pub fn fits(&self, charge: usize, max_bytes: usize) -> bool {
        self.bytes.saturating_add(charge) <= max_bytes
    }

    /// The age at `now` of the item at `index` (0 = the oldest).
    pub fn age_at(&self, index: usize, now: Instant) -> Option<Duration> {
        let item = self.items.get(index)?;
        Some(now.saturating_duration_since(item.enqueued_at()))
    }

    /// The age at `now` of the oldest item.
    pub fn oldest_age(&self, now: Instant) -> Option<Duration> {
        self.age_at(0, now)
    }

    /// The oldest item.
    pub fn front(&self) -> Option<&T> {
        self.items.front()
    }

    /// The newest item.
    pub fn back(&self) -> Option<&T> {
        self.items.back()
    }

    /// The items, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + '_ {
        self.items.iter()
    }

    /// Appends `item` (the newest).
    pub fn push_back(&mut self, item: T) {
        self.add(&item);
        self.items.push_back(item);
    }

    /// Puts `item` back ahead of all others (the oldest).
    pub fn push_front(&mut self, item: T) {
        self.add(&item);
        self.items.push_front(item);
    }

    /// Removes the oldest item.
    pub fn pop_front(&mut self) -> Option<T> {
        self.items.pop_front().inspect(|item| self.sub(item))
    }

    /// Removes the newest item.
    pub fn pop_back(&mut self) -> Option<T> {
        self.items.pop_back().inspect(|item| self.sub(item))
    }

    /// Removes the oldest item if `evict` says so: called in a loop, evicts the oldest
    /// while the caller's bound is broken, handing each one back.
    pub fn pop_front_if(&mut self, evict: impl FnOnce(&T) -> bool) -> Option<T> {
        if evict(self.items.front()?) {
            self.pop_front()
        } else {
            None
        }
    }

    /// Removes the oldest item if it is older than `max_age` at `now`.
    pub fn pop_expired(&mut self, now: Instant, max_age: Duration) -> Option<T> {
        self.pop_front_if(|item| now.saturating_duration_since(item.enqueued_at()) > max_age)
    }

    /// Removes up to `n` of the oldest items, in order.
    pub fn drain_front(&mut self, n: usize) -> impl Iterator<Item = T> + '_ {
        let n = n.min(self.items.len());
        for item in self.items.range(..n) {
            self.bytes -= item.charge();
            self.frames -= item.frames();
        }
        self.items.drain(..n)
    }

    /// Removes every item, in order (those the caller does not take are dropped when
    /// the iterator is).
    pub fn drain_all(&mut self) -> impl Iterator<Item = T> + '_ {
        self.bytes = 0;
        self.frames = 0;
        self.items.drain(..)
    }

    fn add(&mut self, item: &T) {
        self.bytes += item.charge();
        self.frames += item.frames();
    }

    fn sub(&mut self, item: &T) {
        self.bytes -= item.charge();
        self.frames -= item.frames();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Item {
        id: u32,
        bytes: usize,
        at: Instant,
        control: bool,
    }

    impl Charged for Item {
        fn charge(&self) -> usize {
            self.bytes
        }
        fn enqueued_at(&self) -> Instant {
            self.at
        }
        fn frames(&self) -> usize {
            usize::from(!self.control)
        }
    }

    fn item(id: u32, bytes: usize, at: Instant) -> Item {
        Item {
            id,
            bytes,
            at,
            control: false,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    fn ids(q: &BoundedQueue<Item>) -> Vec<u32> {
        q.iter().map(|i| i.id).collect()
    }

    /// The totals equal the sums over what is queued.
    fn assert_totals(q: &BoundedQueue<Item>) {
        assert_eq!(q.bytes(), q.iter().map(Charged::charge).sum::<usize>());
        assert_eq!(q.frames(), q.iter().map(Charged::frames).sum::<usize>());
    }

    #[test]
    fn totals_follow_every_push_and_pop_and_order_is_kept() {
        let t0 = Instant::now();
        let mut q = BoundedQueue::default();
        assert_eq!((q.is_empty(), q.bytes(), q.frames()), (true, 0, 0));
        q.push_back(item(1, 100, t0));
        q.push_back(item(2, 200, t0));
        q.push_back(Item {
            control: true,
            ..item(3, 64, t0)
        });
        assert_eq!((q.len(), q.bytes(), q.frames()), (3, 364, 2));
        assert_totals(&q);
        let one = q.pop_front().expect("front");
        assert_eq!((one.id, q.bytes(), q.frames()), (1, 264, 1));
        q.push_front(one);
        assert_eq!(ids(&q), [1, 2, 3]);
        assert_eq!(q.pop_back().map(|i| i.id), Some(3));
        assert_eq!((q.bytes(), q.frames()), (300, 2));
        assert_eq!(
            (q.front().map(|i| i.id), q.back().map(|i| i.id)),
            (Some(1), Some(2))
        );
        assert_totals(&q);
    }

    #[test]
    fn fits_counts_the_charge_against_the_bound() {
        let t0 = Instant::now();
        let mut q = BoundedQueue::default();
        assert!(q.fits(1_000, 1_000), "an exact fit fits");
        q.push_back(item(1, 600, t0));
        assert!(q.fits(400, 1_000));
        assert!(!q.fits(401, 1_000));
    }

    #[tokio::test(start_paused = true)]
    async fn ages_follow_the_paused_clock() {
        let t0 = Instant::now();
        let mut q = BoundedQueue::default();
        assert_eq!(q.oldest_age(t0), None);
        q.push_back(item(1, 10, t0));
        tokio::time::advance(30 * MS).await;
        q.push_back(item(2, 10, Instant::now()));
        tokio::time::advance(20 * MS).await;
        let now = Instant::now();
        assert_eq!(q.oldest_age(now), Some(50 * MS));
        assert_eq!(q.age_at(1, now), Some(20 * MS));
        assert_eq!(q.age_at(2, now), None);
        assert_eq!(q.oldest_age(t0), Some(Duration::ZERO), "never negative");
    }

    #[test]
    fn pop_expired_takes_only_what_is_older_than_max_age() {
        let t0 = Instant::now();
        let mut q = BoundedQueue::default();
        for id in 0..4u32 {
            q.push_back(item(id, 10, t0 + id * 10 * MS));
        }
        let now = t0 + 45 * MS;
        let expired: Vec<u32> =
            std::iter::from_fn(|| q.pop_expired(now, 25 * MS).map(|i| i.id)).collect();
        assert_eq!(
            expired,
            [0, 1],
            "ages 45 and 35 ms; 25 ms is not over the bound"
        );
        assert_eq!((ids(&q), q.bytes()), (vec![2, 3], 20));
    }

    #[test]
    fn pop_front_if_evicts_while_the_callers_bound_is_broken() {
        let t0 = Instant::now();
        let mut q = BoundedQueue::default();
        for id in 0..5 {
            q.push_back(item(id, 100, t0));
        }
        // The caller's own total (say, a budget that also counts items in flight):
        // 600 bytes pending, 250 more to admit under a 700-byte bound.
        let mut pending = 600;
        let mut evicted = Vec::new();
        while let Some(i) = q.pop_front_if(|_| pending + 250 > 700) {
            pending -= i.bytes;
            evicted.push(i.id);
        }
        assert_eq!(evicted, [0, 1]);
        assert_eq!(
            q.pop_front_if(|i| i.id == 9),
            None,
            "declined: nothing removed"
        );
        assert_eq!((ids(&q), q.bytes()), (vec![2, 3, 4], 300));
        q.drain_all().for_each(drop);
        assert_eq!(q.pop_front_if(|_| true), None);
    }

    #[test]
    fn drains_hand_back_every_item_and_keep_the_totals() {
        let t0 = Instant::now();
        let mut q = BoundedQueue::default();
        for id in 0..5 {
            q.push_back(item(id, 10 * (id as usize + 1), t0));
        }
        let first: Vec<u32> = q.drain_front(2).map(|i| i.id).collect();
        assert_eq!(first, [0, 1]);
        assert_eq!((q.bytes(), q.frames()), (120, 3));
        let rest: Vec<u32> = q.drain_front(10).map(|i| i.id).collect();
        assert_eq!(rest, [2, 3, 4], "clamped to what is queued");
        assert_eq!((q.len(), q.bytes(), q.frames()), (0, 0, 0));
        q.push_back(item(7, 70, t0));
        q.push_back(item(8, 80, t0));
        let all: Vec<u32> = q.drain_all().map(|i| i.id).collect();
        assert_eq!(all, [7, 8]);
        assert_eq!((q.len(), q.bytes(), q.frames()), (0, 0, 0));
    }

    #[test]
    fn a_drain_dropped_unread_still_empties_the_queue() {
        let t0 = Instant::now();
        let mut q = BoundedQueue::default();
        q.push_back(item(1, 10, t0));
        q.push_back(item(2, 10, t0));
        drop(q.drain_front(1));
        assert_eq!((ids(&q), q.bytes()), (vec![2], 10));
        drop(q.drain_all());
        assert_eq!((q.len(), q.bytes(), q.frames()), (0, 0, 0));
        assert_totals(&q);
    }
}
