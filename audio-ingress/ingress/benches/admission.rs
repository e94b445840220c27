//! Admission cost of `StreamHandle::try_push`, in ns per frame.
//!
//! `cargo bench -p weir-audio-ingress --bench admission`
//!
//! Each run opens a stream with a budget large enough for the whole batch (64 MiB,
//! `max_age` 60 s) and pushes 50,000 frames of 640 bytes in a tight synchronous loop on
//! a current-thread runtime, so the publisher task cannot run during the measurement:
//! what is timed is exactly the producer's side — one mutex, the byte/age checks, the
//! sequence number, encoding the packet (one allocation and a copy of the PCM), the
//! reservation (per-stream and aggregate counters, gauges) and the publisher wake-up.
//! (The publisher never ran, so the direct path is not taken here.) The stream is then finished (published to a null sink) outside the
//! timed region. Median and spread of 9 runs, first without a metrics recorder, then
//! with the Prometheus recorder installed (as in `serve`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use weir_audio_producer::publisher::{Sink, SinkError};
use weir_audio_producer::{Ingress, StreamConfig};

#[derive(Clone)]
struct NullSink;

impl Sink for NullSink {
    async fn publish(&self, _: Subject, _: HeaderMap, _: Bytes) -> Result<(), SinkError> {
        Ok(())
    }
}

const FRAMES: u32 = 50_000;
const RUNS: usize = 9;

fn config() -> StreamConfig {
    StreamConfig::builder()
        .max_bytes(64 * 1024 * 1024)
        .max_age(Duration::from_secs(60))
        .publish_timeout(Duration::from_secs(60))
        // Admission cost at full speed, not the rate bound.
        .max_rate_permille(0)
        .build()
        .expect("bench config")
}

fn measure(rt: &tokio::runtime::Runtime, label: &str) -> f64 {
    let ingress = rt.block_on(async { Ingress::new(NullSink, config()) });
    let pcm = Bytes::from(vec![0u8; 640]);
    let mut per_frame = Vec::with_capacity(RUNS);
    for run in 0..RUNS {
        let ns = rt.block_on(async {
            let stream = ingress.open(&format!("bench-{run}"), None).expect("open");
            let start = Instant::now();
            for _ in 0..FRAMES {
                black_box(stream.try_push(pcm.clone())).expect("admitted");
            }
            let elapsed = start.elapsed();
            let summary = stream.finish().await;
            assert_eq!(summary.snapshot.frames.published, u64::from(FRAMES));
            elapsed.as_nanos() as f64 / f64::from(FRAMES)
        });
        per_frame.push(ns);
    }
    per_frame.sort_by(f64::total_cmp);
    let median = per_frame[RUNS / 2];
    println!(
        "try_push ({label}): median {median:.0} ns/frame (min {:.0}, max {:.0}) over {RUNS} runs of {FRAMES} frames",
        per_frame[0],
        per_frame[RUNS - 1]
    );
    median
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    measure(&rt, "no metrics recorder");
    let recorder = weir_audio_ingress::metrics::prometheus_recorder();
    metrics::set_global_recorder(recorder).expect("recorder");
    measure(&rt, "Prometheus recorder installed");
}
