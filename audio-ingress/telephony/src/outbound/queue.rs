//! [`OutQueue`]: the bot's audio re-cut into 20 ms frames, bounded by bytes and age,
//! released at real time, with marks in order. The invariants are the module's
//! (see [`super`]).
//!
//! Storage: a `VecDeque` of whole frames (each its own `Vec<i16>` of
//! [`FRAME_SAMPLES`], allocated when the frame is completed at push and handed out as
//! is by `pop_due`), a partial tail, and a `VecDeque` of marks, each placed by the
//! absolute number of frames queued before it (so dropping frames by age or by `clear`
//! never has to walk the marks). Byte and frame counts are the deques' lengths: O(1).

use std::collections::VecDeque;
use std::mem;
use std::time::{Duration, Instant};

use super::{
    Cleared, DropReason, Dropped, Due, FRAME_BYTES, FRAME_SAMPLES, MAX_MARK_NAME_BYTES,
    MAX_QUEUED_MARKS, OutboundConfig, OutboundError, frames_duration,
};

/// A whole frame and when its first sample was pushed.
#[derive(Debug)]
struct QueuedFrame {
    pcm: Vec<i16>,
    at: Instant,
}

/// A mark, due once `after_frames` frames (counted since the queue was made) have left.
#[derive(Debug)]
struct QueuedMark {
    name: String,
    after_frames: u64,
    at: Instant,
}

/// A run of continuous audio: frame `k` of it is due at `start + k × 20 ms − lead`.
#[derive(Debug, Clone, Copy)]
struct Run {
    start: Instant,
    /// Frames of this run popped so far: the next one is frame `sent`.
    sent: u64,
}

impl Run {
    /// When what was popped in this run has finished playing (at real time from
    /// `start`).
    fn played_out(&self) -> Instant {
        // `checked_add` fails only beyond the platform's Instant range (centuries of
        // audio); falling back to `start` then makes the frame due at once.
        self.start
            .checked_add(frames_duration(self.sent))
            .unwrap_or(self.start)
    }

    /// When the run's next frame is due.
    fn next_due(&self, lead: Duration) -> Instant {
        let at = self.played_out();
        at.checked_sub(lead).unwrap_or(at)
    }
}

/// The bounded, paced queue of the bot's audio towards one carrier stream. Time is
/// passed in; see the module docs for the invariants.
#[derive(Debug)]
pub struct OutQueue {
    cfg: OutboundConfig,
    frames: VecDeque<QueuedFrame>,
    /// Fewer than [`FRAME_SAMPLES`] samples waiting for more audio.
    tail: Vec<i16>,
    /// When the tail's first sample was pushed; `Some` exactly when the tail is not empty.
    tail_at: Option<Instant>,
    marks: VecDeque<QueuedMark>,
    /// Frames ever queued (completed), and frames ever removed (popped, expired,
    /// cleared): `frames.len() == enqueued - removed`.
    enqueued: u64,
    removed: u64,
    /// The current run; `None` before the first frame and after `clear`.
    run: Option<Run>,
}

impl OutQueue {
    /// An empty queue. `cfg` should have passed [`OutboundConfig::validate`]; if it
    /// holds no whole frame, every push is refused as `too_large`.
    pub fn new(cfg: OutboundConfig) -> Self {
        Self {
            cfg,
            frames: VecDeque::with_capacity(cfg.max_frames().min(256)),
            tail: Vec::with_capacity(FRAME_SAMPLES),
            tail_at: None,
            marks: VecDeque::new(),
            enqueued: 0,
            removed: 0,
            run: None,
        }
    }

    /// Appends 16 kHz mono s16le PCM, re-cut into 20 ms frames; a partial tail waits
    /// for the next push (or is padded by [`Self::push_mark`] / [`Self::flush_tail`]).
    /// All or nothing: `Ok(None)` queued all of it; `Ok(Some(Dropped{QueueFull}))`
    /// refused all of it because its frames do not fit beside what is queued (which
    /// keeps playing); `Err` refused it as invalid (`odd_length`) or larger than the
    /// queue could ever hold (`too_large`). Only `Ok(None)` changes the queue. An empty
    /// push is `Ok(None)` and changes nothing.
    pub fn push_audio(
        &mut self,
        pcm_le: &[u8],
        now: Instant,
    ) -> Result<Option<Dropped>, OutboundError> {
        if !pcm_le.len().is_multiple_of(2) {
            return Err(OutboundError::OddLength { len: pcm_le.len() });
        }
        let samples = pcm_le.len() / 2;
        if samples == 0 {
            return Ok(None);
        }
        let charged = samples.div_ceil(FRAME_SAMPLES).saturating_mul(FRAME_BYTES);
        if charged > self.cfg.max_bytes {
            return Err(OutboundError::TooLarge {
                bytes: pcm_le.len(),
                charged,
                max_bytes: self.cfg.max_bytes,
            });
        }
        let frames_after = self.frames.len() + (self.tail.len() + samples).div_ceil(FRAME_SAMPLES);
        if frames_after.saturating_mul(FRAME_BYTES) > self.cfg.max_bytes {
            return Ok(Some(Dropped::of_samples(
                samples as u64,
                DropReason::QueueFull,
            )));
        }
        let mut rest = pcm_le;
        // Each pass moves at least one sample (the tail is never full here), so the
        // loop ends after at most `samples` passes.
        while !rest.is_empty() {
            if self.tail.is_empty() {
                self.tail_at = Some(now);
            }
            let take = (FRAME_SAMPLES - self.tail.len()).min(rest.len() / 2);
            let (head, more) = rest.split_at(take * 2);
            self.tail.extend(
                head.chunks_exact(2)
                    .map(|b| i16::from_le_bytes([b[0], b[1]])),
            );
            rest = more;
            if self.tail.len() == FRAME_SAMPLES {
                self.complete_tail(now);
            }
        }
        Ok(None)
    }

    /// Queues a mark after everything queued so far; a partial tail is first padded
    /// with silence to a whole frame (so the mark comes right after the audio before
    /// it). The mark is due as soon as every frame before it has left the queue.
    /// Refused, with nothing changed: an empty name or one over
    /// [`MAX_MARK_NAME_BYTES`] (`invalid_mark_name`), or [`MAX_QUEUED_MARKS`] already
    /// queued (`too_many_marks`).
    ///
    /// `now` (not in the contract's sketch): the padded frame becomes available now,
    /// which may start a run, and a mark alone in the queue is due at `now`.
    pub fn push_mark(&mut self, name: String, now: Instant) -> Result<(), OutboundError> {
        if name.is_empty() || name.len() > MAX_MARK_NAME_BYTES {
            return Err(OutboundError::InvalidMarkName {
                len: name.len(),
                max: MAX_MARK_NAME_BYTES,
            });
        }
        if self.marks.len() >= MAX_QUEUED_MARKS {
            return Err(OutboundError::TooManyMarks {
                max: MAX_QUEUED_MARKS,
            });
        }
        self.flush_tail(now);
        self.marks.push_back(QueuedMark {
            name,
            after_frames: self.enqueued,
            at: now,
        });
        Ok(())
    }

    /// Pads a partial tail with silence to a whole frame, now available (e.g. at the
    /// end of a reply). Returns whether there was a tail. The bound holds: the tail was
    /// already charged as a whole frame.
    pub fn flush_tail(&mut self, now: Instant) -> bool {
        if self.tail.is_empty() {
            return false;
        }
        self.tail.resize(FRAME_SAMPLES, 0);
        self.complete_tail(now);
        true
    }

    /// When [`Self::pop_due`] will next hand something out: a due mark's push time (in
    /// the past: due now), or the front frame's slot in its run. `None` when nothing
    /// but a partial tail (or nothing) is queued.
    pub fn next_due(&self) -> Option<Instant> {
        if let Some(mark) = self.marks.front()
            && mark.after_frames <= self.removed
        {
            return Some(mark.at);
        }
        self.frames.front()?;
        Some(self.run.as_ref()?.next_due(self.cfg.lead))
    }

    /// The next item if it is due at `now`: a mark once every frame before it has left
    /// the queue; a frame at its slot in the run (a door that woke late gets the
    /// frames it missed on successive calls, at once). `None`: nothing due yet.
    pub fn pop_due(&mut self, now: Instant) -> Option<Due> {
        if let Some(mark) = self.marks.front()
            && mark.after_frames <= self.removed
        {
            return self.marks.pop_front().map(|m| Due::Mark(m.name));
        }
        let run = self.run.as_mut()?;
        if self.frames.is_empty() || now < run.next_due(self.cfg.lead) {
            return None;
        }
        let frame = self.frames.pop_front()?;
        self.removed += 1;
        run.sent += 1;
        Some(Due::Frame(frame.pcm))
    }

    /// Drops, from the front, every frame pushed more than `max_age` before `now`, and
    /// then a partial tail that old. Marks stay in place (those whose audio was dropped
    /// become due). `None` when nothing was that old.
    pub fn expire(&mut self, now: Instant) -> Option<Dropped> {
        let max_age = self.cfg.max_age;
        let mut samples = 0u64;
        while let Some(front) = self.frames.front()
            && now.saturating_duration_since(front.at) > max_age
        {
            self.frames.pop_front();
            self.removed += 1;
            samples += FRAME_SAMPLES as u64;
        }
        if self.frames.is_empty()
            && let Some(at) = self.tail_at
            && now.saturating_duration_since(at) > max_age
        {
            samples += self.tail.len() as u64;
            self.tail.clear();
            self.tail_at = None;
        }
        (samples > 0).then(|| Dropped::of_samples(samples, DropReason::MaxAge))
    }

    /// Empties the queue at once (frames, partial tail, marks) and ends the run: the
    /// next audio starts a new run. Returns what was dropped and the queued marks'
    /// names in order.
    pub fn clear(&mut self) -> Cleared {
        let samples = (self.frames.len() * FRAME_SAMPLES + self.tail.len()) as u64;
        let dropped = Dropped::of_samples(samples, DropReason::Cleared);
        let queued_marks = self.marks.drain(..).map(|m| m.name).collect();
        self.frames.clear();
        self.tail.clear();
        self.tail_at = None;
        self.removed = self.enqueued;
        self.run = None;
        Cleared {
            frames: dropped.frames,
            ms: dropped.ms,
            queued_marks,
        }
    }

    /// Bytes of PCM queued: whole frames plus the partial tail. Never above
    /// `max_bytes` (which is charged in whole frames, a tail as one).
    pub fn queued_bytes(&self) -> usize {
        self.frames.len() * FRAME_BYTES + self.tail.len() * 2
    }

    /// Whole frames queued (the partial tail not included).
    pub fn queued_frames(&self) -> usize {
        self.frames.len()
    }

    /// Marks queued.
    pub fn queued_marks(&self) -> usize {
        self.marks.len()
    }

    /// How long ago the oldest queued audio (front frame, else the tail) was pushed;
    /// zero when no audio is queued.
    pub fn oldest_age(&self, now: Instant) -> Duration {
        self.frames
            .front()
            .map(|f| f.at)
            .or(self.tail_at)
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
    }

    /// Nothing queued: no frame, no tail, no mark.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty() && self.tail.is_empty() && self.marks.is_empty()
    }

    /// Moves the (full) tail into the frames; the frame becomes available at `now`.
    fn complete_tail(&mut self, now: Instant) {
        if self.frames.is_empty() {
            // The queue is dry: the run goes on only if this frame arrived before what
            // was sent finished playing; else (an underrun) a new run starts now.
            let continues = self.run.is_some_and(|run| now <= run.played_out());
            if !continues {
                self.run = Some(Run {
                    start: now,
                    sent: 0,
                });
            }
        }
        let pcm = mem::replace(&mut self.tail, Vec::with_capacity(FRAME_SAMPLES));
        let at = self.tail_at.take().unwrap_or(now);
        self.frames.push_back(QueuedFrame { pcm, at });
        self.enqueued += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::DropReason;
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const FRAME: Duration = Duration::from_millis(20);

    fn cfg(max_bytes: usize, max_age: Duration, lead: Duration) -> OutboundConfig {
        OutboundConfig {
            max_bytes,
            max_age,
            lead,
        }
    }

    /// `n` samples of a recognisable ramp starting at `from`, as s16le bytes.
    fn pcm(from: usize, n: usize) -> Vec<u8> {
        (from..from + n)
            .flat_map(|i| ((i % 30_000) as i16).to_le_bytes())
            .collect()
    }

    fn frame(due: Option<Due>) -> Vec<i16> {
        match due {
            Some(Due::Frame(f)) => f,
            other => panic!("expected a frame, got {other:?}"),
        }
    }

    /// Everything the queue hands out at `now` (bounded).
    fn drain(q: &mut OutQueue, now: Instant) -> Vec<Due> {
        let mut out = Vec::new();
        for _ in 0..10_000 {
            match q.pop_due(now) {
                Some(d) => out.push(d),
                None => return out,
            }
        }
        panic!("pop_due did not run dry");
    }

    /// A compact view of a drain: frame lengths as "F", marks by name.
    fn shape(items: &[Due]) -> Vec<String> {
        items
            .iter()
            .map(|d| match d {
                Due::Frame(f) => {
                    assert_eq!(f.len(), FRAME_SAMPLES);
                    "F".to_owned()
                }
                Due::Mark(m) => m.clone(),
            })
            .collect()
    }

    fn ten_second_burst_is_paced(lead: Duration) {
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut q = OutQueue::new(cfg(320_000, Duration::from_secs(20), lead));
        assert_eq!(q.push_audio(&pcm(0, 500 * FRAME_SAMPLES), t0), Ok(None));
        assert_eq!(q.queued_frames(), 500);
        assert_eq!(q.queued_bytes(), 320_000);
        let mut samples = Vec::new();
        let mut dues = Vec::new();
        for _ in 0..600 {
            let Some(due) = q.next_due() else { break };
            if let Some(early) = due.checked_sub(Duration::from_nanos(1)) {
                assert_eq!(q.pop_due(early), None, "nothing before its time");
            }
            samples.extend(frame(q.pop_due(due)));
            assert_eq!(q.pop_due(due), None, "one frame per slot");
            dues.push(due);
        }
        assert_eq!(dues.len(), 500);
        assert_eq!(dues[0], t0 - lead, "the first frame at push − lead");
        for (k, pair) in dues.windows(2).enumerate() {
            assert_eq!(
                pair[1] - pair[0],
                FRAME,
                "frames {k} and {} are 20 ms apart",
                k + 1
            );
        }
        assert_eq!(dues[499], t0 + FRAME * 499 - lead);
        let want: Vec<i16> = (0..500 * FRAME_SAMPLES)
            .map(|i| (i % 30_000) as i16)
            .collect();
        assert_eq!(samples, want, "the audio comes out whole and in order");
        assert!(q.is_empty());
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn ten_seconds_in_one_burst_come_out_20_ms_apart_from_push_time() {
        ten_second_burst_is_paced(Duration::ZERO);
    }

    #[test]
    fn ten_seconds_in_one_burst_come_out_20_ms_apart_from_push_minus_lead() {
        ten_second_burst_is_paced(40 * MS);
    }

    #[test]
    fn a_late_door_gets_the_frames_it_missed_and_the_schedule_does_not_slip() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(cfg(160_000, Duration::from_secs(10), Duration::ZERO));
        q.push_audio(&pcm(0, 20 * FRAME_SAMPLES), t0)
            .expect("valid");
        // Woke 100 ms late: frames 0..=5 are due.
        assert_eq!(drain(&mut q, t0 + 100 * MS).len(), 6);
        assert_eq!(q.next_due(), Some(t0 + 120 * MS));
    }

    #[test]
    fn a_push_storm_never_exceeds_the_bound_and_refused_audio_is_counted_exactly() {
        let t0 = Instant::now();
        let config = OutboundConfig::default();
        let mut q = OutQueue::new(config);
        // NATS messages of 64 KiB (not whole frames: tails join across pushes) every
        // 10 ms for 3 s, while the door pops at real time.
        let msg_samples = 32_768;
        let (mut accepted, mut refused) = (Vec::<i16>::new(), 0u64);
        let (mut refused_frames, mut refused_ms) = (0u64, 0u64);
        let mut played = Vec::<i16>::new();
        for step in 0..300u32 {
            let now = t0 + 10 * MS * step;
            let from = step as usize * msg_samples;
            match q.push_audio(&pcm(from, msg_samples), now).expect("valid") {
                None => accepted.extend((from..from + msg_samples).map(|i| (i % 30_000) as i16)),
                Some(d) => {
                    assert_eq!(d.reason, DropReason::QueueFull);
                    refused += 1;
                    refused_frames += d.frames;
                    refused_ms += d.ms;
                }
            }
            assert!(q.queued_bytes() <= config.max_bytes, "bound at step {step}");
            for d in drain(&mut q, now) {
                played.extend(frame(Some(d)));
            }
            assert!(q.queued_bytes() <= config.max_bytes);
        }
        assert!(refused > 250, "the storm overflowed: {refused} refused");
        assert_eq!(
            refused_frames,
            refused * 103,
            "32,768 samples = 102.4 frames → 103"
        );
        assert_eq!(refused_ms, refused * 2_048);
        // What played is exactly the accepted audio's beginning, and played + queued
        // (whole frames + tail) is all of it: nothing lost silently.
        assert_eq!(played[..], accepted[..played.len()]);
        let queued_samples = q.queued_bytes() / 2;
        assert_eq!(played.len() + queued_samples, accepted.len());
        // Popped up to t0 + 2,990 ms at real time with a 40 ms lead: slots 0..=151.
        assert_eq!(played.len(), 152 * FRAME_SAMPLES);
    }

    #[test]
    fn a_full_queue_refuses_the_new_audio_and_keeps_what_is_queued() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(OutboundConfig::default());
        assert_eq!(
            q.push_audio(&pcm(0, 249 * FRAME_SAMPLES + 100), t0),
            Ok(None)
        );
        // The tail is charged as the frame it will become: 250 of 250 frames.
        let refused = q.push_audio(&pcm(0, 221), t0 + MS).expect("valid");
        assert_eq!(
            refused,
            Some(Dropped {
                frames: 1,
                ms: 14,
                reason: DropReason::QueueFull
            }),
            "221 samples would need a 251st frame: all refused"
        );
        assert_eq!(q.queued_bytes(), 249 * FRAME_BYTES + 200, "nothing changed");
        assert_eq!(
            q.push_audio(&pcm(249 * FRAME_SAMPLES + 100, 220), t0 + MS),
            Ok(None)
        );
        assert_eq!((q.queued_frames(), q.queued_bytes()), (250, 160_000));
        assert_eq!(
            q.push_audio(&pcm(0, 1), t0 + MS).expect("valid"),
            Some(Dropped {
                frames: 1,
                ms: 1,
                reason: DropReason::QueueFull
            })
        );
        assert_eq!(
            q.push_audio(&pcm(0, 2 * FRAME_SAMPLES), t0 + MS)
                .expect("valid"),
            Some(Dropped {
                frames: 2,
                ms: 40,
                reason: DropReason::QueueFull
            })
        );
        assert_eq!(q.queued_bytes(), 160_000);

        // Padding never crosses the bound: the tail was charged already.
        let mut q = OutQueue::new(OutboundConfig::default());
        q.push_audio(&pcm(0, 249 * FRAME_SAMPLES + 1), t0)
            .expect("valid");
        q.push_mark("m".into(), t0).expect("valid");
        assert_eq!(q.queued_bytes(), 160_000);

        // A full queue plays on unbroken while new frames are refused, then admitted
        // as room frees up, in order after it.
        let mut q = OutQueue::new(OutboundConfig::default());
        q.push_audio(&pcm(0, 250 * FRAME_SAMPLES), t0)
            .expect("valid");
        let mut expected = pcm_samples(0, 250 * FRAME_SAMPLES);
        let (mut out, mut refused) = (Vec::new(), 0);
        for k in 0..250u32 {
            let now = t0 + FRAME * k;
            let from = 7 * k as usize;
            match q.push_audio(&pcm(from, FRAME_SAMPLES), now).expect("valid") {
                None => expected.extend(pcm_samples(from, FRAME_SAMPLES)),
                Some(d) => refused += d.frames,
            }
            out.extend(drain(&mut q, now).into_iter().flat_map(|d| frame(Some(d))));
        }
        assert_eq!(refused, 1, "only the push into the full queue at t0");
        assert_eq!(
            out.len(),
            252 * FRAME_SAMPLES,
            "slots 0..=251 by t0 + 4,980 ms"
        );
        assert_eq!(out[..], expected[..out.len()]);
    }

    fn pcm_samples(from: usize, n: usize) -> Vec<i16> {
        (from..from + n).map(|i| (i % 30_000) as i16).collect()
    }

    #[test]
    fn a_push_the_queue_could_never_hold_is_too_large_and_changes_nothing() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(OutboundConfig::default());
        // 160,002 bytes: 251 frames' charge.
        let err = q.push_audio(&pcm(0, 80_001), t0).expect_err("too large");
        assert_eq!(err.code(), "too_large");
        assert_eq!(
            err,
            OutboundError::TooLarge {
                bytes: 160_002,
                charged: 160_640,
                max_bytes: 160_000
            }
        );
        assert!(q.is_empty());
        // Exactly the bound fits an empty queue.
        assert_eq!(q.push_audio(&pcm(0, 80_000), t0), Ok(None));
    }

    #[test]
    fn an_odd_length_push_is_refused_with_nothing_changed() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(OutboundConfig::default());
        q.push_audio(&pcm(0, FRAME_SAMPLES + 100), t0)
            .expect("valid");
        let before = (q.queued_bytes(), q.queued_frames(), q.next_due());
        let err = q.push_audio(&[1, 2, 3], t0 + MS).expect_err("odd");
        assert_eq!(err.code(), "odd_length");
        assert_eq!(err, OutboundError::OddLength { len: 3 });
        assert_eq!((q.queued_bytes(), q.queued_frames(), q.next_due()), before);
        // The tail is intact: 220 more samples complete the second frame exactly.
        q.push_audio(&pcm(FRAME_SAMPLES + 100, 220), t0 + MS)
            .expect("valid");
        assert_eq!(q.queued_bytes(), 2 * FRAME_BYTES);
        let out: Vec<i16> = drain(&mut q, t0 + FRAME)
            .into_iter()
            .flat_map(|d| frame(Some(d)))
            .collect();
        assert_eq!(out, pcm_samples(0, 2 * FRAME_SAMPLES));
        assert_eq!(q.push_audio(&[], t0), Ok(None), "an empty push is nothing");
        assert!(q.is_empty());
    }

    #[test]
    fn frames_older_than_max_age_are_dropped_from_the_front() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(cfg(160_000, Duration::from_secs(1), Duration::ZERO));
        q.push_audio(&pcm(0, 10 * FRAME_SAMPLES), t0)
            .expect("valid");
        q.push_mark("after_ten".into(), t0).expect("valid");
        q.push_audio(&pcm(0, 5 * FRAME_SAMPLES), t0 + 600 * MS)
            .expect("valid");
        assert_eq!(
            q.expire(t0 + Duration::from_secs(1)),
            None,
            "exactly max_age is not older"
        );
        assert_eq!(
            q.expire(t0 + 1_001 * MS),
            Some(Dropped {
                frames: 10,
                ms: 200,
                reason: DropReason::MaxAge
            })
        );
        assert_eq!(q.queued_frames(), 5);
        assert_eq!(q.oldest_age(t0 + 1_001 * MS), 401 * MS);
        // The mark after the dropped audio is due now, before the younger frames.
        assert_eq!(
            q.pop_due(t0 + 1_001 * MS),
            Some(Due::Mark("after_ten".into()))
        );
        // A partial tail ages from its first sample and goes with the last frames.
        q.push_audio(&pcm(0, 100), t0 + 700 * MS).expect("valid");
        assert_eq!(q.expire(t0 + 1_650 * MS).map(|d| d.frames), Some(5));
        assert_eq!(q.queued_bytes(), 200, "the tail is younger");
        assert_eq!(
            q.expire(t0 + 1_701 * MS),
            Some(Dropped {
                frames: 1,
                ms: 7,
                reason: DropReason::MaxAge
            })
        );
        assert!(q.is_empty());
        assert_eq!(q.oldest_age(t0 + 2_000 * MS), Duration::ZERO);
        assert_eq!(q.expire(t0 + Duration::from_secs(9)), None);
    }

    #[test]
    fn clear_returns_exact_counts_and_names_and_leaves_an_empty_queue() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(cfg(160_000, Duration::from_secs(10), 40 * MS));
        q.push_audio(&pcm(0, 7 * FRAME_SAMPLES + 100), t0)
            .expect("valid");
        q.push_mark("a".into(), t0).expect("valid"); // pads: 8 frames
        q.push_audio(&pcm(0, 2 * FRAME_SAMPLES), t0).expect("valid");
        q.push_mark("b".into(), t0).expect("valid");
        q.push_audio(&pcm(0, 50), t0).expect("valid");
        assert_eq!(
            shape(&drain(&mut q, t0 - 40 * MS)),
            ["F"],
            "one frame played"
        );
        let cleared = q.clear();
        assert_eq!(
            cleared,
            Cleared {
                frames: 10,
                ms: 9 * 20 + 4,
                queued_marks: vec!["a".into(), "b".into()]
            }
        );
        assert!(q.is_empty());
        assert_eq!(
            (q.queued_bytes(), q.queued_frames(), q.queued_marks()),
            (0, 0, 0)
        );
        assert_eq!(q.next_due(), None);
        assert_eq!(q.pop_due(t0 + Duration::from_secs(60)), None);
        assert_eq!(
            q.clear(),
            Cleared::default(),
            "clearing an empty queue drops nothing"
        );
        // The next audio starts a new run at its push, not in the old schedule.
        let t1 = t0 + 10 * MS;
        q.push_audio(&pcm(0, FRAME_SAMPLES), t1).expect("valid");
        assert_eq!(q.next_due(), Some(t1 - 40 * MS));
    }

    #[test]
    fn marks_come_out_in_order_after_their_audio() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(cfg(160_000, Duration::from_secs(10), Duration::ZERO));
        q.push_audio(&pcm(0, 3 * FRAME_SAMPLES), t0).expect("valid");
        q.push_mark("m1".into(), t0).expect("valid");
        q.push_mark("m2".into(), t0).expect("valid");
        q.push_audio(&pcm(0, FRAME_SAMPLES + 160), t0)
            .expect("valid");
        q.push_mark("m3".into(), t0).expect("valid");
        assert_eq!(q.queued_marks(), 3);
        // Paced: at t0 only the first frame; the marks wait for their audio.
        assert_eq!(shape(&drain(&mut q, t0)), ["F"]);
        assert_eq!(shape(&drain(&mut q, t0 + 40 * MS)), ["F", "F", "m1", "m2"]);
        assert_eq!(q.next_due(), Some(t0 + 60 * MS));
        let rest = drain(&mut q, t0 + 80 * MS);
        assert_eq!(shape(&rest), ["F", "F", "m3"]);
        // The frame before m3 was padded with silence.
        let Due::Frame(padded) = &rest[1] else {
            panic!("a frame")
        };
        assert_eq!(padded[..160], pcm_samples(FRAME_SAMPLES, 160)[..]);
        assert!(padded[160..].iter().all(|&s| s == 0));
        assert!(q.is_empty());
    }

    #[test]
    fn a_mark_alone_is_due_at_its_push_and_a_tail_alone_never_is() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(OutboundConfig::default());
        q.push_mark("alone".into(), t0).expect("valid");
        assert_eq!(q.next_due(), Some(t0));
        assert_eq!(q.pop_due(t0), Some(Due::Mark("alone".into())));
        q.push_audio(&pcm(0, 100), t0).expect("valid");
        assert_eq!(q.next_due(), None, "a partial tail waits for more audio");
        assert_eq!(q.pop_due(t0 + Duration::from_secs(5)), None);
        assert!(q.flush_tail(t0 + 5 * MS));
        assert!(!q.flush_tail(t0 + 5 * MS), "nothing left to flush");
        assert_eq!(
            q.next_due(),
            Some(t0 + 5 * MS - OutboundConfig::default().lead)
        );
        assert_eq!(shape(&drain(&mut q, t0 + 5 * MS)), ["F"]);
    }

    #[test]
    fn bad_marks_are_refused_with_nothing_changed() {
        let t0 = Instant::now();
        let mut q = OutQueue::new(OutboundConfig::default());
        q.push_audio(&pcm(0, 100), t0).expect("valid");
        let code = |r: Result<(), OutboundError>| r.map_err(|e| e.code());
        assert_eq!(
            code(q.push_mark(String::new(), t0)),
            Err("invalid_mark_name")
        );
        let long = "x".repeat(MAX_MARK_NAME_BYTES + 1);
        assert_eq!(code(q.push_mark(long, t0)), Err("invalid_mark_name"));
        assert_eq!(
            (q.queued_frames(), q.queued_bytes()),
            (0, 200),
            "the tail was not padded"
        );
        for i in 0..MAX_QUEUED_MARKS {
            q.push_mark(format!("m{i}"), t0).expect("room");
        }
        assert_eq!(
            code(q.push_mark("one_more".into(), t0)),
            Err("too_many_marks")
        );
        assert_eq!(q.queued_marks(), MAX_QUEUED_MARKS);
    }

    #[test]
    fn an_underrun_starts_a_new_run_without_a_catch_up_burst() {
        let lead = 40 * MS;
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut q = OutQueue::new(cfg(160_000, Duration::from_secs(10), lead));
        q.push_audio(&pcm(0, 2 * FRAME_SAMPLES), t0).expect("valid");
        assert_eq!(shape(&drain(&mut q, t0 - 20 * MS)), ["F", "F"]);
        // Sent audio plays out at t0 + 40 ms; the next audio comes at t0 + 100 ms.
        let t1 = t0 + 100 * MS;
        q.push_audio(&pcm(0, 10 * FRAME_SAMPLES), t1)
            .expect("valid");
        assert_eq!(q.next_due(), Some(t1 - lead), "a new run, not slot 2 (t0)");
        // The lead's worth (3 frames: due t1 − 40, t1 − 20, t1), not the 6 frames that
        // slots 2..=7 of the old run would have released at once.
        assert_eq!(shape(&drain(&mut q, t1)), ["F", "F", "F"]);
        assert_eq!(q.next_due(), Some(t1 + FRAME));
    }

    #[test]
    fn audio_arriving_before_the_sent_audio_played_out_continues_the_run() {
        let lead = 40 * MS;
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut q = OutQueue::new(cfg(160_000, Duration::from_secs(10), lead));
        q.push_audio(&pcm(0, 2 * FRAME_SAMPLES), t0).expect("valid");
        assert_eq!(shape(&drain(&mut q, t0 - 20 * MS)), ["F", "F"]);
        // The queue is empty but the carrier still has audio until t0 + 40 ms.
        let t1 = t0 + 30 * MS;
        q.push_audio(&pcm(0, 3 * FRAME_SAMPLES), t1).expect("valid");
        assert_eq!(q.next_due(), Some(t0), "slot 2 of the same run");
        // Slots 2 and 3 are past: sent at once to restore the lead; slot 4 on time.
        assert_eq!(shape(&drain(&mut q, t1)), ["F", "F"]);
        assert_eq!(q.next_due(), Some(t0 + 2 * FRAME));
    }
}
