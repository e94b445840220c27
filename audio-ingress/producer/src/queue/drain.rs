//! The publisher's side of the queue: what goes out next ([`FrameQueue::pop`]), what
//! happens to a frame whose publish failed, and the stream's last packet.
//!
//! Invariants a change must not break (with the parent module's): gap markers go out
//! before the frames behind them and the `end` last; a failed frame is requeued,
//! dropped into a gap marker or counted in the overload report, never lost silently.

use super::*;

impl FrameQueue {
    /// Takes the next item for the publisher. Order: gap markers, frames, `end`.
    pub fn pop(&mut self, now: Instant) -> Next {
        let next = self.pop_inner(now);
        // Empty: the publisher parks until woken, with nothing of this stream in its
        // hands; until its next pop a producer may hand frames over directly.
        self.publisher_idle = matches!(next, Next::Empty);
        next
    }

    pub(super) fn pop_inner(&mut self, now: Instant) -> Next {
        self.inflight_since = None;
        self.expire(now);
        if let Phase::Draining {
            deadline: Some(d), ..
        } = self.phase
            && now >= d
        {
            self.drop_all(DropReason::Shutdown);
        }
        // A marker goes out after the frames queued before it (a `rate` or `resume`
        // marker takes seqs after frames still queued): seq order on the wire.
        if let Some(g) = self.gaps.front()
            && self.items.front().is_none_or(|f| f.seq > g.last_seq)
            && let Some(g) = self.gaps.pop_front()
        {
            return Next::Gap(g);
        }
        if let Some(f) = self.items.pop_front() {
            // Taking a frame frees no room (it stays reserved until handed over, and
            // with the window until confirmed): a full `close` stream's wait goes on
            // until a frame is admitted again.
            self.inflight_since = Some(f.enqueued_at);
            return Next::Frame(f);
        }
        let (reason, overload) = match &self.phase {
            Phase::Open => return Next::Empty,
            Phase::Ended { .. } => return Next::Done,
            Phase::Draining { reason, .. } => (*reason, None),
            Phase::Ending { reason, overload } => (*reason, overload.clone()),
        };
        if self.control_deadline.is_none() {
            self.set_control_deadline(now + self.end_timeout);
        }
        self.phase = Phase::Ended {
            reason,
            overload: overload.clone(),
        };
        Next::End(EndPacket {
            seq: self.next_seq,
            reason,
            overload,
        })
    }

    /// The publish of the frame in flight failed; applies the policy to it.
    pub fn inflight_failed(
        &mut self,
        frame: QueuedFrame,
        failure: Failure,
        now: Instant,
    ) -> AfterFailure {
        self.inflight_since = None;
        let age = now.saturating_duration_since(frame.enqueued_at);
        if let Phase::Ending { .. } | Phase::Ended { .. } = self.phase {
            self.drop_inflight_on_overload(frame);
            return AfterFailure::Dropped;
        }
        if self.shadow && failure != Failure::Error && !self.limits.too_old(age) {
            self.account().would_reject(WouldReject::PublishTimeout);
            self.inflight_since = Some(frame.enqueued_at);
            return AfterFailure::Retry(frame);
        }
        match (self.limits.policy, failure) {
            (WhenFull::Gap, f) => {
                let (drop, gap) = match f {
                    Failure::Timeout => (DropReason::PublishTimeout, GapReason::PublishFailed),
                    Failure::Error => (DropReason::PublishError, GapReason::PublishFailed),
                    Failure::Expired => (DropReason::MaxAge, GapReason::MaxAge),
                };
                self.prepend_gap(frame, drop, gap);
            }
            (WhenFull::Close, f @ (Failure::Expired | Failure::Timeout)) => {
                let reason = match f {
                    Failure::Expired => OverloadReason::MaxAge,
                    _ => OverloadReason::PublishTimeout,
                };
                self.trip_overload(reason, now);
                self.drop_inflight_on_overload(frame);
            }
            (WhenFull::Close, Failure::Error) => {
                self.account()
                    .dropped(DropReason::PublishError, 1, frame.samples());
                drop(frame);
                self.drop_all(DropReason::PublishError);
                self.phase = Phase::Ending {
                    reason: EndReason::Error,
                    overload: None,
                };
                self.set_control_deadline(now + self.end_timeout);
            }
        }
        AfterFailure::Dropped
    }

    /// Accounts the frame in flight when the stream has already overloaded (or
    /// failed): dropped, and added to the overload report if there is one.
    pub(super) fn drop_inflight_on_overload(&mut self, frame: QueuedFrame) {
        let samples = frame.samples();
        let seq = frame.seq;
        let reason = if self.overload().is_some() {
            DropReason::Overload
        } else {
            DropReason::PublishError
        };
        self.account().dropped(reason, 1, samples);
        if let Phase::Ending {
            overload: Some(o), ..
        } = &mut self.phase
        {
            o.dropped_frames += 1;
            o.dropped_samples += samples;
            o.dropped_first_seq = Some(o.dropped_first_seq.map_or(seq, |s| s.min(seq)));
            o.dropped_last_seq = Some(o.dropped_last_seq.map_or(seq, |s| s.max(seq)));
        }
    }

    /// `gap`: the frame in flight is dropped; it precedes everything queued, so its
    /// marker goes (or merges) at the front.
    pub(super) fn prepend_gap(&mut self, frame: QueuedFrame, drop: DropReason, reason: GapReason) {
        let samples = frame.samples();
        self.account().dropped(drop, 1, samples);
        match self.gaps.front_mut() {
            Some(g) if g.first_seq == frame.seq + 1 && mergeable(g.reason, reason) => {
                // A merged marker carries the cause of its first frame.
                g.first_seq = frame.seq;
                g.samples += samples;
                g.reason = reason;
            }
            _ => self.gaps.push_front(Gap {
                first_seq: frame.seq,
                last_seq: frame.seq,
                samples,
                reason,
            }),
        }
    }

    /// A gap marker in flight could not be published yet: merges markers queued since
    /// (contiguous with it) into it, so one marker covers the whole range.
    /// Applies the age bound first, so frames that expired meanwhile are included.
    pub fn merge_into_gap(&mut self, gap: &mut Gap, now: Instant) {
        self.expire(now);
        while let Some(front) = self.gaps.front() {
            if front.first_seq != gap.last_seq + 1 || !mergeable(front.reason, gap.reason) {
                break;
            }
            gap.last_seq = front.last_seq;
            gap.samples += front.samples;
            self.gaps.pop_front();
        }
    }

    /// Stops admitting; what is queued is still published (until `drain_deadline`, if
    /// any), then `end` with `reason`. Idempotent; a later call can only tighten the
    /// deadlines (a shutdown during a producer's finish).
    pub fn finish(
        &mut self,
        reason: EndReason,
        now: Instant,
        drain_deadline: Option<Instant>,
        control_deadline: Option<Instant>,
    ) {
        if self.phase == Phase::Open {
            self.phase = Phase::Draining {
                reason,
                deadline: drain_deadline,
            };
            self.set_control_deadline(control_deadline.unwrap_or(now + self.end_timeout));
            return;
        }
        if let Phase::Draining { deadline, .. } = &mut self.phase
            && let Some(d) = drain_deadline
        {
            *deadline = Some(deadline.map_or(d, |old| old.min(d)));
        }
        if let Some(d) = control_deadline {
            self.set_control_deadline(d);
        }
    }
}
