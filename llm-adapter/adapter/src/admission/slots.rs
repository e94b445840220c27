//! Counted slots per key, released by `Drop`.
//!
//! A [`SlotTable`] counts how many slots each key holds. [`SlotTable::acquire`] returns a
//! [`SlotGuard`]; dropping the guard gives the slot back. Because the guard is owned by
//! exactly one queue entry and the entry is dropped exactly once, a slot is released
//! exactly once whatever way the request settles (success, backend error, deadline,
//! cancel, shutdown) — there is no counter decremented in several places.
//!
//! Lock order: the admission state lock is taken before a table's lock, never the other
//! way. All acquisitions and all guard drops happen while the admission state lock is
//! held, so the counts seen by the state machine are always current.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use weir_service::sync::locked;

/// Counts of held slots per key.
#[derive(Debug, Clone, Default)]
pub(crate) struct SlotTable {
    inner: Arc<SlotInner>,
}

#[derive(Debug, Default)]
struct SlotInner {
    counts: Mutex<HashMap<String, usize>>,
    acquired: AtomicU64,
    released: AtomicU64,
}

impl SlotInner {
    fn counts(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        locked(&self.counts)
    }
}

impl SlotTable {
    /// Slots held by `key`.
    pub(crate) fn in_use(&self, key: &str) -> usize {
        self.inner.counts().get(key).copied().unwrap_or(0)
    }

    /// Takes one slot of `key` unconditionally; the caller checked the limit.
    pub(crate) fn acquire(&self, key: &str) -> SlotGuard {
        *self.inner.counts().entry(key.to_owned()).or_insert(0) += 1;
        self.inner.acquired.fetch_add(1, Ordering::Relaxed);
        SlotGuard {
            table: self.inner.clone(),
            key: key.to_owned(),
        }
    }

    /// Number of keys holding at least one slot.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> usize {
        self.inner.counts().len()
    }

    /// Every key with its count (for the limits view).
    pub(crate) fn snapshot(&self) -> Vec<(String, usize)> {
        self.inner
            .counts()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Total acquisitions and releases since start.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (
            self.inner.acquired.load(Ordering::Relaxed),
            self.inner.released.load(Ordering::Relaxed),
        )
    }
}

/// One held slot. Dropping it releases the slot.
#[derive(Debug)]
pub(crate) struct SlotGuard {
    table: Arc<SlotInner>,
    key: String,
}

impl SlotGuard {
    /// The key this slot belongs to.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut counts = self.table.counts();
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
        self.table.released.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_release_exactly_once_on_drop() {
        let t = SlotTable::default();
        let a = t.acquire("s1");
        let b = t.acquire("s1");
        let c = t.acquire("s2");
        assert_eq!((t.in_use("s1"), t.in_use("s2"), t.keys()), (2, 1, 2));
        drop(a);
        assert_eq!(t.in_use("s1"), 1);
        drop(b);
        drop(c);
        assert_eq!((t.in_use("s1"), t.keys()), (0, 0));
        assert_eq!(t.totals(), (3, 3));
    }
}
