//! The producer core's API: an [`Ingress`] opens streams; each stream is one
//! [`StreamHandle`] (the producer's end), one bounded queue ([`crate::queue`]) and one
//! publisher task ([`crate::publisher`]).
//!
//! ```no_run
//! # async fn demo(client: async_nats::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use weir_audio_producer::{Ingress, StreamConfig};
//! let ingress = Ingress::new(client, StreamConfig::default());
//! let stream = ingress.open("call-42", Some("session-7".into()))?;
//! stream.try_push(bytes::Bytes::from(vec![0u8; 640]))?;       // never blocks
//! stream.push(bytes::Bytes::from(vec![0u8; 640])).await?;      // waits <= max_wait
//! let summary = stream.finish().await;                          // drains, publishes `end`
//! # Ok(()) }
//! ```
//!
//! Invariants:
//! - Opening a stream spawns exactly one task (its publisher); pushing never spawns.
//!   The task count is therefore streams + a constant, whatever the frame count.
//! - A stream id is active from `open` until its publisher exits (after handing out the
//!   `end`); while active, a second `open` with the same id is refused. The registry
//!   slot is released exactly once, by the publisher's [`SlotGuard`].
//! - Dropping a [`StreamHandle`] without [`StreamHandle::finish`] is defined: the
//!   stream drains what is queued and publishes `end` with `Weir-End-Reason:
//!   producer_gone`.
//! - `try_push` takes one mutex, encodes the admitted frame into its packet (one
//!   allocation) and, when the queue was empty, either hands it to the NATS client
//!   itself (the direct path: the publisher holds nothing and the client takes it on
//!   the first poll) or wakes the publisher; it never awaits.
//! - A stream's frames reach the client in seq order: the direct path runs only while
//!   the publisher is parked with nothing in its hands ([`FrameQueue::take_direct`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::{HeaderMap, Subject};
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::audio::extension::{EndReason, Overload};
use weir_protocol::audio::packet::MAX_SESSION_ID_LEN;
use weir_protocol::audio::{AudioFormat, BodyRef, Gap, encode_packet_in};
use weir_protocol::{StreamId, partition_of};
use weir_service::shutdown::CancellationToken;
use weir_service::sync::locked;

/// The size of a stream's packet arena: admitted frames' packets are carved from it, so
/// the allocator is called once per ~5 frames (or not at all when every packet of the
/// arena was published before it filled, the steady state), and the NATS client's
/// thread frees one arena instead of each packet — per-packet frees from another
/// thread contend for the producer thread's malloc arena (measured: ~15 % of the bulk
/// push's CPU). The cost: a stream holds up to one arena (4 KiB) beyond its frames.
const PACKET_ARENA_BYTES: usize = 4096;

use crate::config::{Delivery, StreamConfig};
use crate::confirm::{Confirmer, Window};
use crate::error::{OpenError, PushError};
use crate::publisher::{Publisher, Sink};
use crate::queue::{Budget, FrameQueue, Lost, OfferMode, QueuedFrame, Refusal, StreamState};
use crate::stats::{Account, Counters, FramesStats, Global, StatsSnapshot, WaitBatch};

mod handle;

pub use handle::{Position, StreamHandle, StreamView};

/// What a stream's producer can observe without pushing (for the WebSocket events).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamStatus {
    /// The stream's state.
    pub state: StreamState,
    /// Why it ends, once it is ending.
    pub end_reason: Option<EndReason>,
    /// The overload report, once it overloaded.
    pub overload: Option<Overload>,
    /// Gap markers handed to NATS so far, and resume losses declared in a header.
    pub gaps: u64,
    /// The last of those.
    pub last_gap: Option<Gap>,
    /// The `end` was handed to NATS.
    pub end_delivered: bool,
    /// The publisher task exited (the end was handed over or given up on) and the
    /// stream id is free again.
    pub finished: bool,
}

/// The direct path of a stream: a producer that finds the publisher parked and the
/// queue otherwise empty hands its frame to NATS itself, under the stream lock (see
/// [`FrameQueue::take_direct`]), instead of waking the publisher. Only when the client
/// takes it at once; otherwise the frame stays queued for the publisher, which handles
/// waiting, timeouts and failures. Same packet, same accounting, same window.
pub(crate) struct Direct {
    /// [`crate::publisher::publish_now`] on the ingress's sink.
    publish: Box<dyn Fn(Subject, Bytes) -> bool + Send + Sync>,
    /// The connection's window: room when frames wait for the server's confirmation
    /// (enabled), and the channel-congestion hint either way.
    window: Arc<Window>,
}

/// Shared state of one stream (queue, wake-ups, status). Crate-internal.
pub(crate) struct StreamShared {
    pub id: StreamId,
    pub session: Option<String>,
    pub subject: Subject,
    core: Mutex<FrameQueue>,
    pub budget: Arc<Budget>,
    pub counters: Arc<Counters>,
    pub global: Arc<Global>,
    /// Wakes the publisher (frame on an empty queue, finish, shutdown).
    pub wake: Notify,
    /// Wakes a producer waiting in `push` (the publisher took a frame).
    pub room: Notify,
    /// Set by a producer about to wait in `push`; the publisher notifies `room` only
    /// then, not for every frame.
    pub room_wanted: AtomicBool,
    /// Wakes the publisher waiting for its frames to be confirmed (before `end`).
    settled: Notify,
    /// Set by the publisher about to wait on `settled`; the window notifies only then
    /// (a `notify_waiters` takes a lock, and the window settles every stream of a
    /// round).
    settle_wanted: AtomicBool,
    status: watch::Sender<StreamStatus>,
    opened_at: Instant,
    /// The direct path; `None` for a lossless sink or with `frame_headers`.
    direct: Option<Direct>,
}

impl StreamShared {
    pub fn lock(&self) -> MutexGuard<'_, FrameQueue> {
        // A panic while holding the lock cannot leave the queue inconsistent in a way
        // that matters more than losing the stream; keep going with the inner value.
        locked(&self.core)
    }

    pub fn account(&self) -> Account<'_> {
        Account {
            stream: &self.counters,
            global: &self.global,
        }
    }

    /// Copies the queue's phase into the watched status (if it changed).
    pub fn sync_status(&self, core: &FrameQueue) {
        let state = core.state();
        let overload = core.overload().cloned();
        let end_reason = core.end_reason();
        self.status.send_if_modified(|s| {
            if s.state == state && s.end_reason == end_reason && s.overload == overload {
                return false;
            }
            s.state = state;
            s.end_reason = end_reason;
            s.overload = overload;
            true
        });
    }

    /// The confirmation window settled frames of this stream: their bytes are free.
    pub fn settled(&self) {
        // SeqCst with the store in `settled_notified`: either the waiter sees this
        // round's settlement under the stream lock, or this swap sees its flag.
        if self.settle_wanted.swap(false, Ordering::SeqCst) {
            self.settled.notify_waiters();
        }
        if self.room_wanted.swap(false, Ordering::AcqRel) {
            self.room.notify_one();
        }
    }

    /// Wakes a producer waiting in `push` if pending bytes are below `below` (there is
    /// room for a frame) or `below` is 0 (the stream changed state: it must look).
    pub fn room_freed(&self, below: u64) {
        if self.room_wanted.load(Ordering::Acquire)
            && (below == 0 || self.budget.bytes() < below)
            && self.room_wanted.swap(false, Ordering::AcqRel)
        {
            self.room.notify_one();
        }
    }

    /// A wait for [`Self::settled`], already enabled: check the condition under the
    /// stream lock after this call, then await it.
    pub fn settled_notified(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut n = Box::pin(self.settled.notified());
        n.as_mut().enable();
        self.settle_wanted.store(true, Ordering::SeqCst);
        n
    }

    /// The direct path for `frame`, just admitted and taken out of the queue
    /// ([`FrameQueue::take_direct`]); called under the stream lock (`core`). `Ok`:
    /// handed over and accounted, and whether the stream must register in the window's
    /// open batch. `Err`: not handed over; the frame comes back untouched.
    fn hand_over_direct(
        &self,
        direct: &Direct,
        core: &mut FrameQueue,
        frame: QueuedFrame,
    ) -> Result<bool, QueuedFrame> {
        let w = &direct.window;
        if w.congested() {
            return Err(frame);
        }
        let permit = if w.enabled() {
            match w.try_acquire(crate::queue::charge_of(frame.pcm_len)) {
                Some(p) => Some(p),
                None => return Err(frame),
            }
        } else {
            None
        };
        let epoch = w.epoch();
        if !(direct.publish)(self.subject.clone(), frame.packet.clone()) {
            return Err(frame);
        }
        self.account()
            .handed_over(Duration::ZERO, core.direct_waits());
        Ok(if w.enabled() {
            core.hand_over(frame, permit, w.open_tag(epoch))
        } else {
            self.account().published(1);
            false
        })
    }

    pub fn gap_published(&self, gap: Gap) {
        self.status.send_modify(|s| {
            s.gaps += 1;
            s.last_gap = Some(gap);
        });
    }

    pub fn end_delivered(&self) {
        self.status.send_modify(|s| s.end_delivered = true);
    }

    pub fn mark_finished(&self) {
        self.status.send_modify(|s| {
            s.finished = true;
            s.state = StreamState::Ended;
        });
    }

    fn close(&self, reason: EndReason, drain: Option<Instant>, control: Option<Instant>) {
        {
            let mut core = self.lock();
            core.finish(reason, Instant::now(), drain, control);
            self.sync_status(&core);
        }
        self.wake.notify_one();
    }

    fn snapshot(&self) -> StreamSnapshot {
        let now = Instant::now();
        let (state, oldest, overload) = {
            let core = self.lock();
            (
                core.state(),
                core.oldest_enqueued_at(),
                core.overload().cloned(),
            )
        };
        let status = self.status.borrow().clone();
        StreamSnapshot {
            stream_id: self.id.to_string(),
            session_id: self.session.clone(),
            subject: self.subject.to_string(),
            state,
            end_reason: status.end_reason,
            open_ms: now.saturating_duration_since(self.opened_at).as_secs_f64() * 1e3,
            pending_bytes: self.budget.bytes(),
            pending_frames: self.budget.frames(),
            pending_bytes_high_water: self.budget.high_water(),
            oldest_frame_age_ms: oldest.map_or(0.0, |t| {
                now.saturating_duration_since(t).as_secs_f64() * 1e3
            }),
            frames: crate::stats::frames_from_counters(&self.counters.snapshot()),
            gaps: status.gaps,
            overload,
            end_delivered: status.end_delivered,
        }
    }
}

/// One stream in the admin `/v1/streams` view.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamSnapshot {
    /// The stream id.
    pub stream_id: String,
    /// The session id, if any.
    pub session_id: Option<String>,
    /// The NATS subject.
    pub subject: String,
    /// State.
    pub state: StreamState,
    /// Why it ends, once ending.
    pub end_reason: Option<EndReason>,
    /// Time since open, ms.
    pub open_ms: f64,
    /// Bytes pending (queued + in flight).
    pub pending_bytes: u64,
    /// Frames pending.
    pub pending_frames: u64,
    /// Highest pending bytes so far (never above the enforced bound).
    pub pending_bytes_high_water: u64,
    /// Age of the oldest pending frame, ms.
    pub oldest_frame_age_ms: f64,
    /// Frame counts.
    pub frames: FramesStats,
    /// Gap markers handed to NATS.
    pub gaps: u64,
    /// The overload report, if it overloaded.
    pub overload: Option<Overload>,
    /// Whether the `end` was handed to NATS.
    pub end_delivered: bool,
}

/// What a finished stream did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamSummary {
    /// The final snapshot.
    #[serde(flatten)]
    pub snapshot: StreamSnapshot,
    /// Whether the publisher finished within the wait bound of `finish`.
    pub finished: bool,
}

/// The registry of active streams, shared with every publisher's [`SlotGuard`].
pub(crate) struct Registry {
    streams: Mutex<HashMap<StreamId, Arc<StreamShared>>>,
    empty: Notify,
    global: Arc<Global>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<StreamId, Arc<StreamShared>>> {
        locked(&self.streams)
    }

    fn all(&self) -> Vec<Arc<StreamShared>> {
        self.lock().values().cloned().collect()
    }
}

/// A stream's place in the registry; removing it (on `Drop`) makes the id available
/// again. Owned by the stream's publisher task, so it is released exactly once, when
/// the task ends (or if the runtime drops the task).
pub(crate) struct SlotGuard {
    registry: Arc<Registry>,
    id: StreamId,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let now_empty = {
            let mut map = self.registry.lock();
            map.remove(&self.id);
            map.is_empty()
        };
        self.registry.global.stream_closed();
        if now_empty {
            self.registry.empty.notify_waiters();
        }
    }
}

struct IngressInner<S: Sink> {
    config: Arc<StreamConfig>,
    sink: S,
    registry: Arc<Registry>,
    max_streams: usize,
    /// Cancelled by [`Ingress::shutdown`]: no stream is admitted any more.
    shutting_down: CancellationToken,
    window: Arc<Window>,
    /// The window task's confirmer, taken when the task starts (first `open`).
    confirmer: Mutex<Option<Arc<dyn Confirmer>>>,
}

impl<S: Sink> Drop for IngressInner<S> {
    fn drop(&mut self) {
        self.window.close();
    }
}

/// The producer core: opens streams that publish to one [`Sink`] (an
/// `async_nats::Client` in production). Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Ingress<S: Sink = async_nats::Client> {
    inner: Arc<IngressInner<S>>,
}

impl<S: Sink> std::fmt::Debug for Ingress<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingress")
            .field("config", &self.inner.config)
            .field("active_streams", &self.active_streams())
            .finish_non_exhaustive()
    }
}

/// What [`Ingress::shutdown`] achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Streams that were open when shutdown began.
    pub streams: usize,
    /// Streams whose publisher had not finished when the grace period ran out.
    pub unfinished: usize,
}

impl<S: Sink> Ingress<S> {
    /// A new ingress without a stream cap. Metric handles are resolved now, under the
    /// current `metrics` recorder.
    pub fn new(sink: S, config: StreamConfig) -> Self {
        Self::with_max_streams(sink, config, usize::MAX)
    }

    /// A new ingress that refuses to open more than `max_streams` streams at a time.
    pub fn with_max_streams(sink: S, config: StreamConfig, max_streams: usize) -> Self {
        let global = Arc::new(Global::new());
        let confirmer = match config.delivery() {
            Delivery::Confirmed => sink.confirmer(),
            Delivery::Unconfirmed | Delivery::JetStream => None,
        };
        let window = Arc::new(Window::new(
            &config,
            confirmer.clone(),
            if sink.lossless() {
                "jetstream"
            } else {
                config.delivery().as_str()
            },
        ));
        Self {
            inner: Arc::new(IngressInner {
                window,
                confirmer: Mutex::new(confirmer),
                config: Arc::new(config),
                sink,
                registry: Arc::new(Registry {
                    streams: Mutex::new(HashMap::new()),
                    empty: Notify::new(),
                    global,
                }),
                max_streams,
                shutting_down: CancellationToken::new(),
            }),
        }
    }

    /// The stream configuration.
    pub fn config(&self) -> &StreamConfig {
        &self.inner.config
    }

    /// The sink.
    pub fn sink(&self) -> &S {
        &self.inner.sink
    }

    /// The connection's confirmation window.
    pub fn window(&self) -> &Arc<Window> {
        &self.inner.window
    }

    /// The aggregate accounting.
    pub fn global(&self) -> &Arc<Global> {
        &self.inner.registry.global
    }

    /// Streams active now (including those still delivering their `end`).
    pub fn active_streams(&self) -> usize {
        self.inner.registry.lock().len()
    }

    /// Whether [`Self::shutdown`] was called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.is_cancelled()
    }

    /// Validates `id` and opens a stream. See [`Self::open_id`].
    pub fn open(&self, id: &str, session_id: Option<String>) -> Result<StreamHandle, OpenError> {
        let opened = StreamId::parse(id).map_err(OpenError::InvalidId);
        self.counted(opened.and_then(|id| self.open_inner(id, session_id)))
    }

    /// Opens a stream and spawns its publisher task on the current tokio runtime.
    /// Refused (and counted) when the id is active, `max_streams` are open, or the
    /// ingress is shutting down.
    pub fn open_id(
        &self,
        id: StreamId,
        session_id: Option<String>,
    ) -> Result<StreamHandle, OpenError> {
        self.counted(self.open_inner(id, session_id))
    }

    /// `result`, a refusal counted by its label.
    fn counted(&self, result: Result<StreamHandle, OpenError>) -> Result<StreamHandle, OpenError> {
        if let Err(e) = &result {
            self.global().admission_rejected(e.as_label());
        }
        result
    }

    fn open_inner(
        &self,
        id: StreamId,
        session_id: Option<String>,
    ) -> Result<StreamHandle, OpenError> {
        if self.is_shutting_down() {
            return Err(OpenError::ShuttingDown);
        }
        if let Some(s) = &session_id
            && (s.len() > MAX_SESSION_ID_LEN || s.chars().any(char::is_control))
        {
            return Err(OpenError::InvalidSession(format!(
                "at most {MAX_SESSION_ID_LEN} bytes without control characters"
            )));
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| OpenError::NoRuntime)?;
        let cfg = &self.inner.config;
        let subject = Subject::from(
            cfg.subject()
                .render(&id, partition_of(&id, cfg.partitions())),
        );
        let global = Arc::clone(self.global());
        let counters = Arc::new(Counters::default());
        let core = FrameQueue::new(cfg, Arc::clone(&counters), Arc::clone(&global));
        let budget = Arc::clone(core.budget());
        let (status, _) = watch::channel(StreamStatus::default());
        let shared = Arc::new(StreamShared {
            id: id.clone(),
            session: session_id,
            subject,
            core: Mutex::new(core),
            budget,
            counters,
            global: Arc::clone(&global),
            wake: Notify::new(),
            room: Notify::new(),
            room_wanted: AtomicBool::new(false),
            settled: Notify::new(),
            settle_wanted: AtomicBool::new(false),
            status,
            opened_at: Instant::now(),
            direct: (!self.inner.sink.lossless() && !cfg.frame_headers()).then(|| {
                let sink = self.inner.sink.clone();
                Direct {
                    publish: Box::new(move |subject, payload| {
                        crate::publisher::publish_now(&sink, subject, HeaderMap::new(), payload)
                    }),
                    window: Arc::clone(&self.inner.window),
                }
            }),
        });
        {
            let mut map = self.inner.registry.lock();
            if map.contains_key(&id) {
                return Err(OpenError::AlreadyActive(id.to_string()));
            }
            if map.len() >= self.inner.max_streams {
                return Err(OpenError::TooManyStreams {
                    limit: self.inner.max_streams,
                });
            }
            map.insert(id.clone(), Arc::clone(&shared));
        }
        global.stream_opened();
        if let Some(confirmer) = locked(&self.inner.confirmer).take() {
            runtime.spawn(crate::confirm::run(
                Arc::clone(&self.inner.window),
                confirmer,
                Arc::clone(&global),
            ));
        }
        let slot = SlotGuard {
            registry: Arc::clone(&self.inner.registry),
            id,
        };
        let publisher = Publisher {
            stream: Arc::clone(&shared),
            sink: self.inner.sink.clone(),
            publish_timeout: cfg.publish_timeout(),
            shadow_max_age: cfg.shadow().then_some(cfg.max_age()),
            enforced_max_age: cfg.enforced_max_age(),
            room_below: (cfg.enforced_max_bytes() - cfg.max_frame_bytes()) as u64 + 1,
            frame_headers: cfg.frame_headers(),
            waits: WaitBatch::default(),
            window: Arc::clone(&self.inner.window),
            msg_id_prefix: self.inner.sink.lossless().then(|| {
                let instance = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                format!("{}:{instance:x}:", shared.id)
            }),
        };
        // One span per stream: every line its publisher logs carries the ids.
        let span = tracing::info_span!(
            "stream",
            stream = %shared.id,
            session = shared.session.as_deref().unwrap_or(""),
        );
        runtime.spawn(tracing::Instrument::instrument(publisher.run(slot), span));
        Ok(StreamHandle {
            view: StreamView { shared },
            closed: false,
            finish_bound: cfg.max_age() + cfg.publish_timeout() * 2 + cfg.end_timeout(),
        })
    }

    /// Each active stream, for the admin view.
    pub fn streams(&self) -> Vec<StreamSnapshot> {
        let mut v: Vec<StreamSnapshot> = self
            .inner
            .registry
            .all()
            .iter()
            .map(|s| s.snapshot())
            .collect();
        v.sort_by(|a, b| a.stream_id.cmp(&b.stream_id));
        v
    }

    /// Age of the oldest pending frame over all streams (also sets the gauge).
    pub fn oldest_frame_age(&self) -> Duration {
        let age = self.oldest(FrameQueue::oldest_enqueued_at);
        self.global().set_oldest_age(age);
        age
    }

    /// Age of the oldest frame handed to NATS and not yet confirmed, over all streams.
    pub fn oldest_unconfirmed_age(&self) -> Duration {
        self.oldest(FrameQueue::oldest_unconfirmed_at)
    }

    /// The largest age of `since` over all streams.
    fn oldest(&self, since: impl Fn(&FrameQueue) -> Option<Instant>) -> Duration {
        let now = Instant::now();
        let streams = self.inner.registry.all();
        let oldest = streams.iter().filter_map(|s| since(&s.lock())).min();
        oldest.map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// The `/v1/stats` snapshot.
    pub fn stats(&self) -> StatsSnapshot {
        let g = self.global();
        let tasks_alive = tokio::runtime::Handle::try_current()
            .map_or(0, |h| h.metrics().num_alive_tasks() as u64);
        StatsSnapshot {
            active_streams: g.active_streams(),
            streams_total: g.streams_total(),
            pending_bytes: g.pending_bytes(),
            pending_frames: g.pending_frames(),
            pending_bytes_limit_per_stream: Some(self.inner.config.max_bytes() as u64),
            oldest_frame_age_ms: self.oldest_frame_age().as_secs_f64() * 1e3,
            queue_wait_ms: g.queue_wait(),
            frames: crate::stats::frames_from_counters(&g.counters.snapshot()),
            admission_rejects: g.admission_rejects(),
            overloads: g.overloads(),
            gaps: g.counters.snapshot().gaps,
            tasks_alive,
            nats_connected: self.inner.sink.is_connected(),
            window: Some(self.inner.window.stats(self.oldest_unconfirmed_age())),
        }
    }

    /// Stops admitting streams, finishes every open stream (reason `shutdown`) and waits
    /// for their publishers. Within `grace`: the first half drains queues (frames still
    /// queued then are dropped, reason `shutdown`), the rest delivers the `end`s.
    pub async fn shutdown(&self, grace: Duration) -> ShutdownReport {
        self.inner.shutting_down.cancel();
        let now = Instant::now();
        let drain = now + grace / 2;
        let control = now + grace;
        let streams = self.inner.registry.all();
        for s in &streams {
            s.close(EndReason::Shutdown, Some(drain), Some(control));
        }
        let count = streams.len();
        drop(streams);
        // Publishers exit by the control deadline; allow one more publish timeout.
        let until = control + self.inner.config.publish_timeout() + Duration::from_millis(100);
        let _ = tokio::time::timeout_at(until, self.wait_idle()).await;
        ShutdownReport {
            streams: count,
            unfinished: self.active_streams(),
        }
    }

    /// Resolves when no stream is active.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.inner.registry.empty.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.registry.lock().is_empty() {
                return;
            }
            notified.await;
        }
    }
}
