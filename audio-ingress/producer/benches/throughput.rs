//! Ingress throughput vs plain async-nats publish of the same 640-byte frames to the same
//! nats-server, in the same run.
//!
//! `cargo bench -p weir-audio-producer --bench throughput`
//!
//! A fresh nats-server (weir-testkit, loopback) and one client per variant. Each round
//! sends 1,000 streams × 200 frames (200,000 packets) three ways, in rotating order:
//!
//! - `plain`: 10 tasks, each encodes its stream's packets (deployed layout, as the
//!   Python producer does) and calls `client.publish` — the naive producer;
//! - `ingress`: 10 streams of the producer core with the **default** configuration
//!   (`push`, which waits for room in the 16,000-byte budget; a publisher task per
//!   stream: encode with the capture time in the meta, publish under the timeout, the
//!   server-confirmed window, accounting). A frame counts only once the server
//!   confirmed it, and `finish` waits for that;
//! - `ingress/unconfirmed`: the same with `delivery = "unconfirmed"` (the window off: a
//!   frame counts once handed to the client) — isolates the cost of the window;
//! - `ingress/jetstream`: the same with `delivery = "jetstream"` (lossless mode): every
//!   frame is stored in a file-backed JetStream stream and counts once the server acked
//!   it, one ack in flight per stream. It runs against a **second** nats-server with
//!   JetStream enabled (same binary, same machine), so that JetStream cannot change the
//!   other variants' numbers; the stream is purged between rounds (outside the timing).
//!   Its age bound is 5 s instead of 500 ms (see `config`): a bulk push keeps every
//!   stream's 25 frames queued, and 1,000 streams × 25 frames at the JetStream rate
//!   wait longer than 500 ms. In real time the question is the other way round: how
//!   many 50-frame/s streams the measured rate sustains.
//!
//! The cost of lossless mode is the `ingress/jetstream` ÷ `ingress` ratio in the summary.
//! Every variant ends with `client.flush()`; the time is from the first publish to the
//! end of the flush. 7 rounds; medians of frames/s and of the per-round ratios.
//! `THROUGHPUT_ONLY=plain|ingress|ingress-unconfirmed|jetstream|null` runs one variant
//! (profiling); `null` is the ingress (unconfirmed) into a sink that takes every message
//! at once — the producer core alone, without a NATS client. `THROUGHPUT_MAX_BYTES`
//! overrides the per-stream budget (default 16,000), to show how far the budget itself
//! bounds a bulk push (below).
//!
//! Why 1,000 streams and not a few: the budget now holds up to the server, so one
//! stream can never have more than its budget (25 frames) between the producer and the
//! server's confirmation — by Little's law a *single* stream's bulk rate is at most
//! 25 frames per confirmation round (~5 ms): ~5,000 frames/s, 100× real time. That is
//! the bound doing its job, not a cost per frame. What the ingress must sustain is many
//! real-time streams, i.e. aggregate throughput over many streams, which this measures.
//! `THROUGHPUT_STREAMS=10 THROUGHPUT_FRAMES=20000` reproduces the old bulk shape.

use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_audio_producer::jetstream::JetStreamSink;
use weir_audio_producer::publisher::Sink;
use weir_audio_producer::{Delivery, Ingress, StreamConfig};
use weir_protocol::WireName;
use weir_protocol::audio::Packet;
use weir_testkit::{NatsServer, NatsServerOptions};

/// Rounds of the core variants (`THROUGHPUT_ROUNDS` overrides); medians over them.
const ROUNDS: usize = 15;
/// Warm-up rounds of each core variant, not counted.
const WARMUP_ROUNDS: usize = 2;
/// Rounds of lossless mode (each ~3 s).
const JETSTREAM_ROUNDS: usize = 5;

fn rounds() -> usize {
    env_or("THROUGHPUT_ROUNDS", ROUNDS as u64) as usize
}

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn streams() -> usize {
    env_or("THROUGHPUT_STREAMS", 1_000) as usize
}

fn frames() -> u64 {
    env_or("THROUGHPUT_FRAMES", 200)
}

async fn client(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect")
}

fn pcm() -> Bytes {
    Bytes::from((0..640u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
}

async fn plain(client: &async_nats::Client, round: usize) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..streams())
        .map(|s| {
            let client = client.clone();
            let subject = format!("inference.whisper.stream.plain-{round}-{s}");
            tokio::spawn(async move {
                let pcm = pcm();
                for seq in 1..=frames() {
                    let payload = Packet::frame(seq, pcm.clone()).encode().expect("encode");
                    client
                        .publish(subject.clone(), payload)
                        .await
                        .expect("publish");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    client.flush().await.expect("flush");
    start.elapsed()
}

async fn ingress(client: &async_nats::Client, round: usize, delivery: Delivery) -> Duration {
    ingress_with(client.clone(), client, round, delivery).await
}

/// A sink that takes every message at once and drops it: the ingress alone.
#[derive(Clone)]
struct NullSink;

impl Sink for NullSink {
    async fn publish(
        &self,
        _subject: async_nats::Subject,
        _headers: async_nats::HeaderMap,
        payload: Bytes,
    ) -> Result<(), weir_audio_producer::publisher::SinkError> {
        drop(payload);
        Ok(())
    }
}

/// The JetStream stream of the `ingress/jetstream` variant.
const JS_STREAM: &str = "WEIR_AUDIO_BENCH";

fn config(delivery: Delivery) -> StreamConfig {
    // Default budget; max_wait and the publish timeout at the age bound (500 ms) so a
    // scheduling hiccup on a shared machine does not end a stream mid-measurement.
    let b = StreamConfig::builder()
        .delivery(delivery)
        .jetstream_stream(JS_STREAM)
        .max_bytes(env_or("THROUGHPUT_MAX_BYTES", 16_000) as usize)
        .max_wait(Duration::from_millis(500))
        .publish_timeout(Duration::from_millis(500))
        // Throughput pushes as fast as possible: no rate bound (max_rate).
        .max_rate_permille(0);
    let b = match std::env::var("THROUGHPUT_CONFIRM_INTERVAL_MS") {
        Ok(ms) => b.confirm_interval(Duration::from_millis(ms.parse().expect("ms"))),
        Err(_) => b,
    };
    // Lossless mode: the same byte budget (25 frames), but an age bound of 5 s. In
    // this bulk test every stream keeps its 25 frames queued, so a frame waits
    // streams × 25 / rate: at 1,000 streams and ~35,000 stored frames/s that is ~0.7 s,
    // over the default 500 ms — the age bound would (rightly) overload streams that
    // are pushed far faster than real time. The rate, not the latency, is measured here.
    // `max_wait` likewise: a producer waits for its stream's room for one ack round of
    // every stream, ~0.5 s at 1,000 streams on a busy machine.
    let b = if delivery == Delivery::JetStream {
        b.max_age(Duration::from_secs(5))
            .max_wait(Duration::from_secs(5))
            .publish_timeout(Duration::from_secs(2))
    } else {
        b
    };
    b.build().expect("cfg")
}

async fn jetstream_sink(client: &async_nats::Client) -> JetStreamSink {
    JetStreamSink::new(
        client.clone(),
        &config(Delivery::JetStream).jetstream(),
        Duration::from_secs(5),
    )
    .await
    .expect("JetStream stream")
}

async fn lossless(sink: &JetStreamSink, client: &async_nats::Client, round: usize) -> Duration {
    let d = ingress_with(sink.clone(), client, round, Delivery::JetStream).await;
    let js = async_nats::jetstream::new(client.clone());
    js.get_stream(JS_STREAM)
        .await
        .expect("stream")
        .purge()
        .await
        .expect("purge");
    d
}

async fn ingress_with<S: Sink>(
    sink: S,
    client: &async_nats::Client,
    round: usize,
    delivery: Delivery,
) -> Duration {
    let ingress = Ingress::new(sink, config(delivery));
    let start = Instant::now();
    let tasks: Vec<_> = (0..streams())
        .map(|s| {
            let stream = ingress
                .open(&format!("ingress-{round}-{}-{s}", delivery.as_str()), None)
                .expect("open");
            tokio::spawn(async move {
                let pcm = pcm();
                for _ in 1..=frames() {
                    stream.push(pcm.clone()).await.expect("admitted");
                }
                stream.finish().await
            })
        })
        .collect();
    for t in tasks {
        let summary = t.await.expect("task");
        assert_eq!(
            summary.snapshot.frames.published,
            frames(),
            "no frame may be dropped"
        );
    }
    client.flush().await.expect("flush");
    let took = start.elapsed();
    if std::env::var_os("THROUGHPUT_DEBUG").is_some() {
        let w = ingress.stats().window.unwrap_or_default();
        eprintln!(
            "  {}: window rounds {}, round p50 {:.1} ms p99 {:.1} ms, limit {} B",
            delivery.as_str(),
            w.rounds,
            w.round_ms.p50,
            w.round_ms.p99,
            w.limit_bytes
        );
    }
    took
}

/// CPU time (user + system) of this process so far: the producers, the ingress and
/// the NATS client, not the server.
fn cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let tv =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1_000);
    tv(u.user_time()) + tv(u.system_time())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let server = NatsServer::start().expect("nats-server (scripts/ensure-nats-server)");
    let js_server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("nats-server with JetStream");
    println!(
        "nats-server {} (core variants and, separately, JetStream with a file store)",
        weir_testkit::binary::version_of(server.binary()).expect("version")
    );
    rt.block_on(async {
        let js_client = client(js_server.url()).await;
        let client = client(server.url()).await;
        let sink = jetstream_sink(&js_client).await;
        let total = (streams() as u64 * frames()) as f64;
        if let Ok(only) = std::env::var("THROUGHPUT_ONLY") {
            for round in 0..rounds() {
                let c0 = cpu();
                let d = match only.as_str() {
                    "plain" => plain(&client, round).await,
                    "ingress" => ingress(&client, round, Delivery::Confirmed).await,
                    "jetstream" => lossless(&sink, &js_client, round).await,
                    "null" => ingress_with(NullSink, &client, round, Delivery::Unconfirmed).await,
                    _ => ingress(&client, round, Delivery::Unconfirmed).await,
                };
                println!(
                    "{only}: {:.0} frames/s, {:.2} us CPU/frame",
                    total / d.as_secs_f64(),
                    (cpu() - c0).as_secs_f64() * 1e6 / total
                );
            }
            return;
        }
        // The core variants first, rotated, then lossless mode on its own: its file
        // store's writeback would otherwise run (kernel threads, on the same 2 cores)
        // during whichever core variant follows it.
        // [plain, ingress (default), ingress/unconfirmed]
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut cpus: [Vec<f64>; 3] = Default::default();
        let (mut ratio, mut ratio_off, mut window_cost) = (vec![], vec![], vec![]);
        // Warm-up: the first rounds of a fresh process and server run slower (allocator
        // and socket buffers growing), by up to 2x.
        for w in 0..WARMUP_ROUNDS {
            plain(&client, 1000 + w).await;
            ingress(&client, 1000 + w, Delivery::Confirmed).await;
            ingress(&client, 2000 + w, Delivery::Unconfirmed).await;
        }
        let rounds = rounds();
        for round in 0..rounds {
            let mut d = [Duration::ZERO; 3];
            let mut c = [0f64; 3];
            // Rotate the order so no variant always runs first or last.
            for k in 0..3 {
                let v = (k + round) % 3;
                let c0 = cpu();
                d[v] = match v {
                    0 => plain(&client, round).await,
                    1 => ingress(&client, round, Delivery::Confirmed).await,
                    _ => ingress(&client, round, Delivery::Unconfirmed).await,
                };
                c[v] = (cpu() - c0).as_secs_f64() * 1e6 / total;
            }
            let f: Vec<f64> = d.iter().map(|x| total / x.as_secs_f64()).collect();
            println!(
                "round {round}: plain {:.0} frames/s, ingress {:.0}, ingress/unconfirmed {:.0}  (ingress/plain {:.2}, unconfirmed/plain {:.2}, ingress/unconfirmed {:.3}); us CPU/frame {:.2}, {:.2}, {:.2}",
                f[0], f[1], f[2], f[1] / f[0], f[2] / f[0], f[1] / f[2], c[0], c[1], c[2]
            );
            for (r, x) in rates.iter_mut().zip(&f) {
                r.push(*x);
            }
            for (r, x) in cpus.iter_mut().zip(&c) {
                r.push(*x);
            }
            ratio.push(f[1] / f[0]);
            ratio_off.push(f[2] / f[0]);
            window_cost.push(f[1] / f[2]);
        }
        let mut js = vec![];
        let mut cjs = vec![];
        lossless(&sink, &js_client, 99).await;
        for round in 0..JETSTREAM_ROUNDS {
            let c0 = cpu();
            let d = lossless(&sink, &js_client, round).await;
            cjs.push((cpu() - c0).as_secs_f64() * 1e6 / total);
            js.push(total / d.as_secs_f64());
            println!("jetstream round {round}: {:.0} frames/s", js[round]);
        }
        let [p, ing, off] = &mut rates;
        let (p, ing, off, js) = (median(p), median(ing), median(off), median(&mut js));
        println!(
            "median over {rounds} rounds of {} streams x {} frames: plain {p:.0} frames/s, ingress {ing:.0}, ingress/unconfirmed {off:.0}; ingress/jetstream {js:.0} ({JETSTREAM_ROUNDS} rounds)",
            streams(),
            frames(),
        );
        let [cp, cing, coff] = &mut cpus;
        println!(
            "median us CPU/frame of this process (producers, ingress, NATS client; not the server): plain {:.2}, ingress {:.2}, ingress/unconfirmed {:.2}, ingress/jetstream {:.2}",
            median(cp),
            median(cing),
            median(coff),
            median(&mut cjs)
        );
        println!(
            "median ratios: ingress/plain {:.2} (target >= 0.9), ingress(unconfirmed)/plain {:.2}, ingress/ingress(unconfirmed) {:.3} (window cost, target >= 0.95)",
            median(&mut ratio),
            median(&mut ratio_off),
            median(&mut window_cost)
        );
        println!(
            "ratio of medians: ingress/jetstream / ingress {:.3} (the cost of lossless mode; JetStream on a second server, file store)",
            js / ing
        );
    });
}
