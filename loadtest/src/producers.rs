//! Synthetic producers: one WebSocket client per stream, 640-byte frames at 20 ms — or,
//! with `--transport whip`, one WHIP session per stream sending the same audio as 20 ms
//! Opus packets ([`whip`]), or, with `--transport twilio`, one Twilio Media Streams
//! WebSocket per stream sending it as 20 ms µ-law chunks at 8 kHz ([`twilio`]).
//!
//! Cadence: a 20 ms `Interval` with `MissedTickBehavior::Skip` per producer, started at
//! a random phase inside one frame; a late tick is not made up but counted
//! (`ticks_missed`: `expected − sent` per connection). docs/loadtest.md ("Cadence")
//! says why.
//!
//! A stream: connect to `/v1/streams/{id}`, send frames until the run's stop time,
//! then either send `{"type":"end"}` and wait (bounded) for the `closed` event, or —
//! for the share that "vanishes" — drop the TCP connection without a close frame.
//! Server events (`overload`, `gap`, `closed`) and close codes are counted. When the
//! server ends a stream early (overload, close 1013) or refuses it (HTTP 503), the
//! producer stops sending at once and, if reconnecting is enabled, retries under a new
//! id (`s7`, `s7r1`, `s7r2`, ...) after a back-off, as a telephony gateway would.
//!
//! Each stream sends for exactly the run's duration from its own (spread) start, so a
//! run lasts `duration + start_spread` and the nominal frame count is
//! `streams × duration × 50`.
//!
//! Invariants: every loop is bounded by the run's stop time plus fixed grace periods;
//! every frame a producer wrote is counted in `frames_sent` exactly once; ticks when the
//! stream was down (refused, closed, reconnecting) are counted in `frames_not_sent`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rand::Rng;
use serde::Serialize;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use weir_protocol::audio::FRAME_DURATION;

use crate::counters::{Count, bump, counters};
use crate::speech::SpeechClip;
use crate::stats::LatencyHistogram;

mod twilio;
mod whip;
pub use twilio::TwilioClip;
pub use whip::OpusClip;

/// How the producers reach the ingress (`--transport`).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// One WebSocket per stream, PCM frames (`/v1/streams/{id}`).
    #[default]
    Ws,
    /// One WHIP session per stream, Opus over WebRTC (`/v1/whip/{id}`).
    Whip,
    /// One Twilio Media Streams WebSocket per stream, 8 kHz µ-law chunks
    /// (`/v1/telephony/twilio`).
    Twilio,
}

/// How long a producer waits for the `closed` event after sending `end`.
pub const END_GRACE: Duration = Duration::from_secs(5);
/// How long a connection attempt may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one frame send may block before the connection is given up.
pub(crate) const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of the producer fleet.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// The ingress WebSocket address (loopback).
    pub ws_addr: SocketAddr,
    /// How long the producers send.
    pub duration: Duration,
    /// Share (0..=1) of streams that vanish without `end` at the stop time.
    pub vanish_share: f64,
    /// Whether a producer reconnects (under a new id) after the server ended or refused
    /// its stream.
    pub reconnect: bool,
    /// Back-off before reconnecting (the server's `Retry-After` wins when larger,
    /// capped at 2 s).
    pub reconnect_delay: Duration,
    /// Spread of the connection start times (streams connect uniformly within it).
    pub start_spread: Duration,
    /// WebSocket, WHIP or Twilio.
    pub transport: Transport,
    /// The stream ids, one producer each; a reconnect appends `r1`, `r2`, ...
    pub ids: Arc<Vec<String>>,
}

counters! {
    /// Counters shared by all producers (atomics, read by the sampler while running).
    pub struct ProducerCounters;
    /// A plain copy of [`ProducerCounters`].
    pub struct ProducerSnapshot {
        /// Connections established.
        connects,
        /// Connection attempts refused before the upgrade (503, 409, 400...).
        refused,
        /// Connection attempts that failed otherwise (TCP error, timeout).
        connect_errors,
        /// Frames written to a socket.
        frames_sent,
        /// Ticks at which the stream was down (refused, ended by the server, reconnecting).
        frames_not_sent,
        /// Ticks skipped because the producer task ran late.
        ticks_missed,
        /// `overload` events received.
        overload_events,
        /// `gap` events received.
        gap_events,
        /// `closed` events received.
        closed_events,
        /// Streams ended with `{"type":"end"}`.
        ended,
        /// Streams dropped without `end` on purpose.
        vanished,
        /// Streams ended early by the server (overload or close before `end`).
        ended_by_server,
        /// Streams that broke (send error, socket error).
        broken,
        /// Messages in a carrier's dialect received from the server (`--transport twilio`:
        /// `media`, `mark`, `clear`, ...).
        carrier_events,
        /// Producers still running.
        active,
        /// Refused WebSocket attempts whose refusal carried a `Retry-After`.
        refusals_with_retry_after,
        /// Streams the server ended with reason `no_capacity` (a worker refused them after
        /// the door admitted them).
        ended_no_capacity,
        /// Frames written on those streams before they were ended.
        frames_sent_ended_no_capacity,
        ;
        /// Close codes received from the server, by code.
        close_codes: Mutex<BTreeMap<u16, u64>>,
        /// HTTP statuses of refused connection attempts, by status.
        refusals: Mutex<BTreeMap<u16, u64>>,
        /// Refused WebSocket attempts by the `error.code` of the refusal body
        /// (`no_capacity`, `overloaded`, ...; `none` without a readable body).
        refusal_codes: Mutex<BTreeMap<String, u64>>,
        /// WebSocket attempts refused by HTTP status: connect → the refusal received, as
        /// the caller measures it.
        refusal_ms: LatencyHistogram,
    }
}

impl ProducerCounters {
    /// Counts one server event (a JSON message on the WebSocket or the WHIP data
    /// channel); returns its `type` (`overload`, `gap`, `closed`, ...).
    pub(crate) fn count_event<'v>(&self, v: &'v serde_json::Value) -> Option<&'v str> {
        let kind = v.get("type").and_then(|t| t.as_str());
        let counter = match kind {
            Some("overload") => &self.overload_events,
            Some("gap") => &self.gap_events,
            Some("closed") => &self.closed_events,
            _ => return kind,
        };
        counter.inc();
        kind
    }
}

/// Starts every producer; the returned handle joins them.
pub fn start(
    config: ProducerConfig,
    clip_seed: u64,
    counters: Arc<ProducerCounters>,
) -> tokio::task::JoinSet<()> {
    let mut set = tokio::task::JoinSet::new();
    let streams = config.ids.len();
    let vanish_count = ((streams as f64) * config.vanish_share.clamp(0.0, 1.0)).round() as usize;
    // Each clip encoded for the transport once, here.
    let encoded: Vec<Option<Encoded>> = clips(clip_seed)
        .into_iter()
        .map(|c| match config.transport {
            Transport::Ws => Ok(Encoded::Pcm(c)),
            Transport::Whip => OpusClip::encode(&c).map(Encoded::Opus),
            Transport::Twilio => TwilioClip::encode(&c).map(Encoded::Twilio),
        })
        .map(|r| {
            let transport = config.transport;
            r.map_err(|e| tracing::error!(error = %e, %transport, "cannot encode the clip"))
                .ok()
        })
        .collect();
    let http = reqwest::Client::builder()
        .timeout(CONNECT_TIMEOUT + END_GRACE)
        .build()
        .unwrap_or_default();
    // The run starts once the clips are ready (rendering and encoding them is not part
    // of any stream's time).
    let start = Instant::now();
    for (index, offset) in start_offsets(streams, config.start_spread).enumerate() {
        let stream = Producer {
            index,
            config: config.clone(),
            encoded: encoded[index % encoded.len()].clone(),
            http: http.clone(),
            counters: counters.clone(),
            start_at: start + offset,
            // Each stream sends for exactly `duration` from its own start, so the
            // nominal count is streams × duration × 50 whatever the spread.
            stop_at: start + offset + config.duration,
            // Spread the vanishing ones over the index range.
            vanish: vanish_count > 0 && (index * vanish_count) % streams < vanish_count,
        };
        counters.active.inc();
        set.spawn(async move {
            let counters = stream.counters.clone();
            stream.run().await;
            counters.active.fetch_sub(1, Ordering::Relaxed);
        });
    }
    set
}

/// A handful of distinct clips from `seed`, shared (`Bytes`) between streams.
pub(crate) fn clips(seed: u64) -> Vec<SpeechClip> {
    (0..8).map(|i| SpeechClip::render(seed + i, 150)).collect()
}

/// `n` random start offsets within `spread`, each with a random phase inside one frame
/// (so that N streams do not all send in the same millisecond).
pub(crate) fn start_offsets(n: usize, spread: Duration) -> impl Iterator<Item = Duration> {
    let spread_ms = spread.as_millis().max(1) as u64;
    let mut rng = rand::rng();
    (0..n).map(move |_| {
        Duration::from_millis(rng.random_range(0..spread_ms))
            + Duration::from_micros(rng.random_range(0..20_000))
    })
}

/// A clip as the transport sends it, encoded once before the run.
#[derive(Clone)]
enum Encoded {
    /// The clip's PCM frames as they are (`ws`).
    Pcm(SpeechClip),
    /// Opus packets (`whip`).
    Opus(OpusClip),
    /// Base64 µ-law chunks (`twilio`).
    Twilio(TwilioClip),
}

/// How one connection ended.
pub(crate) enum ConnectionEnd {
    /// The run's stop time came; the stream was ended (or vanished) on purpose.
    Finished,
    /// The server ended or refused the stream; retry after this delay.
    Retry(Duration),
    /// Give up (no time left or reconnects disabled).
    Stop,
}

/// A producer's WebSocket to the ingress.
pub(crate) type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
/// The sending half of a [`WsStream`].
pub(crate) type WsSink = futures::stream::SplitSink<WsStream, Message>;
/// The receiving half of a [`WsStream`].
pub(crate) type WsSource = futures::stream::SplitStream<WsStream>;

/// Sends `text` (bounded by [`SEND_TIMEOUT`]); whether it was written.
async fn send_text(sink: &mut WsSink, text: String) -> bool {
    let sent = tokio::time::timeout(SEND_TIMEOUT, sink.send(Message::Text(text.into())));
    matches!(sent.await, Ok(Ok(())))
}

/// Reads the server's messages until a close frame (its code counted), an error or
/// EOF, handing each text message, parsed as JSON (`null` when it is not), to
/// `on_text`.
pub(crate) async fn read_server(
    mut source: WsSource,
    counters: &ProducerCounters,
    mut on_text: impl FnMut(serde_json::Value),
) {
    while let Some(msg) = source.next().await {
        match msg {
            Ok(Message::Text(text)) => {
                on_text(serde_json::from_str(text.as_str()).unwrap_or_default())
            }
            Ok(Message::Close(frame)) => {
                let code = frame.as_ref().map(|f| u16::from(f.code)).unwrap_or(1005);
                bump(&counters.close_codes, code);
                break;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
}

/// What the reader of a WebSocket stream tells its sender.
#[derive(Default)]
struct ReaderFlags {
    /// Set when the server ended the stream (overload, `no_capacity`, close frame,
    /// error or EOF).
    server_done: AtomicBool,
    /// Set when a `closed` event's reason was `no_capacity`.
    no_capacity: AtomicBool,
    /// Notified on the `closed` event, and when the stream is over for the server.
    got_closed_event: tokio::sync::Notify,
}

/// The reader of a WebSocket stream: it counts server events (a carrier-dialect message,
/// one with an `event` member, in `carrier_events`) and tells the sender to stop when
/// the server ends the stream.
struct WsReader {
    flags: Arc<ReaderFlags>,
    task: tokio::task::JoinHandle<()>,
}

impl WsReader {
    fn spawn(source: WsSource, counters: Arc<ProducerCounters>) -> Self {
        let flags = Arc::new(ReaderFlags::default());
        let f = flags.clone();
        let task = tokio::spawn(async move {
            read_server(source, &counters, |v| {
                if v.get("event").is_some() {
                    return counters.carrier_events.inc();
                }
                match counters.count_event(&v) {
                    Some("overload") => f.server_done.store(true, Ordering::Relaxed),
                    Some("closed") => {
                        if v["reason"] == "no_capacity" {
                            f.no_capacity.store(true, Ordering::Relaxed);
                            f.server_done.store(true, Ordering::Relaxed);
                        }
                        f.got_closed_event.notify_one()
                    }
                    _ => {}
                }
            })
            .await;
            // The stream is over for the server (close frame, error or EOF).
            f.server_done.store(true, Ordering::Relaxed);
            f.got_closed_event.notify_one();
        });
        Self { flags, task }
    }

    /// Waits for the reader at most 1 s, then aborts it.
    async fn join(&mut self) {
        if tokio::time::timeout(Duration::from_secs(1), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

pub(crate) struct Producer {
    index: usize,
    config: ProducerConfig,
    /// The clip as the transport sends it (`None`: the encoder refused it).
    encoded: Option<Encoded>,
    http: reqwest::Client,
    counters: Arc<ProducerCounters>,
    start_at: Instant,
    stop_at: Instant,
    vanish: bool,
}

impl Producer {
    async fn run(self) {
        tokio::time::sleep_until(self.start_at).await;
        let mut attempt = 0u32;
        let mut frame_index = self.index as u64 * 37;
        // Bounded: every iteration either finishes, or waits at least the back-off
        // before the next; the loop ends at the stop time.
        while Instant::now() < self.stop_at {
            let base = self.config.ids.get(self.index).cloned().unwrap_or_default();
            let id = if attempt == 0 {
                base
            } else {
                format!("{base}r{attempt}")
            };
            attempt += 1;
            let end = match &self.encoded {
                Some(Encoded::Pcm(clip)) => {
                    let url = format!("ws://{}/v1/streams/{id}", self.config.ws_addr);
                    let frame = |_, _, _, i| Message::Binary(clip.frame(i));
                    let end = |_| r#"{"type":"end"}"#.to_owned();
                    self.ws_stream(&url, vec![], &mut frame_index, frame, end)
                        .await
                }
                Some(Encoded::Opus(opus)) => {
                    self.whip_connection(&id, opus, &mut frame_index).await
                }
                Some(Encoded::Twilio(clip)) => {
                    self.twilio_connection(&id, clip, &mut frame_index).await
                }
                // The encoder refused the clip: nothing can be sent.
                None => ConnectionEnd::Stop,
            };
            match end {
                ConnectionEnd::Finished | ConnectionEnd::Stop => return,
                ConnectionEnd::Retry(delay) => {
                    if !self.config.reconnect {
                        self.count_down_until(self.stop_at);
                        return;
                    }
                    let resume = (Instant::now() + delay).min(self.stop_at);
                    self.count_down_until(resume);
                    tokio::time::sleep_until(resume).await;
                }
            }
        }
    }

    /// Counts the ticks between now and `until` as not sent (the stream is down).
    fn count_down_until(&self, until: Instant) {
        let now = Instant::now();
        if until > now {
            let ticks = (until - now).as_micros() / FRAME_DURATION.as_micros();
            self.counters.frames_not_sent.add(ticks as u64);
        }
    }

    /// One WebSocket stream at `url` (`/v1/streams/{id}`, or the Twilio route): the
    /// `hello` messages, then one `message(tick, began, sent, frame)` per tick (see
    /// [`Producer::send_ticks`]); at the stop time it vanishes, or sends `end(sent)` and
    /// waits (bounded) for the server's `closed` event or close frame.
    pub(crate) async fn ws_stream(
        &self,
        url: &str,
        hello: Vec<String>,
        frame_index: &mut u64,
        message: impl FnMut(Instant, Instant, u64, u64) -> Message,
        end: impl FnOnce(u64) -> String,
    ) -> ConnectionEnd {
        let (mut sink, source) = match self.open_ws(url).await {
            Ok(ws) => ws.split(),
            Err(end) => return end,
        };
        let mut reader = WsReader::spawn(source, self.counters.clone());
        let mut hello_sent = true;
        for text in hello {
            hello_sent = hello_sent && send_text(&mut sink, text).await;
        }
        let (ended_early, sent_here) = if hello_sent {
            let done = &reader.flags.server_done;
            self.send_ticks(&mut sink, done, frame_index, message).await
        } else {
            (true, 0)
        };
        if ended_early {
            // The server ended the stream (or the socket broke) before the stop time.
            self.counters.ended_by_server.inc();
            let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
            reader.join().await;
            if reader.flags.no_capacity.load(Ordering::Relaxed) {
                self.counters.ended_no_capacity.inc();
                self.counters.frames_sent_ended_no_capacity.add(sent_here);
            }
            return self.retry_unless_over();
        }
        if self.vanish {
            // No `end`, no close frame: the TCP connection just ends.
            self.counters.vanished.inc();
            reader.task.abort();
            return ConnectionEnd::Finished;
        }
        if send_text(&mut sink, end(sent_here)).await {
            self.counters.ended.inc();
        }
        let _ = tokio::time::timeout(END_GRACE, reader.flags.got_closed_event.notified()).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
        reader.join().await;
        ConnectionEnd::Finished
    }

    /// Opens the WebSocket at `url` (bounded by [`CONNECT_TIMEOUT`]) and counts the
    /// connect; a refusal (an HTTP status: its latency, `error.code` and `Retry-After`
    /// counted) or a failure becomes the connection's end.
    pub(crate) async fn open_ws(&self, url: &str) -> Result<WsStream, ConnectionEnd> {
        let asked = Instant::now();
        let connected =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(url)).await;
        match connected {
            Ok(Ok((ws, _))) => {
                self.counters.connects.inc();
                Ok(ws)
            }
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp))) => {
                self.counters.refusal_ms.record(asked.elapsed());
                bump(&self.counters.refusal_codes, refusal_code(&resp));
                let retry_after = resp.headers().get("retry-after");
                let retry_after = retry_after.and_then(|v| v.to_str().ok());
                if retry_after.is_some() {
                    self.counters.refusals_with_retry_after.inc();
                }
                Err(self.refused(resp.status().as_u16(), retry_after))
            }
            Ok(Err(_)) | Err(_) => Err(self.connect_failed()),
        }
    }

    /// Sends one message per 20 ms tick (Skip) until the stop time; `message(tick,
    /// began, sent, frame)` builds each from the tick's time, the time the sending
    /// began, the frames sent so far on this connection and the clip's frame index
    /// (which advances by one per message). Stops early when `server_done` is set or a
    /// send fails (counted as `broken` unless the server was done). Counts the frames
    /// sent and the ticks missed; returns whether it stopped early, and the frames sent.
    pub(crate) async fn send_ticks(
        &self,
        sink: &mut WsSink,
        server_done: &AtomicBool,
        frame_index: &mut u64,
        mut message: impl FnMut(Instant, Instant, u64, u64) -> Message,
    ) -> (bool, u64) {
        let mut interval = crate::scenario::ticker(FRAME_DURATION);
        let began = Instant::now();
        let mut sent_here: u64 = 0;
        let mut ended_early = false;
        loop {
            let tick = interval.tick().await;
            if tick >= self.stop_at {
                break;
            }
            if server_done.load(Ordering::Relaxed) {
                ended_early = true;
                break;
            }
            let msg = message(tick, began, sent_here, *frame_index);
            *frame_index += 1;
            match tokio::time::timeout(SEND_TIMEOUT, sink.send(msg)).await {
                Ok(Ok(())) => {
                    sent_here += 1;
                    self.counters.frames_sent.inc();
                }
                Ok(Err(_)) | Err(_) => {
                    // The server closed or the socket broke mid-send: the frame was not
                    // written.
                    if !server_done.load(Ordering::Relaxed) {
                        self.counters.broken.inc();
                    }
                    ended_early = true;
                    break;
                }
            }
        }
        self.count_missed(began, sent_here);
        (ended_early, sent_here)
    }

    /// Retries after the back-off, or stops when the stop time has come.
    pub(crate) fn retry_unless_over(&self) -> ConnectionEnd {
        if Instant::now() >= self.stop_at {
            ConnectionEnd::Stop
        } else {
            ConnectionEnd::Retry(self.backoff(Duration::ZERO))
        }
    }

    /// Counts the ticks from `began` to now (at most the stop time) that sent no frame,
    /// `sent` having been sent.
    pub(crate) fn count_missed(&self, began: Instant, sent: u64) {
        let ended_at = Instant::now().min(self.stop_at);
        let expected = (ended_at.saturating_duration_since(began).as_micros()
            / FRAME_DURATION.as_micros()) as u64;
        self.counters
            .ticks_missed
            .add(expected.saturating_sub(sent));
    }

    /// The connection was refused with HTTP `status`: counted; retried after the
    /// back-off, or the server's `Retry-After` (seconds) when longer.
    pub(crate) fn refused(&self, status: u16, retry_after: Option<&str>) -> ConnectionEnd {
        self.counters.refused.inc();
        bump(&self.counters.refusals, status);
        let hint = retry_after
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_secs);
        ConnectionEnd::Retry(self.backoff(hint))
    }

    /// The connection failed otherwise (TCP error, timeout): counted, retried.
    pub(crate) fn connect_failed(&self) -> ConnectionEnd {
        self.counters.connect_errors.inc();
        ConnectionEnd::Retry(self.backoff(Duration::ZERO))
    }

    fn backoff(&self, hint: Duration) -> Duration {
        self.config
            .reconnect_delay
            .max(hint.min(Duration::from_secs(2)))
    }
}

/// The `error.code` of a refused upgrade's body (`none` without a readable one).
pub(crate) fn refusal_code(
    resp: &tokio_tungstenite::tungstenite::http::Response<Option<Vec<u8>>>,
) -> String {
    (resp.body().as_deref())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "none".to_owned())
}

/// Frames a fleet of `streams` producers offers in `duration` at 50 frames/s.
pub fn nominal_frames(streams: usize, duration: Duration) -> u64 {
    streams as u64 * (duration.as_micros() / FRAME_DURATION.as_micros()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nominal_rate_is_fifty_per_second() {
        assert_eq!(nominal_frames(10, Duration::from_secs(2)), 1000);
        assert_eq!(nominal_frames(1, Duration::from_millis(19)), 0);
    }
}
