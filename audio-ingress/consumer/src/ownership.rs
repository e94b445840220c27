//! Lease ownership over NATS (`ownership = { lease = ... }`): the driver that runs the
//! [`Planner`](crate::lease::Planner) against a JetStream KV bucket and core-NATS
//! heartbeats, and starts and fences one feed per held partition. The protocol (the
//! bucket, its operations, the heartbeats, validity and fencing) is docs/scale-out.md
//! § The lease protocol.
//!
//! Invariants:
//! - Each KV operation runs in its own task, bounded by a third of the renewal interval
//!   (1 s by default), so one stalled write never delays another partition's renewal; a
//!   timeout is unknown, never a loss, and a renewal is retried at the next tick.
//! - A renewal refused with `WrongLastRevision` reads the key once through the stream's
//!   leader: this worker at a newer revision (a timed-out renewal that landed) is
//!   adopted; another owner, or none, fences; anything else is unknown like a timeout.
//! - The connection must not be `no_echo`: the worker's own heartbeats drive the
//!   planner's echo clock and the [`Liveness`] every fence depends on. When the liveness
//!   has run out, every held partition is fenced (`stalled`) before anything else.
//! - A feed (one core subscription and one demultiplexer behind a [`Fence`]) starts only
//!   [`CONFIRM_SETTLE`] after the watcher showed this worker's own acquisition write, so
//!   that a rival that won the same compare-and-swap (nats-server#4320) is seen first.
//!   The fence also closes by itself at the lease's local validity, even if this task is
//!   late.
//! - Shutdown drains every feed within the grace period (the leases stay valid), then
//!   fences and deletes every held key, so that successors take over at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use futures::StreamExt;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::config::LeaseSettings;
use crate::demux::Demux;
use crate::fence::{Fence, Liveness};
use crate::handler::HandlerFactory;
use crate::lease::{Action, LeaseInfo, Planner};
use crate::metrics as m;
use crate::stop::{self, StopSender, StopSignal};
use crate::{ConsumerError, ConsumerErrorKind, OperationError, Shared, run_subscription};
use weir_protocol::WireName;
use weir_service::nats::kv_stream_config;
use weir_service::sync::locked;

mod bucket;

use bucket::{key, open_bucket, partition_of, read_own, run_watcher, update};

/// Bound of the bucket setup at start.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of one setup attempt (a node that just joined a cluster may leave JetStream
/// requests unanswered for a while; another attempt may go elsewhere or succeed).
const SETUP_ATTEMPT: Duration = Duration::from_secs(2);
/// Pause between two bucket setup attempts.
const SETUP_RETRY: Duration = Duration::from_millis(250);
/// How long shutdown waits for the releases after the feeds drained.
pub(crate) const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause before re-creating a failed watcher.
const WATCH_RETRY: Duration = Duration::from_millis(500);
/// Watcher entries buffered for the driver (a full buffer makes the watcher wait).
const WATCH_CHANNEL: usize = 1_024;
/// The heartbeat header carrying `<nonce> <send time, µs since the driver started>`.
const BEAT_HEADER: &str = "Weir-Lease-Beat";
/// The heartbeat header carrying the worker's slots (`max_streams`), its weight in the
/// balance; while a live worker's heartbeats lack it (an older worker), the balance is
/// unweighted for everyone (see [`crate::lease`]).
pub(crate) const SLOTS_HEADER: &str = "Weir-Lease-Slots";

/// The lease table, as [`crate::Consumer::leases`] reads it.
pub(crate) type LeaseBoard = Mutex<Vec<LeaseInfo>>;

/// Sets up the bucket and the heartbeat subscription, then spawns the driver.
pub(crate) async fn start<F: HandlerFactory>(
    client: async_nats::Client,
    shared: Arc<Shared>,
    lease: LeaseSettings,
    factory: Arc<F>,
    stop: StopSignal,
) -> Result<(JoinHandle<()>, Arc<LeaseBoard>), ConsumerError> {
    // Retried within the bound: right after a cluster starts (or while its meta leader
    // moves) JetStream answers "temporarily unavailable", and workers starting together
    // race to create the same stream.
    let deadline = Instant::now() + SETUP_TIMEOUT;
    let (stream, kv) = loop {
        let attempt = deadline.min(Instant::now() + SETUP_ATTEMPT);
        let error = match tokio::time::timeout_at(attempt, open_bucket(&client, &lease)).await {
            Ok(Ok(kv)) => break kv,
            Ok(Err(e)) => e,
            Err(_) => OperationError::new(
                ConsumerErrorKind::Lease,
                format!(
                    "lease bucket {:?}: no answer within {SETUP_ATTEMPT:?}",
                    lease.bucket
                ),
            ),
        };
        if Instant::now() + SETUP_RETRY >= deadline {
            return Err(ConsumerError::Operation(error));
        }
        tracing::warn!(
            bucket = lease.bucket,
            error = %error,
            "lease bucket not ready; retrying"
        );
        tokio::time::sleep(SETUP_RETRY).await;
    };
    let heartbeats = crate::subscribe(&client, vec![lease.heartbeat_subject()], SETUP_TIMEOUT)
        .await?
        .into_iter()
        .next()
        .map(|(_, sub)| sub)
        .ok_or_else(|| {
            ConsumerError::Operation(OperationError::new(
                ConsumerErrorKind::Lease,
                format!("lease bucket {:?}: no heartbeat subscription", lease.bucket),
            ))
        })?;
    let board = Arc::new(LeaseBoard::default());
    let partitions = shared.settings.partitions.get();
    let started = Instant::now();
    let driver = Driver {
        planner: Planner::new(lease.worker_id.clone(), partitions, lease.timing, started)
            .with_slots(shared.settings.max_streams.get() as u64),
        started,
        nonce: crate::capacity::random_nonce(),
        liveness: Arc::new(Liveness::new(started)),
        warned_no_echo: false,
        had_owner: vec![false; partitions as usize],
        client,
        kv,
        stream,
        shared,
        factory,
        lease,
        feeds: HashMap::new(),
        pending: HashMap::new(),
        own_seen: HashMap::new(),
        feed_tasks: JoinSet::new(),
        ops: JoinSet::new(),
        board: board.clone(),
    };
    Ok((tokio::spawn(driver.run(heartbeats, stop)), board))
}

/// How long after the watcher showed this worker's own acquisition write a partition
/// starts delivering: a rival write that won the same compare-and-swap (nats-server
/// #4320) is committed right after ours and shows up in the same watcher well within
/// it; then this worker fences without ever having delivered.
const CONFIRM_SETTLE: Duration = Duration::from_millis(250);

/// A pending lease the watcher did not confirm within this is read through the
/// stream's leader instead (a watcher being re-created, or lagging).
const CONFIRM_READ_AFTER: Duration = Duration::from_secs(1);

/// An acquired lease whose feed has not started yet.
#[derive(Debug, Clone, Copy)]
struct Pending {
    revision: u64,
    handover: bool,
    acquired_at: Instant,
    /// When the watcher (or a read through the leader) showed our write of at least
    /// `revision` as the key's latest.
    confirmed_at: Option<Instant>,
    /// A confirmation read is in flight.
    reading: bool,
}

/// One held partition's feed.
struct Feed {
    fence: Arc<Fence>,
    stop: StopSender,
}

#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    Claim,
    #[strum(serialize = "takeover")]
    TakeOver,
    Renew,
    Release,
    /// A read of the key through the stream's leader, for a pending lease the watcher
    /// did not confirm in time.
    Confirm,
}

/// An operation's outcome; its name is the `outcome` label of the lease metrics.
#[derive(Debug, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
enum OpResult {
    Ok(u64),
    /// The key carries our newer write already (renewal only).
    #[strum(serialize = "ok")]
    Adopt(u64),
    Conflict,
    Timeout,
    Error(String),
}

struct OpDone {
    partition: u32,
    kind: OpKind,
    sent_at: Instant,
    result: OpResult,
}

struct Driver<F: HandlerFactory> {
    planner: Planner,
    /// The origin of the send times in this driver's heartbeats.
    started: Instant,
    /// This driver's heartbeat nonce: tells its own heartbeats from those of another
    /// process that (wrongly) uses the same worker id.
    nonce: String,
    /// Shared by every fence: see the module docs.
    liveness: Arc<Liveness>,
    /// Whether the missing echo was logged.
    warned_no_echo: bool,
    /// Whether the key of a partition was ever seen (a put, or the delete marker of a
    /// release): a stream picked up there mid-way is a handover, not a late join.
    had_owner: Vec<bool>,
    client: async_nats::Client,
    kv: kv::Store,
    /// The bucket's stream, for reads served by its leader.
    stream: stream::Stream,
    shared: Arc<Shared>,
    factory: Arc<F>,
    lease: LeaseSettings,
    feeds: HashMap<u32, Feed>,
    /// Acquired, feed not started yet (see [`CONFIRM_SETTLE`]).
    pending: HashMap<u32, Pending>,
    /// Per partition, the newest revision of this worker's own writes the watcher
    /// showed.
    own_seen: HashMap<u32, u64>,
    feed_tasks: JoinSet<()>,
    ops: JoinSet<OpDone>,
    board: Arc<LeaseBoard>,
}

impl<F: HandlerFactory> Driver<F> {
    async fn run(mut self, mut heartbeats: async_nats::Subscriber, mut stop: StopSignal) {
        let tick_period = (self.lease.heartbeat_interval / 2)
            .clamp(Duration::from_millis(20), Duration::from_millis(250));
        let mut tick = tokio::time::interval(tick_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut beat = tokio::time::interval(self.lease.heartbeat_interval);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let hb_subject = self.lease.heartbeat_subject();
        // The watcher runs in its own task (its creation can stall for seconds during a
        // KV leader election, which must not delay renewals); it ends with the driver (the
        // set aborts it when dropped).
        let (entries_tx, mut entries) = tokio::sync::mpsc::channel(WATCH_CHANNEL);
        let mut watcher = JoinSet::new();
        watcher.spawn(run_watcher(
            self.kv.clone(),
            entries_tx,
            self.lease.timing.renew_interval,
        ));
        let deadline = loop {
            tokio::select! {
                deadline = stop::stopped(&mut stop) => break deadline,
                Some(done) = self.ops.join_next(), if !self.ops.is_empty() => {
                    if let Ok(done) = done {
                        self.on_done(done);
                    }
                }
                msg = heartbeats.next() => {
                    if let Some(msg) = msg {
                        self.on_heartbeat(&msg);
                    }
                }
                Some(entry) = entries.recv() => self.on_entry(entry),
                _ = beat.tick() => {
                    let id = self.planner.me().to_owned();
                    let sent = Instant::now().saturating_duration_since(self.started);
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(BEAT_HEADER, format!("{} {}", self.nonce, sent.as_micros()));
                    headers.insert(SLOTS_HEADER, self.shared.settings.max_streams.to_string());
                    let publish =
                        self.client
                            .publish_with_headers(hb_subject.clone(), headers, id.into());
                    if tokio::time::timeout(self.lease.heartbeat_interval, publish).await.is_err() {
                        tracing::warn!("lease heartbeat not queued in time");
                    }
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    // A lapse found here stays latched while the liveness is out:
                    // what is acquired meanwhile is dropped again, and no feed starts.
                    if self.check_liveness(now) && self.liveness.is_valid(now) {
                        self.liveness.clear_lapse();
                    }
                    self.reap_closed_fences();
                    let actions = self.planner.plan(now);
                    self.apply_all(actions);
                    self.start_confirmed(now);
                    self.publish_state(now);
                }
            }
        };
        self.shutdown(deadline).await;
    }

    fn publish_state(&self, now: Instant) {
        let mut table = self.planner.snapshot(now);
        for l in &mut table {
            l.delivering = l.held && self.feeds.contains_key(&l.partition);
        }
        *locked(&self.board) = table;
        ::metrics::gauge!(m::CONSUMER_LEASES_HELD).set(self.feeds.len() as f64);
        ::metrics::gauge!(m::CONSUMER_LEASE_LIVE_WORKERS).set(self.planner.live().len() as f64);
    }

    /// A heartbeat arrived: a peer's is heard, this driver's own moves the echo clock
    /// and renews the liveness.
    fn on_heartbeat(&mut self, msg: &async_nats::Message) {
        let Ok(id) = std::str::from_utf8(&msg.payload) else {
            return;
        };
        let now = Instant::now();
        if id != self.planner.me() {
            // Slots out of 1..=MAX_SLOTS (or unreadable) count as absent: while such a
            // peer is live, every worker's share is the equal one.
            let slots = msg
                .headers
                .as_ref()
                .and_then(|h| h.get(SLOTS_HEADER))
                .and_then(|v| v.as_str().trim().parse::<u64>().ok())
                .filter(|s| (1..=weir_protocol::capacity::MAX_SLOTS).contains(s));
            self.planner.heard_with_slots(id, slots, now);
            return;
        }
        let beat = msg.headers.as_ref().and_then(|h| h.get(BEAT_HEADER));
        let sent_us = beat.and_then(|v| {
            let (nonce, us) = v.as_str().split_once(' ')?;
            (nonce == self.nonce).then(|| us.parse::<u64>().ok())?
        });
        let Some(us) = sent_us else {
            tracing::error!(
                worker = id,
                "a heartbeat with this worker's id from another process: two workers share one worker_id"
            );
            return;
        };
        let sent_at = self.started + Duration::from_micros(us);
        // Revoke before renewing: a liveness that ran out is not revived under the
        // fences that were open before it did. The latch is cleared after the renewal,
        // so a lapse a handler finds in between is dealt with at the next check.
        let lapsed = self.check_liveness(now);
        // A heartbeat heard back keeps the worker live for the heartbeat timeout. A peer
        // writes a takeover no earlier than a whole timeout after the send time of this
        // worker's last heartbeat it heard (measured on its own echo clock), and starts
        // delivering [`CONFIRM_SETTLE`] after its write showed in its watcher: that
        // settle time and the write's round trip are the margin (clock-rate drift and
        // scheduling). Any shorter would only fence a worker for a reconnect that its
        // peers forgive.
        self.liveness
            .renew(sent_at + self.lease.timing.heartbeat_timeout);
        if lapsed {
            self.liveness.clear_lapse();
        }
        self.planner.echoed(sent_at);
        // A dead peer is known now: take its partitions without waiting for the tick.
        let actions = self.planner.plan_claims(now);
        self.apply_all(actions);
    }

    /// When the liveness ran out, fences every held partition (reason `stalled`) and
    /// returns true.
    fn check_liveness(&mut self, now: Instant) -> bool {
        if !self.liveness.has_lapsed(now) {
            if !self.planner.has_echo()
                && !self.warned_no_echo
                && now.saturating_duration_since(self.started)
                    >= 4 * self.lease.timing.heartbeat_timeout
            {
                self.warned_no_echo = true;
                tracing::error!(
                    "no own lease heartbeat came back: is the NATS connection no_echo? \
                     lease ownership needs its own heartbeats; claiming nothing"
                );
            }
            return false;
        }
        let lost = self.planner.lose_all();
        if !lost.is_empty() {
            tracing::warn!(
                partitions = lost.len(),
                "own heartbeats not heard back in time (stalled or cut off): fencing every lease"
            );
        }
        // And whatever feed is still open (none, if the planner and the feeds agree).
        let open: BTreeSet<u32> = lost.into_iter().chain(self.feeds.keys().copied()).collect();
        for p in open {
            self.fence(p, "stalled");
        }
        true
    }

    /// Applies a plan: a fence followed by the release of the same partition is a
    /// release, any other fence ran out of validity.
    fn apply_all(&mut self, actions: Vec<Action>) {
        let released: Vec<u32> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Release { partition, .. } => Some(*partition),
                _ => None,
            })
            .collect();
        for action in actions {
            let reason = match &action {
                Action::Fence(p) if released.contains(p) => "released",
                _ => "expired",
            };
            self.apply(action, reason);
        }
    }

    fn on_entry(&mut self, entry: kv::Entry) {
        let Some(p) = partition_of(&entry.key) else {
            return;
        };
        if let Some(slot) = self.had_owner.get_mut(p as usize) {
            *slot = true;
        }
        let value = match entry.operation {
            kv::Operation::Put => Some((
                String::from_utf8_lossy(&entry.value).into_owned(),
                entry.revision,
            )),
            kv::Operation::Delete | kv::Operation::Purge => None,
        };
        let freed = value.is_none();
        let now = Instant::now();
        if let Some((owner, revision)) = &value
            && owner == self.planner.me()
        {
            let seen = self.own_seen.entry(p).or_insert(0);
            *seen = (*seen).max(*revision);
            if let Some(pending) = self.pending.get_mut(&p)
                && pending.confirmed_at.is_none()
                && *revision >= pending.revision
            {
                pending.confirmed_at = Some(now);
            }
        }
        if let Some(action) = self.planner.observe(p, value, now) {
            self.apply(action, "taken_over");
        } else {
            self.sync_fence(p); // our own write may have extended the lease
        }
        if freed {
            let actions = self.planner.plan_claims(now);
            self.apply_all(actions);
        }
    }

    /// Executes one planner action. `fence_reason` labels a fence.
    fn apply(&mut self, action: Action, fence_reason: &'static str) {
        match action {
            Action::Fence(p) => self.fence(p, fence_reason),
            Action::Claim(p) => {
                let kv = self.kv.clone();
                let me = self.planner.me().to_owned();
                self.spawn_op(p, OpKind::Claim, async move {
                    match kv.create(key(p), me.into()).await {
                        Ok(rev) => OpResult::Ok(rev),
                        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                            OpResult::Conflict
                        }
                        Err(e) => OpResult::Error(e.to_string()),
                    }
                });
            }
            Action::TakeOver {
                partition,
                revision,
                from,
            } => {
                tracing::info!(partition, revision, from, "taking over a lease");
                self.spawn_update(partition, revision, OpKind::TakeOver);
            }
            Action::Renew {
                partition,
                revision,
            } => self.spawn_update(partition, revision, OpKind::Renew),
            Action::Release {
                partition,
                revision,
            } => {
                tracing::info!(partition, revision, "releasing a lease");
                let kv = self.kv.clone();
                self.spawn_op(partition, OpKind::Release, async move {
                    match kv
                        .delete_expect_revision(key(partition), Some(revision))
                        .await
                    {
                        Ok(()) => OpResult::Ok(revision),
                        Err(e) => OpResult::Error(e.to_string()),
                    }
                });
            }
        }
    }

    /// Spawns the compare-and-swap of a takeover or a renewal (see [`update`]).
    fn spawn_update(&mut self, p: u32, revision: u64, kind: OpKind) {
        let (kv, leader) = (self.kv.clone(), self.stream.clone());
        let me = self.planner.me().to_owned();
        let renewal = kind == OpKind::Renew;
        self.spawn_op(p, kind, async move {
            update(&kv, &leader, p, &me, revision, renewal).await
        });
    }

    fn spawn_op(
        &mut self,
        partition: u32,
        kind: OpKind,
        op: impl Future<Output = OpResult> + Send + 'static,
    ) {
        // Short, so that during a KV leader election a retry follows every second and
        // the first write after the election lands early (a timeout is unknown, never
        // a loss: validity runs from the last success either way).
        let bound = (self.lease.timing.renew_interval / 3)
            .clamp(Duration::from_millis(250), Duration::from_secs(2));
        let sent_at = Instant::now();
        self.ops.spawn(async move {
            let result = tokio::time::timeout(bound, op)
                .await
                .unwrap_or(OpResult::Timeout);
            OpDone {
                partition,
                kind,
                sent_at,
                result,
            }
        });
    }

    fn on_done(&mut self, done: OpDone) {
        let OpDone {
            partition: p,
            kind,
            sent_at,
            result,
        } = done;
        ::metrics::counter!(m::CONSUMER_LEASE_OPS_TOTAL, m::LABEL_OP => kind.as_str(), m::LABEL_OUTCOME => <&str>::from(&result))
            .increment(1);
        match (kind, result) {
            (OpKind::Claim | OpKind::TakeOver, OpResult::Ok(rev)) => {
                if self.planner.acquired(p, rev, sent_at).is_none() {
                    tracing::warn!(
                        partition = p,
                        revision = rev,
                        op = kind.as_str(),
                        "lease write accepted but another worker's newer write stands (nats-server#4320); not delivering"
                    );
                    ::metrics::counter!(m::CONSUMER_LEASE_FENCES_TOTAL, m::LABEL_REASON => "raced")
                        .increment(1);
                    return;
                }
                let handover = kind == OpKind::TakeOver
                    || self.had_owner.get(p as usize).copied().unwrap_or(false);
                let confirmed_at =
                    (self.own_seen.get(&p).copied().unwrap_or(0) >= rev).then(Instant::now);
                tracing::info!(
                    partition = p,
                    revision = rev,
                    op = kind.as_str(),
                    handover,
                    "lease acquired"
                );
                self.pending.insert(
                    p,
                    Pending {
                        revision: rev,
                        handover,
                        acquired_at: Instant::now(),
                        confirmed_at,
                        reading: false,
                    },
                );
            }
            (OpKind::Claim | OpKind::TakeOver, result) => {
                if let OpResult::Error(e) = &result {
                    tracing::debug!(partition = p, error = e, "lease claim failed");
                }
                self.planner.settled(p);
            }
            (OpKind::Renew, OpResult::Ok(rev)) => {
                self.planner.renewed(p, rev, sent_at);
                self.sync_fence(p);
            }
            (OpKind::Renew, OpResult::Adopt(rev)) => {
                self.planner.adopt(p, rev);
                self.sync_fence(p);
            }
            (OpKind::Renew, OpResult::Conflict) => {
                if let Some(action) = self.planner.renew_refused(p) {
                    self.apply(action, "conflict");
                }
            }
            (OpKind::Renew, result) => {
                tracing::warn!(
                    partition = p,
                    outcome = <&str>::from(&result),
                    "lease renewal unknown; retrying"
                );
                self.planner.renew_unknown(p, sent_at);
            }
            (OpKind::Release, _) => self.planner.settled(p),
            (OpKind::Confirm, result) => {
                let Some(pending) = self.pending.get_mut(&p) else {
                    return;
                };
                pending.reading = false;
                match result {
                    OpResult::Ok(seq) if seq >= pending.revision => {
                        pending.confirmed_at.get_or_insert_with(Instant::now);
                    }
                    OpResult::Ok(_) | OpResult::Adopt(_) | OpResult::Conflict => {
                        tracing::warn!(
                            partition = p,
                            "pending lease not the key's latest write: not delivering"
                        );
                        if let Some(action) = self.planner.lose(p) {
                            self.apply(action, "raced");
                        }
                    }
                    OpResult::Timeout | OpResult::Error(_) => {} // read again next tick
                }
            }
        }
    }

    /// A handler found a feed's fence run out (its lease's validity, just before a
    /// late renewal answer extended it in the planner): the planner must not keep
    /// holding a partition nobody delivers. Fenced here (its streams end `Handover`)
    /// and then taken back by CAS from this worker's own revision, so its streams
    /// continue with a declared gap.
    fn reap_closed_fences(&mut self) {
        let closed: Vec<u32> = self
            .feeds
            .iter()
            .filter(|(_, f)| f.fence.is_revoked())
            .map(|(p, _)| *p)
            .collect();
        for p in closed {
            tracing::warn!(
                partition = p,
                "lease fence ran out before its renewal answer: re-taking it"
            );
            if let Some(action) = self.planner.lose(p) {
                self.apply(action, "expired");
            } else {
                self.fence(p, "expired");
            }
        }
    }

    /// Moves a feed's fence to the planner's validity of its lease (forward only).
    fn sync_fence(&self, p: u32) {
        if let (Some(valid_until), Some(feed)) = (self.planner.valid_until(p), self.feeds.get(&p)) {
            feed.fence.extend(valid_until);
        }
    }

    /// Starts the feed of every pending lease whose own write the watcher showed at
    /// least [`CONFIRM_SETTLE`] ago (and that is still held).
    fn start_confirmed(&mut self, now: Instant) {
        if !self.liveness.is_valid(now) {
            return; // not while this worker's own heartbeats are not coming back
        }
        let unconfirmed: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, w)| {
                w.confirmed_at.is_none()
                    && !w.reading
                    && now.saturating_duration_since(w.acquired_at) >= CONFIRM_READ_AFTER
            })
            .map(|(p, _)| *p)
            .collect();
        for p in unconfirmed {
            if let Some(pending) = self.pending.get_mut(&p) {
                pending.reading = true;
            }
            let (leader, bucket) = (self.stream.clone(), self.lease.bucket.clone());
            let me = self.planner.me().to_owned();
            self.spawn_op(p, OpKind::Confirm, async move {
                match read_own(&leader, &bucket, p, &me).await {
                    Ok(Some(seq)) => OpResult::Ok(seq),
                    Ok(None) => OpResult::Conflict,
                    Err(e) => OpResult::Error(e.to_string()),
                }
            });
        }
        let due: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, w)| w.confirmed_at.is_some_and(|at| now >= at + CONFIRM_SETTLE))
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            let Some(pending) = self.pending.remove(&p) else {
                continue;
            };
            match self.planner.valid_until(p) {
                Some(valid_until) => {
                    tracing::info!(
                        partition = p,
                        revision = pending.revision,
                        "lease delivering"
                    );
                    self.start_feed(p, valid_until, pending.handover);
                }
                None => tracing::info!(partition = p, "pending lease no longer held"),
            }
        }
    }

    fn start_feed(&mut self, p: u32, valid_until: Instant, handover: bool) {
        let now = Instant::now();
        let fence = Arc::new(Fence::new(now, valid_until, self.liveness.clone()));
        let (stop_tx, stop_rx) = stop::channel();
        let subject = self.shared.settings.subject.pattern_for_partition(p);
        let demux = Demux::leased(
            self.shared.clone(),
            self.factory.clone(),
            fence.clone(),
            handover,
        );
        let client = self.client.clone();
        let idle = self.shared.settings.idle_timeout;
        self.feed_tasks.spawn(async move {
            match client.subscribe(subject.clone()).await {
                Ok(sub) => {
                    run_subscription(subject, sub.map(Ok).boxed(), demux, idle, stop_rx).await;
                }
                Err(e) => {
                    tracing::warn!(subject, error = %e, "cannot subscribe to a leased partition")
                }
            }
        });
        self.feeds.insert(
            p,
            Feed {
                fence,
                stop: stop_tx,
            },
        );
    }

    /// Closes a partition's fence and stops its feed at once.
    fn fence(&mut self, p: u32, reason: &'static str) {
        ::metrics::counter!(m::CONSUMER_LEASE_FENCES_TOTAL, m::LABEL_REASON => reason).increment(1);
        if self.pending.remove(&p).is_some() {
            tracing::info!(
                partition = p,
                reason,
                "pending lease fenced before delivering"
            );
        }
        if let Some(feed) = self.feeds.remove(&p) {
            feed.fence.revoke();
            feed.stop.send_replace(Some(Instant::now()));
            tracing::info!(partition = p, reason, "partition fenced");
        }
    }

    async fn shutdown(mut self, deadline: Instant) {
        // Drain every feed while the leases are still valid...
        for feed in self.feeds.values() {
            feed.stop.send_replace(Some(deadline));
        }
        let _ = tokio::time::timeout_at(deadline, async {
            while self.feed_tasks.join_next().await.is_some() {}
        })
        .await;
        // ... then fence and release every lease, so that successors need not wait.
        for feed in self.feeds.values() {
            feed.fence.revoke();
        }
        self.feed_tasks.shutdown().await;
        let held = self.planner.fence_all();
        ::metrics::counter!(m::CONSUMER_LEASE_FENCES_TOTAL, m::LABEL_REASON => "shutdown")
            .increment(held.len() as u64);
        let mut releases = JoinSet::new();
        for (p, rev) in held {
            let kv = self.kv.clone();
            releases.spawn(async move { kv.delete_expect_revision(key(p), Some(rev)).await });
        }
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, async {
            while releases.join_next().await.is_some() {}
        })
        .await;
        *locked(&self.board) = self.planner.snapshot(Instant::now());
        ::metrics::gauge!(m::CONSUMER_LEASES_HELD).set(0.0);
    }
}
