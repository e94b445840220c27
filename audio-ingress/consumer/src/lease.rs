//! Lease-based partition ownership: the pure decision logic (no NATS, no tasks).
//!
//! The [`Planner`] holds what one worker knows — the last value it saw of every
//! partition's lease key, the core-NATS heartbeats it heard, the leases it holds — and
//! turns the passage of time into [`Action`]s that the NATS driver
//! ([`crate::ownership`]) executes and reports back. All of it is synchronous and
//! driven by an injected [`Instant`], so the tests run it on a paused clock.
//!
//! Invariants a reader must not break:
//! - **The revision is the fencing token.** A held lease is valid until
//!   `last successful renewal *send* time + TTL − margin` (measured on this worker's
//!   monotonic clock, from before the request left, so a slow reply never extends it).
//!   The planner answers [`Action::Fence`] at that instant at the latest, and at once
//!   when a renewal is refused (`WrongLastRevision`) or the watcher shows another
//!   worker's higher revision for the key. The driver stops delivering the partition's
//!   frames before anything else.
//! - **A timeout is unknown, not lost.** A renewal that timed out leaves the lease held
//!   with its old validity (which keeps running down): a KV leader election stalls
//!   writes for ~5 s, shorter than TTL − margin with the defaults.
//! - **Release fences first.** [`Action::Release`] is only emitted together with the
//!   fence of the same partition, before it: nobody can acquire what this worker still
//!   delivers.
//! - **One operation per partition in flight.** No new claim, renewal or release is
//!   planned for a partition until the previous one reported back.
//! - **Liveness is judged on this worker's own heartbeats heard back** (the *echo
//!   clock*: the send time of the latest own heartbeat that came back), never on the
//!   wall clock alone. A peer is dead when a heartbeat this worker sent at least a
//!   heartbeat timeout after it last heard the peer has come back, and the peer's did
//!   not come in between. Heartbeats share one subscription, delivered in the order
//!   they reached the server, so a worker that was stalled (or cut off) judges nobody
//!   dead on waking: the peers' heartbeats queued during the stall come before its own.
//!   The other half is the [`Liveness`](crate::fence::Liveness) of each worker: it
//!   delivers only until the send time of its latest heartbeat heard back + the
//!   heartbeat timeout, so a worker that stalls or loses its connection stops before a
//!   new owner can deliver (which waits a settle time after its takeover write). Together: a takeover never
//!   overlaps the old owner's deliveries, whether the old owner died, stalled or was
//!   cut off (what remains, an asymmetric route failure between two nodes, is fenced
//!   by the watcher and the next renewal; see docs/scale-out.md).
//! - **Balance, weighted by slots** (docs/scale-out.md § Capacity-weighted share). Each
//!   worker aims at ⌈P × slots / Σ slots of the live workers⌉, or at ⌈P / live⌉ while
//!   any live worker's heartbeats carry no slots: never two scales at once, whose
//!   shares could add up to less than P. It claims up to its share in a worker-specific
//!   order, and releases at most one partition per tick, only to a settled worker below
//!   its share that stays at or below this worker's load per slot
//!   ([`Planner::someone_below`]), and not within a heartbeat timeout of its own last
//!   acquisition: no thundering herd, no ping-pong.
//! - **No partition stays free.** One free (no key, or expired) for more than a
//!   heartbeat timeout is claimed even at the share ([`Planner::claim_long_free`]): the
//!   shares add up to P only while the workers' views agree.
//! - **Takeover.** A partition whose owner is not live is taken by compare-and-swap on
//!   the owner's last revision seen; a key not rewritten for a TTL is taken by
//!   `create` (it has expired). Until its echo clock is a heartbeat timeout past its
//!   start the planner claims nothing: it has not yet had the chance to hear the
//!   others.
//! - **Two winners are possible, the later one stands.** Before nats-server 2.9.21 a
//!   clustered stream checks the expected revision outside its consensus
//!   (nats-server#4320), so two workers racing for one key can both be told they won.
//!   An acquisition is therefore not trusted by itself: the planner refuses it when
//!   the watcher already shows another worker's newer write, fences a held lease when
//!   one arrives later, and the driver starts delivering only a settle time after the
//!   watcher showed its own write (the rival's write is committed right after it).
//! - **A lapse loses everything.** When this worker's liveness ran out (it stalled, or
//!   its heartbeats stopped coming back), [`Planner::lose_all`] fences every held
//!   partition; they are taken back by compare-and-swap from this worker's own last
//!   revision, which fails if anyone took them meanwhile.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::fnv1a_32;

/// The timing of leases (validated by the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) ttl: Duration,
    pub(crate) renew_interval: Duration,
    pub(crate) margin: Duration,
    pub(crate) heartbeat_timeout: Duration,
}

/// What the planner last saw of a partition's key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    owner: String,
    revision: u64,
    /// When this worker saw the write (local clock: server timestamps are another
    /// host's clock).
    at: Instant,
}

/// A lease this worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    revision: u64,
    /// Fence at this instant unless renewed.
    valid_until: Instant,
    /// When the last renewal (successful or not) was sent.
    last_attempt: Instant,
    /// The send time of the first renewal whose outcome is unknown (it timed out)
    /// since the last one known to have landed: a write of ours found later at a
    /// newer revision was sent no earlier than this.
    first_unknown: Option<Instant>,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Stop delivering the partition's frames now (the lease is, or may be, lost).
    Fence(u32),
    /// `create` the key (only if absent).
    Claim(u32),
    /// `update` the key from the dead owner's revision (compare-and-swap).
    TakeOver {
        partition: u32,
        revision: u64,
        from: String,
    },
    /// `update` the key from our revision.
    Renew { partition: u32, revision: u64 },
    /// Delete the key expecting our revision (after [`Action::Fence`] of it).
    Release { partition: u32, revision: u64 },
}

/// One lease as [`crate::Consumer::leases`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LeaseInfo {
    /// The partition.
    pub partition: u32,
    /// The worker that owns it, as last seen (`None`: free or expired).
    pub owner: Option<String>,
    /// The key's revision: the fencing token.
    pub revision: Option<u64>,
    /// Whether this worker holds it.
    pub held: bool,
    /// Whether this worker delivers its frames: held, and the acquisition confirmed by
    /// the watcher (a lease just acquired is held a short settle time before it
    /// delivers; see the ownership driver).
    pub delivering: bool,
    /// Time left: for a held lease until this worker fences it (local validity), for
    /// another worker's lease until its key expires unless renewed (estimated from when
    /// this worker saw the last write).
    #[serde(serialize_with = "ms")]
    pub expires_in: Option<Duration>,
}

fn ms<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&d.map(|d| d.as_millis() as u64), s)
}

/// The decision logic of one worker; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Planner {
    me: String,
    partitions: u32,
    timing: Timing,
    started: Instant,
    view: Vec<Option<Seen>>,
    /// Per peer: when it was first heard (since it was last taken for dead) and last.
    heard: HashMap<String, (Instant, Instant)>,
    /// This worker's slots (`max_streams`): its weight in the balance.
    slots: u64,
    /// Per peer: the slots its last heartbeat carried (absent: it sent none, and the
    /// balance is unweighted while it is live).
    peer_slots: HashMap<String, u64>,
    /// Per partition: since when it is free (no key, or expired) in this worker's view,
    /// out of its start grace; `None` while it is held or owned.
    free_since: Vec<Option<Instant>>,
    held: BTreeMap<u32, Held>,
    in_flight: BTreeSet<u32>,
    /// The echo clock: the send time of the latest own heartbeat heard back.
    echo: Option<Instant>,
    /// When this worker last acquired a lease: no release for a heartbeat timeout
    /// after it (the others' acquisitions of the same failover are not in the view
    /// yet, and a worker that looks below its share may not be).
    last_acquired: Option<Instant>,
    /// Partitions this worker released, and when: not claimed back for a heartbeat
    /// timeout, so that the worker they were released to gets them (no ping-pong).
    released: HashMap<u32, Instant>,
}

impl Planner {
    pub(crate) fn new(me: String, partitions: u32, timing: Timing, now: Instant) -> Self {
        Self {
            me,
            partitions,
            timing,
            started: now,
            view: vec![None; partitions as usize],
            heard: HashMap::new(),
            slots: 1,
            peer_slots: HashMap::new(),
            free_since: vec![None; partitions as usize],
            held: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            echo: None,
            last_acquired: None,
            released: HashMap::new(),
        }
    }

    /// This worker's id.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// This worker's slots (`max_streams`, at least 1): its weight in the balance.
    pub(crate) fn with_slots(mut self, slots: u64) -> Self {
        self.slots = slots.max(1);
        self
    }

    /// A heartbeat of `worker` without slots arrived (a worker of an older version).
    #[cfg(test)]
    pub(crate) fn heard(&mut self, worker: &str, now: Instant) {
        self.heard_with_slots(worker, None, now);
    }

    /// A heartbeat of `worker` arrived, carrying its slots (`None`: it sent none; while
    /// it is live every worker's share is the equal one).
    pub(crate) fn heard_with_slots(&mut self, worker: &str, slots: Option<u64>, now: Instant) {
        if worker == self.me {
            return;
        }
        match slots {
            Some(s) => {
                self.peer_slots.insert(worker.to_owned(), s.max(1));
            }
            None => {
                self.peer_slots.remove(worker);
            }
        }
        let timeout = self.timing.heartbeat_timeout;
        let entry = self.heard.entry(worker.to_owned()).or_insert((now, now));
        if now.saturating_duration_since(entry.1) >= timeout {
            entry.0 = now; // back from the dead: a new life
        }
        entry.1 = now;
    }

    /// This worker's own heartbeat, sent at `sent_at`, came back: the echo clock
    /// moves to it (never backward).
    pub(crate) fn echoed(&mut self, sent_at: Instant) {
        self.echo = Some(self.echo.map_or(sent_at, |e| e.max(sent_at)));
    }

    /// Whether any own heartbeat came back yet.
    pub(crate) fn has_echo(&self) -> bool {
        self.echo.is_some()
    }

    /// The instant against which peers' heartbeats are judged (see the module docs).
    fn echo_clock(&self) -> Instant {
        self.echo.unwrap_or(self.started)
    }

    /// The liveness ran out: every held lease is fenced (returned, ascending). Claims
    /// and renewals in flight still report back.
    pub(crate) fn lose_all(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.held).into_keys().collect()
    }

    /// The watcher saw the key of `partition`: `Some((owner, revision))` for a write,
    /// `None` for a delete or purge. Returns a fence when it shows another worker's
    /// newer revision of a lease held here.
    pub(crate) fn observe(
        &mut self,
        partition: u32,
        value: Option<(String, u64)>,
        now: Instant,
    ) -> Option<Action> {
        let validity = self.validity();
        let slot = self.view.get_mut(partition as usize)?;
        match value {
            Some((owner, revision)) => {
                if slot.as_ref().is_some_and(|s| s.revision > revision) {
                    return None; // an older write delivered late
                }
                *slot = Some(Seen {
                    owner: owner.clone(),
                    revision,
                    at: now,
                });
                self.free_since[partition as usize] = None;
                let h = self.held.get_mut(&partition)?;
                if revision <= h.revision {
                    return None;
                }
                if owner == self.me {
                    // Our own write that we did not hear back about (a renewal that
                    // timed out but landed): continue from it, valid from the first
                    // unknown renewal's send time (the earliest it can have been sent).
                    h.revision = revision;
                    if let Some(sent) = h.first_unknown.take() {
                        h.valid_until = h.valid_until.max(sent + validity);
                    }
                    return None;
                }
                self.held.remove(&partition);
                Some(Action::Fence(partition))
            }
            None => {
                // Free from now on (counted from the next plan), whatever it was before.
                *slot = None;
                self.free_since[partition as usize] = None;
                None
            }
        }
    }

    /// The live workers, this one included, judged on the echo clock.
    pub(crate) fn live(&self) -> BTreeSet<&str> {
        let clock = self.echo_clock();
        let mut live: BTreeSet<&str> = self
            .heard
            .iter()
            .filter(|(_, (_, last))| {
                clock.saturating_duration_since(*last) < self.timing.heartbeat_timeout
            })
            .map(|(w, _)| w.as_str())
            .collect();
        live.insert(&self.me);
        live
    }

    /// Per live worker: its weight and its share. The weights are the slots the
    /// heartbeats announced only when every live worker announced them (this one
    /// always has its own); otherwise every weight is 1, so every worker — including
    /// one of an older version, which computes ⌈P / live⌉ itself — has the same share
    /// and the shares add up to at least P.
    fn shares(&self, live: &BTreeSet<String>) -> HashMap<String, (u64, usize)> {
        let weighted = live
            .iter()
            .all(|w| *w == self.me || self.peer_slots.contains_key(w));
        let weight = |w: &str| match (weighted, w == self.me) {
            (false, _) => 1,
            (true, true) => self.slots,
            (true, false) => self.peer_slots.get(w).copied().unwrap_or(1),
        };
        let total: u64 = live.iter().map(|w| weight(w)).sum();
        live.iter()
            .map(|w| {
                let slots = weight(w);
                (
                    w.clone(),
                    (slots, weighted_share(self.partitions, slots, total)),
                )
            })
            .collect()
    }

    /// The partitions held here, ascending.
    #[cfg(test)]
    pub(crate) fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.held.keys().copied()
    }

    /// What to do now.
    pub(crate) fn plan(&mut self, now: Instant) -> Vec<Action> {
        self.plan_with(now, true)
    }

    /// What to do now, releasing nothing: run when a key was freed (deleted), so that
    /// a worker below its share claims it without waiting for its next tick, while
    /// releases stay one per tick.
    pub(crate) fn plan_claims(&mut self, now: Instant) -> Vec<Action> {
        self.plan_with(now, false)
    }

    fn plan_with(&mut self, now: Instant, release: bool) -> Vec<Action> {
        let mut actions = Vec::new();
        // 1. Fence what ran out of validity.
        let expired: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| now >= h.valid_until)
            .map(|(p, _)| *p)
            .collect();
        for p in expired {
            self.held.remove(&p);
            actions.push(Action::Fence(p));
        }
        // 2. Renew what is due.
        for (&p, h) in &mut self.held {
            if !self.in_flight.contains(&p)
                && now.saturating_duration_since(h.last_attempt) >= self.timing.renew_interval
            {
                h.last_attempt = now;
                self.in_flight.insert(p);
                actions.push(Action::Renew {
                    partition: p,
                    revision: h.revision,
                });
            }
        }
        // 3. Keys that name this worker but are not held here (a claim or takeover
        //    that timed out but landed; leases lost to a lapse) are taken back by CAS
        //    from that revision whatever the share: nobody else takes a live worker's
        //    keys, so left alone they would sit unread until they expire. Balance
        //    releases them later if they are too many. Not for what was released
        //    lately (a stale view of our own write), nor keys old enough to have
        //    expired.
        let mine_unheld: Vec<(u32, u64)> = (0..self.partitions)
            .filter(|p| !self.held.contains_key(p) && !self.in_flight.contains(p))
            .filter(|p| !self.released.contains_key(p))
            .filter_map(|p| match &self.view[p as usize] {
                Some(s)
                    if s.owner == self.me
                        && now.saturating_duration_since(s.at) < self.timing.ttl =>
                {
                    Some((p, s.revision))
                }
                _ => None,
            })
            .collect();
        for (p, revision) in mine_unheld {
            self.in_flight.insert(p);
            actions.push(Action::TakeOver {
                partition: p,
                revision,
                from: self.me.clone(),
            });
        }
        // 4. Balance. Nothing before the others had a chance to be heard.
        if self.echo_clock().saturating_duration_since(self.started) < self.timing.heartbeat_timeout
        {
            return actions;
        }
        self.balance(now, release, &mut actions);
        actions
    }

    /// Claims up to this worker's share, the safety net's claim, and at most one
    /// release (only when `release`).
    fn balance(&mut self, now: Instant, release: bool, actions: &mut Vec<Action>) {
        self.track_free(now);
        let live: BTreeSet<String> = self.live().into_iter().map(str::to_owned).collect();
        let weights = self.shares(&live);
        let share = weights.get(&self.me).map_or(0, |(_, share)| *share);
        let claiming = self.in_flight.iter().filter(|p| !self.held.contains_key(p));
        let mine = self.held.len() + claiming.count();
        let cooldown = self.timing.heartbeat_timeout;
        self.released
            .retain(|_, at| now.saturating_duration_since(*at) < cooldown);
        if mine < share {
            let mut free: Vec<(u32, Action)> = (0..self.partitions)
                .filter(|p| {
                    !self.held.contains_key(p)
                        && !self.in_flight.contains(p)
                        && !self.released.contains_key(p)
                })
                .filter_map(|p| {
                    let action = match &self.view[p as usize] {
                        None => Action::Claim(p),
                        Some(s) if now.saturating_duration_since(s.at) >= self.timing.ttl => {
                            Action::Claim(p)
                        }
                        Some(s) if s.owner == self.me || !live.contains(s.owner.as_str()) => {
                            Action::TakeOver {
                                partition: p,
                                revision: s.revision,
                                from: s.owner.clone(),
                            }
                        }
                        Some(_) => return None,
                    };
                    Some((p, action))
                })
                .collect();
            // A worker-specific order (rendezvous hashing): survivors spread over the
            // orphans instead of all racing for the lowest partition.
            free.sort_by_key(|(p, _)| fnv1a_32(format!("{}/{p}", self.me).as_bytes()));
            for (p, action) in free.into_iter().take(share - mine) {
                self.in_flight.insert(p);
                actions.push(action);
            }
        }
        actions.extend(self.claim_long_free(now));
        let settling = self
            .last_acquired
            .is_some_and(|t| now.saturating_duration_since(t) < self.timing.heartbeat_timeout);
        if release && !settling && self.held.len() >= share && self.someone_below(now, &weights) {
            let candidate = self
                .held
                .iter()
                .rev()
                .find(|(p, _)| !self.in_flight.contains(p))
                .map(|(p, h)| (*p, h.revision));
            if let Some((p, revision)) = candidate {
                self.held.remove(&p);
                self.in_flight.insert(p);
                self.released.insert(p, now);
                actions.push(Action::Fence(p));
                actions.push(Action::Release {
                    partition: p,
                    revision,
                });
            }
        }
    }

    /// Notes since when each partition is free (no key, or expired) in this worker's
    /// view; a partition held, or owned by anyone, is not.
    fn track_free(&mut self, now: Instant) {
        for (p, since) in self.free_since.iter_mut().enumerate() {
            let free = !self.held.contains_key(&(p as u32))
                && match &self.view[p] {
                    None => true,
                    Some(s) => now.saturating_duration_since(s.at) >= self.timing.ttl,
                };
            *since = free.then(|| since.unwrap_or(now));
        }
    }

    /// The safety net: one partition free for more than a heartbeat timeout, claimed
    /// whatever this worker's share. The shares each worker computes add up to P when
    /// the views agree; while they do not (a worker's view of the live set or of the
    /// weights lags, a version that decides otherwise), a partition could sit unread
    /// with everyone at their share. One per plan, in the worker-specific order, never
    /// one in flight or released here lately; the balance releases it later if this
    /// worker then holds too many.
    fn claim_long_free(&mut self, now: Instant) -> Option<Action> {
        let timeout = self.timing.heartbeat_timeout;
        let p = (0..self.partitions)
            .filter(|p| !self.in_flight.contains(p) && !self.released.contains_key(p))
            .filter(|p| {
                self.free_since[*p as usize]
                    .is_some_and(|t| now.saturating_duration_since(t) > timeout)
            })
            .min_by_key(|p| fnv1a_32(format!("{}/{p}", self.me).as_bytes()))?;
        self.in_flight.insert(p);
        Some(Action::Claim(p))
    }

    /// Whether releasing one partition helps a live worker (`weights`: its weight and
    /// share, see [`Planner::shares`]): a settled worker below its own share (so it
    /// claims it) that, after the move, still carries no more partitions per slot than
    /// this worker — with equal weights, one that holds at least two fewer (⌈P/n⌉ at
    /// most, everyone within one of each other). Never back and forth: the move keeps
    /// the receiver at or below this worker's load.
    fn someone_below(&self, now: Instant, weights: &HashMap<String, (u64, usize)>) -> bool {
        let held = self.held.len() as u128;
        let mut counts: HashMap<&str, usize> = weights.keys().map(|w| (w.as_str(), 0)).collect();
        for s in self.view.iter().flatten() {
            if let Some(c) = counts.get_mut(s.owner.as_str()) {
                *c += 1;
            }
        }
        // Only towards a worker out of its start grace: before that it claims nothing,
        // and a partition released to it would sit unread.
        let settled = |w: &str| {
            self.heard.get(w).is_some_and(|(first, _)| {
                now.saturating_duration_since(*first) >= self.timing.heartbeat_timeout
            })
        };
        let me_slots = u128::from(weights.get(&self.me).map_or(1, |(slots, _)| *slots));
        counts.iter().any(|(w, c)| {
            let Some(&(slots_w, share_w)) = weights.get(*w) else {
                return false;
            };
            *w != self.me.as_str()
                && *c < share_w
                && held.saturating_sub(1) * u128::from(slots_w) >= (*c as u128 + 1) * me_slots
                && settled(w)
        })
    }

    /// A claim or takeover sent at `sent_at` succeeded with `revision`; returns the
    /// validity of the new lease, or `None` when the watcher already showed another
    /// worker's newer write of the key (two compare-and-swaps from the same revision
    /// can both succeed on a clustered stream before nats-server 2.9.21 — see
    /// nats-server#4320 — and the later write is the one that stands).
    pub(crate) fn acquired(
        &mut self,
        partition: u32,
        revision: u64,
        sent_at: Instant,
    ) -> Option<Instant> {
        self.in_flight.remove(&partition);
        if self
            .view
            .get(partition as usize)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.revision > revision && s.owner != self.me)
        {
            return None;
        }
        let valid_until = sent_at + self.validity();
        self.last_acquired = Some(self.last_acquired.map_or(sent_at, |t| t.max(sent_at)));
        self.held.insert(
            partition,
            Held {
                revision,
                valid_until,
                last_attempt: sent_at,
                first_unknown: None,
            },
        );
        self.wrote(partition, revision, sent_at);
        Some(valid_until)
    }

    /// The local validity of a held lease.
    pub(crate) fn valid_until(&self, partition: u32) -> Option<Instant> {
        self.held.get(&partition).map(|h| h.valid_until)
    }

    /// An operation reported back without changing what is held: a claim or takeover
    /// that failed (someone else was faster, or no answer), or a release that finished
    /// (deleted, or refused because someone else holds the key).
    pub(crate) fn settled(&mut self, partition: u32) {
        self.in_flight.remove(&partition);
    }

    /// A renewal sent at `sent_at` succeeded: the validity moves forward (nothing when
    /// the lease was fenced meanwhile).
    pub(crate) fn renewed(&mut self, partition: u32, revision: u64, sent_at: Instant) {
        self.in_flight.remove(&partition);
        let validity = self.validity();
        let Some(h) = self.held.get_mut(&partition) else {
            return;
        };
        h.revision = revision;
        h.first_unknown = None;
        h.valid_until = h.valid_until.max(sent_at + validity);
        self.wrote(partition, revision, sent_at);
    }

    /// This worker's own write of `partition`, sent at `sent_at`, landed as `revision`.
    fn wrote(&mut self, partition: u32, revision: u64, sent_at: Instant) {
        if let Some(slot) = self.view.get_mut(partition as usize) {
            *slot = Some(Seen {
                owner: self.me.clone(),
                revision,
                at: sent_at,
            });
        }
    }

    /// The key already carries this worker's newer write (a renewal that timed out
    /// had landed): continue from `revision`, validity unchanged, renew at once.
    pub(crate) fn adopt(&mut self, partition: u32, revision: u64) {
        self.in_flight.remove(&partition);
        let validity = self.validity();
        if let Some(h) = self.held.get_mut(&partition) {
            h.revision = h.revision.max(revision);
            // The landed write was sent no earlier than the first unknown renewal.
            if let Some(sent) = h.first_unknown.take() {
                h.valid_until = h.valid_until.max(sent + validity);
            }
            h.last_attempt = h
                .last_attempt
                .checked_sub(self.timing.renew_interval)
                .unwrap_or(h.last_attempt);
        }
    }

    /// A renewal was refused (`WrongLastRevision` from another writer): fence now.
    pub(crate) fn renew_refused(&mut self, partition: u32) -> Option<Action> {
        self.in_flight.remove(&partition);
        self.lose(partition)
    }

    /// The lease of `partition` turned out not to be this worker's (a read after an
    /// acquisition found another write latest): fence it. In-flight operations still
    /// report back.
    pub(crate) fn lose(&mut self, partition: u32) -> Option<Action> {
        self.held
            .remove(&partition)
            .map(|_| Action::Fence(partition))
    }

    /// A renewal got no answer in time: unknown. The lease stays held; its validity
    /// keeps running down from the last success.
    pub(crate) fn renew_unknown(&mut self, partition: u32, sent_at: Instant) {
        self.in_flight.remove(&partition);
        if let Some(h) = self.held.get_mut(&partition) {
            h.first_unknown.get_or_insert(sent_at);
        }
    }

    /// Every held lease, fenced for shutdown: `(partition, revision)` to release.
    pub(crate) fn fence_all(&mut self) -> Vec<(u32, u64)> {
        let held = std::mem::take(&mut self.held);
        held.into_iter().map(|(p, h)| (p, h.revision)).collect()
    }

    /// The lease table for [`crate::Consumer::leases`].
    pub(crate) fn snapshot(&self, now: Instant) -> Vec<LeaseInfo> {
        let ttl = self.timing.ttl;
        (0..self.partitions)
            .map(|p| {
                let (owner, revision, held, expires_at) =
                    match (self.held.get(&p), &self.view[p as usize]) {
                        (Some(h), _) => {
                            (Some(&self.me), Some(h.revision), true, Some(h.valid_until))
                        }
                        (None, Some(s)) if now.saturating_duration_since(s.at) < ttl => {
                            (Some(&s.owner), Some(s.revision), false, Some(s.at + ttl))
                        }
                        _ => (None, None, false, None),
                    };
                LeaseInfo {
                    partition: p,
                    owner: owner.cloned(),
                    revision,
                    held,
                    delivering: false,
                    expires_in: expires_at.map(|t| t.saturating_duration_since(now)),
                }
            })
            .collect()
    }

    fn validity(&self) -> Duration {
        self.timing.ttl.saturating_sub(self.timing.margin)
    }
}

/// ⌈partitions × slots / total_slots⌉: a worker's share of the partitions (the whole
/// share of ⌈P / n⌉ when every worker has the same slots).
pub(crate) fn weighted_share(partitions: u32, slots: u64, total_slots: u64) -> usize {
    let p = u128::from(partitions);
    let share = (p * u128::from(slots)).div_ceil(u128::from(total_slots.max(1)));
    usize::try_from(share.min(p)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        ttl: Duration::from_secs(10),
        renew_interval: Duration::from_secs(3),
        margin: Duration::from_secs(1),
        heartbeat_timeout: Duration::from_millis(1_500),
    };

    fn claims(actions: &[Action]) -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Claim(p) => Some(*p),
                Action::TakeOver { partition, .. } => Some(*partition),
                _ => None,
            })
            .collect()
    }

    /// Plans at `now` as the driver does after its own heartbeat sent at `now` came
    /// back (the echo clock keeps up with the wall clock).
    fn plan(p: &mut Planner, now: Instant) -> Vec<Action> {
        p.echoed(now);
        p.plan(now)
    }

    fn plan_claims(p: &mut Planner, now: Instant) -> Vec<Action> {
        p.echoed(now);
        p.plan_claims(now)
    }

    async fn step(d: u64) -> Instant {
        tokio::time::advance(Duration::from_millis(d)).await;
        Instant::now()
    }

    #[tokio::test(start_paused = true)]
    async fn waits_to_hear_peers_then_claims_its_share() {
        let mut p = Planner::new("a".into(), 8, T, Instant::now());
        assert!(
            plan(&mut p, Instant::now()).is_empty(),
            "nothing during the grace"
        );
        let now = step(1_000).await;
        p.heard("b", now);
        let now = step(600).await;
        let actions = plan(&mut p, now);
        assert_eq!(claims(&actions).len(), 4, "⌈8/2⌉: {actions:?}");
        // In flight: nothing more is planned for them.
        assert!(claims(&plan(&mut p, now)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_interval_and_fences_when_validity_runs_out() {
        let start = Instant::now();
        let mut p = Planner::new("a".into(), 1, T, start);
        let now = step(1_500).await;
        assert_eq!(plan(&mut p, now), vec![Action::Claim(0)]);
        let valid = p.acquired(0, 7, now);
        assert_eq!(valid, Some(now + Duration::from_secs(9)));
        let now = step(3_000).await;
        assert_eq!(
            plan(&mut p, now),
            vec![Action::Renew {
                partition: 0,
                revision: 7
            }]
        );
        // The renewal times out: unknown, still held, no extension.
        p.renew_unknown(0, now);
        assert_eq!(p.held().collect::<Vec<_>>(), vec![0]);
        let now = step(3_000).await;
        assert!(matches!(
            plan(&mut p, now)[..],
            [Action::Renew { revision: 7, .. }]
        ));
        p.renew_unknown(0, now);
        // 9 s after the last successful send: fenced, even with no answer at all.
        let now = step(2_999).await;
        assert!(!plan(&mut p, now).contains(&Action::Fence(0)));
        let now = step(1).await;
        assert!(plan(&mut p, now).contains(&Action::Fence(0)));
        assert_eq!(p.held().count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn validity_counts_from_the_send_time_not_the_answer() {
        let mut p = Planner::new("a".into(), 1, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        p.acquired(0, 1, now);
        let sent = step(3_000).await;
        plan(&mut p, sent);
        // The answer arrives 2 s after the request left.
        step(2_000).await;
        p.renewed(0, 2, sent);
        assert_eq!(p.valid_until(0), Some(sent + Duration::from_secs(9)));
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_last_revision_or_a_newer_foreign_write_fences_at_once() {
        let mut p = Planner::new("a".into(), 2, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        p.acquired(0, 5, now);
        p.acquired(1, 6, now);
        assert_eq!(p.renew_refused(0), Some(Action::Fence(0)));
        // Our own newer write (a renewal that timed out but landed) is adopted.
        assert_eq!(p.observe(1, Some(("a".into(), 7)), now), None);
        assert_eq!(
            plan(&mut p, now)
                .iter()
                .find(|a| matches!(a, Action::Renew { .. })),
            None
        );
        // An older write delivered late changes nothing; a newer one by b fences.
        assert_eq!(p.observe(1, Some(("b".into(), 4)), now), None);
        assert_eq!(
            p.observe(1, Some(("b".into(), 9)), now),
            Some(Action::Fence(1))
        );
        assert_eq!(p.held().count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn takes_over_a_dead_workers_partitions_by_its_revision() {
        let mut p = Planner::new("a".into(), 4, T, Instant::now());
        let now = Instant::now();
        p.heard("b", now);
        for part in 0..4 {
            p.observe(part, Some(("b".into(), 10 + u64::from(part))), now);
        }
        // b is alive: a claims nothing of b's (share 2, but all 4 are b's and live).
        let now = step(1_500).await;
        p.heard("b", now);
        assert!(claims(&plan(&mut p, now)).is_empty());
        // b goes silent: after the heartbeat timeout a takes all four by CAS.
        let now = step(1_500).await;
        let actions = plan(&mut p, now);
        let mut taken: Vec<(u32, u64)> = actions
            .iter()
            .filter_map(|a| match a {
                Action::TakeOver {
                    partition,
                    revision,
                    from,
                } if from == "b" => Some((*partition, *revision)),
                _ => None,
            })
            .collect();
        taken.sort_unstable();
        assert_eq!(taken, vec![(0, 10), (1, 11), (2, 12), (3, 13)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_key_is_claimed_by_create() {
        let mut p = Planner::new("a".into(), 1, T, Instant::now());
        let now = Instant::now();
        p.observe(0, Some(("b".into(), 3)), now);
        // b keeps heartbeating but stopped renewing (e.g. its KV writes fail).
        for _ in 0..7 {
            let now = step(1_400).await;
            p.heard("b", now);
        }
        let now = step(200).await;
        assert_eq!(plan(&mut p, now), vec![Action::Claim(0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn above_its_share_it_releases_one_per_tick_fence_first() {
        let mut p = Planner::new("a".into(), 4, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        for part in 0..4 {
            p.acquired(part, u64::from(part) + 1, now);
        }
        // A second worker appears with nothing: share 2, but nothing is released to it
        // before it is out of its start grace.
        p.heard("c", now);
        assert!(plan(&mut p, now).is_empty());
        for _ in 0..3 {
            let t = step(500).await;
            p.heard("c", t);
        }
        let now = Instant::now();
        let actions = plan(&mut p, now);
        assert_eq!(
            actions,
            vec![
                Action::Fence(3),
                Action::Release {
                    partition: 3,
                    revision: 4
                }
            ]
        );
        p.settled(3);
        p.observe(3, None, now);
        let actions = plan(&mut p, now);
        assert_eq!(actions.len(), 2, "{actions:?}");
        p.settled(2);
        p.observe(2, None, now);
        // At its share: no more releases, and c now holds what it claimed.
        p.observe(3, Some(("c".into(), 9)), now);
        p.observe(2, Some(("c".into(), 10)), now);
        assert!(plan(&mut p, now).is_empty());
        assert_eq!(p.held().count(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_freed_key_is_claimed_at_once_but_releases_wait_for_the_tick() {
        let mut p = Planner::new("a".into(), 4, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        for part in 0..4 {
            p.acquired(part, 1, now);
        }
        p.heard("c", now);
        assert!(
            plan_claims(&mut p, now).is_empty(),
            "no release outside the tick"
        );
        let mut q = Planner::new("c".into(), 4, T, Instant::now());
        let now = step(1_500).await;
        q.heard("a", now);
        for part in 0..4 {
            q.observe(part, Some(("a".into(), 1)), now);
        }
        assert!(plan_claims(&mut q, now).is_empty());
        q.observe(3, None, now);
        assert_eq!(plan_claims(&mut q, now), vec![Action::Claim(3)]);
    }

    #[tokio::test(start_paused = true)]
    async fn at_its_share_it_still_gives_one_to_a_worker_two_below_and_does_not_take_it_back() {
        let mut p = Planner::new("a".into(), 7, T, Instant::now());
        for part in 0..3 {
            p.acquired(part, 1, Instant::now());
        }
        for _ in 0..4 {
            let now = Instant::now();
            p.heard("b", now);
            p.heard("c", now);
            step(500).await;
        }
        let now = Instant::now();
        p.heard("b", now);
        p.heard("c", now);
        for part in 3..6 {
            p.observe(part, Some(("b".into(), 1)), now);
        }
        p.observe(6, Some(("c".into(), 1)), now);
        // ⌈7/3⌉ = 3: a and b at it, c one below... two below a: a gives one.
        let actions = plan(&mut p, now);
        assert_eq!(
            actions,
            vec![
                Action::Fence(2),
                Action::Release {
                    partition: 2,
                    revision: 1
                }
            ]
        );
        p.settled(2);
        p.observe(2, None, now);
        // a is below its share now, but does not claim back what it just released.
        assert!(plan_claims(&mut p, now).is_empty());
        p.observe(2, Some(("c".into(), 2)), now);
        // 2 / 3 / 2: settled.
        assert!(plan(&mut p, now).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn does_not_release_when_nobody_is_below_the_share() {
        let mut p = Planner::new("a".into(), 5, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        for part in 0..3 {
            p.acquired(part, 1, now);
        }
        p.heard("b", now);
        p.observe(3, Some(("b".into(), 1)), now);
        p.observe(4, Some(("b".into(), 1)), now);
        // share ⌈5/2⌉ = 3: a holds 3, b 2 — balanced, nothing moves.
        assert!(plan(&mut p, now).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn snapshot_shows_owner_revision_and_expiry() {
        let mut p = Planner::new("a".into(), 2, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        p.acquired(0, 4, now);
        p.observe(1, Some(("b".into(), 8)), now);
        let now = step(1_000).await;
        let s = p.snapshot(now);
        assert_eq!(s[0].owner.as_deref(), Some("a"));
        assert!(s[0].held);
        assert_eq!(s[0].revision, Some(4));
        assert_eq!(s[0].expires_in, Some(Duration::from_secs(8)));
        assert_eq!(s[1].owner.as_deref(), Some("b"));
        assert!(!s[1].held);
        assert_eq!(s[1].expires_in, Some(Duration::from_secs(9)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_worker_judges_nobody_dead_before_its_own_heartbeats_come_back() {
        let mut p = Planner::new("a".into(), 4, T, Instant::now());
        let t0 = step(1_500).await;
        p.echoed(t0);
        p.heard("b", t0);
        for part in 0..4 {
            p.observe(part, Some(("b".into(), 1 + u64::from(part))), t0);
        }
        assert!(claims(&p.plan(t0)).is_empty());
        // a stalls for 3 s: on waking its tick may run before it read the heartbeats
        // queued meanwhile. Its echo clock is still t0: b is not dead.
        let woke = step(3_000).await;
        assert!(
            claims(&p.plan(woke)).is_empty(),
            "no takeover on a stale echo clock"
        );
        // b's queued heartbeat comes first, then a's own: still alive.
        p.heard("b", woke);
        p.echoed(woke - Duration::from_millis(500));
        assert!(claims(&p.plan(woke)).is_empty());
        // b really is silent from now on: taken over once a's heartbeat sent a timeout
        // after b's last one came back.
        let t = step(1_499).await;
        p.echoed(t);
        assert!(claims(&p.plan(t)).is_empty());
        let t = step(1).await;
        p.echoed(t);
        assert_eq!(claims(&p.plan(t)).len(), 4, "b is dead by a's echo clock");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapse_loses_every_lease_and_takes_them_back_from_its_own_revision() {
        let mut p = Planner::new("a".into(), 2, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        p.acquired(0, 5, now);
        p.acquired(1, 6, now);
        assert_eq!(p.lose_all(), vec![0, 1]);
        assert_eq!(p.held().count(), 0);
        let now = step(100).await;
        let mut actions = plan(&mut p, now);
        actions.sort_by_key(|a| format!("{a:?}"));
        assert_eq!(
            actions,
            vec![
                Action::TakeOver {
                    partition: 0,
                    revision: 5,
                    from: "a".into()
                },
                Action::TakeOver {
                    partition: 1,
                    revision: 6,
                    from: "a".into()
                },
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_its_own_heartbeats_back_a_worker_claims_nothing() {
        let mut p = Planner::new("a".into(), 2, T, Instant::now());
        let now = step(10_000).await;
        assert!(!p.has_echo());
        assert!(
            p.plan(now).is_empty(),
            "the grace never ends without an echo"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquisition_behind_a_newer_foreign_write_is_refused() {
        let mut p = Planner::new("a".into(), 1, T, Instant::now());
        let now = step(1_500).await;
        assert_eq!(plan(&mut p, now), vec![Action::Claim(0)]);
        // Both compare-and-swaps "succeeded"; the watcher showed b's write first.
        p.observe(0, Some(("b".into(), 74)), now);
        assert_eq!(p.acquired(0, 73, now), None);
        assert_eq!(p.held().count(), 0);
        assert_eq!(p.valid_until(0), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_naming_this_worker_is_taken_back_even_at_its_share() {
        let mut p = Planner::new("a".into(), 2, T, Instant::now());
        let now = step(1_500).await;
        p.heard("b", now);
        let claimed = claims(&plan(&mut p, now));
        assert_eq!(claimed.len(), 1, "share ⌈2/2⌉ = 1");
        let (mine, other) = (claimed[0], 1 - claimed[0]);
        p.acquired(mine, 3, now);
        p.observe(other, Some(("b".into(), 4)), now);
        assert!(claims(&plan(&mut p, now)).is_empty(), "at its share");
        // The other partition now names a, which does not hold it: a takeover of a's
        // that timed out at a's side but landed. a takes it back by CAS although it is
        // at its share.
        p.observe(other, Some(("a".into(), 5)), now);
        assert_eq!(
            plan(&mut p, now),
            vec![Action::TakeOver {
                partition: other,
                revision: 5,
                from: "a".into()
            }]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_renewal_found_landed_extends_from_its_earliest_send_time() {
        let mut p = Planner::new("a".into(), 1, T, Instant::now());
        let now = step(1_500).await;
        plan(&mut p, now);
        p.acquired(0, 1, now);
        // Two renewals time out (a KV leader election, acks slower than the bound)...
        let first = step(3_000).await;
        plan(&mut p, first);
        p.renew_unknown(0, first);
        let second = step(3_000).await;
        plan(&mut p, second);
        p.renew_unknown(0, second);
        assert_eq!(p.valid_until(0), Some(now + Duration::from_secs(9)));
        // ... but landed: the next one is refused, the key names a at revision 3.
        p.adopt(0, 3);
        assert_eq!(
            p.valid_until(0),
            Some(first + Duration::from_secs(9)),
            "valid from the first unknown renewal's send time, not the second's"
        );
        // The same through the watcher.
        let third = step(3_000).await;
        plan(&mut p, third);
        p.renew_unknown(0, third);
        assert_eq!(p.observe(0, Some(("a".into(), 4)), third), None);
        assert_eq!(p.valid_until(0), Some(third + Duration::from_secs(9)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_partition_free_for_over_a_heartbeat_timeout_is_claimed_even_at_the_share() {
        let mut p = Planner::new("a".into(), 4, T, Instant::now());
        let start = step(1_500).await;
        p.heard("b", start);
        let mine = claims(&plan(&mut p, start));
        assert_eq!(mine.len(), 2, "share ⌈4/2⌉ = 2");
        for part in &mine {
            p.acquired(*part, 1, start);
        }
        let others: Vec<u32> = (0..4).filter(|x| !mine.contains(x)).collect();
        // b holds one of the other two and, below its share, should claim the last
        // one, but does not (its view differs): a is at its share and waits...
        p.observe(others[0], Some(("b".into(), 2)), start);
        let mut now = start;
        while now.saturating_duration_since(start) < T.heartbeat_timeout {
            now = step(250).await;
            p.heard("b", now);
            assert!(plan(&mut p, now).is_empty(), "free for {:?}", now - start);
        }
        // ... then claims it: free for more than a heartbeat timeout.
        let now = step(250).await;
        p.heard("b", now);
        assert_eq!(plan(&mut p, now), vec![Action::Claim(others[1])]);
        // One operation in flight: not claimed again until it reports back.
        assert!(plan(&mut p, now).is_empty());
        // b won the race after all: the partition is owned, nothing more to claim.
        p.observe(others[1], Some(("b".into(), 3)), now);
        p.settled(others[1]);
        let now = step(2_000).await;
        p.heard("b", now);
        assert!(claims(&plan(&mut p, now)).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn no_release_within_a_heartbeat_timeout_of_its_own_last_acquisition() {
        let mut p = Planner::new("a".into(), 4, T, Instant::now());
        for _ in 0..4 {
            let now = Instant::now();
            p.heard("c", now);
            step(500).await;
        }
        let now = Instant::now();
        p.heard("c", now);
        for part in 0..4 {
            p.acquired(part, 1, now);
        }
        // c looks two below (its own takeovers may just not be in a's view yet).
        assert!(plan(&mut p, now).is_empty(), "settling: no release");
        let t = step(1_499).await;
        p.heard("c", t);
        assert!(plan(&mut p, t).is_empty());
        let t = step(1).await;
        p.heard("c", t);
        assert!(
            plan(&mut p, t).contains(&Action::Fence(3)),
            "settled: one is released"
        );
    }
}

#[cfg(test)]
mod weighted_tests;
