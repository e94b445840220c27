//! Offered load at twice the backend's capacity, every request with a deadline.
//!
//! Open-loop callers (a fixed arrival rate, like users, not waiting for each other)
//! send `2 × capacity` requests per second with `Weir-Timeout-Ms`. Reported per
//! scenario (medians over `WEIR_BENCH_ROUNDS` rounds, default 3, of
//! `WEIR_BENCH_SECS` seconds, default 5):
//! - goodput: `ok` answers per second (and as a share of capacity);
//! - refusals by code;
//! - requests started after their deadline, counted by the adapter and, independently,
//!   by the sim backend (must be 0);
//! - the share of backend time spent on requests that finished within their deadline
//!   (target ≥ 95 %);
//! - queue wait p50/p99 of started requests, and callers' p99 for `ok` answers.
//!
//! Scenarios:
//! - `sized`: 8 workers, fixed 20 ms inference (capacity 400/s), queue 64, deadline
//!   500 ms — the queue bound keeps every admitted request within its deadline;
//! - `oversized`: 8 workers, log-normal inference (median 20 ms, p99 80 ms), queue 512,
//!   deadline 300 ms, defaults otherwise — a queue holding more than a deadline's worth
//!   of work: requests expire while queued (answered without touching the backend), and
//!   those that start do so with little budget left, so many are aborted mid-inference;
//! - `oversized+min_start_budget`: the same with `deadline.min_start_budget_ms = 80`
//!   (the backend's p99): a request is started only if it can finish.
//!
//! Run: `cargo bench -p weir-llm-adapter --bench overload`

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{connect, hist, install_metrics, knob, median};
use hdrhistogram::Histogram;
use weir_llm_adapter::Config;
use weir_llm_adapter::backend::sim::SimBackend;
use weir_llm_adapter::config::{Latency, SimConfig};
use weir_protocol::llm::headers as h;

struct Scenario {
    name: &'static str,
    config: &'static str,
    latency: Latency,
    capacity_rps: f64,
    deadline_ms: u64,
}

#[derive(Default)]
struct Outcome {
    codes: BTreeMap<String, u64>,
    ok_latency: Option<Histogram<u64>>,
}

struct Round {
    offered_rps: f64,
    goodput_rps: f64,
    refused: BTreeMap<String, u64>,
    started_after_deadline: u64,
    sim_started_after_deadline: u64,
    useful_share: f64,
    queue_p50: f64,
    queue_p99: f64,
    ok_p99_ms: f64,
    lost: u64,
}

async fn round(server_url: &str, sc: &Scenario, secs: u64, seed: u64) -> Round {
    let adapter_client = connect(server_url).await;
    let config = Config::from_toml_str(sc.config).expect("config");
    let sim = SimBackend::new(SimConfig {
        latency: sc.latency,
        error_rate: 0.0,
        seed,
    });
    let sim_handle = sim.handle();
    let adapter = weir_llm_adapter::start(adapter_client, config, Arc::new(sim))
        .await
        .expect("adapter");
    let caller = connect(server_url).await;
    caller.flush().await.expect("flush");

    let rate = sc.capacity_rps * 2.0;
    let per_tick = rate / 100.0; // 10 ms ticks
    let outcome = Arc::new(Mutex::new(Outcome {
        ok_latency: Some(hist()),
        ..Default::default()
    }));
    let payload = Bytes::from(vec![b'x'; 256]);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut carry = 0.0;
    let mut tasks = Vec::new();
    while t0.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        carry += per_tick;
        while carry >= 1.0 {
            carry -= 1.0;
            sent += 1;
            let caller = caller.clone();
            let payload = payload.clone();
            let outcome = outcome.clone();
            let deadline = sc.deadline_ms;
            tasks.push(tokio::spawn(async move {
                let mut hm = async_nats::HeaderMap::new();
                hm.insert(h::TIMEOUT_MS, deadline.to_string().as_str());
                let req = async_nats::Request::new()
                    .payload(payload)
                    .headers(hm)
                    .timeout(Some(Duration::from_millis(deadline + 2000)));
                let start = Instant::now();
                let r = caller.send_request("llm.infer", req).await;
                let took = start.elapsed();
                let code = match &r {
                    Ok(m) => m
                        .headers
                        .as_ref()
                        .and_then(|hm| hm.get(h::ERROR_CODE))
                        .map_or("ok".to_owned(), |v| v.as_str().to_owned()),
                    Err(_) => "client_timeout".to_owned(),
                };
                let mut o = outcome.lock().expect("lock");
                if code == "ok"
                    && let Some(hh) = o.ok_latency.as_mut()
                {
                    hh.saturating_record(took.as_micros() as u64);
                }
                *o.codes.entry(code).or_insert(0) += 1;
            }));
        }
    }
    let elapsed = t0.elapsed();
    for t in tasks {
        let _ = t.await;
    }
    let s = adapter.stats();
    adapter.shutdown().await;
    let o = outcome.lock().expect("lock");
    let ok = o.codes.get("ok").copied().unwrap_or(0);
    let answered: u64 = o.codes.values().sum();
    let mut refused = o.codes.clone();
    refused.remove("ok");
    Round {
        offered_rps: sent as f64 / elapsed.as_secs_f64(),
        goodput_rps: ok as f64 / elapsed.as_secs_f64(),
        refused,
        started_after_deadline: s.started_after_deadline,
        sim_started_after_deadline: sim_handle.stats().started_after_deadline,
        useful_share: s.useful_backend_share(),
        queue_p50: s.queue_wait_ms.p50,
        queue_p99: s.queue_wait_ms.p99,
        ok_p99_ms: o
            .ok_latency
            .as_ref()
            .map_or(0.0, |hh| hh.value_at_quantile(0.99) as f64 / 1000.0),
        lost: sent - answered,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn bench() {
    let rounds = knob("WEIR_BENCH_ROUNDS", 3);
    let secs = knob("WEIR_BENCH_SECS", 5);
    install_metrics();
    let server =
        weir_testkit::NatsServer::start().expect("nats-server (scripts/ensure-nats-server)");
    let scenarios = [
        Scenario {
            name: "sized",
            config: "workers = 8\nqueue_capacity = 64\n[session]\npending_cap = 0\n[trace]\nlog = false",
            latency: Latency::Fixed(Duration::from_millis(20)),
            capacity_rps: 400.0,
            deadline_ms: 500,
        },
        Scenario {
            name: "oversized",
            config: "workers = 8\nqueue_capacity = 512\n[session]\npending_cap = 0\n[trace]\nlog = false",
            latency: Latency::LogNormal {
                median: Duration::from_millis(20),
                p99: Duration::from_millis(80),
            },
            // mean of that log-normal ≈ 22.8 ms → 8 / 0.0228 s
            capacity_rps: 350.0,
            deadline_ms: 300,
        },
        Scenario {
            name: "oversized+min_start_budget",
            config: "workers = 8\nqueue_capacity = 512\n[session]\npending_cap = 0\n[deadline]\nmin_start_budget_ms = 80\n[trace]\nlog = false",
            latency: Latency::LogNormal {
                median: Duration::from_millis(20),
                p99: Duration::from_millis(80),
            },
            capacity_rps: 350.0,
            deadline_ms: 300,
        },
    ];
    for sc in &scenarios {
        println!(
            "scenario {}: capacity ~{:.0}/s, offered {:.0}/s, deadline {} ms",
            sc.name,
            sc.capacity_rps,
            sc.capacity_rps * 2.0,
            sc.deadline_ms
        );
        let mut goodput = Vec::new();
        let mut useful = Vec::new();
        let mut sad = 0;
        let mut sim_sad = 0;
        let mut lost = 0;
        let mut refused_total: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in 0..rounds {
            let x = round(server.url(), sc, secs, r + 1).await;
            println!(
                "  round {r}: offered {:.0}/s goodput {:.0}/s ({:.0}% of capacity) useful backend share {:.1}% \
                 started_after_deadline {} (sim {}) queue wait p50 {:.1} ms p99 {:.1} ms ok p99 {:.1} ms refused {:?} lost {}",
                x.offered_rps,
                x.goodput_rps,
                100.0 * x.goodput_rps / sc.capacity_rps,
                100.0 * x.useful_share,
                x.started_after_deadline,
                x.sim_started_after_deadline,
                x.queue_p50,
                x.queue_p99,
                x.ok_p99_ms,
                x.refused,
                x.lost
            );
            goodput.push(x.goodput_rps);
            useful.push(x.useful_share);
            sad += x.started_after_deadline;
            sim_sad += x.sim_started_after_deadline;
            lost += x.lost;
            for (k, v) in &x.refused {
                refused_total
                    .entry(k.clone())
                    .or_default()
                    .push(*v as f64 / secs as f64);
            }
        }
        println!(
            "  median goodput {:.0}/s ({:.0}% of capacity); median useful backend share {:.1}%; \
             started after deadline: {sad} (sim: {sim_sad}); lost answers: {lost}",
            median(&goodput),
            100.0 * median(&goodput) / sc.capacity_rps,
            100.0 * median(&useful)
        );
        let refused: Vec<String> = refused_total
            .iter()
            .map(|(k, v)| format!("{k} {:.0}/s", median(v)))
            .collect();
        println!("  median refusals: {}", refused.join(", "));
        println!();
    }
}
