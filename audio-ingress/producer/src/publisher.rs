//! The publisher: one task per stream that takes packets from the stream's queue and
//! hands them to NATS, each call bounded by `publish_timeout`.
//!
//! With the confirmation window on (the default, [`crate::confirm`]), a frame first
//! takes room in the connection's window (waiting at most until it would exceed the age
//! bound), and after the hand-over stays pending in its stream until the server
//! confirms it. The `end` waits (until the control deadline) for the stream's frames to
//! be settled, so that it can carry the cumulative `Weir-Possibly-Lost` report.
//!
//! Frames arrive encoded ([`crate::queue`]), their capture time in the packet meta, and
//! go without NATS headers (they halve the publish rate, see
//! [`StreamConfig::frame_headers`](crate::StreamConfig::frame_headers)) unless
//! `frame_headers = true`, a `Weir-Possibly-Lost` declaration or a lossless sink
//! (`Nats-Msg-Id`) needs them.
//!
//! Two paths per frame. The **fast path** ([`Publisher::publish_frames`]) takes up to
//! [`MAX_BATCH`] queued frames under one lock and hands each over if it gets window
//! room and a place in the client's channel on the first poll; the first one that
//! cannot sends the rest back to the queue and takes the **slow path**
//! ([`Publisher::publish_frame`]): wait for window room until the age bound, publish
//! under `publish_timeout`, the policy on failure. (The producer's direct path in
//! [`crate::stream`] is the same hand-over done by the producer while this task is
//! parked.)
//!
//! The connection epoch is read before frames are handed over and compared with the
//! epoch of the window batch they are tagged with: if the connection changed in
//! between, they are possibly lost at once (the client may have dropped them with its
//! write buffer), never counted as confirmed by a marker of the new connection.
//!
//! Why a timeout around every call: async-nats `publish` returns once the message is in
//! the client's command channel; when that channel is full (server slow, stopped or
//! disconnected) it waits without limit. The channel send is cancel-safe, so a timed-out
//! publish simply did not queue the message.
//!
//! What a failed publish means, by packet (the policies' table: docs/audio-ingress.md,
//! "Policies and their trade-offs"):
//! - **frame**: one attempt, then the policy (`publish_timeout`; no window room before
//!   the age bound: `max_age`); shadow mode retries it within the ceiling, a lossless
//!   sink within the age budget;
//! - **gap marker**: retried, absorbing later drops, until it is handed over (once the
//!   stream is closing, until its control deadline);
//! - **end**: retried until the control deadline, then counted (`control_packets_lost`)
//!   and logged.
//!
//! Invariants: the task owns the stream's registry slot and releases it (by `Drop`) when
//! it exits; it exits only after handing out the `end` (or giving up on it at the
//! deadline); it never spawns.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::{HeaderMap, HeaderName, HeaderValue, Subject};
use bytes::Bytes;
use tokio::time::{Instant, timeout};
use weir_protocol::WireName;
use weir_protocol::audio::extension::{PROTOCOL_VERSION, PossibleLoss, headers};
use weir_protocol::audio::{AudioFormat, BodyRef, EncodeError, Gap, encode_packet_ref};
use weir_service::ratelimit::LogLimit;

use crate::confirm::{Confirmer, NatsConfirmer, Window, WindowPermit};
use crate::queue::{
    AfterFailure, ControlCheck, EndPacket, Failure, Next, QueuedFrame, StreamState,
};
use crate::stats::{Account, WaitBatch, WouldReject};
use crate::stream::{SlotGuard, StreamShared};

/// Why a sink operation failed: a [`SinkErrorKind`], a short message and the client's
/// error as [`std::error::Error::source`]. Built only on failure, so the publish path
/// pays nothing for it when publishes succeed.
pub type SinkError = weir_service::Error<SinkErrorKind>;

/// What every [`Sink`] operation returns.
pub type SinkResult = Result<(), SinkError>;

/// Machine-readable kind of a [`SinkError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkErrorKind {
    /// The client refused the message (core NATS), or the JetStream publish failed.
    Publish,
    /// JetStream did not acknowledge storing the message.
    Ack,
    /// Flushing the client's buffer failed.
    Flush,
    /// The JetStream stream could not be created or opened.
    Stream,
    /// A confirmation round (see [`crate::confirm`]) failed.
    Confirm,
}

/// Where packets go: the NATS client, or a test double.
pub trait Sink: Clone + Send + Sync + 'static {
    /// Hands one message over. May wait (the caller bounds it with a timeout; the
    /// future must be cancel-safe: cancelled = not sent).
    fn publish(
        &self,
        subject: Subject,
        headers: HeaderMap,
        payload: Bytes,
    ) -> impl Future<Output = SinkResult> + Send;

    /// Whether the sink is connected (for `/readyz` and `/v1/stats`).
    fn is_connected(&self) -> bool {
        true
    }

    /// Pushes buffered messages towards the server (called at shutdown, bounded by the
    /// caller).
    fn flush(&self) -> impl Future<Output = SinkResult> + Send {
        async { Ok(()) }
    }

    /// How the server confirms what was handed over (see [`crate::confirm`]). `None`:
    /// this sink cannot confirm, and a frame counts as published once handed over.
    fn confirmer(&self) -> Option<Arc<dyn Confirmer>> {
        None
    }

    /// Whether `publish` returns only once the server stored the message and a retry
    /// with the same `Nats-Msg-Id` is deduplicated (JetStream, [`crate::jetstream`]):
    /// then a failed frame publish is retried within the frame's age budget, and every
    /// packet carries a message id.
    fn lossless(&self) -> bool {
        false
    }
}

impl Sink for async_nats::Client {
    async fn publish(&self, subject: Subject, headers: HeaderMap, payload: Bytes) -> SinkResult {
        self.publish_with_headers(subject, headers, payload)
            .await
            .map_err(|e| SinkError::with_source(SinkErrorKind::Publish, "publish failed", e))
    }

    fn is_connected(&self) -> bool {
        self.connection_state() == async_nats::connection::State::Connected
    }

    async fn flush(&self) -> SinkResult {
        async_nats::Client::flush(self)
            .await
            .map_err(|e| SinkError::with_source(SinkErrorKind::Flush, "flush failed", e))
    }

    fn confirmer(&self) -> Option<Arc<dyn Confirmer>> {
        Some(Arc::new(NatsConfirmer::new(self.clone())))
    }
}

const VERSION: HeaderName = HeaderName::from_static(headers::VERSION);
const CAPTURED_AT_MS: HeaderName = HeaderName::from_static(headers::CAPTURED_AT_MS);
const END_REASON: HeaderName = HeaderName::from_static(headers::END_REASON);
const OVERLOAD: HeaderName = HeaderName::from_static(headers::OVERLOAD);
const POSSIBLY_LOST: HeaderName = HeaderName::from_static(headers::POSSIBLY_LOST);
const MSG_ID: HeaderName = HeaderName::from_static("Nats-Msg-Id");

fn value(s: &str) -> Option<HeaderValue> {
    s.parse().ok()
}

/// Headers carried by every packet.
fn base_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(VERSION, HeaderValue::from(PROTOCOL_VERSION));
    h
}

/// Frames one fast-path round takes from the queue at most (the default budget is 25
/// frames; a batch holds no extra memory: its frames keep their reservations).
const MAX_BATCH: usize = 32;

/// Pause before retrying a publish that failed at once (server gone).
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Hands a message to `sink` only if it is accepted on the first poll (room in the
/// client's channel): never waits. `false`: not sent (the send is cancel-safe), or the
/// sink refused it; the caller takes the path with timeouts and failure handling.
pub(crate) fn publish_now<S: Sink>(
    sink: &S,
    subject: Subject,
    headers: HeaderMap,
    payload: Bytes,
) -> bool {
    let fut = sink.publish(subject, headers, payload);
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    matches!(fut.as_mut().poll(&mut cx), std::task::Poll::Ready(Ok(())))
}

/// How often a publisher waiting for the verdict on a control packet looks whether the
/// window closed.
const END_RECHECK: Duration = Duration::from_millis(100);

/// How often one gap marker is published again after reconnects (each within its
/// verdict time).
const CONTROL_REPUBLISH_MAX: usize = 3;

/// The publisher of one stream.
pub(crate) struct Publisher<S: Sink> {
    pub stream: Arc<StreamShared>,
    pub sink: S,
    pub publish_timeout: Duration,
    pub shadow_max_age: Option<Duration>,
    /// The age bound enforced on frames waiting for window room.
    pub enforced_max_age: Duration,
    /// A producer waiting for room is woken once pending bytes are below this (the
    /// enforced byte bound less one largest frame).
    pub room_below: u64,
    pub frame_headers: bool,
    pub waits: WaitBatch,
    /// The connection's confirmation window; disabled: published at hand-over.
    pub window: Arc<Window>,
    /// Lossless sink: `Nats-Msg-Id` = this prefix + seq on every packet, and failed
    /// frame publishes are retried within the age budget.
    pub msg_id_prefix: Option<String>,
}

impl<S: Sink> Publisher<S> {
    /// Runs until the stream's `end` is handed over (or given up on).
    pub async fn run(mut self, slot: SlotGuard) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut handed = Vec::with_capacity(MAX_BATCH);
        loop {
            let now = Instant::now();
            let mut fast = false;
            let next = {
                let mut core = self.stream.lock();
                let next = core.pop(now);
                // The status only changes once the stream leaves `Open`; skip the
                // watch's lock on the per-frame path.
                if core.state() != StreamState::Open {
                    self.stream.sync_status(&core);
                }
                // A pending possible-loss declaration rides on the next frame: that
                // frame takes the slow path, which adds the header.
                if matches!(next, Next::Frame(_)) && self.fast_path() && !core.has_declaration() {
                    fast = true;
                    core.take_more(&mut batch, MAX_BATCH - 1);
                }
                next
            };
            match next {
                Next::Empty => {
                    // The pop may have dropped expired frames (`gap`).
                    self.stream.room_freed(self.room_below);
                    self.stream.global.record_waits(&mut self.waits);
                    self.stream.wake.notified().await;
                    continue;
                }
                Next::Frame(frame) => {
                    if fast {
                        self.publish_frames(frame, &mut batch, &mut handed, now)
                            .await;
                    } else {
                        self.publish_frame(frame).await;
                    }
                }
                Next::Gap(gap) => self.publish_gap(gap).await,
                Next::End(end) => {
                    self.publish_end(end).await;
                    self.stream.room_freed(0);
                    break;
                }
                Next::Done => break,
            }
            // Room appears when this task releases frames (published without a window,
            // dropped by the policy) or the stream overloaded: tell a waiting producer,
            // once per batch rather than once per frame. Frames waiting for the server's
            // confirmation free their room when the window settles them (`settled`).
            self.stream.room_freed(self.room_below);
        }
        self.stream.global.record_waits(&mut self.waits);
        self.stream.lock().flush_direct_waits();
        // The id first, then `finished`: whoever waited for the stream to finish may
        // open its id again at once.
        drop(slot);
        self.stream.mark_finished();
    }

    /// Whether frames may take the synchronous fast path ([`Self::publish_frames`]):
    /// not for a lossless sink, whose publish completes only with the server's ack.
    fn fast_path(&self) -> bool {
        self.msg_id_prefix.is_none()
    }

    /// The per-frame fast path: `first` and the frames taken with it (`rest`, in seq
    /// order) are handed to the client one by one for as long as each gets window room
    /// and a place in the client's channel at once — what happens whenever NATS keeps
    /// up. One lock to take the batch, one to park it as unconfirmed, one clock read.
    ///
    /// The first frame that cannot go at once leaves the fast path: the frames behind
    /// it go back to the front of the queue (where the age bound and the policy apply
    /// to them again) and it takes [`Self::publish_frame`], the path with waiting,
    /// timeouts and failure handling. So a stall behaves exactly as without batching.
    async fn publish_frames(
        &mut self,
        first: QueuedFrame,
        rest: &mut Vec<QueuedFrame>,
        handed: &mut Vec<QueuedFrame>,
        now: Instant,
    ) {
        let mut slow = None;
        let epoch = self.window.epoch();
        // One permit holds the whole batch's window room (grown frame by frame).
        let mut permit = None;
        let mut frames = std::iter::once(first).chain(rest.drain(..));
        for frame in frames.by_ref() {
            match self.try_hand_over(frame, &mut permit) {
                Ok(done) => handed.push(done),
                Err(frame) => {
                    slow = Some(frame);
                    break;
                }
            }
        }
        for frame in handed.iter() {
            self.account_handed(frame, now);
        }
        let window = self.confirming().cloned();
        let register = {
            let mut core = self.stream.lock();
            let register = match &window {
                Some(w) => core.hand_over_all(handed.drain(..), permit, w.open_tag(epoch)),
                None => false,
            };
            core.requeue_front(frames);
            register
        };
        if window.is_none() {
            // No confirmation: published now; dropping the frames releases them.
            self.account().published(handed.len() as u64);
            handed.clear();
        }
        if register && let Some(w) = &window {
            w.register(&self.stream);
        }
        if let Some(frame) = slow {
            self.publish_frame(frame).await;
        }
    }

    /// One frame through the fast path: not while the channel is congested, window room
    /// now (taken into the batch's `permit`), and its packet accepted by the client's
    /// channel on the first poll. `Err` gives the frame back untouched, its window room
    /// returned (a publish future dropped before completing did not queue the message).
    fn try_hand_over(
        &mut self,
        frame: QueuedFrame,
        permit: &mut Option<WindowPermit>,
    ) -> Result<QueuedFrame, QueuedFrame> {
        if self.window.congested() {
            return Err(frame);
        }
        let bytes = crate::queue::charge_of(frame.pcm_len);
        let grown = match (self.confirming(), permit.as_mut()) {
            (None, _) => false,
            (Some(_), Some(p)) => {
                if !p.try_grow(bytes) {
                    return Err(frame);
                }
                true
            }
            (Some(w), None) => match w.try_acquire(bytes) {
                Some(p) => {
                    *permit = Some(p);
                    false
                }
                None => return Err(frame),
            },
        };
        if publish_now(
            &self.sink,
            self.stream.subject.clone(),
            self.frame_headers(&frame),
            frame.packet.clone(),
        ) {
            Ok(frame)
        } else {
            match permit.as_mut() {
                Some(p) if grown => p.shrink(bytes),
                _ => *permit = None,
            }
            Err(frame)
        }
    }

    /// The headers of a frame: none by default (async-nats then sends a plain `PUB`,
    /// no allocation); the version and capture time with `frame_headers`.
    fn frame_headers(&self, frame: &QueuedFrame) -> HeaderMap {
        if self.frame_headers {
            let mut h = base_headers();
            h.insert(CAPTURED_AT_MS, HeaderValue::from(frame.captured_at_ms));
            h
        } else {
            HeaderMap::new()
        }
    }

    /// Accounts one frame handed over: its queue wait, and in shadow mode whether the
    /// age bound would have dropped it.
    fn account_handed(&mut self, frame: &QueuedFrame, now: Instant) {
        let wait = now.saturating_duration_since(frame.enqueued_at);
        if let Some(max_age) = self.shadow_max_age
            && wait > max_age
        {
            self.account().would_reject(WouldReject::Age);
        }
        self.stream.account().handed_over(wait, &mut self.waits);
    }

    fn account(&self) -> Account<'_> {
        self.stream.account()
    }

    /// Encodes one packet of this stream (borrowing its session id: no per-frame copy).
    fn encode(
        &self,
        seq: u64,
        captured_at_ms: Option<u64>,
        body: BodyRef<'_>,
    ) -> Result<Bytes, EncodeError> {
        encode_packet_ref(
            seq,
            AudioFormat::DEPLOYED,
            self.stream.session.as_deref(),
            captured_at_ms,
            body,
        )
    }

    /// Adds a pending possible-loss declaration of this stream to `headers` of the
    /// packet `seq`; returns it so that it can be restored if the packet is not handed
    /// over.
    fn declare(&self, headers: &mut HeaderMap, seq: u64) -> Option<PossibleLoss> {
        let d = self.stream.lock().take_declaration(seq)?;
        if let Some(v) = value(&d.to_header_value()) {
            if headers.get(VERSION).is_none() {
                headers.insert(VERSION, HeaderValue::from(PROTOCOL_VERSION));
            }
            headers.insert(POSSIBLY_LOST, v);
        }
        Some(d)
    }

    /// Adds `Nats-Msg-Id` for a lossless sink.
    fn identify(&self, headers: &mut HeaderMap, seq: u64) {
        if let Some(prefix) = &self.msg_id_prefix
            && let Some(v) = value(&format!("{prefix}{seq}"))
        {
            headers.insert(MSG_ID, v);
        }
    }

    fn undeclare(&self, d: Option<PossibleLoss>) {
        if let Some(d) = d {
            self.stream.lock().restore_declaration(d);
        }
    }

    async fn attempt(
        &self,
        headers: HeaderMap,
        payload: Bytes,
        packet: &'static str,
    ) -> Result<(), Failure> {
        let fut = self
            .sink
            .publish(self.stream.subject.clone(), headers, payload);
        let mut fut = std::pin::pin!(fut);
        // Most publishes complete at once (room in the client's channel): skip the
        // timer (and its clock read) then. The send is cancel-safe either way.
        let result = match futures::poll!(fut.as_mut()) {
            std::task::Poll::Ready(r) => {
                self.window.set_congested(false);
                Ok(r)
            }
            std::task::Poll::Pending => {
                self.window.set_congested(true);
                timeout(self.publish_timeout, fut).await
            }
        };
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                metrics::counter!(crate::metrics::PUBLISH_ERRORS_TOTAL, crate::metrics::LABEL_PACKET => packet)
                    .increment(1);
                // Per packet of every stream during an outage: once per 5 s.
                static PUBLISH_FAILED: LogLimit = LogLimit::new(Duration::from_secs(5));
                if let Some(suppressed) = PUBLISH_FAILED.allow() {
                    tracing::warn!(stream = %self.stream.id, packet, error = %e, suppressed,
                        "NATS publish failed (suppressed: similar lines since the last one)");
                }
                Err(Failure::Error)
            }
            Err(_) => {
                metrics::counter!(crate::metrics::PUBLISH_TIMEOUTS_TOTAL, crate::metrics::LABEL_PACKET => packet)
                    .increment(1);
                Err(Failure::Timeout)
            }
        }
    }

    /// The window to use, if frames wait for the server's confirmation.
    fn confirming(&self) -> Option<&Arc<Window>> {
        Some(&self.window).filter(|w| w.enabled())
    }

    async fn publish_frame(&mut self, mut frame: QueuedFrame) {
        loop {
            let permit = match self.confirming() {
                Some(w) => {
                    let deadline = frame.enqueued_at + self.enforced_max_age;
                    w.acquire(crate::queue::charge_of(frame.pcm_len), deadline)
                        .await
                }
                None => None,
            };
            let epoch = self.window.epoch();
            let result = if self.confirming().is_some() && permit.is_none() {
                Err(Failure::Expired)
            } else {
                let mut headers = self.frame_headers(&frame);
                let declared = self.declare(&mut headers, frame.seq);
                self.identify(&mut headers, frame.seq);
                let r = self.attempt(headers, frame.packet.clone(), "frame").await;
                if r.is_err() {
                    self.undeclare(declared);
                }
                r
            };
            let now = Instant::now();
            match result {
                Ok(()) => {
                    self.account_handed(&frame, now);
                    match (self.confirming(), permit) {
                        (Some(w), permit) => {
                            // The batch is read under the stream lock, which the window
                            // task also takes to settle: see `confirm` (batches).
                            let register = {
                                let mut core = self.stream.lock();
                                core.hand_over(frame, permit, w.open_tag(epoch))
                            };
                            if register {
                                w.register(&self.stream);
                            }
                        }
                        // No confirmation: published now; dropping the frame releases
                        // its reservation.
                        (None, _) => self.account().published(1),
                    }
                    return;
                }
                Err(failure) => {
                    drop(permit);
                    if self.msg_id_prefix.is_some()
                        && failure != Failure::Expired
                        && now < frame.enqueued_at + self.enforced_max_age
                    {
                        // Lossless: the same message id again; the server keeps one copy.
                        if failure == Failure::Error {
                            tokio::time::sleep(self.publish_timeout.min(RETRY_PAUSE)).await;
                        }
                        continue;
                    }
                    let after = {
                        let mut core = self.stream.lock();
                        let after = core.inflight_failed(frame, failure, now);
                        self.stream.sync_status(&core);
                        after
                    };
                    match after {
                        AfterFailure::Retry(f) => frame = f,
                        AfterFailure::Dropped => return,
                    }
                }
            }
        }
    }

    async fn publish_gap(&self, mut gap: Gap) {
        loop {
            let deadline = {
                let mut core = self.stream.lock();
                core.merge_into_gap(&mut gap, Instant::now());
                core.control_deadline()
            };
            let Ok(payload) = self.encode(gap.last_seq, None, BodyRef::Gap(&gap)) else {
                // Built from admitted frames; cannot be inconsistent. Count and move on.
                self.stream.global.control_lost("gap");
                return;
            };
            let mut headers = base_headers();
            let declared = self.declare(&mut headers, gap.last_seq);
            self.identify(&mut headers, gap.last_seq);
            let epoch = self.window.epoch();
            let attempt = self.attempt(headers.clone(), payload.clone(), "gap").await;
            if attempt.is_err() {
                self.undeclare(declared);
            }
            match attempt {
                Ok(()) => {
                    // Confirmed like a frame; the same marker again if a reconnect came
                    // first (not re-merged: a consumer that got the first copy sees the
                    // second as a stale packet, never as new seqs). While the stream is
                    // open, the verdict is awaited for at most `max_age`.
                    let verdict_by =
                        deadline.unwrap_or_else(|| Instant::now() + self.enforced_max_age);
                    let mut epoch = epoch;
                    for _ in 0..CONTROL_REPUBLISH_MAX {
                        if !self
                            .control_lost_in_reconnect(epoch, Some(verdict_by))
                            .await
                        {
                            break;
                        }
                        self.stream.global.control_republished("gap");
                        epoch = self.window.epoch();
                        let again = self.attempt(headers.clone(), payload.clone(), "gap").await;
                        if again.is_err() {
                            break;
                        }
                    }
                    self.account().gap_published(gap.frames());
                    self.stream.gap_published(gap);
                    return;
                }
                Err(failure) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        self.stream.global.control_lost("gap");
                        tracing::warn!(stream = %self.stream.id, first_seq = gap.first_seq,
                            last_seq = gap.last_seq, "gap marker not delivered before the deadline");
                        return;
                    }
                    if failure == Failure::Error {
                        // An error returns at once; do not spin.
                        tokio::time::sleep(self.publish_timeout).await;
                    }
                }
            }
        }
    }

    /// Waits until every frame of the stream handed to NATS is confirmed or declared
    /// possibly lost, at most until `deadline`.
    async fn wait_settled(&self, deadline: Option<Instant>) {
        if self.confirming().is_none() {
            return;
        }
        loop {
            let mut settled = self.stream.settled_notified();
            if !self.stream.lock().has_unconfirmed() {
                return;
            }
            match deadline {
                Some(d) if Instant::now() >= d => return,
                Some(d) => {
                    tokio::select! {
                        () = &mut settled => {}
                        () = tokio::time::sleep_until(d) => {}
                    }
                }
                None => settled.await,
            }
        }
    }

    /// With a confirmation window: waits (at most until `deadline`) for the window's
    /// verdict on the control packet (`end` or gap marker) just handed over on
    /// connection `epoch`; `true` when the connection was replaced before a marker
    /// behind it came back — the client may have discarded it with its write buffer, so
    /// it must go again. One without a verdict by the deadline (the server stalled)
    /// stays counted as published.
    async fn control_lost_in_reconnect(&self, epoch: u64, deadline: Option<Instant>) -> bool {
        let Some(w) = self.confirming() else {
            return false;
        };
        let register = self.stream.lock().control_handed_over(w.open_tag(epoch));
        if register {
            w.register(&self.stream);
        }
        loop {
            let mut settled = self.stream.settled_notified();
            match self.stream.lock().control_check() {
                ControlCheck::Lost => return true,
                ControlCheck::Confirmed | ControlCheck::None => return false,
                ControlCheck::Pending(_) => {}
            }
            let now = Instant::now();
            if w.is_closed() || deadline.is_some_and(|d| now >= d) {
                return false;
            }
            // Re-check now and then: a closed window settles nothing and wakes no one.
            let recheck = now + END_RECHECK;
            let until = deadline.map_or(recheck, |d| d.min(recheck));
            tokio::select! {
                () = &mut settled => {}
                () = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn publish_end(&self, end: EndPacket) {
        let Ok(payload) = self.encode(end.seq, None, BodyRef::End) else {
            self.stream.global.control_lost("end");
            return;
        };
        let deadline = self.stream.lock().control_deadline();
        self.wait_settled(deadline).await;
        let mut headers = base_headers();
        if let Some(d) = self.stream.lock().end_declaration()
            && let Some(v) = value(&d.to_header_value())
        {
            headers.insert(POSSIBLY_LOST, v);
        }
        if let Some(v) = value(end.reason.as_str()) {
            headers.insert(END_REASON, v);
        }
        if let Some(o) = &end.overload
            && let Some(v) = value(&o.to_header_value())
        {
            headers.insert(OVERLOAD, v);
        }
        self.identify(&mut headers, end.seq);
        let deadline = self.stream.lock().control_deadline();
        loop {
            let epoch = self.window.epoch();
            match self.attempt(headers.clone(), payload.clone(), "end").await {
                Ok(()) => {
                    if self.control_lost_in_reconnect(epoch, deadline).await {
                        // Published again on the new connection; a consumer that got
                        // the first copy ignores the second (an end for an ended stream).
                        self.stream.global.control_republished("end");
                        tracing::info!(stream = %self.stream.id, seq = end.seq,
                            "end handed over before a reconnect: published again");
                        continue;
                    }
                    self.stream.global.end_published(end.reason);
                    self.stream.end_delivered();
                    tracing::debug!(stream = %self.stream.id, seq = end.seq, reason = end.reason.as_str(), "end published");
                    return;
                }
                Err(failure) => {
                    let now = Instant::now();
                    if deadline.is_none_or(|d| now >= d) {
                        self.stream.global.control_lost("end");
                        tracing::warn!(stream = %self.stream.id, seq = end.seq,
                            reason = end.reason.as_str(), "end not delivered before the deadline");
                        return;
                    }
                    if failure == Failure::Error {
                        tokio::time::sleep(self.publish_timeout).await;
                    }
                }
            }
        }
    }
}
