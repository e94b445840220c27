//! The producer's end of one stream: pushing frames (the hot path), the rate class,
//! closing and finishing.
//!
//! Invariants (with the parent module's): `try_push` takes one mutex and never awaits;
//! `push` waits only for room, bounded by `max_wait`; a handle dropped without
//! `finish` ends its stream with reason `producer_gone`, exactly once.

use super::*;

/// Where a stream stands ([`StreamView::position`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Sequence number of the last frame admitted (0 before the first).
    pub last_seq: u64,
    /// Samples of that frame (0 before the first).
    pub frame_samples: u64,
    /// Time since that frame was admitted (since the open before the first).
    pub since_last_frame: Duration,
    /// The stream still admits frames.
    pub open: bool,
}

/// The producer's end of one stream. Not `Clone`: one producer per stream.
///
/// Dropping it without [`finish`](Self::finish) ends the stream with reason
/// `producer_gone` (what is queued is still published, then the `end`).
///
/// It derefs to its [`StreamView`], which reads the stream: id, subject, status,
/// snapshot, position, the wait for its publisher.
pub struct StreamHandle {
    pub(super) view: StreamView,
    pub(super) closed: bool,
    pub(super) finish_bound: Duration,
}

impl std::ops::Deref for StreamHandle {
    type Target = StreamView;

    fn deref(&self) -> &StreamView {
        &self.view
    }
}

impl std::fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamHandle")
            .field("id", &self.shared.id)
            .field("subject", &self.shared.subject)
            .finish_non_exhaustive()
    }
}

fn to_push_error(r: Refusal) -> PushError {
    match r {
        Refusal::Full {
            pending_bytes,
            max_bytes,
            ..
        } => PushError::Full {
            pending_bytes,
            max_bytes,
        },
        Refusal::Overloaded(o) => PushError::Overloaded(o),
        Refusal::Closed(r) => PushError::Closed(r),
        Refusal::Invalid(e) => PushError::InvalidFrame(e),
    }
}

impl StreamHandle {
    /// Offers one frame of s16le mono PCM (even length, 2..=`max_frame_bytes`).
    /// Synchronous: never blocks, never spawns. `Ok(seq)` when admitted.
    ///
    /// - `close`: a full queue refuses with [`PushError::Full`]; a queue that stays
    ///   full for `max_wait` overloads the stream ([`PushError::Overloaded`], now and
    ///   for every later push).
    /// - `gap`: never `Full`; the oldest frames make room (declared in a gap marker).
    pub fn try_push(&self, pcm: Bytes) -> Result<u64, PushError> {
        self.offer(&pcm, OfferMode::Try).map_err(to_push_error)
    }

    /// Like [`try_push`](Self::try_push), but a full `close` queue waits for room for
    /// at most `max_wait`, then overloads the stream.
    pub async fn push(&self, pcm: Bytes) -> Result<u64, PushError> {
        // Fast path: room now. No waiter registration, no `room_wanted` flag (so the
        // publisher does not notify per frame).
        match self.offer(&pcm, OfferMode::Wait) {
            Err(Refusal::Full { .. }) => {}
            other => return other.map_err(to_push_error),
        }
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            // Before offering: a frame taken after this store is followed by a notify.
            self.shared.room_wanted.store(true, Ordering::Release);
            match self.offer(&pcm, OfferMode::Wait) {
                Err(Refusal::Full { overload_at, .. }) => {
                    tokio::select! {
                        () = &mut room => {}
                        () = tokio::time::sleep_until(overload_at) => {}
                    }
                }
                other => return other.map_err(to_push_error),
            }
        }
    }

    /// Offers `pcm`: admitted frames are encoded here, once, in the producer's task
    /// (the packet the publisher and any retry hand over), and handed to NATS right
    /// away when the direct path allows it.
    fn offer(&self, pcm: &Bytes, mode: OfferMode) -> Result<u64, Refusal> {
        let shared = &self.shared;
        let encode = |arena: &mut BytesMut, seq, captured_at_ms| {
            if arena.capacity() == 0 {
                *arena = BytesMut::with_capacity(PACKET_ARENA_BYTES);
            }
            encode_packet_in(
                arena,
                seq,
                AudioFormat::DEPLOYED,
                shared.session.as_deref(),
                Some(captured_at_ms),
                BodyRef::Frame(pcm),
            )
            .ok()
        };
        let (result, wake, register) = {
            let mut core = shared.lock();
            let was_empty = core.is_empty();
            let result = core.offer_with(pcm.len(), Instant::now(), mode, encode);
            let mut wake = match &result {
                Ok(_) => was_empty,
                Err(Refusal::Overloaded(_)) => {
                    shared.sync_status(&core);
                    true
                }
                Err(_) => false,
            };
            let mut register = false;
            if let (Ok(seq), Some(direct)) = (&result, &shared.direct)
                && was_empty
                && let Some(frame) = core.take_direct(*seq)
            {
                match shared.hand_over_direct(direct, &mut core, frame) {
                    Ok(r) => {
                        register = r;
                        wake = false;
                    }
                    Err(frame) => core.restore_direct(frame),
                }
            }
            (result, wake, register)
        };
        if register && let Some(d) = &shared.direct {
            d.window.register(shared);
        }
        if wake {
            shared.wake.notify_one();
        }
        result
    }

    /// Declares `frames` frames (`samples` samples) that the stream never received —
    /// the loss of a resumed connection, or of the producer's source (see
    /// `FrameQueue::skip`): they take the next seqs, and the declaration (reason
    /// `resume` / `source`) goes out in seq order. `Ok(None)` for 0 frames.
    ///
    /// The producer's status counts it as a gap at once when it is declared in a
    /// header (a marker counts when the publisher hands it over), so a door tells its
    /// producer either way.
    pub fn declare_lost(
        &self,
        frames: u64,
        samples: u64,
        cause: Lost,
    ) -> Result<Option<Gap>, PushError> {
        let (gap, marker) = {
            let mut core = self.shared.lock();
            (
                core.skip(frames, samples, cause).map_err(to_push_error)?,
                core.gap_packets(),
            )
        };
        if let Some(gap) = gap {
            if marker {
                self.shared.wake.notify_one();
            } else {
                self.shared.gap_published(gap);
            }
        }
        Ok(gap)
    }

    /// Lowers this stream's rate bound (`max_rate`, in thousandths of real time) — a
    /// producer token's rate class, given by the front door that authenticated it.
    pub fn limit_rate(&self, max_rate_permille: u32) {
        self.shared.lock().limit_rate(max_rate_permille);
    }

    /// A read-only view of the stream that outlives this handle (for an observer that
    /// reports the stream's events and summary after [`finish`](Self::finish) took the
    /// handle). The view neither ends the stream nor holds its registry slot.
    pub fn view(&self) -> StreamView {
        self.view.clone()
    }

    /// Ends the stream without waiting: no more frames; what is queued is published,
    /// then `end` with `reason`. Later pushes are refused.
    pub fn close(&mut self, reason: EndReason) {
        if !self.closed {
            self.closed = true;
            self.shared.close(reason, None, None);
        }
    }

    /// Ends the stream (reason `producer`) and waits until its publisher has handed
    /// the `end` to NATS (or given up at `end_timeout`).
    pub async fn finish(self) -> StreamSummary {
        self.finish_with(EndReason::Producer).await
    }

    /// [`finish`](Self::finish) with another end reason (e.g. `idle`, `error`).
    pub async fn finish_with(mut self, reason: EndReason) -> StreamSummary {
        self.close(reason);
        self.wait_ended().await
    }

    /// Waits (at most the finish bound) until every frame settled and the `end` was
    /// confirmed or given up; the summary. Does not close the stream: a `closed` event
    /// after an overload reports the final counts, not those at the stop.
    pub async fn wait_ended(&self) -> StreamSummary {
        self.wait_finished(self.finish_bound + Duration::from_millis(500))
            .await
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        self.close(EndReason::ProducerGone);
    }
}

/// A read-only view of one stream ([`StreamHandle::view`]): its status, snapshot and
/// the wait for its publisher. Cheap to clone.
///
/// Invariant: a view never changes the stream. Dropping it does not end the stream,
/// and it does not hold the id's registry slot (the publisher releases that when it
/// exits); it only keeps the stream's shared state (queue, counters) in memory.
#[derive(Clone)]
pub struct StreamView {
    pub(super) shared: Arc<StreamShared>,
}

impl std::fmt::Debug for StreamView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamView")
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

impl StreamView {
    /// The stream id.
    pub fn id(&self) -> &StreamId {
        &self.shared.id
    }

    /// The NATS subject the stream publishes to.
    pub fn subject(&self) -> &str {
        self.shared.subject.as_str()
    }

    /// The session id the stream was opened with.
    pub fn session_id(&self) -> Option<&str> {
        self.shared.session.as_deref()
    }

    /// A watch on the stream's status (overload, gaps published, end delivered).
    pub fn status(&self) -> watch::Receiver<StreamStatus> {
        self.shared.status.subscribe()
    }

    /// The stream as the admin view shows it.
    pub fn snapshot(&self) -> StreamSnapshot {
        self.shared.snapshot()
    }

    /// Where the stream stands, for a producer that resumes it.
    pub fn position(&self) -> Position {
        let now = Instant::now();
        let core = self.shared.lock();
        Position {
            last_seq: core.last_seq(),
            frame_samples: core.last_frame_samples(),
            since_last_frame: core.last_admitted_at().map_or_else(
                || now.saturating_duration_since(self.shared.opened_at),
                |t| now.saturating_duration_since(t),
            ),
            open: core.state() == StreamState::Open,
        }
    }

    /// Waits (at most `bound`) for the publisher to exit and returns the summary.
    /// Does not close the stream.
    pub async fn wait_finished(&self, bound: Duration) -> StreamSummary {
        let mut rx = self.status();
        let finished = tokio::time::timeout(bound, rx.wait_for(|s| s.finished))
            .await
            .is_ok_and(|r| r.is_ok());
        StreamSummary {
            snapshot: self.shared.snapshot(),
            finished,
        }
    }
}
