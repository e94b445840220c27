//! The pump: one task per WHIP stream, between the driver and the stream's queue.
//! Decodes each Opus packet to 16 kHz mono s16le (the mono decoder downmixes the
//! `opus/48000/2` track), cuts 20 ms frames (320 samples, 640 bytes) and pushes them
//! with [`StreamHandle::push`] — the same call, queue, policy and publisher as the
//! WebSocket door. Status changes (gap markers, overload, end) go back to the publisher
//! as the WebSocket door's JSON events on the `weir` data channel.
//!
//! Loss: a jump in the RTP sequence is a gap (counted, with the packets it misses);
//! up to [`MAX_CONCEALED_PACKETS`] missing packets are replaced by the decoder's loss
//! concealment (counted as concealed frames), so the stream keeps its timeline across
//! short losses; a longer hole is not filled. A packet the decoder refuses is counted
//! and concealed. Late or repeated packets are counted and ignored.
//!
//! Decode cost is measured per packet (`decode_us_mean`, `decode_us_max` in the admin
//! `/v1/whip` view). Decoding runs here, not in the driver: a slow decode delays this
//! stream only.
//!
//! Outcomes: a lost publisher (ICE disconnected or silent, DTLS failure: the session
//! is already closed) parks the stream for a resume ([`crate::resume`]); a new session
//! with the resume token takes it (`error` `taken_over`, session closed); `DELETE` ends
//! it `producer`, anything else as its [`Ending`] — then `closed`, and the session
//! closes.
//!
//! While the stream runs, its capacity notices go to the data channel as `degraded`
//! and `recovered` events.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use opus_pure::OpusDecoder;
use tokio::sync::{mpsc, oneshot};
use weir_protocol::WireName;
use weir_protocol::audio::{FRAME_SAMPLES, SAMPLE_RATE};

use super::driver::{Command, Media};
use super::{SessionCounters, WhipCounters};
use crate::door::{self, Ending};
use crate::metrics as m;
use crate::resume::admit::wall_time_loss;
use crate::resume::{Attachment, Held};
use crate::shutdown::TaskTrackerToken;
use weir_audio_producer::error::PushError;

/// Most missing packets in one gap that are concealed (100 ms at 20 ms packets).
pub const MAX_CONCEALED_PACKETS: u64 = 5;
/// Largest Opus packet: 120 ms, 1,920 samples at 16 kHz.
const MAX_PACKET_SAMPLES: usize = 1_920;

/// What a pump owns.
pub(crate) struct Pump {
    /// The stream (handle and capacity ticket), attached to this session: dropped, it
    /// parks for a resume.
    pub att: Attachment,
    /// `opened` or `resumed`, sent first (`None`: resume off).
    pub first_event: Option<serde_json::Value>,
    /// A resumed session: when the resume was requested; its first frame declares the
    /// audio lost since the stream's last frame ([`wall_time_loss`]).
    pub resumed_at: Option<tokio::time::Instant>,
    pub media: mpsc::Receiver<Media>,
    pub stop: mpsc::Receiver<oneshot::Sender<()>>,
    pub driver: mpsc::Sender<Command>,
    pub key: String,
    pub counters: Arc<SessionCounters>,
    pub totals: Arc<WhipCounters>,
    pub ended: Arc<AtomicBool>,
    pub _guard: TaskTrackerToken,
}

enum Outcome {
    Delete(oneshot::Sender<()>),
    Gone,
    /// A resume (a new WHIP session with the token) took the stream.
    TakenOver,
    /// The stream ends here: it overloaded or ended, or the decoder could not be
    /// created ([`Ending::Internal`]).
    Ends(Ending),
}

/// Opus → 20 ms PCM frames, with the sequence bookkeeping.
pub struct Decoder {
    opus: OpusDecoder,
    last_seq: Option<u64>,
    /// Samples of the last decoded packet: the length of a concealed one.
    last_samples: usize,
    pcm: Vec<i16>,
    /// Decoded samples not yet cut into a frame.
    carry: Vec<i16>,
}

impl Decoder {
    /// A 16 kHz mono decoder.
    pub fn new() -> Option<Self> {
        Some(Self {
            opus: OpusDecoder::new(SAMPLE_RATE as i32, 1).ok()?,
            last_seq: None,
            last_samples: FRAME_SAMPLES,
            pcm: vec![0; MAX_PACKET_SAMPLES],
            carry: Vec::with_capacity(2 * MAX_PACKET_SAMPLES),
        })
    }

    /// Decodes the packet `seq` (and conceals a short gap before it); complete frames
    /// go to `out` as s16le bytes.
    pub fn packet(
        &mut self,
        seq: u64,
        data: &[u8],
        c: &SessionCounters,
        t: &SessionCounters,
        out: &mut Vec<Bytes>,
    ) {
        c.add(|x| &x.packets, t, 1);
        if let Some(last) = self.last_seq {
            if seq <= last {
                c.add(|x| &x.rtp_late, t, 1);
                return;
            }
            let missing = seq - last - 1;
            if missing > 0 {
                c.add(|x| &x.rtp_gaps, t, 1);
                c.add(|x| &x.rtp_lost, t, missing);
                metrics::counter!(m::WHIP_RTP_GAPS_TOTAL).increment(1);
                metrics::counter!(m::WHIP_RTP_LOST_PACKETS_TOTAL).increment(missing);
                for _ in 0..missing.min(MAX_CONCEALED_PACKETS) {
                    self.conceal(c, t, out);
                }
            }
        }
        self.last_seq = Some(seq);
        let n = self.decode(data, c, t);
        if n == 0 {
            // Refused packet: conceal its place.
            self.conceal(c, t, out);
            return;
        }
        self.cut(n, out);
    }

    /// One lost packet's worth of loss concealment, counted.
    fn conceal(&mut self, c: &SessionCounters, t: &SessionCounters, out: &mut Vec<Bytes>) {
        let n = self.decode(&[], c, t);
        let frames = n.div_ceil(FRAME_SAMPLES) as u64;
        c.add(|x| &x.concealed_frames, t, frames);
        metrics::counter!(m::WHIP_CONCEALED_FRAMES_TOTAL).increment(frames);
        self.cut(n, out);
    }

    /// One decode into `self.pcm`, timed; 0 samples when refused (counted).
    fn decode(&mut self, data: &[u8], c: &SessionCounters, t: &SessionCounters) -> usize {
        let started = std::time::Instant::now();
        // A packet says its own length (at most the buffer); a lost one is concealed
        // for the length of the last.
        let frame_size = if data.is_empty() {
            self.last_samples
        } else {
            MAX_PACKET_SAMPLES
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.opus.decode_s16(data, frame_size, &mut self.pcm)
        }));
        let ns = started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        match result {
            Ok(Ok(n)) if n <= self.pcm.len() => {
                c.decode_took(t, ns);
                metrics::counter!(m::WHIP_PACKETS_DECODED_TOTAL).increment(1);
                metrics::gauge!(m::WHIP_DECODE_SECONDS_TOTAL).increment(ns as f64 / 1e9);
                if !data.is_empty() && n > 0 {
                    self.last_samples = n;
                }
                n
            }
            refused => {
                c.add(|x| &x.decode_errors, t, 1);
                metrics::counter!(m::WHIP_DECODE_ERRORS_TOTAL).increment(1);
                // A panic may leave the decoder inconsistent: start afresh.
                if refused.is_err()
                    && let Ok(d) = OpusDecoder::new(SAMPLE_RATE as i32, 1)
                {
                    self.opus = d;
                }
                0
            }
        }
    }

    /// Appends `n` decoded samples and moves every complete frame to `out`.
    fn cut(&mut self, n: usize, out: &mut Vec<Bytes>) {
        self.carry.extend_from_slice(&self.pcm[..n]);
        let whole = self.carry.len() / FRAME_SAMPLES * FRAME_SAMPLES;
        for frame in self.carry[..whole].chunks_exact(FRAME_SAMPLES) {
            out.push(door::frame_bytes(frame));
        }
        self.carry.drain(..whole);
    }
}

/// Runs one stream's pump until its [`Outcome`].
pub(crate) async fn run(mut p: Pump) {
    let outcome = pump(&mut p).await;
    p.ended.store(true, Ordering::Release);
    finish(p, outcome).await;
}

async fn pump(p: &mut Pump) -> Outcome {
    let Some(mut decoder) = Decoder::new() else {
        return Outcome::Ends(Ending::Internal);
    };
    if let Some(ev) = p.first_event.take() {
        event_to(&p.driver, &p.key, ev).await;
    }
    let revoked = p.att.revoked();
    tokio::pin!(revoked);
    let mut status = door::StatusWatch::new(p.att.handle());
    let mut frames = Vec::new();
    let (handle, ticket) = p.att.parts();
    loop {
        tokio::select! {
            // Status first, as the WebSocket door: a flood of packets must not starve
            // the publisher's events.
            biased;
            () = &mut revoked => return Outcome::TakenOver,
            change = status.next_or_notice(ticket, handle) => {
                if let Some(ev) = change.event {
                    event_to(&p.driver, &p.key, ev).await;
                }
                if let Some(stop) = change.stop {
                    return Outcome::Ends(stop);
                }
            }
            stop = p.stop.recv() => match stop {
                Some(stop) => return Outcome::Delete(stop),
                None => return Outcome::Gone,
            },
            m = p.media.recv() => {
                let Some(m) = m else { return Outcome::Gone };
                decoder.packet(m.seq, &m.data, &p.counters, &p.totals.media, &mut frames);
                if !frames.is_empty()
                    && let Some(t) = p.resumed_at.take()
                {
                    // The first audio of a resumed session: the time since the
                    // stream's last frame is declared lost (reason `resume`).
                    let (lost, samples) = wall_time_loss(handle.position());
                    if let Err(PushError::Closed(r)) = handle.declare_lost(lost, samples, weir_audio_producer::Lost::Resume) {
                        return Outcome::Ends(Ending::Closed(r));
                    }
                    metrics::histogram!(m::RESUME_SECONDS).record(t.elapsed().as_secs_f64());
                }
                for frame in frames.drain(..) {
                    p.counters.add(|x| &x.frames, &p.totals.media, 1);
                    // Overloaded or closed (640-byte frames are always valid, and
                    // `push` waits instead of answering Full).
                    if let Err(e) = handle.push(frame).await {
                        return Outcome::Ends(e.into());
                    }
                }
            }
        }
    }
}

async fn finish(p: Pump, outcome: Outcome) {
    let Pump {
        att, driver, key, ..
    } = p;
    let (ending, reply) = match outcome {
        Outcome::Gone => {
            // The publisher is gone (the driver already closed the session): the
            // stream parks for a resume (resume off: it ends `producer_gone`).
            drop(att);
            return;
        }
        Outcome::TakenOver => {
            // A new session took the stream: this one is told, then closed.
            drop(att);
            let message = "a new WHIP session resumed this stream; it goes on there";
            event_to(&driver, &key, door::error_event("taken_over", message)).await;
            command(&driver, Command::Close { key }).await;
            return;
        }
        Outcome::Delete(stop) => (Ending::Producer, Some(stop)),
        Outcome::Ends(ending) => (ending, None),
    };
    let Held { mut handle, ticket } = att.end(ending.reason().as_str());
    door::release_when_finished(ticket, handle.status());
    // The `overload` event at once, `closed` once the stream has finished (as the
    // WebSocket door does), then the session closes.
    if let Some(ev) = ending.close(&mut handle) {
        event_to(&driver, &key, ev).await;
    }
    let summary = ending.finished(&handle).await;
    event_to(&driver, &key, door::closed_event(ending.reason(), &summary)).await;
    command(&driver, Command::Close { key }).await;
    if let Some(reply) = reply {
        let _ = reply.send(());
    }
}

/// Queues one event for the data channel.
async fn event_to(driver: &mpsc::Sender<Command>, key: &str, ev: serde_json::Value) {
    let (key, text) = (key.to_owned(), ev.to_string());
    command(driver, Command::Event { key, text }).await;
}

/// Queues one command for the driver (bounded: the driver's command channel, 1 s).
async fn command(driver: &mpsc::Sender<Command>, cmd: Command) {
    let _ = tokio::time::timeout(Duration::from_secs(1), driver.send(cmd)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 ms Opus packets (48 kHz stereo, as browsers and aiortc send) of a 440 Hz tone.
    fn packets(n: usize) -> Vec<Vec<u8>> {
        let mut enc =
            opus_pure::OpusEncoder::new(48_000, 2, opus_pure::Application::Audio).expect("enc");
        (0..n)
            .map(|f| {
                let pcm: Vec<i16> = (0..960)
                    .flat_map(|i| {
                        let t = (f * 960 + i) as f64 / 48_000.0;
                        let v = (8_000.0 * (2.0 * std::f64::consts::PI * 440.0 * t).sin()) as i16;
                        [v, v]
                    })
                    .collect();
                let mut out = vec![0u8; 4_000];
                let len = enc.encode_s16(&pcm, 960, &mut out).expect("encode");
                out.truncate(len);
                out
            })
            .collect()
    }

    #[test]
    fn gaps_are_counted_and_short_ones_concealed_in_20_ms_frames() {
        let p = packets(40);
        let (c, t) = (SessionCounters::default(), SessionCounters::default());
        let mut d = Decoder::new().expect("decoder");
        let mut out = Vec::new();
        // 1..=3, then 4 and 5 lost, then 6..=10.
        for seq in (1..=3).chain(6..=10) {
            d.packet(seq, &p[seq as usize - 1], &c, &t, &mut out);
        }
        assert_eq!(out.len(), 10, "8 decoded + 2 concealed frames");
        assert!(out.iter().all(|f| f.len() == FRAME_SAMPLES * 2));
        let n = |c: &SessionCounters, key: &str| c.snapshot()[key].as_u64().expect(key);
        assert_eq!(
            (
                n(&c, "rtp_gaps"),
                n(&c, "rtp_lost"),
                n(&c, "concealed_frames")
            ),
            (1, 2, 2)
        );
        assert_eq!(n(&c, "packets"), 8);
        // A repeated packet is ignored and counted.
        d.packet(6, &p[5], &c, &t, &mut out);
        assert_eq!((out.len(), n(&c, "rtp_late")), (10, 1));
        // A long hole (20 missing) conceals only MAX_CONCEALED_PACKETS.
        d.packet(31, &p[30], &c, &t, &mut out);
        assert_eq!((n(&c, "rtp_gaps"), n(&c, "rtp_lost")), (2, 22));
        assert_eq!(n(&c, "concealed_frames"), 2 + MAX_CONCEALED_PACKETS);
        assert_eq!(out.len() as u64, 10 + MAX_CONCEALED_PACKETS + 1);
        // Totals follow the session's counters; decode time is measured.
        assert_eq!(n(&t, "concealed_frames"), n(&c, "concealed_frames"));
        let mean = c.snapshot()["decode_us_mean"].as_f64().expect("mean");
        assert!(n(&c, "decoded") >= 9 && mean > 0.0);
    }

    #[test]
    fn the_decoded_tone_is_the_tone() {
        let p = packets(25);
        let (c, t) = (SessionCounters::default(), SessionCounters::default());
        let mut d = Decoder::new().expect("decoder");
        let mut out = Vec::new();
        for (i, packet) in p.iter().enumerate() {
            d.packet(i as u64 + 1, packet, &c, &t, &mut out);
        }
        let pcm: Vec<f64> = out
            .iter()
            .flat_map(|f| {
                f.chunks_exact(2)
                    .map(|b| f64::from(i16::from_le_bytes([b[0], b[1]])))
            })
            .collect();
        assert_eq!(pcm.len(), 25 * FRAME_SAMPLES);
        // Zero crossings of a 440 Hz tone over the last 0.4 s: 352 (± codec delay).
        let tail = &pcm[pcm.len() - 6_400..];
        let crossings = tail
            .windows(2)
            .filter(|w| (w[0] < 0.0) != (w[1] < 0.0))
            .count();
        assert!(
            (348..=356).contains(&crossings),
            "{crossings} zero crossings"
        );
        let rms = (tail.iter().map(|x| x * x).sum::<f64>() / tail.len() as f64).sqrt();
        assert!(
            (4_500.0..=6_800.0).contains(&rms),
            "rms {rms} (tone rms 5657)"
        );
    }
}
