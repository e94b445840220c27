//! The flapping producer: the client side of resume (docs/protocol.md, the resume
//! handshake), one WebSocket stream per call whose TCP connection is cut every
//! `flap_every`.
//!
//! The producer's capture clock never stops: a `tokio::time::Interval` of 20 ms with
//! [`MissedTickBehavior::Skip`] (the pacing of [`crate::producers`]) yields one frame
//! per tick for the whole call, whatever the connection does. Frame numbering follows
//! the door's: the k-th frame the producer *offers* has seq k.
//!
//! The cut (`SO_LINGER` 0, then drop: a TCP RST), the reconnect (a resume naming
//! `last_seq` and `next_seq` = frames offered + 1, or a fresh open) and the frames held
//! during a handshake (at most [`HANDSHAKE_BUFFER`], written right after the upgrade,
//! numbered as `next_seq` named them) are described in docs/loadtest.md ("Producers
//! that flap"). The producer never replays a frame it offered.
//!
//! Latencies: `reconnect_ms` is cut → `101 Switching Protocols`; `resume_ms` is cut →
//! the `resumed` event (the door then stands ready for the next frame).
//!
//! Invariants: every tick is one frame, offered exactly once (written to a live
//! socket, written to a socket that then died, or lost between attempts) or held for
//! the handshake and offered after it; every loop ends at the call's stop time plus
//! fixed grace periods; only loopback addresses are targeted (the caller's `ws_addr`).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use weir_protocol::audio::FRAME_DURATION;

use crate::counters::{Count, bump, counters};
use crate::speech::SpeechClip;
use crate::stats::LatencyHistogram;

/// How long one connection attempt (TCP connect + upgrade) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Frames held while a handshake is under way: the whole [`CONNECT_TIMEOUT`].
pub const HANDSHAKE_BUFFER: usize = 150;
/// Back-off after a refused or failed attempt.
pub const RETRY_DELAY: Duration = Duration::from_millis(20);
/// How long one frame write may block before the connection counts as lost.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the producer waits for `closed` after its `end`.
pub const END_GRACE: Duration = Duration::from_secs(5);
/// No cut before this much of the call has passed (the door's `opened` must be in).
pub const FIRST_CUT_AFTER: Duration = Duration::from_secs(1);
/// No cut closer than this to the call's end (its `end` goes out on a settled link).
pub const LAST_CUT_BEFORE: Duration = Duration::from_secs(1);

/// Settings of the flapping producers.
#[derive(Debug, Clone)]
pub struct FlapConfig {
    /// The door's WebSocket address (loopback).
    pub ws_addr: SocketAddr,
    /// The calls' stream ids, one producer each.
    pub ids: Arc<Vec<String>>,
    /// How long each call sends.
    pub duration: Duration,
    /// Every connection is cut this often (staggered across calls).
    pub flap_every: Duration,
    /// Reconnect with the resume token (else a fresh open of the same id).
    pub resume: bool,
    /// Calls start uniformly within this spread.
    pub start_spread: Duration,
}

/// When call `index` of `calls` cuts first, after its start: [`FIRST_CUT_AFTER`] plus
/// its share of `flap_every`, so that the cuts of all calls are spread evenly (pure).
pub fn first_cut(index: usize, calls: usize, flap_every: Duration) -> Duration {
    let share = index as f64 / calls.max(1) as f64;
    FIRST_CUT_AFTER + flap_every.mul_f64(share)
}

/// The path and query of a reconnect (pure): a resume when `token` is set, else a
/// fresh open.
pub fn reconnect_path(id: &str, token: Option<&str>, last_seq: u64, next_seq: u64) -> String {
    match token {
        Some(t) => {
            format!("/v1/streams/{id}?resume_token={t}&last_seq={last_seq}&next_seq={next_seq}")
        }
        None => format!("/v1/streams/{id}"),
    }
}

counters! {
    /// Counters shared by all flapping producers.
    pub struct FlapCounters;
    /// A plain copy of [`FlapCounters`] (the report's `flap.producers`).
    pub struct FlapSnapshot {
        /// Connections upgraded (first opens and reconnects).
        connects,
        /// Connections cut on purpose (RST).
        cuts,
        /// Connections lost otherwise (read or write error, close frame) before the end.
        unplanned_drops,
        /// Reconnects that resumed (a `resumed` event).
        resumes,
        /// Fresh opens after a drop (no token, or a refused resume).
        fresh_reopens,
        /// Attempts refused before the upgrade.
        refused,
        /// Attempts that failed otherwise (TCP, timeout).
        connect_errors,
        /// `error` events with code `taken_over`.
        taken_over,
        /// `resumed` events whose `next_seq` was not the producer's.
        next_seq_mismatches,
        /// Frames the door said it declared lost (`resumed.gap.frames`).
        door_declared_frames,
        /// Frames offered (numbered).
        frames_offered,
        /// Of those, frames written to a socket.
        frames_written,
        /// Of those, frames held during a handshake and written after it.
        frames_after_handshake,
        /// Frames offered while no connection could take them (between failed attempts).
        frames_lost_between_attempts,
        /// Ticks skipped because the producer task ran late.
        ticks_missed,
        /// `ack` events.
        acks,
        /// `gap` events.
        gap_events,
        /// Calls ended with `end` and a `closed` event.
        ended,
        /// Calls that could not send their `end` (no connection at the stop time).
        end_failed,
        ;
        /// Refused attempts by the refusal's `error.code` (`none` without a body).
        refusal_codes: Mutex<BTreeMap<String, u64>>,
        /// `closed` events by reason.
        closed_reasons: Mutex<BTreeMap<String, u64>>,
        /// Close codes received (`4001` = taken over).
        close_codes: Mutex<BTreeMap<u16, u64>>,
        /// Cut → `resumed` event, client side.
        resume_ms: LatencyHistogram,
        /// Cut → the reconnect's `101`, client side (every design).
        reconnect_ms: LatencyHistogram,
        ;
        /// Calls connected now.
        pub up: AtomicU64,
    }
}

/// Starts every call; each task returns, for the audit, its stream id and the frames it
/// offered (= the seq of its last frame).
pub fn start(
    config: FlapConfig,
    clip_seed: u64,
    counters: Arc<FlapCounters>,
) -> tokio::task::JoinSet<(String, u64)> {
    let mut set = tokio::task::JoinSet::new();
    let start = Instant::now();
    let clips = crate::producers::clips(clip_seed);
    let calls = config.ids.len();
    let offsets = crate::producers::start_offsets(calls, config.start_spread);
    for ((index, id), offset) in config.ids.iter().enumerate().zip(offsets) {
        let start_at = start + offset;
        let call = Call {
            id: id.clone(),
            ws_addr: config.ws_addr,
            resume: config.resume,
            clip: clips[index % clips.len()].clone(),
            clip_index: index as u64 * 37,
            counters: counters.clone(),
            start_at,
            stop_at: start_at + config.duration,
            next_cut: start_at + first_cut(index, calls, config.flap_every),
            flap_every: config.flap_every,
            offered: 0,
            base: 0,
            last_seq: 0,
            token: None,
            lost_at: None,
            link: Link::Down { retry_at: start_at },
        };
        set.spawn(call.run());
    }
    set
}

type Ws = WebSocketStream<TcpStream>;
type Attempt = Pin<Box<dyn Future<Output = Result<Ws, Refusal>> + Send>>;

/// Why an attempt did not upgrade.
#[derive(Debug)]
enum Refusal {
    /// Refused with an HTTP status and the body's `error.code`.
    Http(u16, String),
    /// TCP error, handshake error or timeout.
    Failed,
}

/// The call's connection.
enum Link {
    /// No connection; the next attempt at `retry_at`.
    Down { retry_at: Instant },
    /// An attempt under way; the frames ticked meanwhile wait in `held`.
    Connecting {
        attempt: Attempt,
        resuming: bool,
        next_seq: u64,
        held: Vec<Bytes>,
    },
    /// Upgraded. `resume_since`: a resume whose `resumed` event has not come yet.
    Up {
        ws: Box<Ws>,
        resume_since: Option<Instant>,
        expect_next_seq: Option<u64>,
    },
}

/// What the link did.
enum LinkEvent {
    Message(Option<Result<Message, tokio_tungstenite::tungstenite::Error>>),
    Attempted(Result<Box<Ws>, Refusal>),
    /// The back-off after a failed attempt is over.
    Retry,
}

/// Waits for the link's next event; pending forever when it has none to give.
async fn link_event(link: &mut Link) -> LinkEvent {
    match link {
        Link::Up { ws, .. } => LinkEvent::Message(ws.next().await),
        Link::Connecting { attempt, .. } => LinkEvent::Attempted(attempt.await.map(Box::new)),
        Link::Down { retry_at, .. } => {
            tokio::time::sleep_until(*retry_at).await;
            LinkEvent::Retry
        }
    }
}

/// One attempt: TCP connect (`SO_LINGER` 0, so that dropping it resets), then the
/// WebSocket upgrade, within [`CONNECT_TIMEOUT`].
async fn open(addr: SocketAddr, path: String) -> Result<Ws, Refusal> {
    let attempt = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|_| Refusal::Failed)?;
        let _ = tcp.set_nodelay(true);
        tcp.set_zero_linger().map_err(|_| Refusal::Failed)?;
        let url = format!("ws://{addr}{path}");
        match tokio_tungstenite::client_async(url, tcp).await {
            Ok((ws, _)) => Ok(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let code = crate::producers::refusal_code(&resp);
                Err(Refusal::Http(resp.status().as_u16(), code))
            }
            Err(_) => Err(Refusal::Failed),
        }
    };
    tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .unwrap_or(Err(Refusal::Failed))
}

struct Call {
    id: String,
    ws_addr: SocketAddr,
    resume: bool,
    clip: SpeechClip,
    clip_index: u64,
    counters: Arc<FlapCounters>,
    start_at: Instant,
    stop_at: Instant,
    next_cut: Instant,
    flap_every: Duration,
    /// Frames offered so far, over every stream instance of the call.
    offered: u64,
    /// `offered` when the current stream instance began: its frame k is offered
    /// frame `base + k` (a fresh open starts a new instance at seq 1).
    base: u64,
    /// The last seq the door confirmed.
    last_seq: u64,
    /// The resume token, once `opened` gave it (and while the stream lives).
    token: Option<String>,
    /// When the link was lost, until a reconnect upgraded (for the latencies).
    lost_at: Option<Instant>,
    link: Link,
}

impl Call {
    async fn run(mut self) -> (String, u64) {
        tokio::time::sleep_until(self.start_at).await;
        // The first open starts with the call: the ticks of its handshake are held and
        // offered after it, like a reconnect's.
        self.connect();
        let mut interval = tokio::time::interval_at(self.start_at, FRAME_DURATION);
        interval.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut ticks: u64 = 0;
        // Bounded: the loop ends at the first tick at or after the stop time.
        loop {
            tokio::select! {
                tick = interval.tick() => {
                    if tick >= self.stop_at {
                        break;
                    }
                    ticks += 1;
                    self.on_tick(tick).await;
                }
                ev = link_event(&mut self.link) => self.on_link(ev).await,
            }
        }
        let expected = (self.stop_at - self.start_at).as_micros() / FRAME_DURATION.as_micros();
        self.counters
            .ticks_missed
            .add((expected as u64).saturating_sub(ticks));
        self.finish().await;
        if matches!(self.link, Link::Up { .. }) {
            self.counters.up.fetch_sub(1, Ordering::Relaxed);
        }
        (self.id, self.offered)
    }

    /// One frame: written, held for a handshake, or offered and lost; then the cut
    /// when it is due.
    async fn on_tick(&mut self, tick: Instant) {
        let frame = self.clip.frame(self.clip_index);
        self.clip_index += 1;
        match &mut self.link {
            Link::Up { .. } => {
                if !self.write(frame).await {
                    self.lost_link();
                    return;
                }
            }
            Link::Connecting { held, .. } if held.len() < HANDSHAKE_BUFFER => held.push(frame),
            Link::Connecting { .. } => {
                // The handshake outlived its buffer (it is also timing out): give it
                // up, and this frame with the held ones.
                self.attempt_failed(Refusal::Failed);
                self.lose_frames(1);
            }
            // The attempt starts when the back-off ends (`LinkEvent::Retry`).
            Link::Down { .. } => self.lose_frames(1),
        }
        let can_cut = !self.resume || self.token.is_some();
        if tick >= self.next_cut && matches!(self.link, Link::Up { .. }) && can_cut {
            if tick + self.flap_every.min(LAST_CUT_BEFORE) < self.stop_at {
                self.cut();
            }
            self.next_cut += self.flap_every;
        }
    }

    /// Offers `frame` on the live link; returns whether it was written (if not, the
    /// link is broken).
    async fn write(&mut self, frame: Bytes) -> bool {
        let Link::Up { ws, .. } = &mut self.link else {
            return false;
        };
        self.offered += 1;
        self.counters.frames_offered.inc();
        let sent = tokio::time::timeout(SEND_TIMEOUT, ws.send(Message::Binary(frame))).await;
        let written = matches!(sent, Ok(Ok(())));
        if written {
            self.counters.frames_written.inc();
        }
        written
    }

    /// Offered frames no connection could take (the next resume declares them).
    fn lose_frames(&mut self, n: u64) {
        self.offered += n;
        self.counters.frames_offered.add(n);
        self.counters.frames_lost_between_attempts.add(n);
    }

    /// The socket-level kill: the socket (SO_LINGER 0) is dropped, the kernel sends
    /// an RST; the reconnect starts at once.
    fn cut(&mut self) {
        self.counters.cuts.inc();
        self.reconnect_now();
    }

    /// The link broke without our cut (read or write error, or the server closed).
    fn lost_link(&mut self) {
        self.counters.unplanned_drops.inc();
        self.reconnect_now();
    }

    /// Drops the link (dropping the WebSocket drops its TcpStream: with SO_LINGER 0,
    /// that is the RST) and starts the reconnect at once.
    fn reconnect_now(&mut self) {
        if matches!(self.link, Link::Up { .. }) {
            self.counters.up.fetch_sub(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        self.lost_at = Some(now);
        self.link = Link::Down { retry_at: now };
        self.connect();
    }

    /// Starts an attempt: a resume when the token is known, else a fresh open.
    fn connect(&mut self) {
        let token = self.token.as_deref().filter(|_| self.resume);
        let next_seq = self.offered - self.base + 1;
        let path = reconnect_path(&self.id, token, self.last_seq, next_seq);
        self.link = Link::Connecting {
            attempt: Box::pin(open(self.ws_addr, path)),
            resuming: token.is_some(),
            next_seq,
            held: Vec::new(),
        };
    }

    fn attempt_failed(&mut self, why: Refusal) {
        if let Link::Connecting { held, .. } = &self.link {
            let held = held.len() as u64;
            self.lose_frames(held);
        }
        match why {
            Refusal::Http(status, code) => {
                self.counters.refused.inc();
                // A refused resume will not be accepted later: the stream is gone for
                // the door (or never was); the next attempt opens a fresh one.
                if code.starts_with("resume_") || matches!(status, 400 | 401 | 403) {
                    self.token = None;
                }
                bump(&self.counters.refusal_codes, code);
            }
            Refusal::Failed => {
                self.counters.connect_errors.inc();
            }
        }
        self.link = Link::Down {
            retry_at: Instant::now() + RETRY_DELAY,
        };
    }

    async fn on_link(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Attempted(Ok(ws)) => self.upgraded(ws).await,
            LinkEvent::Attempted(Err(why)) => self.attempt_failed(why),
            LinkEvent::Retry => self.connect(),
            LinkEvent::Message(Some(Ok(Message::Text(text)))) => {
                self.on_event(text.as_str());
            }
            LinkEvent::Message(Some(Ok(Message::Close(frame)))) => {
                let code = frame.as_ref().map_or(1005, |f| u16::from(f.code));
                bump(&self.counters.close_codes, code);
                self.lost_link();
            }
            LinkEvent::Message(Some(Ok(_))) => {}
            LinkEvent::Message(Some(Err(_)) | None) => self.lost_link(),
        }
    }

    /// The attempt upgraded: the frames held during the handshake go out first,
    /// numbered from the `next_seq` the attempt named.
    async fn upgraded(&mut self, ws: Box<Ws>) {
        let now = Instant::now();
        let Link::Connecting {
            resuming,
            next_seq,
            held,
            ..
        } = std::mem::replace(&mut self.link, Link::Down { retry_at: now })
        else {
            return;
        };
        self.counters.connects.inc();
        self.counters.up.inc();
        let since = self.lost_at.take();
        if let Some(s) = since {
            self.counters.reconnect_ms.record(now - s);
        }
        if resuming {
            self.counters.resumes.inc();
        } else {
            if since.is_some() {
                self.counters.fresh_reopens.inc();
            }
            // A new stream instance: its token comes with its `opened` event, its seqs
            // start at 1.
            self.token = None;
            self.base = self.offered;
            self.last_seq = 0;
        }
        self.link = Link::Up {
            ws,
            resume_since: since.filter(|_| resuming),
            expect_next_seq: resuming.then_some(next_seq),
        };
        let mut held = held.into_iter();
        // Bounded by HANDSHAKE_BUFFER frames.
        for frame in held.by_ref() {
            if !self.write(frame).await {
                self.lose_frames(held.len() as u64);
                self.lost_link();
                return;
            }
            self.counters.frames_after_handshake.inc();
        }
    }

    /// One event of the door; returns whether it was `closed`.
    fn on_event(&mut self, text: &str) -> bool {
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        let u = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        match v.get("type").and_then(serde_json::Value::as_str) {
            Some("opened") if self.resume => {
                self.token = v["resume_token"].as_str().map(str::to_owned);
            }
            Some("ack") => {
                self.counters.acks.inc();
                if let Some(seq) = u("seq") {
                    self.last_seq = self.last_seq.max(seq);
                }
            }
            Some("resumed") => {
                if let Some(seq) = u("seq") {
                    self.last_seq = seq;
                }
                if let Some(frames) = v["gap"].get("frames").and_then(serde_json::Value::as_u64) {
                    self.counters.door_declared_frames.add(frames);
                }
                if let Link::Up {
                    resume_since,
                    expect_next_seq,
                    ..
                } = &mut self.link
                {
                    if let Some(s) = resume_since.take() {
                        self.counters.resume_ms.record(s.elapsed());
                    }
                    if expect_next_seq
                        .take()
                        .is_some_and(|n| u("next_seq") != Some(n))
                    {
                        self.counters.next_seq_mismatches.inc();
                    }
                }
            }
            Some("gap") => {
                self.counters.gap_events.inc();
            }
            Some("error") if v["code"] == "taken_over" => {
                self.counters.taken_over.inc();
            }
            Some("closed") => {
                let reason = v["reason"].as_str().unwrap_or("none").to_owned();
                bump(&self.counters.closed_reasons, reason);
                // The stream is over for the door: a reconnect opens a new one.
                self.token = None;
                return true;
            }
            _ => {}
        }
        false
    }

    /// At the stop time: settles the link (at most one attempt), sends `end` and waits
    /// (bounded) for `closed`.
    async fn finish(&mut self) {
        if matches!(self.link, Link::Down { .. }) {
            self.connect();
        }
        if matches!(self.link, Link::Connecting { .. }) {
            // The attempt has its own timeout (CONNECT_TIMEOUT).
            let attempted = link_event(&mut self.link).await;
            self.on_link(attempted).await;
        }
        let Link::Up { ws, .. } = &mut self.link else {
            self.counters.end_failed.inc();
            return;
        };
        let end = Message::Text(r#"{"type":"end"}"#.into());
        if !matches!(
            tokio::time::timeout(SEND_TIMEOUT, ws.send(end)).await,
            Ok(Ok(()))
        ) {
            self.counters.end_failed.inc();
            return;
        }
        let deadline = Instant::now() + END_GRACE;
        // Bounded by END_GRACE.
        loop {
            let Link::Up { ws, .. } = &mut self.link else {
                return;
            };
            match tokio::time::timeout_at(deadline, ws.next()).await {
                Ok(Some(Ok(Message::Text(text)))) => {
                    if self.on_event(text.as_str()) {
                        self.counters.ended.inc();
                        break;
                    }
                }
                Ok(Some(Ok(Message::Close(frame)))) => {
                    let code = frame.as_ref().map_or(1005, |f| u16::from(f.code));
                    bump(&self.counters.close_codes, code);
                    break;
                }
                Ok(Some(Ok(_))) => {}
                Ok(Some(Err(_)) | None) | Err(_) => break,
            }
        }
        if let Link::Up { ws, .. } = &mut self.link {
            let _ = tokio::time::timeout(Duration::from_secs(1), SinkExt::close(ws.as_mut())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_are_spread_over_one_period() {
        let every = Duration::from_secs(10);
        assert_eq!(first_cut(0, 1000, every), FIRST_CUT_AFTER);
        assert_eq!(
            first_cut(500, 1000, every),
            FIRST_CUT_AFTER + Duration::from_secs(5)
        );
        assert!(first_cut(999, 1000, every) < FIRST_CUT_AFTER + every);
        assert_eq!(
            first_cut(0, 0, every),
            FIRST_CUT_AFTER,
            "no division by zero"
        );
    }

    #[test]
    fn a_reconnect_resumes_with_the_token_or_opens_fresh() {
        assert_eq!(
            reconnect_path("call-1", Some("dG9r"), 40, 43),
            "/v1/streams/call-1?resume_token=dG9r&last_seq=40&next_seq=43"
        );
        assert_eq!(reconnect_path("call-1", None, 40, 43), "/v1/streams/call-1");
    }

    /// What the in-process door saw of one stream.
    #[derive(Debug, Default)]
    struct DoorStream {
        /// The door's seq: frames taken, plus frames declared lost.
        seq: u64,
        taken: u64,
        declared: u64,
        opens: u64,
        resumes: u64,
        ended: bool,
    }

    type Doors = Arc<Mutex<BTreeMap<String, DoorStream>>>;

    /// A door that numbers frames as the contract does: `opened` with a token on a
    /// fresh open; on a resume it declares `door_seq + 1 ..= next_seq - 1` and answers
    /// `resumed`; it acks every 10 frames; `end` gets `closed`. Every resume's upgrade
    /// is answered 100 ms late, so that the producer holds frames for the handshake.
    // The callback's type is tungstenite's (its error is an HTTP response).
    #[allow(clippy::result_large_err)]
    async fn door(listener: tokio::net::TcpListener, doors: Doors) {
        // Ends when the test ends (the runtime drops it).
        while let Ok((tcp, _)) = listener.accept().await {
            let doors = doors.clone();
            tokio::spawn(async move {
                let mut path = String::new();
                let mut peek = [0u8; 512];
                let n = tcp.peek(&mut peek).await.unwrap_or(0);
                if String::from_utf8_lossy(&peek[..n]).contains("resume_token=") {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let callback =
                    |req: &tokio_tungstenite::tungstenite::handshake::server::Request, resp| {
                        path = req.uri().to_string();
                        Ok(resp)
                    };
                let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else {
                    return;
                };
                let (route, query) = path.split_once('?').unwrap_or((&path, ""));
                let id = route.rsplit('/').next().unwrap_or("").to_owned();
                let param = |k: &str| {
                    query
                        .split('&')
                        .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                        .and_then(|v| v.parse::<u64>().ok())
                };
                let first = {
                    let mut d = doors.lock().unwrap();
                    let s = d.entry(id.clone()).or_default();
                    match param("next_seq") {
                        Some(next) => {
                            let door_seq = s.seq;
                            assert!(param("last_seq").unwrap() <= door_seq, "not ahead");
                            assert!(next > door_seq, "next_seq above the door's seq");
                            s.declared += next - 1 - door_seq;
                            s.seq = next - 1;
                            s.resumes += 1;
                            format!(
                                r#"{{"type":"resumed","stream_id":"{id}","seq":{door_seq},"next_seq":{next},"gap":null,"resume_token":"t","resume_window_ms":5000}}"#
                            )
                        }
                        None => {
                            s.opens += 1;
                            format!(
                                r#"{{"type":"opened","stream_id":"{id}","resume_token":"t","resume_window_ms":5000}}"#
                            )
                        }
                    }
                };
                if ws.send(Message::Text(first.into())).await.is_err() {
                    return;
                }
                while let Some(Ok(msg)) = ws.next().await {
                    let ack = match msg {
                        Message::Binary(_) => {
                            let mut d = doors.lock().unwrap();
                            let s = d.entry(id.clone()).or_default();
                            s.seq += 1;
                            s.taken += 1;
                            s.seq
                                .is_multiple_of(10)
                                .then(|| format!(r#"{{"type":"ack","seq":{}}}"#, s.seq))
                        }
                        Message::Text(_) => {
                            doors.lock().unwrap().entry(id.clone()).or_default().ended = true;
                            let closed = r#"{"type":"closed","reason":"producer"}"#;
                            let _ = ws.send(Message::Text(closed.into())).await;
                            return;
                        }
                        _ => None,
                    };
                    if let Some(ack) = ack
                        && ws.send(Message::Text(ack.into())).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_offered_frame_is_taken_or_declared_by_the_door() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ws_addr = listener.local_addr().unwrap();
        let doors = Doors::default();
        tokio::spawn(door(listener, doors.clone()));
        let counters = Arc::new(FlapCounters::default());
        let ids: Vec<String> = (0..4).map(|i| format!("call{i}")).collect();
        let mut calls = start(
            FlapConfig {
                ws_addr,
                ids: Arc::new(ids.clone()),
                duration: Duration::from_secs(5),
                flap_every: Duration::from_secs(1),
                resume: true,
                start_spread: Duration::from_millis(20),
            },
            1,
            counters.clone(),
        );
        let mut outcomes = Vec::new();
        while let Some(o) = calls.join_next().await {
            outcomes.push(o.unwrap());
        }
        let p = counters.snapshot();
        assert!(p.cuts >= 4 * 3, "{p:?}");
        assert_eq!(p.resumes, p.cuts, "{p:?}");
        assert_eq!(
            (p.unplanned_drops, p.refused, p.end_failed),
            (0, 0, 0),
            "{p:?}"
        );
        assert!(
            p.frames_after_handshake > 0,
            "frames held for the handshake: {p:?}"
        );
        assert_eq!(p.resume_ms.count, p.resumes);
        assert!(
            p.resume_ms.p50 >= 100.0,
            "the door answered 100 ms late: {p:?}"
        );
        let d = doors.lock().unwrap();
        for (id, offered) in &outcomes {
            let s = &d[id];
            assert!(s.ended, "{id}: {s:?}");
            assert_eq!(s.opens, 1, "one stream: {s:?}");
            assert_eq!(
                s.seq, *offered,
                "the door's numbering is the producer's: {id} {s:?}"
            );
            assert_eq!(s.taken + s.declared, *offered, "{id} {s:?}");
        }
        assert_eq!(
            outcomes.iter().map(|(_, offered)| offered).sum::<u64>(),
            p.frames_offered
        );
    }
}
