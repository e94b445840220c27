//! Test support (feature `testing`, never in a production build), shared by the
//! integration tests of `weir-audio-producer` and `weir-audio-ingress`: NATS clients
//! with short timeouts, and a [`Collector`] that records every packet of a subject
//! pattern, per stream.
//!
//! Every wait here is bounded ([`STEP`], or the bound the caller gives): a helper that
//! cannot finish in time panics with what it was waiting for, so a broken test fails
//! instead of hanging.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use weir_protocol::audio::extension::{Extensions, PossibleLoss};
use weir_protocol::audio::{DecodeOptions, Gap, Packet, PacketBody, decode};
use weir_service::nats::NatsConfig;

/// Bound on any single await in these tests.
pub const STEP: Duration = Duration::from_secs(10);

/// Connects the producer client (first connection must succeed): the test client's
/// settings (connect 500 ms, ping 1 s) with a small command channel
/// (`client_capacity`), so a stalled server is felt quickly.
pub async fn producer_client(url: &str, client_capacity: usize) -> async_nats::Client {
    let mut config = NatsConfig::for_url("weir-audio-producer-test", url);
    config.client_capacity = client_capacity;
    tokio::time::timeout(STEP, crate::nats::connect(&config))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// 640 bytes of PCM whose content depends on `seq`.
pub fn pcm(seq: u64) -> Bytes {
    Bytes::from(
        (0..640u64)
            .map(|i| ((seq * 7 + i) % 251) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// One received packet.
#[derive(Debug, Clone)]
pub struct Received {
    /// The decoded packet.
    pub packet: Packet,
    /// Its weir headers.
    pub ext: Extensions,
}

/// What one stream's subscriber saw.
#[derive(Debug, Clone, Default)]
pub struct StreamLog {
    /// Frame sequence numbers, in arrival order.
    pub frames: Vec<u64>,
    /// Gap markers, each once (the ingress publishes a marker again when a reconnect
    /// came before the server confirmed it, and the first copy may have arrived after
    /// all).
    pub gaps: Vec<Gap>,
    /// The end packet, if seen.
    pub end: Option<Received>,
    /// Packets that did not decode.
    pub errors: u64,
    /// Everything, in order (frames without PCM to save memory).
    pub seqs: Vec<u64>,
    /// Every `Weir-Possibly-Lost` declaration seen, with the seq of its carrier.
    pub declarations: Vec<(u64, PossibleLoss)>,
}

impl StreamLog {
    /// Frames covered by gap markers.
    pub fn gap_frames(&self) -> u64 {
        self.gaps.iter().map(Gap::frames).sum()
    }

    /// Sequence numbers below the end's that arrived neither as a frame nor inside a
    /// gap marker: loss in transit, as a consumer detects it.
    pub fn missing(&self) -> Vec<u64> {
        let Some(end) = &self.end else {
            return Vec::new();
        };
        let gaps = self.gaps.iter().flat_map(|g| g.first_seq..=g.last_seq);
        let seen: HashSet<u64> = self.frames.iter().copied().chain(gaps).collect();
        (1..end.packet.seq).filter(|s| !seen.contains(s)).collect()
    }

    /// Whether sequence numbers never went backwards.
    pub fn in_order(&self) -> bool {
        self.seqs.windows(2).all(|w| w[0] < w[1])
    }
}

/// Subscribes to `pattern` on its own connection and records every packet by the
/// subject's last token (the stream id). The subscriber connection uses the default
/// 60 s ping, so a 5 s SIGSTOP does not make it reconnect (its subscription survives).
#[derive(Clone)]
pub struct Collector {
    logs: Arc<Mutex<BTreeMap<String, StreamLog>>>,
    total: Arc<std::sync::atomic::AtomicU64>,
    _client: async_nats::Client,
}

impl Collector {
    /// Starts collecting; returns once the subscription is confirmed by the server.
    pub async fn start(url: &str, pattern: &str) -> Self {
        let client = tokio::time::timeout(
            STEP,
            async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_millis(500))
                .subscription_capacity(400_000)
                .connect(url),
        )
        .await
        .expect("connect in time")
        .expect("connect");
        let mut sub = client
            .subscribe(pattern.to_owned())
            .await
            .expect("subscribe");
        tokio::time::timeout(STEP, client.flush())
            .await
            .expect("flush in time")
            .expect("flush");
        let logs: Arc<Mutex<BTreeMap<String, StreamLog>>> = Arc::default();
        let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (l, t) = (Arc::clone(&logs), Arc::clone(&total));
        tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let stream = msg
                    .subject
                    .as_str()
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let ext = Extensions::read(|k| {
                    msg.headers
                        .as_ref()
                        .and_then(|h| h.get(k))
                        .map(|v| v.as_str())
                });
                let mut logs = l.lock().expect("lock");
                let log = logs.entry(stream).or_default();
                t.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match decode(&msg.payload, &DecodeOptions::default()) {
                    Ok(packet) => {
                        if let PacketBody::Gap(g) = &packet.body
                            && log.gaps.contains(g)
                        {
                            continue;
                        }
                        log.seqs.push(packet.seq);
                        if let Some(d) = &ext.possibly_lost {
                            log.declarations.push((packet.seq, d.clone()));
                        }
                        match &packet.body {
                            PacketBody::Frame { .. } => log.frames.push(packet.seq),
                            PacketBody::Gap(g) => log.gaps.push(*g),
                            PacketBody::End => log.end = Some(Received { packet, ext }),
                        }
                    }
                    Err(_) => log.errors += 1,
                }
            }
        });
        Self {
            logs,
            total,
            _client: client,
        }
    }

    /// A copy of what was seen.
    pub fn logs(&self) -> BTreeMap<String, StreamLog> {
        self.logs.lock().expect("lock").clone()
    }

    /// One stream's log.
    pub fn log(&self, stream: &str) -> StreamLog {
        self.logs
            .lock()
            .expect("lock")
            .get(stream)
            .cloned()
            .unwrap_or_default()
    }

    /// Messages received so far.
    pub fn total(&self) -> u64 {
        self.total.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits (at most `bound`) until `n` streams have their `end`.
    pub async fn wait_ends(&self, n: usize, bound: Duration) -> bool {
        wait_until(bound, || {
            self.logs
                .lock()
                .expect("lock")
                .values()
                .filter(|l| l.end.is_some())
                .count()
                >= n
        })
        .await
    }
}

/// Polls `cond` every 20 ms for at most `bound`.
pub async fn wait_until(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sum of a `dropped` map.
pub fn sum(map: &BTreeMap<String, u64>) -> u64 {
    map.values().sum()
}

/// Counts by key.
pub fn counts<K: std::hash::Hash + Eq>(items: impl IntoIterator<Item = K>) -> HashMap<K, u64> {
    let mut m = HashMap::new();
    for k in items {
        *m.entry(k).or_default() += 1;
    }
    m
}
