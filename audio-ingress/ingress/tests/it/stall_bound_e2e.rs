//! The stall bound, end to end: a stalled NATS server never
//! yields stale audio without a signal, at 1, 10 and 50 streams.
//!
//! Everything is real and in its default shape, as a new user would run it:
//! - a real `nats-server` (weir-testkit), SIGSTOPped for [`PAUSE`] at [`PAUSE_AT`];
//! - the real `audio-ingress serve` binary with its **default configuration** (only the
//!   NATS URL and free loopback ports are set);
//! - N WebSocket producers (tokio-tungstenite) sending 640-byte PCM frames at the real
//!   20 ms cadence for [`SEND_FOR`]. The first 8 bytes of each frame's PCM are the
//!   producer's send time (Unix µs, big-endian), so the observer can time every frame
//!   without trusting any weir header. Each producer records every text event the
//!   ingress sends (`overload`, `gap`, `closed`, ...) and the close code;
//! - a plain async-nats subscriber on a separate connection to
//!   `inference.whisper.stream.>` that decodes every packet and records, per stream,
//!   receive time − embedded send time, and the `gap`/`end` packets.
//!
//! Asserted per size: every stream that had a frame delivered more than
//! [`STALE_AFTER`] after its send time got an `overload` or `gap` event, and at most
//! [`MAX_STALE_PER_STREAM`] such stale frames (0.5 s of audio) reached the subscriber.
//!
//! Producers behave like real ones: one whose stream was ended (overload, close 1013)
//! reconnects at once under a new stream id (`stall-<i>-r<n>`) and goes on sending at
//! the cadence. The stale limit applies per *producer*, summed over its stream
//! instances: reconnecting during a stall must not multiply the stale audio that
//! reaches the recogniser (the load test found that it did with a 64 KiB window floor).
//!
//! The three sizes run one after another (nextest test group `stall-bound`,
//! `.config/nextest.toml`), so that they do not compete with each other for the CPU and
//! the timings stay the stall's own.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use weir_protocol::audio::{DecodeOptions, PacketBody, decode};
use weir_testkit::NatsServer;

use crate::support;
use support::{Binary, STEP, http_get};

/// Frame cadence of a real producer.
const FRAME_INTERVAL: Duration = Duration::from_millis(20);
/// PCM bytes per frame (20 ms of 16 kHz mono s16le).
const FRAME_BYTES: usize = 640;
/// How long each producer sends.
const SEND_FOR: Duration = Duration::from_secs(12);
/// When the server is stopped, from the producers' first frame.
const PAUSE_AT: Duration = Duration::from_secs(3);
/// How long the server stays stopped.
const PAUSE: Duration = Duration::from_secs(6);
/// A frame delivered later than this after its send time is stale.
const STALE_AFTER: Duration = Duration::from_millis(1500);
/// Stale frames tolerated per stream: 0.5 s of audio.
const MAX_STALE_PER_STREAM: u64 = 25;
/// Bound on one WebSocket send: a send blocked this long means the ingress stopped
/// reading; the producer gives up (and records it) instead of hanging the test.
const SEND_TIMEOUT: Duration = Duration::from_secs(3);
/// After the producers stop: how long to wait for their close and for the subscriber
/// to see every stream's `end` (the backlog of the pause drains in well under this).
const DRAIN: Duration = Duration::from_secs(6);
/// The subject the ingress publishes frames on by default.
const SUBJECT_PREFIX: &str = "inference.whisper.stream.";

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A frame whose first 8 bytes are the send time (Unix µs, big-endian).
fn frame_now() -> bytes::Bytes {
    let mut pcm = vec![0u8; FRAME_BYTES];
    pcm[..8].copy_from_slice(&unix_us().to_be_bytes());
    bytes::Bytes::from(pcm)
}

/// Reconnects one producer may make (a stall of 6 s at ~0.5 s per overload needs ~12).
const MAX_INSTANCES: usize = 40;

/// What one producer saw: its stream instances, in order.
#[derive(Debug, Default)]
struct ProducerLog {
    instances: Vec<InstanceLog>,
}

impl ProducerLog {
    fn frames_sent(&self) -> u64 {
        self.instances.iter().map(|i| i.frames_sent).sum()
    }
}

/// What one stream instance (one WebSocket) saw.
#[derive(Debug, Default)]
struct InstanceLog {
    id: String,
    frames_sent: u64,
    /// Why sending stopped early, if it did.
    send_stopped: Option<String>,
    /// Every text event the ingress sent, in order.
    events: Vec<Value>,
    close_code: Option<u16>,
}

impl InstanceLog {
    fn signalled(&self) -> bool {
        self.events
            .iter()
            .any(|e| e["type"] == "overload" || e["type"] == "gap")
    }

    fn event_types(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or("?").to_owned())
            .collect()
    }
}

/// What the subscriber saw of one stream.
#[derive(Debug, Default, Clone)]
struct ObservedStream {
    frames: u64,
    /// Frames received more than [`STALE_AFTER`] after their send time.
    stale: u64,
    max_delay_us: u64,
    gap_packets: u64,
    gap_frames: u64,
    end: bool,
    decode_errors: u64,
}

#[derive(Debug, Default)]
struct Observed {
    streams: BTreeMap<String, ObservedStream>,
    /// Connection events of the subscriber's own client (a drop loses frames in
    /// flight to it, which the test must not blame on the ingress).
    disconnects: u64,
}

/// Starts the plain subscriber; returns once the server confirmed the subscription.
async fn start_subscriber(url: &str) -> (Arc<Mutex<Observed>>, tokio::task::JoinHandle<()>) {
    let observed = Arc::new(Mutex::new(Observed::default()));
    let on_event = observed.clone();
    let client = tokio::time::timeout(
        STEP,
        async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_millis(500))
            .subscription_capacity(1 << 17)
            .event_callback(move |event| {
                let on_event = on_event.clone();
                async move {
                    if matches!(event, async_nats::Event::Disconnected)
                        && let Ok(mut o) = on_event.lock()
                    {
                        o.disconnects += 1;
                    }
                }
            })
            .connect(url),
    )
    .await
    .expect("subscriber connects in time")
    .expect("subscriber connects");
    let mut sub = client
        .subscribe(format!("{SUBJECT_PREFIX}>"))
        .await
        .expect("subscribe");
    tokio::time::timeout(STEP, client.flush())
        .await
        .expect("flush in time")
        .expect("flush");
    let shared = observed.clone();
    let task = tokio::spawn(async move {
        let _client = client; // keep the connection for the task's life
        let opts = DecodeOptions::default();
        while let Some(msg) = sub.next().await {
            let now_us = unix_us();
            let id = msg
                .subject
                .as_str()
                .strip_prefix(SUBJECT_PREFIX)
                .unwrap_or(msg.subject.as_str())
                .to_owned();
            let Ok(mut o) = shared.lock() else { return };
            let s = o.streams.entry(id).or_default();
            match decode(&msg.payload, &opts) {
                Ok(p) => match p.body {
                    PacketBody::Frame { pcm } => {
                        s.frames += 1;
                        if pcm.len() >= 8 {
                            let mut sent = [0u8; 8];
                            sent.copy_from_slice(&pcm[..8]);
                            let delay = now_us.saturating_sub(u64::from_be_bytes(sent));
                            s.max_delay_us = s.max_delay_us.max(delay);
                            if delay > STALE_AFTER.as_micros() as u64 {
                                s.stale += 1;
                            }
                        }
                    }
                    PacketBody::Gap(g) => {
                        s.gap_packets += 1;
                        s.gap_frames += g.frames();
                    }
                    PacketBody::End => s.end = true,
                },
                Err(_) => s.decode_errors += 1,
            }
        }
    });
    (observed, task)
}

/// One producer: frames at the real cadence from `start` for [`SEND_FOR`], then
/// `{"type":"end"}`. When the ingress ends its stream early (overload) it reconnects at
/// once under a new id and carries on. Every instance's events are recorded.
async fn run_producer(
    ws_addr: SocketAddr,
    index: usize,
    first: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
    start: Instant,
) -> ProducerLog {
    let frames = (SEND_FOR.as_millis() / FRAME_INTERVAL.as_millis()) as u32;
    let mut log = ProducerLog::default();
    let mut next_frame = 0u32;
    let mut ws = Some(first);
    for n in 0..MAX_INSTANCES {
        let id = if n == 0 {
            format!("stall-{index}")
        } else {
            format!("stall-{index}-r{n}")
        };
        let socket = match ws.take() {
            Some(s) => s,
            None => {
                let url = format!("ws://{ws_addr}/v1/streams/{id}");
                match tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url)).await {
                    Ok(Ok((s, _))) => s,
                    // Refused (e.g. 503) or slow: try again shortly, within the run.
                    _ => {
                        tokio::time::sleep(FRAME_INTERVAL * 5).await;
                        if Instant::now() >= start + SEND_FOR {
                            break;
                        }
                        continue;
                    }
                }
            }
        };
        let (instance, sent_until) = run_instance(socket, id, start, next_frame, frames).await;
        next_frame = sent_until;
        let ended_early = instance.close_code.is_some() && next_frame < frames;
        log.instances.push(instance);
        if !ended_early || Instant::now() >= start + SEND_FOR {
            break;
        }
    }
    log
}

/// One stream instance: sends frames `from..frames` at their cadence slots until the
/// ingress closes the socket; returns its log and the next frame index.
async fn run_instance(
    ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>,
    id: String,
    start: Instant,
    from: u32,
    frames: u32,
) -> (InstanceLog, u32) {
    let (mut tx, mut rx) = ws.split();
    let read_until = start + SEND_FOR + DRAIN;
    let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let closed_r = Arc::clone(&closed);
    let reader = tokio::spawn(async move {
        let mut events = Vec::new();
        let mut close_code = None;
        while let Ok(Some(msg)) = tokio::time::timeout_at(read_until, rx.next()).await {
            match msg {
                Ok(Message::Text(t)) => events.push(
                    serde_json::from_str::<Value>(t.as_str())
                        .unwrap_or_else(|_| Value::String(t.to_string())),
                ),
                Ok(Message::Close(frame)) => {
                    close_code = frame.map(|f| u16::from(f.code));
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        closed_r.store(true, std::sync::atomic::Ordering::Release);
        (events, close_code)
    });
    let mut log = InstanceLog {
        id,
        ..InstanceLog::default()
    };
    let mut k = from;
    while k < frames {
        tokio::time::sleep_until(start + FRAME_INTERVAL * k).await;
        if closed.load(std::sync::atomic::Ordering::Acquire) {
            break;
        }
        match tokio::time::timeout(SEND_TIMEOUT, tx.send(Message::Binary(frame_now()))).await {
            Ok(Ok(())) => log.frames_sent += 1,
            Ok(Err(e)) => {
                log.send_stopped = Some(format!("send failed: {e}"));
                break;
            }
            Err(_) => {
                log.send_stopped = Some("send blocked".to_owned());
                break;
            }
        }
        k += 1;
    }
    if log.send_stopped.is_none() && !closed.load(std::sync::atomic::Ordering::Acquire) {
        let end = tx.send(Message::Text(r#"{"type":"end"}"#.into()));
        if !matches!(tokio::time::timeout(SEND_TIMEOUT, end).await, Ok(Ok(()))) {
            log.send_stopped = Some("end not sent".to_owned());
        }
    }
    // Bounded by `read_until`; a panic in the reader only loses its events.
    if let Ok((events, close_code)) = reader.await {
        log.events = events;
        log.close_code = close_code;
    }
    // Answer the close (best effort, bounded).
    let _ = tokio::time::timeout(Duration::from_millis(500), tx.close()).await;
    (log, k)
}

/// The whole scenario at `streams` streams; asserts the acceptance criteria.
async fn stall_bound(streams: usize) {
    let server = NatsServer::start().expect("nats-server");
    let (observed, subscriber) = start_subscriber(server.url()).await;
    let mut ingress = Binary::start_ready(server.url(), &[]).await;

    // Every producer is connected before the clock starts.
    let mut sockets = Vec::with_capacity(streams);
    for i in 0..streams {
        let url = format!("ws://{}/v1/streams/stall-{i}", ingress.ws);
        let (ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
            .await
            .expect("upgrade in time")
            .expect("upgrade");
        sockets.push(ws);
    }
    let start = Instant::now() + Duration::from_millis(100);
    let ws_addr = ingress.ws;
    let producers: Vec<_> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, ws)| tokio::spawn(run_producer(ws_addr, i, ws, start)))
        .collect();

    tokio::time::sleep_until(start + PAUSE_AT).await;
    server.pause().expect("pause");
    tokio::time::sleep(PAUSE).await;
    server.resume().expect("resume");

    let mut logs = Vec::with_capacity(streams);
    for p in producers {
        // Each producer is bounded by SEND_FOR + DRAIN (+ the close answer).
        let log = tokio::time::timeout(SEND_FOR + DRAIN + STEP, p)
            .await
            .expect("producer finished in time")
            .expect("producer task");
        logs.push(log);
    }
    // The subscriber: until every stream's end arrived, or the drain bound.
    let deadline = Instant::now() + DRAIN;
    loop {
        let instances: usize = logs.iter().map(|l: &ProducerLog| l.instances.len()).sum();
        let ends = observed
            .lock()
            .map(|o| o.streams.values().filter(|s| s.end).count())
            .unwrap_or(0);
        if ends >= instances || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A last moment for packets in flight right behind the ends.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, stats) = http_get(ingress.admin, "/v1/stats").await;
    let stats: Value = serde_json::from_str(&stats).unwrap_or(Value::Null);
    subscriber.abort();
    let _ = ingress.child.start_kill();
    let _ = tokio::time::timeout(STEP, ingress.child.wait()).await;

    let observed = observed.lock().map(|mut o| std::mem::take(&mut *o));
    let observed = observed.expect("observer lock");
    let mut stale_total = 0;
    let mut stale_max = 0;
    let mut frames_received = 0;
    let mut delay_max_us = 0;
    let mut violations = Vec::new();
    for (i, log) in logs.iter().enumerate() {
        // Stale frames of one producer, summed over its stream instances.
        let mut producer_stale = 0;
        for inst in &log.instances {
            let seen = observed.streams.get(&inst.id).cloned().unwrap_or_default();
            frames_received += seen.frames;
            stale_total += seen.stale;
            producer_stale += seen.stale;
            delay_max_us = delay_max_us.max(seen.max_delay_us);
            if seen.stale > 0 && !inst.signalled() {
                violations.push(format!(
                    "{}: {} stale frames, max delay {:.2} s, and NO overload/gap event; \
                     events {:?}, close {:?}, sending stopped: {:?}",
                    inst.id,
                    seen.stale,
                    seen.max_delay_us as f64 / 1e6,
                    inst.event_types(),
                    inst.close_code,
                    inst.send_stopped
                ));
            }
        }
        stale_max = stale_max.max(producer_stale);
        if producer_stale > MAX_STALE_PER_STREAM {
            violations.push(format!(
                "producer {i}: {producer_stale} stale frames over {} stream instance(s) \
                 (limit {MAX_STALE_PER_STREAM})",
                log.instances.len()
            ));
        }
    }
    let frames_sent: u64 = logs.iter().map(ProducerLog::frames_sent).sum();
    let instances: Vec<&InstanceLog> = logs.iter().flat_map(|l| &l.instances).collect();
    let with_events = instances.iter().filter(|l| l.signalled()).count();
    let mut close_codes: BTreeMap<String, usize> = BTreeMap::new();
    for l in &instances {
        let code = l.close_code.map_or("none".to_owned(), |c| c.to_string());
        *close_codes.entry(code).or_default() += 1;
    }
    let ends = observed.streams.values().filter(|s| s.end).count();
    let gap_packets: u64 = observed.streams.values().map(|s| s.gap_packets).sum();
    let f = &stats["frames"];
    println!(
        "stall_bound streams={streams} frames_sent={frames_sent} frames_received={frames_received} \
         stale_max_per_producer={stale_max} stale_total={stale_total} delay_max_s={:.2} \
         stream_instances={} instances_with_overload_or_gap={with_events} ends_received={ends} gap_packets={gap_packets} \
         close_codes={close_codes:?} observer_disconnects={} ingress: offered={} published={} \
         dropped={} overloads={} gaps={}",
        delay_max_us as f64 / 1e6,
        instances.len(),
        observed.disconnects,
        f["offered"],
        f["published"],
        f["dropped"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum::<u64>()),
        stats["overloads"],
        stats["gaps"],
    );
    assert!(
        violations.is_empty(),
        "{} violation(s) at {streams} streams (stale = delivered > {:?} after send):\n{}",
        violations.len(),
        STALE_AFTER,
        violations.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_bound_1_stream() {
    stall_bound(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_bound_10_streams() {
    stall_bound(10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_bound_50_streams() {
    stall_bound(50).await;
}
