//! Ingress throughput vs plain async-nats publish of the same 640-byte frames to the same
//! nats-server, in the same run.
//!
//! `cargo bench -p weir-audio-ingress --bench throughput`
//!
//! A fresh nats-server (weir-testkit, loopback) and one client per variant. Each round
//! sends 10 streams × 20,000 frames (200,000 packets) three ways, in rotating order:
//!
//! - `plain`: 10 tasks, each encodes its stream's packets (deployed layout, as the
//!   Python producer does) and calls `client.publish` — the naive producer;
//! - `plain+headers`: the same with the two headers weir adds to every frame
//!   (`Weir-Audio-Version`, `Weir-Captured-At-Ms`) — isolates the cost of the headers;
//! - `ingress`: 10 streams of the producer core with the default configuration (`push`,
//!   which waits for room in the 16,000-byte budget; a publisher task per stream:
//!   encode + headers + publish under the timeout + accounting);
//! - `ingress/no-frame-headers`: the same with `frame_headers = false` (frames go out as
//!   plain `PUB`, like `plain`; `end` keeps its headers).
//!
//! Every variant ends with `client.flush()`; the time is from the first publish to the
//! end of the flush. 7 rounds; medians of frames/s and of the per-round ratios.
//! `THROUGHPUT_ONLY=plain|ingress|ingress-nh` runs one variant (for profiling).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::{HeaderMap, HeaderValue};
use bytes::Bytes;
use weir_audio_ingress::{Ingress, StreamConfig};
use weir_protocol::audio::Packet;
use weir_protocol::audio::extension::headers;
use weir_testkit::NatsServer;

const STREAMS: usize = 10;
const FRAMES: u64 = 20_000;
const ROUNDS: usize = 7;

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

async fn plain(client: &async_nats::Client, round: usize, with_headers: bool) -> Duration {
    let start = Instant::now();
    let tasks: Vec<_> = (0..STREAMS)
        .map(|s| {
            let client = client.clone();
            let subject = format!("inference.whisper.stream.plain-{round}-{s}");
            tokio::spawn(async move {
                let pcm = pcm();
                for seq in 1..=FRAMES {
                    let payload = Packet::frame(seq, pcm.clone()).encode().expect("encode");
                    if with_headers {
                        let mut h = HeaderMap::new();
                        h.insert(headers::VERSION, HeaderValue::from("1"));
                        let ms = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_millis() as u64);
                        h.insert(
                            headers::CAPTURED_AT_MS,
                            HeaderValue::from(ms.to_string().as_str()),
                        );
                        client
                            .publish_with_headers(subject.clone(), h, payload)
                            .await
                            .expect("publish");
                    } else {
                        client
                            .publish(subject.clone(), payload)
                            .await
                            .expect("publish");
                    }
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

async fn ingress(client: &async_nats::Client, round: usize, frame_headers: bool) -> Duration {
    // Default budget; max_wait and the publish timeout at the age bound (500 ms) so a
    // scheduling hiccup on a shared machine does not end a stream mid-measurement.
    let cfg = StreamConfig::builder()
        .frame_headers(frame_headers)
        .max_wait(Duration::from_millis(500))
        .publish_timeout(Duration::from_millis(500))
        .build()
        .expect("cfg");
    let ingress = Ingress::new(client.clone(), cfg);
    let start = Instant::now();
    let tasks: Vec<_> = (0..STREAMS)
        .map(|s| {
            let stream = ingress
                .open(&format!("ingress-{round}-{frame_headers}-{s}"), None)
                .expect("open");
            tokio::spawn(async move {
                let pcm = pcm();
                for _ in 1..=FRAMES {
                    stream.push(pcm.clone()).await.expect("admitted");
                }
                stream.finish().await
            })
        })
        .collect();
    for t in tasks {
        let summary = t.await.expect("task");
        assert_eq!(
            summary.snapshot.frames.published, FRAMES,
            "no frame may be dropped"
        );
    }
    client.flush().await.expect("flush");
    start.elapsed()
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
    rt.block_on(async {
        let client = client(server.url()).await;
        let total = (STREAMS as u64 * FRAMES) as f64;
        if let Ok(only) = std::env::var("THROUGHPUT_ONLY") {
            // For profiling one variant: THROUGHPUT_ONLY=plain|ingress|ingress-nh
            for round in 0..ROUNDS {
                let d = match only.as_str() {
                    "plain" => plain(&client, round, false).await,
                    "ingress" => ingress(&client, round, true).await,
                    _ => ingress(&client, round, false).await,
                };
                println!("{only}: {:.0} frames/s", total / d.as_secs_f64());
            }
            return;
        }
        // [plain, plain+headers, ingress, ingress/no-frame-headers]
        let mut rates: [Vec<f64>; 4] = Default::default();
        let (mut ratio, mut ratio_h, mut ratio_nh) = (vec![], vec![], vec![]);
        // Warm-up.
        plain(&client, 99, false).await;
        ingress(&client, 99, true).await;
        for round in 0..ROUNDS {
            let mut d = [Duration::ZERO; 4];
            // Rotate the order so no variant always runs first or last.
            for k in 0..4 {
                let v = (k + round) % 4;
                d[v] = match v {
                    0 => plain(&client, round, false).await,
                    1 => plain(&client, round, true).await,
                    2 => ingress(&client, round, true).await,
                    _ => ingress(&client, round, false).await,
                };
            }
            let f: Vec<f64> = d.iter().map(|x| total / x.as_secs_f64()).collect();
            println!(
                "round {round}: plain {:.0} frames/s, plain+headers {:.0}, ingress {:.0}, ingress/no-frame-headers {:.0}  (ingress/plain {:.2}, ingress/plain+headers {:.2}, no-frame-headers/plain {:.2})",
                f[0], f[1], f[2], f[3], f[2] / f[0], f[2] / f[1], f[3] / f[0]
            );
            for (r, x) in rates.iter_mut().zip(&f) {
                r.push(*x);
            }
            ratio.push(f[2] / f[0]);
            ratio_h.push(f[2] / f[1]);
            ratio_nh.push(f[3] / f[0]);
        }
        let [p, ph, ing, nh] = &mut rates;
        println!(
            "median over {ROUNDS} rounds of {STREAMS} streams x {FRAMES} frames: plain {:.0} frames/s, plain+headers {:.0}, ingress {:.0}, ingress/no-frame-headers {:.0}",
            median(p),
            median(ph),
            median(ing),
            median(nh)
        );
        println!(
            "median ratios: ingress/plain {:.2}, ingress/plain+headers {:.2} (same bytes on the wire), ingress(no-frame-headers)/plain {:.2} (same bytes on the wire)",
            median(&mut ratio),
            median(&mut ratio_h),
            median(&mut ratio_nh)
        );
    });
}
