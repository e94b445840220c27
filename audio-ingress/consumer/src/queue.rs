//! One stream's queue between the subscription's dispatcher and the stream's handler
//! task, bounded by bytes *and* by the age of its oldest event.
//!
//! Invariants a reader must not break:
//! - The queue never holds more than `max_bytes` (PCM bytes plus [`CONTROL_EVENT_BYTES`]
//!   per gap notice), except for the single event admitted into an empty queue and
//!   the final [`End`] (0 bytes), which is always admitted so a handler always learns
//!   that its stream ended.
//! - [`StreamQueue::push`] never waits: the dispatcher serves many streams and must not
//!   be held up by one slow handler. Over the bound it either refuses (`close` policy:
//!   the caller ends the stream) or drops the oldest events and puts one
//!   [`GapCause::Overload`] notice covering exactly their seqs in their place (`gap`
//!   policy). Every refused or dropped frame is returned to the caller to be counted.
//! - After [`StreamQueue::close`] nothing else is queued; after the handler task has
//!   gone ([`ReceiverGuard`] dropped) the queue is emptied and refuses everything.
//!
//! Storage, byte and frame totals and ages are [`BoundedQueue`]'s, and the budget and
//! its policy are [`QueueLimits`] and [`WhenFull`] (`weir-service`, shared with the
//! ingress's frame queue); applying them and the overload notice are this file's.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use weir_service::bounded::{BoundedQueue, Charged, QueueLimits, WhenFull};
use weir_service::sync::locked;

use super::event::{End, GapCause, GapNotice, LocalOverload, OverloadBound, StreamEvent};

/// Bytes a gap notice counts against the bound (it carries no PCM, but an unbounded
/// number of them must not fit either).
pub(crate) const CONTROL_EVENT_BYTES: usize = 64;

struct Queued {
    event: StreamEvent,
    at: Instant,
}

impl Charged for Queued {
    fn charge(&self) -> usize {
        match &self.event {
            StreamEvent::Frame(f) => f.pcm.len(),
            StreamEvent::Gap(_) | StreamEvent::LossDeclared(_) => CONTROL_EVENT_BYTES,
            StreamEvent::End(_) => 0,
        }
    }

    fn enqueued_at(&self) -> Instant {
        self.at
    }

    fn frames(&self) -> usize {
        usize::from(matches!(self.event, StreamEvent::Frame(_)))
    }
}

#[derive(Default)]
struct State {
    items: BoundedQueue<Queued>,
    closed: bool,
    receiver_gone: bool,
}

/// The result of [`StreamQueue::push`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Push {
    /// Queued. Under the `gap` policy, older frames may have been dropped to make room:
    /// `dropped_frames` of them (already replaced by an overload gap notice).
    Queued {
        /// Frames dropped from the queue to make room.
        dropped_frames: u64,
        /// The overload that caused the drop, if any.
        overload: Option<LocalOverload>,
    },
    /// Not queued: over the bound under the `close` policy. The caller ends the stream.
    Overloaded(LocalOverload),
    /// Not queued: the stream was already closed.
    Closed,
    /// Not queued: the handler task is gone.
    ReceiverGone,
}

/// A snapshot of a queue's fill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Fill {
    /// Bytes counted against the bound.
    pub(crate) bytes: usize,
    /// Frames queued.
    pub(crate) frames: usize,
    /// Age of the oldest queued event.
    pub(crate) oldest_age: Duration,
}

/// One stream's bounded queue. Shared between the dispatcher (pushes) and the stream's
/// handler task (pops).
pub(crate) struct StreamQueue {
    limits: QueueLimits,
    state: Mutex<State>,
    ready: Notify,
    /// Woken (all waiters) when the queue is closed or its handler task is gone: see
    /// [`StreamQueue::ended`].
    ended: Notify,
    /// Frames the handler finished with (counted by the handler task without the
    /// consumer-wide registry lock; folded into the stream's record when it finishes).
    delivered: AtomicU64,
}

impl StreamQueue {
    /// An empty queue.
    pub(crate) fn new(limits: QueueLimits) -> Self {
        Self {
            limits,
            state: Mutex::new(State::default()),
            ready: Notify::new(),
            ended: Notify::new(),
            delivered: AtomicU64::new(0),
        }
    }

    /// Counts one frame the handler finished with.
    pub(crate) fn count_delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    /// Frames the handler finished with so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Queues `event` (a frame or a gap notice; use [`Self::close`] for the end),
    /// applying the bound and the policy. Never waits.
    pub(crate) fn push(&self, event: StreamEvent, now: Instant) -> Push {
        let item = Queued { event, at: now };
        let bytes = item.charge();
        let mut st = locked(&self.state);
        if st.receiver_gone {
            return Push::ReceiverGone;
        }
        if st.closed {
            return Push::Closed;
        }
        let mut dropped_frames = 0;
        let mut first_overload = None;
        while let Some(overload) = self.over_bound(&st, bytes, now) {
            first_overload.get_or_insert(overload);
            match self.limits.policy {
                WhenFull::Close => return Push::Overloaded(overload),
                WhenFull::Gap => dropped_frames += drop_oldest(&mut st.items),
            }
        }
        st.items.push_back(item);
        drop(st);
        self.ready.notify_one();
        Push::Queued {
            dropped_frames,
            overload: first_overload,
        }
    }

    /// Whether admitting `bytes` more now would break the bound (and which part). A
    /// merged overload notice at the front (left by an earlier drop) is not "old
    /// audio": the age bound looks at the oldest event behind it, and a queue holding
    /// only that notice admits, or dropping could not make progress.
    fn over_bound(&self, st: &State, bytes: usize, now: Instant) -> Option<LocalOverload> {
        st.items.front()?;
        let oldest = oldest_age_behind_notice(&st.items, now);
        let oldest_age = oldest.unwrap_or_default();
        let bound = if !st.items.fits(bytes, self.limits.max_bytes) {
            oldest?;
            OverloadBound::Bytes
        } else if self.limits.too_old(oldest_age) {
            OverloadBound::Age
        } else {
            return None;
        };
        Some(LocalOverload {
            bound,
            pending_bytes: st.items.bytes(),
            oldest_age,
        })
    }

    /// Queues the final event and closes the queue. Always admitted (0 bytes) unless the
    /// queue is already closed or its handler is gone; returns whether it was queued.
    pub(crate) fn close(&self, end: End, now: Instant) -> bool {
        let mut st = locked(&self.state);
        if st.closed || st.receiver_gone {
            return false;
        }
        st.closed = true;
        st.items.push_back(Queued {
            event: StreamEvent::End(end),
            at: now,
        });
        drop(st);
        self.ready.notify_one();
        self.ended.notify_waiters();
        true
    }

    /// Whether the stream was ended for its handler (its `End` is queued) or the
    /// handler task is gone.
    pub(crate) fn is_ended(&self) -> bool {
        let st = locked(&self.state);
        st.closed || st.receiver_gone
    }

    /// Until [`Self::is_ended`].
    pub(crate) async fn ended(&self) {
        loop {
            let notified = self.ended.notified();
            tokio::pin!(notified);
            // Registered before the check: a close in between is not missed.
            notified.as_mut().enable();
            if self.is_ended() {
                return;
            }
            notified.await;
        }
    }

    /// The next event, waiting for one. `None` once the queue is closed and empty (the
    /// `End` has been taken) or the receiver is gone.
    pub(crate) async fn pop(&self) -> Option<StreamEvent> {
        loop {
            {
                let mut st = locked(&self.state);
                if let Some(q) = st.items.pop_front() {
                    return Some(q.event);
                }
                if st.closed || st.receiver_gone {
                    return None;
                }
            }
            // `notify_one` stores a permit when nobody waits, so a push between the
            // check above and this await is not missed.
            self.ready.notified().await;
        }
    }

    /// Current fill.
    pub(crate) fn fill(&self, now: Instant) -> Fill {
        let st = locked(&self.state);
        Fill {
            bytes: st.items.bytes(),
            frames: st.items.frames(),
            oldest_age: oldest_age_behind_notice(&st.items, now).unwrap_or_default(),
        }
    }

    /// Marks the handler gone and empties the queue; returns the frames discarded.
    fn receiver_gone(&self) -> usize {
        let mut st = locked(&self.state);
        st.receiver_gone = true;
        let discarded = st.items.drain_all().map(|q| q.frames()).sum();
        drop(st);
        self.ended.notify_waiters();
        discarded
    }
}

/// The age of the oldest queued event that is not a merged overload notice (those only
/// stand for audio already dropped).
fn oldest_age_behind_notice(items: &BoundedQueue<Queued>, now: Instant) -> Option<Duration> {
    let notice = items
        .front()
        .is_some_and(|q| matches!(&q.event, StreamEvent::Gap(g) if g.cause == GapCause::Overload));
    items.age_at(usize::from(notice), now)
}

/// Drops the oldest events, merging them into one overload notice at the front, until
/// at least one frame's bytes or one other event was freed. Returns frames dropped.
fn drop_oldest(items: &mut BoundedQueue<Queued>) -> u64 {
    let Some(Queued { event, at }) = items.pop_front() else {
        return 0;
    };
    let (mut notice, mut dropped) = match event {
        // A loss declaration covers no seq: dropping it frees its bytes and leaves the
        // timeline whole. (The end is never queued while pushes are admitted.)
        StreamEvent::LossDeclared(_) | StreamEvent::End(_) => return 0,
        StreamEvent::Frame(f) => (
            GapNotice {
                first_seq: f.seq,
                last_seq: f.seq,
                samples: Some(f.samples),
                cause: GapCause::Overload,
            },
            1,
        ),
        StreamEvent::Gap(g) => (
            GapNotice {
                cause: GapCause::Overload,
                ..g
            },
            0,
        ),
    };
    // If the front was a notice, extend it by the next event (never the end); a loss
    // declaration there covers no seq: it just goes (progress).
    if dropped == 0
        && let Some(next) = items.pop_front_if(|q| !matches!(q.event, StreamEvent::End(_)))
    {
        let (last_seq, samples) = match next.event {
            StreamEvent::Frame(f) => {
                dropped = 1;
                (f.seq, Some(f.samples))
            }
            StreamEvent::Gap(g) => (g.last_seq, g.samples),
            StreamEvent::LossDeclared(_) | StreamEvent::End(_) => (notice.last_seq, Some(0)),
        };
        notice.last_seq = last_seq;
        // Declared samples come from the network: saturate.
        notice.samples = notice
            .samples
            .zip(samples)
            .map(|(a, b)| a.saturating_add(b));
    }
    items.push_front(Queued {
        event: StreamEvent::Gap(notice),
        at,
    });
    dropped
}

/// Held by the stream's handler task; when the task ends (normally or by panic) the
/// queue learns that nobody will pop again, frees its content and refuses new events.
pub(crate) struct ReceiverGuard<'a> {
    queue: &'a StreamQueue,
    on_gone: Option<Box<dyn FnOnce(usize) + Send + 'a>>,
}

impl<'a> ReceiverGuard<'a> {
    /// Guards `queue`; `on_gone` gets the number of frames discarded.
    pub(crate) fn new(queue: &'a StreamQueue, on_gone: impl FnOnce(usize) + Send + 'a) -> Self {
        Self {
            queue,
            on_gone: Some(Box::new(on_gone)),
        }
    }
}

impl Drop for ReceiverGuard<'_> {
    fn drop(&mut self) {
        let discarded = self.queue.receiver_gone();
        if let Some(f) = self.on_gone.take() {
            f(discarded);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EndCause, Frame};
    use bytes::Bytes;
    use std::sync::Arc;
    use weir_protocol::audio::AudioFormat;

    fn limits(policy: WhenFull) -> QueueLimits {
        QueueLimits {
            max_bytes: 3_200,
            max_age: Duration::from_millis(500),
            policy,
        }
    }

    fn frame(seq: u64, now: Instant) -> StreamEvent {
        StreamEvent::Frame(Frame {
            seq,
            pcm: Bytes::from(vec![0u8; 640]),
            samples: 320,
            format: AudioFormat::DEPLOYED,
            captured_at_ms: None,
            received_at: now,
        })
    }

    fn end() -> End {
        End {
            seq: None,
            last_seq: None,
            cause: EndCause::Shutdown,
        }
    }

    fn drain_now(q: &StreamQueue) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let mut st = locked(&q.state);
        while let Some(x) = st.items.pop_front() {
            out.push(x.event);
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn close_policy_refuses_over_bytes() {
        let q = StreamQueue::new(limits(WhenFull::Close));
        let now = Instant::now();
        for s in 1..=5 {
            assert!(matches!(
                q.push(frame(s, now), now),
                Push::Queued {
                    dropped_frames: 0,
                    ..
                }
            ));
        }
        let Push::Overloaded(o) = q.push(frame(6, now), now) else {
            panic!("expected overload");
        };
        assert_eq!(o.bound, OverloadBound::Bytes);
        assert_eq!(o.pending_bytes, 3_200);
        assert_eq!(q.fill(now).bytes, 3_200);
        assert!(q.close(end(), now));
        assert_eq!(q.push(frame(7, now), now), Push::Closed);
        assert_eq!(drain_now(&q).len(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn close_policy_refuses_over_age() {
        let q = StreamQueue::new(limits(WhenFull::Close));
        let t0 = Instant::now();
        q.push(frame(1, t0), t0);
        tokio::time::advance(Duration::from_millis(501)).await;
        let now = Instant::now();
        let Push::Overloaded(o) = q.push(frame(2, now), now) else {
            panic!("expected overload");
        };
        assert_eq!(o.bound, OverloadBound::Age);
        assert_eq!(o.oldest_age, Duration::from_millis(501));
    }

    #[tokio::test(start_paused = true)]
    async fn gap_policy_drops_oldest_into_one_notice() {
        let q = StreamQueue::new(limits(WhenFull::Gap));
        let now = Instant::now();
        for s in 1..=5 {
            q.push(frame(s, now), now);
        }
        // Frame 6 needs 640 bytes: frame 1 goes, its notice takes 64 bytes, so frame 2
        // goes too.
        let push = q.push(frame(6, now), now);
        assert!(
            matches!(
                push,
                Push::Queued {
                    dropped_frames: 2,
                    overload: Some(_)
                }
            ),
            "{push:?}"
        );
        assert!(q.fill(now).bytes <= 3_200);
        for s in 7..=20 {
            q.push(frame(s, now), now);
            assert!(q.fill(now).bytes <= 3_200);
        }
        let events = drain_now(&q);
        let StreamEvent::Gap(g) = &events[0] else {
            panic!("expected gap first: {events:?}");
        };
        assert_eq!(g.cause, GapCause::Overload);
        assert_eq!(g.first_seq, 1);
        let next = match &events[1] {
            StreamEvent::Frame(f) => f.seq,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            g.last_seq + 1,
            next,
            "the notice covers exactly the dropped frames"
        );
        assert_eq!(g.samples, Some(320 * g.frames()));
        // Seqs are contiguous after the notice.
        let seqs: Vec<u64> = events[1..]
            .iter()
            .map(|e| match e {
                StreamEvent::Frame(f) => f.seq,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(seqs, (next..=20).collect::<Vec<_>>());
    }

    /// A loss declaration covers no seq: under the `gap` policy it is dropped without
    /// widening the overload notice, whether it is at the front or right behind it,
    /// and the bound still makes progress.
    #[tokio::test(start_paused = true)]
    async fn gap_policy_drops_loss_declarations_without_covering_seqs() {
        use crate::event::LossDeclaration;
        use weir_protocol::audio::extension::PossibleLossReason;
        let declared = || {
            StreamEvent::LossDeclared(LossDeclaration {
                first_seq: 100,
                last_seq: 200,
                frames: 101,
                total_frames: 101,
                reason: PossibleLossReason::UnconfirmedAtDisconnect,
                reclassified_frames: 0,
            })
        };
        let q = StreamQueue::new(limits(WhenFull::Gap));
        let now = Instant::now();
        q.push(declared(), now);
        q.push(frame(1, now), now);
        q.push(declared(), now);
        for s in 2..=30 {
            q.push(frame(s, now), now);
            assert!(q.fill(now).bytes <= 3_200);
        }
        let events = drain_now(&q);
        let StreamEvent::Gap(g) = &events[0] else {
            panic!("expected the overload notice first: {events:?}");
        };
        assert_eq!((g.cause, g.first_seq), (GapCause::Overload, 1));
        let seqs: Vec<u64> = events[1..]
            .iter()
            .map(|e| match e {
                StreamEvent::Frame(f) => f.seq,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(seqs, (g.last_seq + 1..=30).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn gap_policy_drops_stale_frames_by_age() {
        let q = StreamQueue::new(limits(WhenFull::Gap));
        let t0 = Instant::now();
        q.push(frame(1, t0), t0);
        q.push(frame(2, t0), t0);
        tokio::time::advance(Duration::from_millis(600)).await;
        let now = Instant::now();
        let push = q.push(frame(3, now), now);
        assert!(
            matches!(
                push,
                Push::Queued {
                    dropped_frames: 2,
                    ..
                }
            ),
            "{push:?}"
        );
        let events = drain_now(&q);
        assert_eq!(events.len(), 2);
        assert!(
            matches!(&events[0], StreamEvent::Gap(g) if g.first_seq == 1 && g.last_seq == 2),
            "{events:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pop_waits_and_end_is_last() {
        let q = std::sync::Arc::new(StreamQueue::new(limits(WhenFull::Close)));
        let q2 = q.clone();
        let reader = tokio::spawn(async move {
            let mut kinds = Vec::new();
            while let Some(e) = q2.pop().await {
                kinds.push(e.kind());
            }
            kinds
        });
        let now = Instant::now();
        q.push(frame(1, now), now);
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.push(frame(2, now), now);
        q.close(end(), now);
        let kinds = reader.await.expect("reader");
        assert_eq!(kinds, vec!["frame", "frame", "end"]);
    }

    #[tokio::test(start_paused = true)]
    async fn receiver_gone_frees_and_refuses() {
        let q = StreamQueue::new(limits(WhenFull::Close));
        let now = Instant::now();
        q.push(frame(1, now), now);
        q.push(frame(2, now), now);
        let mut discarded = 0;
        drop(ReceiverGuard::new(&q, |n| discarded = n));
        assert_eq!(discarded, 2);
        assert_eq!(q.fill(now), Fill::default());
        assert_eq!(q.push(frame(3, now), now), Push::ReceiverGone);
        assert!(!q.close(end(), now));
        assert!(q.pop().await.is_none());
    }

    #[tokio::test]
    async fn ended_resolves_on_close_and_on_receiver_gone() {
        let now = Instant::now();
        let q = Arc::new(StreamQueue::new(limits(WhenFull::Close)));
        q.push(frame(1, now), now);
        assert!(!q.is_ended());
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.ended().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert!(q.close(end(), now));
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("ended() woke on close")
            .expect("no panic");
        assert!(q.is_ended());
        // Already ended: at once. The pending events are still there, in order.
        q.ended().await;
        assert_eq!(drain_now(&q).len(), 2);

        let q = Arc::new(StreamQueue::new(limits(WhenFull::Close)));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.ended().await }
        });
        tokio::task::yield_now().await;
        drop(ReceiverGuard::new(&q, |_| {}));
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("ended() woke when the receiver went")
            .expect("no panic");
    }
}
