//! Adapter round trip vs a direct NATS request/reply, same process, same nats-server.
//!
//! Server side — every responder and the adapter — runs on one dedicated
//! current-thread tokio runtime (one thread, like a single-threaded server process);
//! callers run on the main multi-thread runtime. Cases:
//! - `direct`: a plain responder (queue subscription, echo) — what a caller gets talking
//!   to a service directly;
//! - `direct+hdr`: the same echo, adding the two timing headers the adapter adds
//!   (`Weir-Queue-Ms`, `Weir-Inference-Ms`), to separate the cost of headers on the wire;
//! - `adapter`: the full adapter (service API, admission, 16 workers, deadline timers,
//!   stats, Prometheus recorder installed) in front of the zero-latency sim backend (echo).
//!
//! Callers are closed-loop tasks sending 256-byte requests with `Weir-Timeout-Ms: 5000`
//! (muxed inbox, the same for every case). Throughput uses `WEIR_BENCH_CONC` callers
//! (default 32); latency at moderate load uses 4. Each round runs every case for
//! `WEIR_BENCH_SECS` seconds (default 2), in rotating order; `WEIR_BENCH_ROUNDS` rounds
//! (default 7). The report shows per-round figures and medians over rounds.
//!
//! Run: `cargo bench -p weir-llm-adapter --bench roundtrip`
//! (`WEIR_BENCH_ONLY=direct|direct+hdr|adapter` drives one case, for profiling).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{connect, cpu_seconds, hist, install_metrics, knob, median};
use futures::StreamExt;
use hdrhistogram::Histogram;
use weir_llm_adapter::Config;
use weir_llm_adapter::backend::sim::SimBackend;
use weir_protocol::llm::headers as h;

const DIRECT: &str = "direct.echo";
const DIRECT_HDR: &str = "direct.hdr";
const ADAPTER: &str = "bench.infer";

struct Run {
    rps: f64,
    /// CPU per request of this process (callers + server side) and of nats-server, µs.
    cpu_us: (f64, f64),
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

async fn drive(
    clients: &[async_nats::Client],
    subject: &str,
    conc: usize,
    secs: u64,
    nats_pid: u32,
) -> Run {
    let me = std::process::id();
    let stop = Arc::new(AtomicBool::new(false));
    let payload = Bytes::from(vec![b'x'; 256]);
    let mut tasks = Vec::new();
    for i in 0..conc {
        let client = clients[i % clients.len()].clone();
        let subject = subject.to_owned();
        let stop = stop.clone();
        let payload = payload.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = hist();
            let mut errors = 0u64;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(h::TIMEOUT_MS, "5000");
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                match client
                    .request_with_headers(subject.clone(), headers.clone(), payload.clone())
                    .await
                {
                    Ok(m)
                        if m.headers
                            .as_ref()
                            .and_then(|hm| hm.get(h::ERROR_CODE))
                            .is_none() =>
                    {
                        h.saturating_record(t0.elapsed().as_micros() as u64);
                    }
                    _ => errors += 1,
                }
            }
            (h, errors)
        }));
    }
    let t0 = Instant::now();
    let cpu0 = (cpu_seconds(me), cpu_seconds(nats_pid));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let cpu1 = (cpu_seconds(me), cpu_seconds(nats_pid));
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    let mut all: Histogram<u64> = hist();
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await.expect("join");
        all.add(&h).expect("merge");
        errors += e;
    }
    let n = all.len().max(1) as f64;
    let per = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => (b - a) * 1e6 / n,
        _ => f64::NAN,
    };
    Run {
        cpu_us: (per(cpu0.0, cpu1.0), per(cpu0.1, cpu1.1)),
        rps: all.len() as f64 / elapsed.as_secs_f64(),
        p50_us: all.value_at_quantile(0.5) as f64,
        p99_us: all.value_at_quantile(0.99) as f64,
        errors,
    }
}

/// Starts the responders and the adapter on a dedicated current-thread runtime; returns
/// once they are subscribed. Sends the adapter's final stats on `stats_tx` when asked.
fn start_server_side(
    url: String,
) -> (
    std::sync::mpsc::Sender<()>,
    std::sync::mpsc::Receiver<String>,
) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (stats_tx, stats_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            for (subject, with_headers) in [(DIRECT, false), (DIRECT_HDR, true)] {
                let responder = connect(&url).await;
                let mut sub = responder
                    .queue_subscribe(subject, "q".to_owned())
                    .await
                    .expect("subscribe");
                responder.flush().await.expect("flush");
                tokio::spawn(async move {
                    while let Some(m) = sub.next().await {
                        let Some(reply) = m.reply else { continue };
                        if with_headers {
                            let mut hm = async_nats::HeaderMap::new();
                            hm.insert(h::QUEUE_MS, "0.012");
                            hm.insert(h::INFERENCE_MS, "0.003");
                            let _ = responder.publish_with_headers(reply, hm, m.payload).await;
                        } else {
                            let _ = responder.publish(reply, m.payload).await;
                        }
                    }
                });
            }
            let workers = knob("WEIR_BENCH_WORKERS", 16);
            let adapter_client = connect(&url).await;
            let config = Config::from_toml_str(&format!(
                "workers = {workers}\nqueue_capacity = 1024\n[trace]\nlog = false\n[service]\nsubject = \"{ADAPTER}\""
            ))
            .expect("config");
            let adapter = weir_llm_adapter::start(
                adapter_client.clone(),
                config,
                Arc::new(SimBackend::fixed(Duration::ZERO)),
            )
            .await
            .expect("adapter");
            adapter_client.flush().await.expect("flush");
            ready_tx.send(()).expect("ready");
            // Park this runtime's block_on on the stop signal without blocking the thread.
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            std::thread::spawn(move || {
                let _ = stop_rx.recv();
                let _ = tx.send(());
            });
            let _ = rx.await;
            let s = adapter.stats();
            let _ = stats_tx.send(format!(
                "offered {} completed {} refused {:?} started_after_deadline {} queue wait p50 {:.3} ms p99 {:.3} ms",
                s.offered, s.completed, s.refused, s.started_after_deadline, s.queue_wait_ms.p50, s.queue_wait_ms.p99
            ));
            adapter.shutdown().await;
        });
    });
    ready_rx.recv().expect("server side ready");
    (stop_tx, stats_rx)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn bench() {
    let rounds = knob("WEIR_BENCH_ROUNDS", 7) as usize;
    let secs = knob("WEIR_BENCH_SECS", 2);
    let conc = knob("WEIR_BENCH_CONC", 32) as usize;
    install_metrics();
    let server =
        weir_testkit::NatsServer::start().expect("nats-server (scripts/ensure-nats-server)");
    let pid = server.pid();
    let (stop_tx, stats_rx) = start_server_side(server.url().to_owned());
    let clients = vec![connect(server.url()).await, connect(server.url()).await];
    for c in &clients {
        c.flush().await.expect("flush");
    }
    // Profiling aid: WEIR_BENCH_ONLY=direct|direct+hdr|adapter drives one case only.
    if let Ok(only) = std::env::var("WEIR_BENCH_ONLY") {
        let subject = match only.as_str() {
            "direct" => DIRECT,
            "direct+hdr" => DIRECT_HDR,
            _ => ADAPTER,
        };
        let run = drive(&clients, subject, conc, secs, pid).await;
        println!(
            "{only}: {:.0} req/s; CPU per request: this process {:.1} us, nats-server {:.1} us",
            run.rps, run.cpu_us.0, run.cpu_us.1
        );
        return;
    }
    // Warm-up, discarded.
    for s in [DIRECT, DIRECT_HDR, ADAPTER] {
        drive(&clients, s, conc, 1, pid).await;
    }

    let cases = [DIRECT, DIRECT_HDR, ADAPTER];
    let mut tp = [Vec::new(), Vec::new(), Vec::new()];
    let mut p50 = [Vec::new(), Vec::new(), Vec::new()];
    let mut p99 = [Vec::new(), Vec::new(), Vec::new()];
    let mut cpu = [
        (Vec::new(), Vec::new()),
        (Vec::new(), Vec::new()),
        (Vec::new(), Vec::new()),
    ];
    let mut ratio = Vec::new();
    let mut ratio_hdr = Vec::new();
    let mut errors = 0;
    println!(
        "{conc} callers for throughput, 4 for latency, {secs} s per case, {rounds} rounds; server side on one thread"
    );
    println!(
        "round | req/s direct  +hdr  adapter  ratio | p50/p99 us (4 callers) direct  +hdr  adapter"
    );
    for round in 0..rounds {
        let mut r_tp = [0.0; 3];
        let mut r_lat = [(0.0, 0.0); 3];
        for k in 0..3 {
            let i = (round + k) % 3;
            let run = drive(&clients, cases[i], conc, secs, pid).await;
            cpu[i].0.push(run.cpu_us.0);
            cpu[i].1.push(run.cpu_us.1);
            errors += run.errors;
            r_tp[i] = run.rps;
        }
        for k in 0..3 {
            let i = (round + k) % 3;
            let run = drive(&clients, cases[i], 4, secs, pid).await;
            errors += run.errors;
            r_lat[i] = (run.p50_us, run.p99_us);
        }
        println!(
            "{round:>5} | {:>11.0} {:>6.0} {:>8.0} {:>6.2} | {:>5.0}/{:<5.0} {:>5.0}/{:<5.0} {:>5.0}/{:<5.0}",
            r_tp[0],
            r_tp[1],
            r_tp[2],
            r_tp[2] / r_tp[0],
            r_lat[0].0,
            r_lat[0].1,
            r_lat[1].0,
            r_lat[1].1,
            r_lat[2].0,
            r_lat[2].1
        );
        for i in 0..3 {
            tp[i].push(r_tp[i]);
            p50[i].push(r_lat[i].0);
            p99[i].push(r_lat[i].1);
        }
        ratio.push(r_tp[2] / r_tp[0]);
        ratio_hdr.push(r_tp[2] / r_tp[1]);
    }
    println!();
    println!("medians over {rounds} rounds:");
    println!(
        "  throughput: direct {:.0} req/s, direct+hdr {:.0} req/s, adapter {:.0} req/s",
        median(&tp[0]),
        median(&tp[1]),
        median(&tp[2])
    );
    println!(
        "  throughput ratio adapter/direct {:.2} (adapter/direct+hdr {:.2}), medians of per-round ratios",
        median(&ratio),
        median(&ratio_hdr)
    );
    println!(
        "  moderate load (4 callers): direct p50 {:.0} us p99 {:.0} us; direct+hdr p50 {:.0} us p99 {:.0} us; adapter p50 {:.0} us p99 {:.0} us",
        median(&p50[0]),
        median(&p99[0]),
        median(&p50[1]),
        median(&p99[1]),
        median(&p50[2]),
        median(&p99[2])
    );
    println!(
        "  added by the adapter vs direct: p50 +{:.0} us, p99 +{:.0} us",
        median(&p50[2]) - median(&p50[0]),
        median(&p99[2]) - median(&p99[0])
    );
    for (i, name) in ["direct", "direct+hdr", "adapter"].iter().enumerate() {
        println!(
            "  CPU per request at {conc} callers, {name}: this process {:.1} us (callers + server side), nats-server {:.1} us",
            median(&cpu[i].0),
            median(&cpu[i].1)
        );
    }
    println!("  errors (non-ok replies or timeouts): {errors}");
    let _ = stop_tx.send(());
    if let Ok(s) = stats_rx.recv_timeout(Duration::from_secs(10)) {
        println!("  adapter stats: {s}");
    }
}
