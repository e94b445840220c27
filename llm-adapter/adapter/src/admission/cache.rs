//! The completion cache: successful replies kept for retries with the same request id,
//! bounded by age (`idempotency.window_ms`), by count (`idempotency.max_entries`) and by
//! bytes (`idempotency.max_bytes`).
//!
//! Invariants:
//! - `bytes` = Σ [`entry_bytes`] of the entries in `map`, and after every
//!   [`CompletionCache::insert`] `bytes ≤ max_bytes` and `map.len() ≤ max_entries`: the
//!   oldest entries are evicted first until both hold;
//! - a reply that alone exceeds `max_bytes` is not stored (counted as `too_large`), so
//!   a single huge reply never flushes the whole cache;
//! - the stored body is a private copy: a `Bytes` view of a larger buffer (the NATS
//!   client's read buffer) would keep more memory alive than is counted;
//! - `order` holds every live entry once plus stale records of replaced entries (told
//!   apart by `generation`); it is trimmed to `2 × max_entries`.
//!
//! Every eviction is counted in [`Stats`] by reason (`max_bytes`, `max_entries`);
//! expiry by age is not an eviction.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use tokio::time::Instant;

use super::Outcome;
use super::stats::{CacheEviction, Stats};

/// Bytes counted per entry besides the body, the headers and the key: the map slot, the
/// order record, the `Outcome` allocation and the key's second copy (an estimate of the
/// allocator's view, rounded up).
pub(crate) const ENTRY_OVERHEAD_BYTES: usize = 256;

/// The bytes an entry costs: body + header names and values + the key (twice: map and
/// order) + [`ENTRY_OVERHEAD_BYTES`].
pub(crate) fn entry_bytes(rid: &str, outcome: &Outcome) -> usize {
    let reply = match &outcome.result {
        Ok(r) => {
            r.body.len()
                + r.headers
                    .iter()
                    .map(|(n, v)| n.len() + v.len())
                    .sum::<usize>()
        }
        Err(e) => e.message.len(),
    };
    reply + 2 * rid.len() + ENTRY_OVERHEAD_BYTES
}

/// One cached reply.
pub(crate) struct CacheEntry<F> {
    /// What makes a retry "the same request".
    pub(crate) fingerprint: F,
    /// The answer to repeat.
    pub(crate) outcome: Arc<Outcome>,
    generation: u64,
    bytes: usize,
}

/// Successful replies kept for retries with the same request id.
pub(crate) struct CompletionCache<F> {
    map: HashMap<String, CacheEntry<F>>,
    order: VecDeque<(Instant, String, u64)>,
    generation: u64,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
    stats: Arc<Stats>,
}

impl<F> CompletionCache<F> {
    /// An empty cache with these bounds (`max_entries` = 0 stores nothing).
    pub(crate) fn new(max_entries: usize, max_bytes: usize, stats: Arc<Stats>) -> Self {
        stats.cache_bounds(max_bytes);
        Self {
            map: HashMap::new(),
            order: VecDeque::new(),
            generation: 0,
            bytes: 0,
            max_entries,
            max_bytes,
            stats,
        }
    }

    /// The live entry for `rid`.
    pub(crate) fn get(&self, rid: &str) -> Option<&CacheEntry<F>> {
        self.map.get(rid)
    }

    /// Drops entries that expired at or before `now`.
    pub(crate) fn purge(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(at, _, _)| *at <= now) {
            self.pop_front(None);
        }
        self.publish();
    }

    /// Removes the oldest order record; if it is the live entry, removes it and counts
    /// `reason` (none for expiry).
    fn pop_front(&mut self, reason: Option<CacheEviction>) {
        if let Some((_, rid, generation)) = self.order.pop_front()
            && self
                .map
                .get(&rid)
                .is_some_and(|e| e.generation == generation)
            && let Some(e) = self.map.remove(&rid)
        {
            self.bytes -= e.bytes;
            if let Some(r) = reason {
                self.stats.cache_evicted(r);
            }
        }
    }

    /// Stores `outcome` for `rid` until `expires`, then evicts the oldest entries until
    /// the bounds hold.
    pub(crate) fn insert(&mut self, rid: String, e: (F, Arc<Outcome>), expires: Instant) {
        let bytes = entry_bytes(&rid, &e.1);
        if self.max_entries == 0 {
            return;
        }
        if bytes > self.max_bytes {
            self.stats.cache_too_large.add(1);
            return;
        }
        let outcome = Arc::new(private_copy(&e.1));
        self.generation += 1;
        self.order
            .push_back((expires, rid.clone(), self.generation));
        let old = self.map.insert(
            rid,
            CacheEntry {
                fingerprint: e.0,
                outcome,
                generation: self.generation,
                bytes,
            },
        );
        self.bytes += bytes;
        if let Some(old) = old {
            self.bytes -= old.bytes;
        }
        while self.map.len() > self.max_entries {
            self.pop_front(Some(CacheEviction::MaxEntries));
        }
        while self.bytes > self.max_bytes {
            self.pop_front(Some(CacheEviction::MaxBytes));
        }
        while self.order.len() > self.max_entries.saturating_mul(2) {
            self.pop_front(Some(CacheEviction::MaxEntries));
        }
        self.publish();
    }

    /// When the oldest record expires.
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        self.order.front().map(|(at, _, _)| *at)
    }

    /// Bytes held now (Σ [`entry_bytes`]).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Entries held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn publish(&self) {
        self.stats.cache_now(self.map.len(), self.bytes);
    }
}

/// The outcome with its body copied into an allocation of its own.
fn private_copy(o: &Outcome) -> Outcome {
    let mut copy = o.clone();
    if let Ok(r) = &mut copy.result {
        r.body = Bytes::copy_from_slice(&r.body);
    }
    copy
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::BackendReply;

    fn reply(len: usize) -> Arc<Outcome> {
        Arc::new(Outcome {
            result: Ok(BackendReply {
                body: Bytes::from(vec![b'x'; len]),
                headers: vec![("X-A".into(), "1".into())],
            }),
            queue_time: Duration::ZERO,
            inference_time: None,
            request_id: None,
        })
    }

    fn stats() -> Arc<Stats> {
        Arc::new(Stats::new(&[], "sim"))
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_never_exceed_the_bound_and_the_oldest_go_first() {
        let stats = stats();
        let max_bytes = 10 * 1_000_000;
        let mut c = CompletionCache::<u8>::new(10_000, max_bytes, stats.clone());
        let now = Instant::now();
        let per = entry_bytes("r-000", &reply(1_000_000));
        // 300 × 1 MB, twice (the second round has new ids, as a replay after expiry).
        for round in 0..2 {
            for i in 0..300 {
                let rid = format!("r{round}{i:03}");
                c.insert(rid, (0, reply(1_000_000)), now + Duration::from_secs(60));
                assert!(c.bytes() <= max_bytes, "{} > {max_bytes}", c.bytes());
            }
        }
        assert_eq!(c.len(), max_bytes / per);
        assert_eq!(c.bytes(), c.len() * per);
        // The newest survive, the oldest were evicted.
        assert!(c.get("r1299").is_some());
        assert!(c.get("r0000").is_none());
        let s = stats.snapshot().cache;
        assert_eq!(s.entries, c.len() as u64);
        assert_eq!(s.bytes, c.bytes() as u64);
        assert_eq!(s.max_bytes, max_bytes as u64);
        assert_eq!(s.evicted_max_bytes, 600 - c.len() as u64);
        assert_eq!((s.evicted_max_entries, s.too_large), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn entry_bound_expiry_and_too_large() {
        let stats = stats();
        let mut c = CompletionCache::<u8>::new(2, 4096, stats.clone());
        let now = Instant::now();
        for rid in ["a", "b", "c"] {
            c.insert(rid.into(), (0, reply(10)), now + Duration::from_secs(1));
        }
        assert_eq!(c.len(), 2);
        assert!(c.get("a").is_none());
        c.insert("big".into(), (0, reply(5000)), now + Duration::from_secs(1));
        assert!(c.get("big").is_none());
        // Replacing an id keeps the byte count exact.
        c.insert("c".into(), (1, reply(100)), now + Duration::from_secs(2));
        assert_eq!(
            c.bytes(),
            entry_bytes("b", &reply(10)) + entry_bytes("c", &reply(100))
        );
        c.purge(now + Duration::from_secs(1));
        assert_eq!((c.len(), c.bytes()), (1, entry_bytes("c", &reply(100))));
        c.purge(now + Duration::from_secs(2));
        assert_eq!((c.len(), c.bytes()), (0, 0));
        let s = stats.snapshot().cache;
        assert_eq!(
            (s.evicted_max_entries, s.evicted_max_bytes, s.too_large),
            (1, 0, 1)
        );
        assert_eq!((s.entries, s.bytes), (0, 0));
    }

    #[test]
    fn the_stored_body_is_a_private_copy() {
        let big = Bytes::from(vec![b'y'; 4096]);
        let view = big.slice(0..10);
        let o = Outcome {
            result: Ok(BackendReply::body(view.clone())),
            queue_time: Duration::ZERO,
            inference_time: None,
            request_id: None,
        };
        let copy = private_copy(&o);
        let body = copy
            .result
            .as_ref()
            .map(|r| r.body.clone())
            .unwrap_or_default();
        assert_eq!(&body[..], &view[..]);
        assert_ne!(body.as_ptr(), view.as_ptr());
    }
}
