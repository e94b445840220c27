//! The door's view of the recognition fleet: the workers' latest valid announcements,
//! the lease bucket's owners, and the streams this door admitted and still holds.
//! Pure and synchronous (the clock is a parameter): [`crate::capacity::listen`] feeds
//! it, [`crate::capacity::Capacity::admit`] asks it.
//!
//! Invariants:
//! - only announcements for the door's own subject template and partition count are
//!   kept; per worker id, one instance at a time (a second instance is ignored while
//!   the first is live) and its `seq` strictly increases;
//! - a worker is live for [`gone_after`] its interval after the receipt (monotonic
//!   clock) of its last valid announcement; a gone worker's slots count nowhere;
//! - in lease mode, once the bucket's view is complete, a partition's worker is the
//!   bucket's owner and nothing a worker announces about partitions changes that
//!   (until it is complete — at start, or while the watcher is re-created — the
//!   announced partitions decide, as in static mode);
//! - nothing was heard → every stream is admitted; a partition whose worker never
//!   announced (a silent worker) is admitted;
//! - an admitted stream is reserved from its admission, bound to its id once the
//!   registry opened it (replacing a finished stream of the same id whose ticket has
//!   not dropped yet), and released exactly once when its ticket drops (a token tells
//!   a stale release from the current one); it counts against its worker's slots until
//!   that worker's announcement lists it;
//! - a worker delivers a partition only while its latest announcement lists it: a
//!   worker that stops listing a partition it claimed (it is shutting down, or lost
//!   the lease) gets no new stream there;
//! - a worker's refusal ends a held stream only when it comes from the worker the
//!   stream was admitted to or the one serving its partition now;
//! - the maps are bounded: at most [`MAX_WORKERS`] workers, the partitions of the
//!   template, the streams the registry admitted.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use weir_protocol::StreamId;
use weir_protocol::audio::ws::Event;
use weir_protocol::capacity::{Announcement, OwnershipKind, gone_after};
use weir_protocol::partition::partition_of;

/// Most workers remembered (live or gone); a new one beyond it replaces the gone one
/// heard longest ago, or is ignored (`too_many_workers`) when every one is live.
pub const MAX_WORKERS: usize = 4_096;
/// Bounds of an estimated `Retry-After`.
pub const RETRY_AFTER_RANGE: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(30));
/// The window over which freed slots are counted for the `Retry-After` estimate.
const FREE_RATE_WINDOW: Duration = Duration::from_secs(30);

/// Why a stream is refused (label `reason` of the refusal metrics).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefuseReason {
    /// The partition's worker stopped announcing, or announces that it no longer
    /// delivers it (shutting down).
    Gone,
    /// The partition has no owner in the lease bucket, or its owner does not deliver
    /// it (yet).
    Orphaned,
    /// The worker's slots are taken (its live streams plus those this door admitted
    /// that it has not listed yet).
    Full,
    /// The worker's lag is above `capacity.max_lag_ms`.
    Lagging,
}

/// The fleet's answer for a new stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Admit; the worker that will serve it, when one announces.
    Admit(Option<String>),
    /// Refuse, with an estimated `Retry-After`.
    Refuse(NoCapacity),
}

/// A refused stream: why, and when to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoCapacity {
    /// Why.
    pub reason: RefuseReason,
    /// The estimated `Retry-After`: when capacity is likely back.
    pub retry_after: Duration,
    /// The worker concerned, if any.
    pub worker: Option<String>,
}

/// What an admitted producer is told about its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Its event: [`Event::Degraded`] when its worker's lag for it is above the
    /// threshold, [`Event::Recovered`] when it is back below.
    Lag(Event),
    /// The worker refused the stream (`max_streams`).
    Refused,
}

/// The door's template and thresholds.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    /// The door's subject template (as written).
    pub subject: String,
    /// The door's partition count.
    pub partitions: NonZeroU32,
    /// `capacity.max_lag_ms`.
    pub max_lag: Duration,
}

struct Worker {
    ann: Announcement,
    received: Instant,
    /// The partitions of its last announcement that claimed any (a worker's last
    /// announcement at shutdown lists none): what it leaves orphaned when gone.
    claimed: Vec<u32>,
}

impl Worker {
    fn live(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.received) < gone_after(self.ann.interval_ms)
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(self.ann.interval_ms)
    }
}

/// A stream this door admitted and holds.
struct Held {
    token: u64,
    worker: Option<String>,
    /// Its worker's latest announcement lists it (or lists only some, truncated).
    listed: bool,
    degraded: bool,
    tx: mpsc::Sender<Notice>,
}

/// The lease bucket's view.
struct Lease {
    bucket: String,
    owners: HashMap<u32, String>,
    /// The watcher delivered the bucket's current state.
    synced: bool,
}

/// Totals for the gauges.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FleetTotals {
    /// Live workers.
    pub live_workers: u64,
    /// Their slots.
    pub slots: u64,
    /// Their slots not taken by a live stream.
    pub free_slots: u64,
    /// p99 of the lag of their listed streams, ms.
    pub lag_p99_ms: u64,
}

/// The fleet view (see the module docs).
pub struct Fleet {
    settings: FleetSettings,
    workers: HashMap<String, Worker>,
    lease: Option<Lease>,
    heard: bool,
    held: HashMap<String, Held>,
    /// Admitted streams the registry has not opened yet: token → their worker.
    reserved: HashMap<u64, Option<String>>,
    /// Per worker, the held and reserved streams its latest announcement does not list
    /// (recounted at each announcement, moved on by `reserve`, `bind` and `release`).
    unlisted: HashMap<String, u64>,
    next_token: u64,
    /// Slots freed (a live count going down) with their time, for `Retry-After`.
    frees: VecDeque<(Instant, u64)>,
    /// The first announcement accepted: the start of the free-rate window.
    first_heard: Option<Instant>,
}

/// What an accepted announcement changed.
#[derive(Debug, Default)]
pub struct Accepted {
    /// The lease bucket was learnt from it: start watching it.
    pub watch_bucket: Option<String>,
    /// Partitions it claims that the bucket gives to another worker (not trusted).
    pub not_owned: u64,
    /// Notices sent (`degraded`).
    pub degraded_sent: u64,
}

impl Fleet {
    /// An empty view.
    pub fn new(settings: FleetSettings) -> Self {
        Self {
            settings,
            workers: HashMap::new(),
            lease: None,
            heard: false,
            held: HashMap::new(),
            reserved: HashMap::new(),
            unlisted: HashMap::new(),
            next_token: 0,
            frees: VecDeque::new(),
            first_heard: None,
        }
    }

    /// The settings.
    pub fn settings(&self) -> &FleetSettings {
        &self.settings
    }

    /// Takes a decoded, fresh announcement received at `now`; `Err(kind)` when it is
    /// ignored (the kind is the metric label).
    pub fn accept(&mut self, ann: Announcement, now: Instant) -> Result<Accepted, &'static str> {
        if ann.subject != self.settings.subject
            || ann.partitions_total != self.settings.partitions.get()
        {
            return Err("other_subject");
        }
        let mut out = Accepted::default();
        let mut freed = 0;
        match self.workers.get(&ann.worker) {
            Some(w) if w.ann.instance != ann.instance => {
                if w.live(now) {
                    return Err("instance_conflict");
                }
            }
            Some(w) if ann.seq <= w.ann.seq => return Err("seq_not_increasing"),
            Some(w) => freed = w.ann.live_streams.saturating_sub(ann.live_streams),
            None => {
                if self.workers.len() >= MAX_WORKERS && !self.evict_gone(now) {
                    return Err("too_many_workers");
                }
            }
        }
        if let (OwnershipKind::Lease, Some(bucket)) = (ann.ownership, &ann.lease_bucket) {
            match &self.lease {
                None => {
                    self.lease = Some(Lease {
                        bucket: bucket.clone(),
                        owners: HashMap::new(),
                        synced: false,
                    });
                    out.watch_bucket = Some(bucket.clone());
                }
                Some(l) if &l.bucket != bucket => return Err("other_bucket"),
                Some(l) if l.synced => {
                    out.not_owned = ann
                        .partitions
                        .iter()
                        .filter(|p| l.owners.get(p).is_some_and(|o| o != &ann.worker))
                        .count() as u64;
                }
                Some(_) => {}
            }
        }
        if freed > 0 {
            self.frees.push_back((now, freed));
        }
        while self
            .frees
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > FREE_RATE_WINDOW)
            || self.frees.len() > 4_096
        {
            self.frees.pop_front();
        }
        out.degraded_sent = self.notify_streams(&ann);
        let claimed = if ann.partitions.is_empty() {
            self.workers
                .get(&ann.worker)
                .filter(|w| w.ann.instance == ann.instance)
                .map(|w| w.claimed.clone())
                .unwrap_or_default()
        } else {
            ann.partitions.clone()
        };
        self.heard = true;
        self.first_heard.get_or_insert(now);
        self.workers.insert(
            ann.worker.clone(),
            Worker {
                ann,
                received: now,
                claimed,
            },
        );
        Ok(out)
    }

    /// Removes the gone worker heard longest ago; `false` when every one is live.
    fn evict_gone(&mut self, now: Instant) -> bool {
        let oldest = self
            .workers
            .iter()
            .filter(|(_, w)| !w.live(now))
            .min_by_key(|(_, w)| w.received)
            .map(|(id, _)| id.clone());
        oldest.is_some_and(|id| self.workers.remove(&id).is_some())
    }

    /// Marks the held streams `ann` lists (and sends `degraded`/`recovered`); the
    /// number of `degraded` notices sent.
    fn notify_streams(&mut self, ann: &Announcement) -> u64 {
        let threshold_ms = u64::try_from(self.settings.max_lag.as_millis()).unwrap_or(u64::MAX);
        let mut sent = 0;
        for h in self.held.values_mut() {
            if h.worker.as_deref() == Some(ann.worker.as_str()) {
                h.listed = ann.streams_truncated;
            }
        }
        for s in &ann.streams {
            let Some(h) = self.held.get_mut(&s.id) else {
                continue;
            };
            h.listed = true;
            h.worker = Some(ann.worker.clone());
            if s.lag_ms > threshold_ms {
                h.degraded = true;
                let notice = Notice::Lag(Event::Degraded {
                    lag_ms: s.lag_ms,
                    threshold_ms,
                    worker: ann.worker.clone(),
                });
                if h.tx.try_send(notice).is_ok() {
                    sent += 1;
                }
            } else if h.degraded
                && h.tx
                    .try_send(Notice::Lag(Event::Recovered { lag_ms: s.lag_ms }))
                    .is_ok()
            {
                // Still `degraded` when the queue was full: `recovered` goes with the
                // next announcement.
                h.degraded = false;
            }
        }
        self.unlisted.clear();
        let unlisted = self.held.values().filter(|h| !h.listed).map(|h| &h.worker);
        for w in unlisted.chain(self.reserved.values()).flatten() {
            *self.unlisted.entry(w.clone()).or_default() += 1;
        }
        sent
    }

    /// The owner the lease bucket gives `partition` (`None`: no key, or deleted).
    pub fn set_owner(&mut self, partition: u32, owner: Option<String>) {
        if partition >= self.settings.partitions.get() {
            return;
        }
        if let Some(l) = &mut self.lease {
            match owner {
                Some(o) => l.owners.insert(partition, o),
                None => l.owners.remove(&partition),
            };
        }
    }

    /// Whether the lease view is complete (`false` while a watcher is re-created: the
    /// owners are cleared and refilled from its history).
    pub fn set_lease_synced(&mut self, synced: bool) {
        if let Some(l) = &mut self.lease {
            if !synced {
                l.owners.clear();
            }
            l.synced = synced;
        }
    }

    /// The decision for a new stream `id` at `now` (no side effect).
    pub fn decide(&self, id: &StreamId, now: Instant) -> Decision {
        if !self.heard {
            return Decision::Admit(None);
        }
        let p = partition_of(id, self.settings.partitions);
        match &self.lease {
            Some(l) if l.synced => match l.owners.get(&p) {
                None => self.refuse(RefuseReason::Orphaned, None, now),
                Some(owner) => match self.workers.get(owner) {
                    None => Decision::Admit(None),
                    Some(w) if !w.live(now) => self.refuse(RefuseReason::Gone, Some(w), now),
                    // The owner is not delivering it: shutting down, or its feed not
                    // started yet after a takeover.
                    Some(w) if !w.ann.partitions.contains(&p) => {
                        self.refuse(RefuseReason::Orphaned, Some(w), now)
                    }
                    Some(w) => self.check(w, now),
                },
            },
            _ => self.decide_by_claims(p, now),
        }
    }

    /// Static mode (or a lease view not complete yet): the workers that announce `p`.
    fn decide_by_claims(&self, p: u32, now: Instant) -> Decision {
        let mut gone = None;
        let mut best: Option<Decision> = None;
        for w in self.workers.values() {
            let delivers = w.ann.partitions.contains(&p);
            if !w.live(now) || !delivers {
                // Gone, or leaving: it claimed `p` and its latest announcement no
                // longer lists it.
                if w.claimed.contains(&p) {
                    gone = Some(w);
                }
                continue;
            }
            let d = self.check(w, now);
            if matches!(d, Decision::Admit(_)) {
                return d;
            }
            best.get_or_insert(d);
        }
        match (best, gone) {
            (Some(d), _) => d,
            (None, Some(w)) => self.refuse(RefuseReason::Gone, Some(w), now),
            (None, None) => Decision::Admit(None),
        }
    }

    /// A live worker: lagging, full, or admitted.
    fn check(&self, w: &Worker, now: Instant) -> Decision {
        if Duration::from_millis(w.ann.lag_ms) > self.settings.max_lag {
            return self.refuse(RefuseReason::Lagging, Some(w), now);
        }
        let unlisted = self.unlisted.get(&w.ann.worker).copied().unwrap_or(0);
        if w.ann.live_streams.saturating_add(unlisted) >= w.ann.max_streams {
            return self.refuse(RefuseReason::Full, Some(w), now);
        }
        Decision::Admit(Some(w.ann.worker.clone()))
    }

    fn refuse(&self, reason: RefuseReason, w: Option<&Worker>, now: Instant) -> Decision {
        Decision::Refuse(NoCapacity {
            reason,
            retry_after: self.retry_after(reason, w, now),
            worker: w.map(|w| w.ann.worker.clone()),
        })
    }

    /// The `Retry-After` estimate (docs/audio-ingress.md § Recognition capacity):
    /// `full`: the time one slot takes to free at the fleet's rate over the last 30 s
    /// (or since the first announcement, when that is shorter);
    /// `lagging`: the lag above the threshold; `gone`/`orphaned`: a worker's
    /// [`gone_after`] (a lease taken over, a worker restarted); the worker's interval
    /// without a better figure; always within [`RETRY_AFTER_RANGE`].
    fn retry_after(&self, reason: RefuseReason, w: Option<&Worker>, now: Instant) -> Duration {
        let interval = w
            .map(Worker::interval)
            .or_else(|| self.workers.values().map(Worker::interval).min())
            .unwrap_or(Duration::from_secs(1));
        let estimate = match reason {
            RefuseReason::Full => {
                let freed: u64 = self.frees.iter().map(|(_, n)| n).sum();
                let span = self
                    .first_heard
                    .map(|t| now.saturating_duration_since(t))
                    .unwrap_or_default()
                    .clamp(interval, FREE_RATE_WINDOW.max(interval));
                if freed == 0 {
                    interval
                } else {
                    span / u32::try_from(freed).unwrap_or(u32::MAX)
                }
            }
            RefuseReason::Lagging => w
                .map(|w| Duration::from_millis(w.ann.lag_ms).saturating_sub(self.settings.max_lag))
                .unwrap_or(interval)
                .max(interval),
            RefuseReason::Gone | RefuseReason::Orphaned => {
                gone_after(u64::try_from(interval.as_millis()).unwrap_or(1_000))
            }
        };
        estimate.clamp(RETRY_AFTER_RANGE.0, RETRY_AFTER_RANGE.1)
    }

    /// Reserves a slot of `worker` (`None`: no announcing worker serves it) for a
    /// stream just admitted; its token.
    pub fn reserve(&mut self, worker: Option<String>) -> u64 {
        self.next_token += 1;
        let token = self.next_token;
        if let Some(w) = &worker {
            *self.unlisted.entry(w.clone()).or_default() += 1;
        }
        self.reserved.insert(token, worker);
        token
    }

    /// Binds reservation `token` to stream `id`, which the registry has just opened:
    /// from now on the stream's notices go to `tx`. A stream of the same id still held
    /// (finished, its ticket not dropped yet) is let go first. `false` when `token`
    /// is not reserved (already bound or released).
    pub fn bind(&mut self, id: &StreamId, token: u64, tx: mpsc::Sender<Notice>) -> bool {
        let Some(worker) = self.reserved.remove(&token) else {
            return false;
        };
        if let Some(old) = self.held.remove(id.as_str()) {
            self.unaccount(&old);
        }
        self.held.insert(
            id.as_str().to_owned(),
            Held {
                token,
                worker,
                listed: false,
                degraded: false,
                tx,
            },
        );
        true
    }

    /// Reserves and binds at once (a stream opened without a registry in between).
    pub fn hold(&mut self, id: &StreamId, worker: Option<String>, tx: mpsc::Sender<Notice>) -> u64 {
        let token = self.reserve(worker);
        self.bind(id, token, tx);
        token
    }

    /// Releases the stream reserved or held with `token` (a token bound to `id` that
    /// a newer stream of the same id has replaced releases nothing).
    pub fn release(&mut self, id: &str, token: u64) {
        if let Some(worker) = self.reserved.remove(&token) {
            self.uncount(worker.as_deref());
        } else if self.held.get(id).is_some_and(|h| h.token == token)
            && let Some(h) = self.held.remove(id)
        {
            self.unaccount(&h);
        }
    }

    /// Takes a held stream that is let go out of its worker's unlisted count.
    fn unaccount(&mut self, h: &Held) {
        if !h.listed {
            self.uncount(h.worker.as_deref());
        }
    }

    fn uncount(&mut self, worker: Option<&str>) {
        if let Some(w) = worker
            && let Some(n) = self.unlisted.get_mut(w)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.unlisted.remove(w);
            }
        }
    }

    /// The notice channel of held stream `id` for a refusal from `worker`:
    /// `Err("refusal_not_held")` when this door does not hold it,
    /// `Err("refusal_other_worker")` when `worker` is neither the one it was admitted
    /// to nor the one serving its partition now (a stream with no known worker takes a
    /// refusal from any).
    pub fn refusal_sender(
        &self,
        id: &StreamId,
        worker: &str,
    ) -> Result<mpsc::Sender<Notice>, &'static str> {
        let h = self.held.get(id.as_str()).ok_or("refusal_not_held")?;
        let admitted_to = h.worker.as_deref();
        if admitted_to.is_none() || admitted_to == Some(worker) || self.serves(worker, id) {
            Ok(h.tx.clone())
        } else {
            Err("refusal_other_worker")
        }
    }

    /// Whether `worker` serves `id`'s partition now: the lease bucket's owner once the
    /// view is complete, else a worker whose announcement lists the partition.
    fn serves(&self, worker: &str, id: &StreamId) -> bool {
        let p = partition_of(id, self.settings.partitions);
        match &self.lease {
            Some(l) if l.synced => l.owners.get(&p).is_some_and(|o| o == worker),
            _ => self
                .workers
                .get(worker)
                .is_some_and(|w| w.ann.partitions.contains(&p)),
        }
    }

    /// Whether the lease bucket's view is complete (`None`: no lease-mode worker heard).
    pub fn lease_synced(&self) -> Option<bool> {
        self.lease.as_ref().map(|l| l.synced)
    }

    /// Whether `worker` is known and live at `now`.
    pub fn is_live(&self, worker: &str, now: Instant) -> bool {
        self.workers.get(worker).is_some_and(|w| w.live(now))
    }

    /// Streams held.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// Totals over the live workers.
    pub fn totals(&self, now: Instant) -> FleetTotals {
        let mut t = FleetTotals::default();
        let mut lags = Vec::new();
        for w in self.workers.values().filter(|w| w.live(now)) {
            t.live_workers += 1;
            t.slots += w.ann.max_streams;
            t.free_slots += w.ann.free_slots();
            lags.extend(w.ann.streams.iter().map(|s| s.lag_ms));
        }
        if !lags.is_empty() {
            lags.sort_unstable();
            let i = (lags.len() * 99).div_ceil(100).saturating_sub(1);
            t.lag_p99_ms = lags[i.min(lags.len() - 1)];
        }
        t
    }
}

#[cfg(test)]
mod tests;
