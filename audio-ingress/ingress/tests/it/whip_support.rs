//! An in-process Rust WHIP publisher for the WHIP tests — the library's
//! `whip::client` (a str0m `Rtc`, the offering side, on its own loopback UDP socket:
//! one send-only Opus track and the `weir` data channel) sending 20 ms Opus packets
//! made by opus-pure at the real cadence. Plus a bounded plain-HTTP client for the WHIP
//! requests, a recorder of the weir packets on NATS, and the similarity measure.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_audio_ingress::whip::client;
use weir_protocol::audio::{DecodeOptions, PacketBody, decode};

/// An HTTP answer: status, headers (lower-case names), body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status code (0: no answer within 5 s).
    pub status: u16,
    /// Headers, names in lower case.
    pub headers: BTreeMap<String, String>,
    /// Body.
    pub body: String,
}

impl Answer {
    /// The JSON error code of a refusal.
    pub fn code(&self) -> String {
        serde_json::from_str::<Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// One HTTP/1.1 request with `Connection: close`, bounded by 5 s.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).to_string();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let mut lines = head.lines();
        let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Some(Answer {
            status,
            headers,
            body: body.to_owned(),
        })
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(Answer {
            status: 0,
            headers: BTreeMap::new(),
            body: String::new(),
        })
}

/// `POST /v1/whip/{id}` with `sdp` as the offer.
pub async fn post_offer(addr: SocketAddr, id: &str, sdp: &str, extra: &[(&str, &str)]) -> Answer {
    let mut headers = vec![("Content-Type", "application/sdp")];
    headers.extend_from_slice(extra);
    request(addr, "POST", &format!("/v1/whip/{id}"), &headers, sdp).await
}

/// 20 ms Opus packets of 16 kHz mono PCM (the library's encoder helper).
pub fn opus_packets(pcm16k: &[i16]) -> Vec<Vec<u8>> {
    client::opus_packets(pcm16k).expect("opus encoder")
}

/// A 440 Hz tone at 16 kHz, `seconds` long.
pub fn tone(seconds: f64) -> Vec<i16> {
    let n = (seconds * 16_000.0) as usize;
    (0..n)
        .map(|i| {
            (8_000.0 * (2.0 * std::f64::consts::PI * 440.0 * i as f64 / 16_000.0).sin()) as i16
        })
        .collect()
}

/// The offering side before the answer.
pub struct Offer {
    inner: client::Offer,
    /// The offer's SDP text.
    pub sdp: String,
}

/// A fresh publisher's offer on a loopback socket (audio send-only + `weir` channel).
pub async fn offer() -> Offer {
    let inner = client::Offer::new(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("offer");
    Offer {
        sdp: inner.sdp.clone(),
        inner,
    }
}

/// What a publisher saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// ICE + DTLS connected.
    pub connected: Option<Instant>,
    /// The `weir` channel opened.
    pub channel_open: bool,
    /// Events received on it, with their arrival time.
    pub events: Vec<(Instant, Value)>,
    /// Packets written.
    pub packets_sent: usize,
    /// The server closed the session (DTLS close / ICE gone) or str0m gave up.
    pub closed: Option<Instant>,
}

impl Seen {
    /// The event types in order.
    pub fn types(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|(_, e)| e["type"].as_str().unwrap_or("?").to_owned())
            .collect()
    }
}

/// A publisher after the answer: drive it with [`Publisher::run`].
pub struct Publisher {
    client: client::Client,
    /// The resource URL (`Location`).
    pub location: String,
    /// What it saw so far.
    pub seen: Arc<Mutex<Seen>>,
}

impl Offer {
    /// Applies the WHIP answer.
    pub fn answered(self, answer: &Answer) -> Publisher {
        assert_eq!(answer.status, 201, "offer refused: {answer:?}");
        Publisher {
            client: self.inner.answered(&answer.body).expect("answer accepted"),
            location: answer.headers.get("location").cloned().expect("Location"),
            seen: Arc::new(Mutex::new(Seen::default())),
        }
    }
}

impl Publisher {
    /// Runs the session: sends the first `send` of `packets` at 20 ms once connected;
    /// then it goes on answering ICE without media or, if `vanish`, goes silent entirely
    /// (300 ms after the last packet, for the paced ones to leave). Returns after
    /// `run_for` or when the server closed the session.
    pub async fn run(
        mut self,
        packets: Vec<Vec<u8>>,
        send: usize,
        vanish: bool,
        run_for: Duration,
    ) -> Seen {
        let end = tokio::time::Instant::now() + run_for;
        let limit = send.min(packets.len());
        let mut next_packet: Option<tokio::time::Instant> = None;
        let mut vanish_at: Option<tokio::time::Instant> = None;
        let mut sent = 0usize;
        loop {
            let now = tokio::time::Instant::now();
            if now >= end {
                break;
            }
            if vanish && sent >= limit {
                // Gone without a word: no DELETE, no DTLS close, no more datagrams.
                let at = *vanish_at.get_or_insert(now + Duration::from_millis(300));
                if now >= at {
                    tokio::time::sleep_until(end).await;
                    break;
                }
            }
            let mut until = end;
            if let Some(t) = next_packet.filter(|_| sent < limit) {
                until = until.min(t);
            }
            if let Some(t) = vanish_at {
                until = until.min(t);
            }
            if let Some(ev) = self.client.next_event(until).await {
                let mut seen = self.seen.lock().expect("seen");
                match ev {
                    client::ClientEvent::Connected => {
                        seen.connected.get_or_insert_with(Instant::now);
                        next_packet.get_or_insert(tokio::time::Instant::now());
                    }
                    client::ClientEvent::ChannelOpen => seen.channel_open = true,
                    client::ClientEvent::Message(v) => seen.events.push((Instant::now(), v)),
                    client::ClientEvent::Closed => {
                        seen.closed.get_or_insert_with(Instant::now);
                        break;
                    }
                }
                continue;
            }
            if let Some(t) = next_packet
                && tokio::time::Instant::now() >= t
                && sent < limit
            {
                if self.client.send_opus(&packets[sent]) {
                    sent += 1;
                    self.seen.lock().expect("seen").packets_sent = sent;
                }
                next_packet = Some(t + Duration::from_millis(20));
            }
        }
        self.seen.lock().expect("seen").clone()
    }
}

/// What a plain NATS subscriber got for one stream.
#[derive(Debug, Default, Clone)]
pub struct NatsLog {
    /// PCM of every frame, in order of arrival, with the frame's seq.
    pub frames: Vec<(u64, Vec<i16>)>,
    /// Per frame: arrival (ms since the Unix epoch) minus its capture time in the meta.
    pub ages_ms: Vec<i64>,
    /// `Weir-End-Reason` of the `end`, once it arrived.
    pub end: Option<String>,
    /// Gap packets.
    pub gaps: u64,
}

/// Subscribes to every stream subject and records packets per stream id.
pub async fn record(url: &str) -> Arc<Mutex<BTreeMap<String, NatsLog>>> {
    let client = async_nats::ConnectOptions::new()
        .subscription_capacity(1 << 16)
        .connect(url)
        .await
        .expect("subscriber connects");
    let mut sub = client
        .subscribe("inference.whisper.stream.>")
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let logs: Arc<Mutex<BTreeMap<String, NatsLog>>> = Arc::default();
    let out = Arc::clone(&logs);
    tokio::spawn(async move {
        let _client = client;
        while let Some(msg) = sub.next().await {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let id = msg
                .subject
                .as_str()
                .rsplit('.')
                .next()
                .unwrap_or("")
                .to_owned();
            let Ok(p) = decode(&msg.payload, &DecodeOptions::default()) else {
                continue;
            };
            let mut logs = out.lock().expect("logs");
            let log = logs.entry(id).or_default();
            match &p.body {
                PacketBody::Frame { pcm } => {
                    let samples = pcm
                        .chunks_exact(2)
                        .map(|b| i16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    log.frames.push((p.seq, samples));
                    if let Some(at) = p.captured_at_ms {
                        log.ages_ms.push(now_ms - at as i64);
                    }
                }
                PacketBody::End => {
                    log.end = Some(
                        msg.headers
                            .as_ref()
                            .and_then(|h| h.get("Weir-End-Reason"))
                            .map(|v| v.as_str().to_owned())
                            .unwrap_or_default(),
                    );
                }
                _ => log.gaps += 1,
            }
        }
    });
    logs
}

/// Waits (at most `bound`) until `f` holds for the recorded logs.
pub async fn wait_for(
    logs: &Arc<Mutex<BTreeMap<String, NatsLog>>>,
    bound: Duration,
    f: impl Fn(&BTreeMap<String, NatsLog>) -> bool,
) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if f(&logs.lock().expect("logs")) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f(&logs.lock().expect("logs"))
}

/// Normalized cross-correlation of `got` against `want` at `lag` (positive: `got` is
/// late), over the overlap; `None` when the overlap is under half of `want`.
fn ncc_at(want: &[f64], got: &[f64], lag: i64) -> Option<f64> {
    let (mut xy, mut xx, mut yy, mut n) = (0.0, 0.0, 0.0, 0usize);
    for (i, &x) in want.iter().enumerate() {
        let j = i as i64 + lag;
        if j < 0 || j as usize >= got.len() {
            continue;
        }
        let y = got[j as usize];
        xy += x * y;
        xx += x * x;
        yy += y * y;
        n += 1;
    }
    (n * 2 >= want.len() && xx > 0.0 && yy > 0.0).then(|| xy / (xx * yy).sqrt())
}

/// The best [`ncc_at`] of `lags`: (ncc, lag).
fn best_of(want: &[f64], got: &[f64], lags: impl Iterator<Item = i64>) -> (f64, i64) {
    lags.filter_map(|lag| ncc_at(want, got, lag).map(|c| (c, lag)))
        .fold((f64::MIN, 0), |b, c| if c.0 > b.0 { c } else { b })
}

/// Normalized cross-correlation of `got` against `want` at the best lag in
/// `-max_lag..=max_lag` samples (positive: `got` is late): (ncc, lag). The lag is found
/// on both signals averaged over 4 samples, then refined ±8 samples at full rate (an
/// exhaustive search is too slow in a debug build).
pub fn best_ncc(want: &[i16], got: &[i16], max_lag: i64) -> (f64, i64) {
    let full = |s: &[i16]| s.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let coarse = |s: &[i16]| {
        s.chunks_exact(4)
            .map(|c| c.iter().map(|&x| f64::from(x)).sum::<f64>() / 4.0)
            .collect::<Vec<_>>()
    };
    let (_, l) = best_of(&coarse(want), &coarse(got), -max_lag / 4..=max_lag / 4);
    best_of(&full(want), &full(got), (4 * l - 8)..=(4 * l + 8))
}
