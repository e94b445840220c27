//! The confirmation window: the byte and age budget holds **up to the server**, not
//! only up to the NATS client.
//!
//! Why (async-nats `publish` returns once a message is in the client's command channel,
//! and a reconnect discards the client's unsent buffer) and what it costs:
//! docs/audio-ingress.md, "Where the bound ends: the server-confirmed window".
//!
//! How: one [`Window`] per NATS connection (one per [`crate::Ingress`]).
//! - A frame handed to the client stays *pending* in its stream ([`crate::queue`]): its
//!   bytes hold the stream's reservation and a [`WindowPermit`], its age counts against
//!   `max_age`. The frame is tagged with the window's open batch number (read under
//!   the stream lock); a stream registers in the open batch once per batch, not once
//!   per frame.
//! - Batches: the window task closes the open batch (incrementing the batch number
//!   under the window lock) and sends its marker. A frame tagged `B` was handed over
//!   before `B` closed, hence before marker `B` was published. Settling `B` for a
//!   stream settles its frames tagged `≤ B`, under the stream lock. A frame tagged `B`
//!   whose stream registered only in `B + 1` (the batch closed between the tag and the
//!   registration) is settled by `B + 1`'s marker, which was also published after it.
//! - One task per window closes the open batch and publishes a small **marker** on the
//!   same connection to a subject that the same connection subscribes to (an inbox
//!   subject, unique per ingress). nats-server keeps the order of one connection's
//!   messages to one subscriber, so the marker's return proves that the server received
//!   every publish made before it. At most one marker is in flight, and markers are at
//!   least `confirm_interval` apart: the cost is one small message per round, never per
//!   frame.
//! - The **connection epoch** (async-nats `Statistics::connects`) is read when a batch
//!   opens and again when its marker returns. If it changed, the connection was replaced
//!   in between and the client may have discarded frames of the batch: they are
//!   *possibly lost* — counted (`unconfirmed_at_disconnect`), released, and declared to
//!   the consumers on the stream's next packet and on its `end` (`Weir-Possibly-Lost`),
//!   never reported as published.
//! - The window's byte limit is `confirm_window` × the admitted byte rate
//!   (`RateMeter`), at least `confirm_window_min_bytes`. When it is full, a publisher
//!   waits in weir's queue, where `max_age` and the policy apply.
//!
//! Invariants:
//! - A frame is counted published only after a marker published after it came back on
//!   the same connection epoch.
//! - A permit's bytes are released exactly once, by `Drop`.
//! - The window task is the only place that settles (confirms or loses) frames; it
//!   settles a batch entirely before it opens the next round.
//! - The open batch is on the current connection epoch within [`EPOCH_POLL`] of a
//!   reconnect, also while the window is idle: a frame handed over on the new
//!   connection is confirmed by a marker, never declared possibly lost because the
//!   window still waited on the old connection.
//! - Nothing here spawns per frame; the window adds one task per ingress.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{Client, Subject, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use metrics::{Counter, Gauge, Histogram as MetricHistogram};
use tokio::sync::Notify;
use tokio::time::Instant;
use weir_service::ratelimit::LogLimit;
use weir_service::shutdown::CancellationToken;
use weir_service::sync::locked;

use crate::config::StreamConfig;
use crate::metrics as m;
use crate::publisher::{SinkError, SinkErrorKind};
use crate::stats::Global;
use crate::stream::StreamShared;

/// One confirmation round trip through the server, for one connection.
pub trait Confirmer: Send + Sync + 'static {
    /// Publishes one marker behind everything handed over so far and resolves when it
    /// came back through the server. Dropping the future abandons the round (a marker
    /// that returns later is skipped by the next round).
    fn round(&self) -> BoxFuture<'_, Result<(), SinkError>>;

    /// The connection epoch: changes whenever the client replaced its connection.
    fn epoch(&self) -> u64;
}

/// The async-nats confirmer: a marker published to, and received from, an inbox
/// subject unique to this ingress on the same connection.
#[derive(Debug)]
pub struct NatsConfirmer {
    client: Client,
    /// The client's statistics, read once: `Client::statistics` clones an `Arc` that
    /// every publisher would otherwise touch on every hand-over.
    stats: Arc<async_nats::Statistics>,
    subject: Subject,
    sub: tokio::sync::Mutex<Option<Subscriber>>,
    next: AtomicU64,
}

impl NatsConfirmer {
    /// A confirmer on `client`'s connection (subscribes on the first round).
    pub fn new(client: Client) -> Self {
        let subject = Subject::from(format!("{}.weir-confirm", client.new_inbox()));
        Self {
            stats: client.statistics(),
            client,
            subject,
            sub: tokio::sync::Mutex::new(None),
            next: AtomicU64::new(0),
        }
    }
}

impl Confirmer for NatsConfirmer {
    fn round(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let mut guard = self.sub.lock().await;
            if guard.is_none() {
                // The SUB goes through the same connection before the marker's PUB, so
                // the server has registered it when the marker arrives.
                let sub = self
                    .client
                    .subscribe(self.subject.clone())
                    .await
                    .map_err(|e| {
                        SinkError::with_source(SinkErrorKind::Confirm, "confirmation subscribe", e)
                    })?;
                *guard = Some(sub);
            }
            let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
            self.client
                .publish(self.subject.clone(), Bytes::from(n.to_string()))
                .await
                .map_err(|e| {
                    SinkError::with_source(SinkErrorKind::Confirm, "confirmation marker", e)
                })?;
            let Some(sub) = guard.as_mut() else {
                return Err(SinkError::new(
                    SinkErrorKind::Confirm,
                    "confirmation subscription missing",
                ));
            };
            loop {
                let Some(msg) = sub.next().await else {
                    *guard = None;
                    return Err(SinkError::new(
                        SinkErrorKind::Confirm,
                        "confirmation subscription closed",
                    ));
                };
                // Markers of abandoned rounds may still arrive: skip them.
                let got = std::str::from_utf8(&msg.payload)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok());
                if got == Some(n) {
                    return Ok(());
                }
            }
        })
    }

    fn epoch(&self) -> u64 {
        self.stats.connects.load(Ordering::Relaxed)
    }
}

/// Frames' bytes inside the window (one frame when acquired; a stream merges the
/// permits of an unconfirmed run with [`Self::absorb`]). Released exactly once, by
/// `Drop`.
#[derive(Debug)]
pub struct WindowPermit {
    window: Arc<Window>,
    bytes: u64,
    frames: u64,
}

impl WindowPermit {
    /// Takes `bytes` more window room for one more frame if there is room now (no new
    /// `Arc` clone: a publisher's batch holds one permit).
    pub(crate) fn try_grow(&mut self, bytes: u64) -> bool {
        if !self.window.try_take(bytes) {
            return false;
        }
        self.bytes += bytes;
        self.frames += 1;
        true
    }

    /// Gives back the room [`Self::try_grow`] took for a frame that was not handed
    /// over after all.
    pub(crate) fn shrink(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        let frames = self.frames.min(1);
        self.window.give_back(bytes, frames);
        self.bytes -= bytes;
        self.frames -= frames;
    }

    /// Takes over `other`'s bytes (of the same window): released with this permit.
    pub(crate) fn absorb(&mut self, mut other: WindowPermit) {
        debug_assert!(Arc::ptr_eq(&self.window, &other.window));
        self.bytes += std::mem::take(&mut other.bytes);
        self.frames += std::mem::take(&mut other.frames);
    }
}

impl Drop for WindowPermit {
    fn drop(&mut self) {
        if self.frames > 0 {
            self.window.give_back(self.bytes, self.frames);
        }
    }
}

struct OpenBatch {
    /// The batch number (frames handed over now are tagged with it).
    id: u64,
    /// The connection epoch when the batch opened.
    epoch: u64,
    /// Streams that handed frames over in this batch (each once).
    streams: Vec<Arc<StreamShared>>,
}

struct Handles {
    unconfirmed_bytes: Gauge,
    unconfirmed_frames: Gauge,
    limit: Gauge,
    rounds: Counter,
    round_seconds: MetricHistogram,
    disconnects: Counter,
}

/// Highest round time recorded for `/v1/stats` (60 s); longer rounds are clamped.
const ROUND_MAX_US: u64 = 60_000_000;
/// A round this slow is logged (rate-limited).
const SLOW_ROUND: Duration = Duration::from_secs(3);
/// How often a waiting round, and the idle window task, re-read the connection epoch.
const EPOCH_POLL: Duration = Duration::from_millis(20);
/// How often the idle window task refreshes the limit and the gauges.
const IDLE_REFRESH: Duration = Duration::from_millis(250);

/// The confirmation window of one NATS connection. See the module docs.
pub struct Window {
    /// Limit = this much of the admitted byte rate (`confirm_window_ms`).
    share: Duration,
    /// The limit never goes below this (`confirm_window_min_bytes`).
    min_bytes: u64,
    /// Minimum spacing of markers (`confirm_interval_ms`).
    interval: Duration,
    mode: &'static str,
    limit: AtomicU64,
    /// The open batch's number (a copy of `open.id`, read without the lock).
    batch: AtomicU64,
    /// The open batch's connection epoch (a copy of `open.epoch`, stored before
    /// `batch`).
    open_epoch: AtomicU64,
    /// The connection's epoch, read by publishers before they hand a frame over;
    /// `None`: the window is disabled (frames count as published at hand-over).
    confirmer: Option<Arc<dyn Confirmer>>,
    unconfirmed_bytes: AtomicU64,
    unconfirmed_frames: AtomicU64,
    open: Mutex<OpenBatch>,
    /// Wakes the window task (a batch got its first entry, or shutdown).
    work: Notify,
    /// Wakes publishers waiting for room.
    room: Notify,
    /// Cancelled by [`Self::close`]: the window task stops.
    closed: CancellationToken,
    /// The client's command channel was full at the last publish that had to wait
    /// (see [`Self::congested`]).
    congested: AtomicBool,
    rounds: AtomicU64,
    disconnects: AtomicU64,
    /// Round times for `/v1/stats` (`round_ms`).
    round_us: weir_service::metrics::LatencyHistogram,
    h: Handles,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("limit_bytes", &self.limit_bytes())
            .field("enabled", &self.enabled())
            .field("unconfirmed_bytes", &self.unconfirmed_bytes())
            .finish_non_exhaustive()
    }
}

/// The `window` object of `/v1/stats`: the shared admin type.
pub use weir_protocol::admin::WindowStats;

impl Window {
    /// A window with `config`'s `confirm_*` settings; disabled (frames count as
    /// published at hand-over) without a `confirmer`. `mode` is reported in the stats.
    pub fn new(
        config: &StreamConfig,
        confirmer: Option<Arc<dyn Confirmer>>,
        mode: &'static str,
    ) -> Self {
        let min_bytes = config.confirm_window_min_bytes();
        let h = Handles {
            unconfirmed_bytes: metrics::gauge!(m::UNCONFIRMED_BYTES),
            unconfirmed_frames: metrics::gauge!(m::UNCONFIRMED_FRAMES),
            limit: metrics::gauge!(m::CONFIRM_WINDOW_LIMIT_BYTES),
            rounds: metrics::counter!(m::CONFIRM_ROUNDS_TOTAL),
            round_seconds: metrics::histogram!(m::CONFIRM_ROUND_SECONDS),
            disconnects: metrics::counter!(m::CONFIRM_DISCONNECTS_TOTAL),
        };
        h.limit.set(min_bytes as f64);
        let epoch = confirmer.as_ref().map_or(0, |c| c.epoch());
        Self {
            share: config.confirm_window(),
            min_bytes,
            interval: config.confirm_interval(),
            mode,
            limit: AtomicU64::new(min_bytes),
            batch: AtomicU64::new(0),
            open_epoch: AtomicU64::new(epoch),
            confirmer,
            unconfirmed_bytes: AtomicU64::new(0),
            unconfirmed_frames: AtomicU64::new(0),
            open: Mutex::new(OpenBatch {
                id: 0,
                epoch,
                streams: Vec::new(),
            }),
            work: Notify::new(),
            room: Notify::new(),
            closed: CancellationToken::new(),
            congested: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            disconnects: AtomicU64::new(0),
            round_us: weir_service::metrics::LatencyHistogram::new(),
            h,
        }
    }

    /// Whether frames wait for the server's confirmation.
    pub fn enabled(&self) -> bool {
        self.confirmer.is_some()
    }

    /// Whether the connection's client channel is full: a publish had to wait and no
    /// publish has gone through at once since. The synchronous hand-overs (the direct
    /// path and the publisher's fast path) do not try while it is: a failed try costs a
    /// registration in the channel's waiter list for nothing, and with many streams
    /// contending for a full channel that is most of the cost. A publisher's awaited
    /// publish clears it as soon as one goes through on its first poll.
    pub(crate) fn congested(&self) -> bool {
        self.congested.load(Ordering::Relaxed)
    }

    /// See [`Self::congested`]. Writes only on a change (the flag's cache line is read
    /// on every frame).
    pub(crate) fn set_congested(&self, congested: bool) {
        if self.congested.load(Ordering::Relaxed) != congested {
            self.congested.store(congested, Ordering::Relaxed);
        }
    }

    /// Bytes handed over and not yet confirmed.
    pub fn unconfirmed_bytes(&self) -> u64 {
        self.unconfirmed_bytes.load(Ordering::Relaxed)
    }

    /// The current byte limit.
    pub fn limit_bytes(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Whether [`Self::close`] was called: nothing settles any more.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Stops the window task (the ingress is gone).
    pub(crate) fn close(&self) {
        self.closed.cancel();
        self.work.notify_one();
    }

    fn lock_open(&self) -> std::sync::MutexGuard<'_, OpenBatch> {
        locked(&self.open)
    }

    /// Takes `bytes` of window room, waiting until `deadline` at most. `None` when the
    /// deadline passed first. An empty window always admits (a frame larger than the
    /// limit still makes progress).
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        bytes: u64,
        deadline: Instant,
    ) -> Option<WindowPermit> {
        // Fast path: room now (no waiter registration, no lock).
        if let Some(p) = self.try_acquire(bytes) {
            return Some(p);
        }
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if let Some(p) = self.try_acquire(bytes) {
                return Some(p);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // Room is announced once per round; re-check at least every interval too.
            let recheck = (now + self.interval.max(Duration::from_millis(1))).min(deadline);
            tokio::select! {
                () = &mut room => {}
                () = tokio::time::sleep_until(recheck) => {}
            }
        }
    }

    /// Takes `bytes` of window room if there is room now.
    pub(crate) fn try_acquire(self: &Arc<Self>, bytes: u64) -> Option<WindowPermit> {
        if !self.try_take(bytes) {
            return None;
        }
        Some(WindowPermit {
            window: Arc::clone(self),
            bytes,
            frames: 1,
        })
    }

    /// Counts one frame of `bytes` into the window if there is room now; the caller
    /// owns the room from then on (in a [`WindowPermit`]).
    fn try_take(&self, bytes: u64) -> bool {
        let limit = self.limit.load(Ordering::Relaxed);
        let took = self
            .unconfirmed_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |cur| {
                (cur == 0 || cur + bytes <= limit).then_some(cur + bytes)
            })
            .is_ok();
        if took {
            self.unconfirmed_frames.fetch_add(1, Ordering::Relaxed);
        }
        took
    }

    /// Returns room taken by [`Self::try_take`] (only a [`WindowPermit`] calls it).
    fn give_back(&self, bytes: u64, frames: u64) {
        self.unconfirmed_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.unconfirmed_frames.fetch_sub(frames, Ordering::Relaxed);
    }

    /// The connection epoch now. A publisher reads it *before* handing frames over and
    /// passes it to [`Self::open_tag`] after.
    pub(crate) fn epoch(&self) -> u64 {
        self.confirmer.as_ref().map_or(0, |c| c.epoch())
    }

    /// The batch that frames handed over since `epoch_before` was read are tagged with
    /// (read under the stream's lock, see the module docs): the open batch, if it opened
    /// on that same connection epoch. `None` when the connection changed in between: the
    /// client may have discarded those frames with its write buffer, and no later
    /// marker can prove otherwise, so they are possibly lost at once.
    pub(crate) fn open_tag(&self, epoch_before: u64) -> Option<u64> {
        let batch = self.batch.load(Ordering::Acquire);
        let same = self.open_epoch.load(Ordering::Acquire) == epoch_before;
        if !same {
            // The window task may be idle on the old epoch: wake it so that it opens a
            // batch on the new one (it also polls every EPOCH_POLL).
            self.work.notify_one();
        }
        same.then_some(batch)
    }

    /// Registers `stream` in the open batch (once per batch: `FrameQueue::hand_over`
    /// says when).
    pub(crate) fn register(&self, stream: &Arc<StreamShared>) {
        let first = {
            let mut open = self.lock_open();
            open.streams.push(Arc::clone(stream));
            open.streams.len() == 1
        };
        if first {
            self.work.notify_one();
        }
    }

    /// Closes the open batch; the next one opens with `epoch_now`.
    fn take_batch(&self, epoch_now: u64) -> OpenBatch {
        let mut open = self.lock_open();
        let closed = OpenBatch {
            id: open.id,
            epoch: std::mem::replace(&mut open.epoch, epoch_now),
            streams: std::mem::take(&mut open.streams),
        };
        open.id += 1;
        self.open_epoch.store(epoch_now, Ordering::Release);
        self.batch.store(open.id, Ordering::Release);
        closed
    }

    /// The `/v1/stats` view; `oldest_unconfirmed` is computed by the caller over the
    /// streams.
    pub fn stats(&self, oldest_unconfirmed: Duration) -> WindowStats {
        let round_ms = self.round_us.percentiles();
        WindowStats {
            mode: Some(self.mode.to_owned()),
            unconfirmed_bytes: self.unconfirmed_bytes(),
            unconfirmed_frames: self.unconfirmed_frames.load(Ordering::Relaxed),
            limit_bytes: self.limit_bytes(),
            rounds: self.rounds.load(Ordering::Relaxed),
            round_ms,
            oldest_unconfirmed_age_ms: oldest_unconfirmed.as_secs_f64() * 1e3,
            disconnects: self.disconnects.load(Ordering::Relaxed),
        }
    }

    fn publish_gauges(&self) {
        self.h
            .unconfirmed_bytes
            .set(self.unconfirmed_bytes() as f64);
        self.h
            .unconfirmed_frames
            .set(self.unconfirmed_frames.load(Ordering::Relaxed) as f64);
        self.h.limit.set(self.limit_bytes() as f64);
    }

    fn record_round(&self, took: Duration) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.h.rounds.increment(1);
        self.h.round_seconds.record(took.as_secs_f64());
        let us = u64::try_from(took.as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, ROUND_MAX_US);
        self.round_us.record_us(&[us]);
    }
}

/// The admitted byte rate, smoothed: an EWMA that follows a rising rate within
/// [`RATE_TAU_UP`] and a falling one over [`RATE_TAU`]. Rising fast matters when load
/// arrives after a quiet spell: with one slow constant the window stayed near its floor
/// (one stream's budget for the whole connection) for tens of milliseconds while every
/// stream waited for room; falling slowly keeps the limit through a short lull.
struct RateMeter {
    last_bytes: u64,
    last_at: Instant,
    rate: f64,
}

const RATE_TAU: Duration = Duration::from_secs(1);
const RATE_TAU_UP: Duration = Duration::from_millis(100);

impl RateMeter {
    fn new(bytes: u64) -> Self {
        Self {
            last_bytes: bytes,
            last_at: Instant::now(),
            rate: 0.0,
        }
    }

    /// Folds in the admitted total now; returns bytes per second.
    fn update(&mut self, bytes: u64) -> f64 {
        let now = Instant::now();
        let dt = now.saturating_duration_since(self.last_at).as_secs_f64();
        if dt >= 0.01 {
            let inst = bytes.saturating_sub(self.last_bytes) as f64 / dt;
            let tau = if inst > self.rate {
                RATE_TAU_UP
            } else {
                RATE_TAU
            };
            let alpha = (dt / tau.as_secs_f64()).min(1.0);
            self.rate += alpha * (inst - self.rate);
            self.last_bytes = bytes;
            self.last_at = now;
        }
        self.rate
    }
}

/// Settles batch `id`: each registered stream's frames tagged `<= id` are published
/// (`confirmed`) or possibly lost. One stream lock per stream in the batch.
fn settle(id: u64, streams: Vec<Arc<StreamShared>>, confirmed: bool) -> (u64, u64) {
    let mut frames = 0;
    let mut touched = 0;
    // One clock read per round, not per stream.
    let now = Instant::now();
    for stream in streams {
        let n = {
            let mut core = stream.lock();
            if confirmed {
                core.confirm_through(id, now)
            } else {
                core.lose_through(id)
            }
        };
        frames += n;
        touched += u64::from(n > 0);
        stream.settled();
    }
    (frames, touched)
}

/// Waits for the next batch to confirm, refreshing the limit meanwhile: the open batch
/// once a stream registered in it (closed no earlier than `confirm_interval` after
/// `last_round`), or one taken at once because the connection was replaced while idle
/// and a stream registered meanwhile. `None` once the window is closed.
async fn next_batch(
    window: &Window,
    confirmer: &dyn Confirmer,
    rate: &mut RateMeter,
    global: &Global,
    last_round: Instant,
) -> Option<OpenBatch> {
    let mut last_limit: Option<Instant> = None;
    let taken = loop {
        let work = window.work.notified();
        tokio::pin!(work);
        work.as_mut().enable();
        if window.closed.is_cancelled() {
            return None;
        }
        if last_limit.is_none_or(|t| t.elapsed() >= IDLE_REFRESH) {
            last_limit = Some(Instant::now());
            let r = rate.update(global.admitted_bytes());
            let limit = ((r * window.share.as_secs_f64()) as u64).max(window.min_bytes);
            window.limit.store(limit, Ordering::Relaxed);
            window.publish_gauges();
        }
        if !window.lock_open().streams.is_empty() {
            break None;
        }
        // Reconnected while idle: the open batch still carries the old connection
        // epoch, so every frame handed over from now on would be tagged `None`
        // (possibly lost at once) and none would register — the batch would never get
        // work and never be replaced. Close it: the next one opens on the new epoch.
        let now = confirmer.epoch();
        if now != window.open_epoch.load(Ordering::Acquire) {
            let batch = window.take_batch(now);
            if !batch.streams.is_empty() {
                break Some(batch);
            }
            continue;
        }
        tokio::select! {
            () = &mut work => {}
            () = tokio::time::sleep(EPOCH_POLL) => {}
        }
    };
    Some(match taken {
        Some(batch) => batch,
        None => {
            tokio::time::sleep_until(last_round + window.interval).await;
            window.take_batch(confirmer.epoch())
        }
    })
}

/// The window task: one per ingress, runs until [`Window::close`].
pub(crate) async fn run(window: Arc<Window>, confirmer: Arc<dyn Confirmer>, global: Arc<Global>) {
    let mut rate = RateMeter::new(global.admitted_bytes());
    let mut last_round = Instant::now();
    // One warning per 10 s for a stalled or failing round.
    let warn = LogLimit::new(Duration::from_secs(10));
    let mut lost_epoch: Option<u64> = None;
    {
        let epoch = confirmer.epoch();
        window.lock_open().epoch = epoch;
        window.open_epoch.store(epoch, Ordering::Release);
    }
    loop {
        let Some(batch) = next_batch(&window, &*confirmer, &mut rate, &global, last_round).await
        else {
            return;
        };
        let started = Instant::now();
        last_round = started;
        let confirmed = loop {
            let round = confirmer.round();
            tokio::pin!(round);
            let outcome = loop {
                tokio::select! {
                    r = &mut round => break Some(r),
                    () = tokio::time::sleep(EPOCH_POLL) => {
                        if confirmer.epoch() != batch.epoch || window.closed.is_cancelled() {
                            break None;
                        }
                        let waited = started.elapsed();
                        if waited >= SLOW_ROUND && warn.allow().is_some() {
                            tracing::warn!(
                                waited_ms = waited.as_millis() as u64,
                                "no confirmation from the NATS server: it is stalled, or this \
                                 user may not publish and subscribe _INBOX.> (the marker subject); \
                                 streams overload at max_age meanwhile"
                            );
                        }
                    }
                }
            };
            if window.closed.is_cancelled() {
                return;
            }
            match outcome {
                Some(Ok(())) => break confirmer.epoch() == batch.epoch,
                None => break false,
                Some(Err(e)) => {
                    if warn.allow().is_some() {
                        tracing::warn!(error = %e, "confirmation round failed; retrying");
                    }
                    if confirmer.epoch() != batch.epoch {
                        break false;
                    }
                    tokio::time::sleep(window.interval.max(EPOCH_POLL)).await;
                }
            }
        };
        let (frames, streams) = settle(batch.id, batch.streams, confirmed);
        if confirmed {
            window.record_round(started.elapsed());
        } else if frames > 0 {
            // Batches of one lost connection count as one disconnect.
            if lost_epoch != Some(batch.epoch) {
                lost_epoch = Some(batch.epoch);
                window.disconnects.fetch_add(1, Ordering::Relaxed);
                window.h.disconnects.increment(1);
            }
            tracing::warn!(
                frames,
                streams,
                "NATS connection replaced before the server confirmed these frames: \
                 declared possibly lost (Weir-Possibly-Lost)"
            );
        }
        window.publish_gauges();
        window.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rate_meter_tracks_the_admitted_rate() {
        let mut m = RateMeter::new(0);
        let mut total = 0;
        for _ in 0..40 {
            tokio::time::advance(Duration::from_millis(100)).await;
            total += 3_200; // 32,000 B/s
            m.update(total);
        }
        let r = m.update(total);
        assert!((r - 32_000.0).abs() < 2_000.0, "{r}");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_meter_rises_fast_and_falls_slowly() {
        let mut m = RateMeter::new(0);
        let mut total = 0;
        // 100 ms at 1 MB/s after silence: most of the way up already.
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(10)).await;
            total += 10_000;
            m.update(total);
        }
        let up = m.update(total);
        assert!(up > 550_000.0, "{up}");
        // Then 100 ms of silence: still most of it.
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(10)).await;
            m.update(total);
        }
        let down = m.update(total);
        assert!(down > 0.85 * up && down < up, "{up} -> {down}");
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_for_room_until_the_deadline() {
        struct Never;
        impl Confirmer for Never {
            fn round(&self) -> BoxFuture<'_, Result<(), SinkError>> {
                Box::pin(futures::future::pending())
            }
            fn epoch(&self) -> u64 {
                1
            }
        }
        let config = crate::StreamConfig::builder()
            .max_frame_bytes(640)
            .confirm_window_min_bytes(1_280)
            .build()
            .expect("config");
        let w = Arc::new(Window::new(&config, Some(Arc::new(Never)), "confirmed"));
        let deadline = Instant::now() + Duration::from_millis(100);
        let a = w.acquire(640, deadline).await.expect("room");
        let b = w.acquire(640, deadline).await.expect("room");
        assert_eq!(w.unconfirmed_bytes(), 1_280);
        let t0 = Instant::now();
        assert!(
            w.acquire(640, deadline).await.is_none(),
            "full until the deadline"
        );
        assert_eq!(Instant::now() - t0, Duration::from_millis(100));
        drop(a);
        let c = w
            .acquire(640, Instant::now())
            .await
            .expect("released by Drop");
        drop((b, c));
        assert_eq!(w.unconfirmed_bytes(), 0);
        // An empty window admits a frame larger than the limit.
        let big = w.acquire(4_000, Instant::now()).await.expect("progress");
        drop(big);
        assert_eq!(w.unconfirmed_bytes(), 0);
    }
}
