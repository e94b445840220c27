//! The doors' side of resume: opening a stream attached to its connection, and taking a
//! parked (or still attached) stream back for a reconnecting producer — the checks of
//! its position, the loss it declares, and the refusals' answers.
//!
//! A resume, in this order, after [`Door::check`] (id, query, producer token): the
//! request alone (`last_seq` and `next_seq` present for a WebSocket, `400
//! invalid_request`); the token ([`Resume::claim`]: `401 resume_invalid`, `403
//! resume_mismatch`, `410 resume_expired` / `resume_ended`); the position, against the
//! stream as it stands, before the connection holding it is revoked: `last_seq` at most
//! the door's (`409 resume_ahead`), `next_seq` above it and its loss possible in the
//! time away (`400 invalid_request`); the claim (`409 taken_over`, `503 resume_busy`);
//! the position again, on the parked stream (still open, else `410 resume_ended`). A
//! refused resume leaves the stream where it was — with its producer, or parked with its
//! window unchanged.
//!
//! Invariants: the loss is declared only once the stream is attached to the new
//! connection (a claim that lost the race declares nothing), before its first frame, so
//! that frame takes `next_seq`; the refreshed producer token's rate class applies.

use std::time::Duration;

use weir_audio_producer::publisher::Sink;
use weir_audio_producer::stream::Position;
use weir_protocol::WireName;
use weir_protocol::audio::ws::{Event, ResumeGap};
use weir_protocol::audio::{FRAME_SAMPLES, Gap, SAMPLE_RATE};

use super::{Attachment, Held, ResumeRefusal};
use crate::auth::Grant;
use crate::door::{self, Admitted, Door, Refused, ResumeAsk, event_value};
use crate::metrics as m;

/// How long a fresh open waits for a parked stream of the same id to finish (its
/// publisher releases the id) before it opens the new one.
pub const EVICT_BOUND: Duration = Duration::from_secs(2);

/// Audio a resume may declare lost beyond the time since the door's last frame (the
/// frames the producer had sent that were still in the network).
const LOSS_SLACK: Duration = Duration::from_secs(2);

/// How the door counts what a resumed stream lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The producer numbers its frames (WebSocket): `next_seq` says how many it
    /// offered; declared at the resume.
    Declared,
    /// The producer does not (WHIP): the door declares the time since its last frame,
    /// in 20 ms frames, when the resumed session's first frame arrives
    /// ([`wall_time_loss`]).
    AtFirstFrame,
}

/// The loss of a stream resumed without frame numbers, at its first frame: the whole
/// 20 ms frames since the last frame the door took.
pub fn wall_time_loss(pos: Position) -> (u64, u64) {
    let per_frame = frame_samples(&pos);
    let frame_ms = (per_frame * 1000 / u64::from(SAMPLE_RATE)).max(1);
    let frames = pos.since_last_frame.as_millis() as u64 / frame_ms;
    (frames, frames.saturating_mul(per_frame))
}

/// Samples of one of the stream's frames (20 ms at 16 kHz before its first frame).
fn frame_samples(pos: &Position) -> u64 {
    match pos.frame_samples {
        0 => FRAME_SAMPLES as u64,
        n => n,
    }
}

/// What a resume established: the `resumed` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resumed {
    /// The door's seq before the resume.
    pub seq: u64,
    /// The seq of the next frame.
    pub next_seq: u64,
    /// The frames declared lost.
    pub gap: Option<Gap>,
    /// The stream's gap count before the loss was declared: the new connection tells
    /// every gap after it ([`crate::door::StatusWatch::since`]).
    pub gaps_before: u64,
}

/// The `opened` event of a resumable stream (`None`: resume off).
pub fn opened_event(att: &Attachment, window: Duration) -> Option<serde_json::Value> {
    Some(event_value(&Event::Opened {
        stream_id: att.handle().id().to_string(),
        resume_token: att.token()?.to_owned(),
        resume_window_ms: window.as_millis() as u64,
    }))
}

impl Resumed {
    /// The `resumed` event.
    pub fn event(&self, att: &Attachment, window: Duration) -> serde_json::Value {
        event_value(&Event::Resumed {
            stream_id: att.handle().id().to_string(),
            seq: self.seq,
            next_seq: self.next_seq,
            gap: self.gap.map(|g| ResumeGap {
                first_seq: g.first_seq,
                last_seq: g.last_seq,
                frames: g.frames(),
                samples: g.samples,
            }),
            resume_token: att.token().unwrap_or_default().to_owned(),
            resume_window_ms: window.as_millis() as u64,
        })
    }
}

/// The answer to a refused resume (counted by its code).
pub fn refusal(r: &ResumeRefusal, retry_after: Duration) -> Refused {
    let (status, code) = r.answer();
    metrics::counter!(m::RESUMES_TOTAL, m::LABEL_OUTCOME => code).increment(1);
    // `resume_busy`, the one 503, carries `Retry-After`.
    Box::new(door::refusal(status, code, r.to_string(), retry_after))
}

/// The frames and samples lost between the door's position and the producer's claim.
fn loss(pos: Position, ask: &ResumeAsk, how: Loss) -> Result<(u64, u64), ResumeRefusal> {
    let door = pos.last_seq;
    let per_frame = frame_samples(&pos);
    if let Some(claimed) = ask.last_seq
        && claimed > door
    {
        return Err(ResumeRefusal::Ahead { claimed, door });
    }
    let frames = match how {
        Loss::AtFirstFrame => return Ok((0, 0)),
        Loss::Declared => {
            let next = request_checked(ask)?;
            if next <= door {
                return Err(ResumeRefusal::BadSeq(format!(
                    "next_seq = {next} must be above the last frame the door took ({door}); \
                     frames the door took are not sent again"
                )));
            }
            next - door - 1
        }
    };
    let samples = frames.saturating_mul(per_frame);
    // At most twice real time over the time away plus the slack, in samples and in
    // frames of at least 5 ms (the smallest a budget charges): a larger claim is not a
    // lost connection's audio.
    let away = pos.since_last_frame + LOSS_SLACK;
    let away_ms = away.as_millis() as u64;
    let allowed = away_ms * u64::from(SAMPLE_RATE) / 1000 * 2;
    if samples > allowed || frames > away_ms * 2 / 5 {
        return Err(ResumeRefusal::BadSeq(format!(
            "next_seq declares {frames} frames ({samples} samples) lost, more than the {} ms \
             since the door's last frame allow",
            pos.since_last_frame.as_millis()
        )));
    }
    Ok((frames, samples))
}

/// A WebSocket resume's request on its own: `last_seq` and `next_seq` present, and
/// `next_seq` above `last_seq`. Returns `next_seq`.
fn request_checked(ask: &ResumeAsk) -> Result<u64, ResumeRefusal> {
    let (Some(last), Some(next)) = (ask.last_seq, ask.next_seq) else {
        return Err(ResumeRefusal::BadSeq(
            "a resume needs last_seq (the last seq the door acknowledged, 0 if none) and \
             next_seq (the seq of the producer's next frame)"
                .to_owned(),
        ));
    };
    if next <= last {
        return Err(ResumeRefusal::BadSeq(format!(
            "next_seq = {next} must be above last_seq = {last}"
        )));
    }
    Ok(next)
}

impl<S: Sink> Door<S> {
    /// Opens the stream of `admitted` ([`Self::open_attached`]), or takes it back when
    /// the request asks for a resume ([`Self::resume`], loss declared `how`): the
    /// attachment, its first event (`opened`, `None` with resume off; `resumed`) and,
    /// for a resume, what it resumed.
    pub async fn open_or_resume(
        &self,
        admitted: Admitted,
        how: Loss,
    ) -> Result<(Attachment, Option<serde_json::Value>, Option<Resumed>), Refused> {
        let window = self.resume.window();
        match admitted.resume.clone() {
            None => {
                let att = self.open_attached(admitted).await?;
                let event = opened_event(&att, window);
                Ok((att, event, None))
            }
            Some(ask) => {
                let (att, resumed) = self.resume(admitted, &ask, how).await?;
                let event = resumed.event(&att, window);
                Ok((att, Some(event), Some(resumed)))
            }
        }
    }

    /// Opens a new stream attached to the request's connection. A parked stream of the
    /// same id (its producer reconnected without its token) ends first, waited for at
    /// most [`EVICT_BOUND`].
    pub async fn open_attached(&self, admitted: Admitted) -> Result<Attachment, Refused> {
        if let Some(parked) = self.resume.evict_parked(&admitted.id) {
            parked.wait_finished(EVICT_BOUND).await;
        }
        let scope = admitted.scope();
        let id = admitted.id.clone();
        let (handle, ticket) = self.open(admitted)?;
        Ok(self.resume.attach_new(id, scope, Held { handle, ticket }))
    }

    /// Takes the stream of `admitted` back for a reconnecting producer (see the
    /// module docs for the order of the checks) and declares what it lost.
    pub async fn resume(
        &self,
        admitted: Admitted,
        ask: &ResumeAsk,
        how: Loss,
    ) -> Result<(Attachment, Resumed), Refused> {
        let retry_after = self.retry_after;
        let refuse = |r: ResumeRefusal| refusal(&r, retry_after);
        if how == Loss::Declared {
            request_checked(ask).map_err(refuse)?;
        }
        let precheck = |pos: Position| loss(pos, ask, how).map(drop);
        let claimed = self
            .resume
            .claim(&admitted.id, &ask.token, admitted.scope(), precheck)
            .await
            .map_err(refuse)?;
        let pos = claimed.handle().position();
        if !pos.open {
            let reason = end_reason(claimed.handle());
            claimed.end(reason);
            return Err(refuse(ResumeRefusal::Ended(reason)));
        }
        // Dropping `claimed` on a refusal parks the stream again.
        let (frames, samples) = loss(pos, ask, how).map_err(refuse)?;
        let att = claimed.attach().map_err(refuse)?;
        let gaps_before = att.handle().status().borrow().gaps;
        let gap =
            match att
                .handle()
                .declare_lost(frames, samples, weir_audio_producer::Lost::Resume)
            {
                Ok(gap) => gap,
                Err(_) => {
                    let reason = end_reason(att.handle());
                    att.end(reason).release();
                    return Err(refuse(ResumeRefusal::Ended(reason)));
                }
            };
        if let Some(permille) = admitted.grant.and_then(|g: Grant| g.max_rate_permille) {
            att.handle().limit_rate(permille);
        }
        metrics::counter!(m::RESUMES_TOTAL, m::LABEL_OUTCOME => "resumed").increment(1);
        Ok((
            att,
            Resumed {
                seq: pos.last_seq,
                next_seq: pos.last_seq + frames + 1,
                gap,
                gaps_before,
            },
        ))
    }
}

/// The end reason of a stream that is no longer open (`ended` when it has none yet).
fn end_reason(handle: &weir_audio_producer::stream::StreamHandle) -> &'static str {
    handle
        .status()
        .borrow()
        .end_reason
        .map_or("ended", |r| r.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(last_seq: u64, since_ms: u64) -> Position {
        Position {
            last_seq,
            frame_samples: 320,
            since_last_frame: Duration::from_millis(since_ms),
            open: true,
        }
    }

    fn ask(last_seq: Option<u64>, next_seq: Option<u64>) -> ResumeAsk {
        ResumeAsk {
            token: String::new(),
            last_seq,
            next_seq,
        }
    }

    #[test]
    fn declared_loss_is_the_frames_between_the_door_and_next_seq() {
        let declared = |p, a, n| loss(p, &ask(a, n), Loss::Declared);
        assert_eq!(declared(pos(100, 50), Some(90), Some(104)), Ok((3, 960)));
        assert_eq!(declared(pos(100, 50), Some(100), Some(101)), Ok((0, 0)));
        assert_eq!(declared(pos(0, 50), Some(0), Some(1)), Ok((0, 0)));
    }

    #[test]
    fn a_claim_ahead_or_behind_the_door_or_incomplete_is_refused() {
        let declared = |p, a, n| loss(p, &ask(a, n), Loss::Declared);
        assert_eq!(
            declared(pos(100, 50), Some(101), Some(102)),
            Err(ResumeRefusal::Ahead {
                claimed: 101,
                door: 100
            })
        );
        let e = declared(pos(100, 50), Some(90), Some(100)).expect_err("behind");
        assert_eq!(e.code(), "invalid_request");
        let e = declared(pos(100, 50), None, Some(101)).expect_err("no last_seq");
        assert!(e.to_string().contains("last_seq"), "{e}");
        let e = declared(pos(100, 50), Some(100), None).expect_err("no next_seq");
        assert!(e.to_string().contains("next_seq"), "{e}");
        let e = request_checked(&ask(Some(7), Some(7))).expect_err("next not above last");
        assert_eq!(e.code(), "invalid_request");
    }

    #[test]
    fn a_loss_larger_than_the_time_away_allows_is_refused() {
        let declared = |p, a, n| loss(p, &ask(a, n), Loss::Declared);
        // 2.05 s away: at most 2 x (2.05 + 2) s = 8.1 s = 405 frames.
        assert!(declared(pos(100, 2050), Some(100), Some(506)).is_ok());
        let e = declared(pos(100, 2050), Some(100), Some(507)).expect_err("big");
        assert_eq!(e.code(), "invalid_request");
        assert!(declared(pos(100, 0), Some(0), Some(1 << 53)).is_err());
        // Tiny last frames do not widen the bound: at most 2 x away / 5 ms frames.
        let tiny = Position {
            frame_samples: 1,
            ..pos(100, 0)
        };
        assert!(declared(tiny, Some(100), Some(100 + 801)).is_ok());
        assert!(declared(tiny, Some(100), Some(100 + 802)).is_err());
    }

    #[test]
    fn wall_time_loss_counts_whole_frames_since_the_last_one() {
        assert_eq!(wall_time_loss(pos(100, 1010)), (50, 16_000));
        assert_eq!(wall_time_loss(pos(100, 19)), (0, 0));
        assert_eq!(
            loss(pos(100, 5000), &ask(None, None), Loss::AtFirstFrame),
            Ok((0, 0))
        );
    }
}
