//! Offered load from half to five times the backend's capacity, every request with a
//! deadline, against the adapter's **defaults** (only `workers` set to the backend's
//! parallelism).
//!
//! Open-loop callers (a fixed arrival rate, like users, not waiting for each other)
//! send `factor × capacity` requests per second with `Weir-Timeout-Ms` = the budget and
//! a NATS request timeout of the same budget: a reply that is not back by then is a
//! *caller timeout*. Reported per scenario (medians over `WEIR_BENCH_ROUNDS` rounds,
//! default 3, of `WEIR_BENCH_SECS` seconds, default 5):
//! - ok in time: `ok` answers received within the budget, per second of the span from
//!   the first send to the last answer (the queue drains after the last send), and as
//!   a share of the capacity over that span (true capacity = workers / mean latency;
//!   the estimator's capacity = workers / its p90 estimate, what the adapter plans with);
//! - refusal latency p50/p99 as the caller saw it (send → reply);
//! - the share of backend time spent on requests answered `ok` (useful backend time);
//! - caller timeouts (target 0), requests started after their deadline (target 0).
//!
//! Scenarios: one worker, sim backend at a fixed 50 ms (capacity 20/s) and log-normal
//! (median 50 ms, p99 150 ms; mean ≈ 55.9 ms, capacity ≈ 17.9/s), budget 2 s, at
//! 0.5×, 1.2×, 2× and 5×; then mixed budgets (half 500 ms, half 5 s) at 2× under
//! `queue_order = "edf"` (the default: EDF within a bound), `"fifo"`, and EDF without
//! the overtake share (`deadline.overtake_share_pct = 0`), ok in time reported per class,
//! in rounds three times as long (a 5 s budget needs them to reach a steady state).
//!
//! Run: `cargo bench -p weir-llm-adapter --bench overload`
//! (`WEIR_BENCH_ONLY=fixed` / `lognormal` / `mixed` runs one group.)

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{connect, install_metrics, knob, median};
use weir_llm_adapter::Config;
use weir_llm_adapter::backend::sim::SimBackend;
use weir_llm_adapter::config::{Latency, SimConfig};
use weir_protocol::llm::headers as h;

struct Scenario {
    name: String,
    /// Round length as a multiple of `WEIR_BENCH_SECS` (long budgets need long rounds
    /// to reach a steady state).
    secs_factor: u64,
    config: String,
    latency: Latency,
    workers: usize,
    /// Mean service time, for the true capacity.
    mean_ms: f64,
    factor: f64,
    /// Budgets, cycled over the requests (one class per distinct value).
    budgets_ms: Vec<u64>,
}

impl Scenario {
    fn capacity(&self) -> f64 {
        self.workers as f64 * 1000.0 / self.mean_ms
    }
}

#[derive(Default)]
struct Calls {
    /// (budget, code, latency, answered at)
    all: Vec<(u64, String, Duration, Instant)>,
}

struct Round {
    /// First send → last answer: the backend works through the queue after the last
    /// send, so rates and the share of capacity are taken over this span.
    span_s: f64,
    ok_in_time: u64,
    offered_rps: f64,
    ok_in_time_rps: f64,
    ok_in_time_by_budget: BTreeMap<u64, (u64, u64)>,
    refusal_p50_ms: f64,
    refusal_p99_ms: f64,
    caller_timeouts: u64,
    started_after_deadline: u64,
    useful_share: f64,
    estimate_ms: f64,
    codes: BTreeMap<String, u64>,
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

async fn round(server_url: &str, sc: &Scenario, secs: u64, seed: u64) -> Round {
    let adapter_client = connect(server_url).await;
    let config = Config::from_toml_str(&sc.config).expect("config");
    let sim = SimBackend::new(SimConfig {
        latency: sc.latency,
        error_rate: 0.0,
        seed,
        ..SimConfig::default()
    });
    let sim_handle = sim.handle();
    let adapter = weir_llm_adapter::start(adapter_client, config, Arc::new(sim))
        .await
        .expect("adapter");
    let caller = connect(server_url).await;
    caller.flush().await.expect("flush");

    let rate = sc.capacity() * sc.factor;
    let per_tick = rate / 200.0; // 5 ms ticks
    let calls = Arc::new(Mutex::new(Calls::default()));
    let payload = Bytes::from(vec![b'x'; 256]);
    let mut tick = tokio::time::interval(Duration::from_millis(5));
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
            let budget = sc.budgets_ms[sent as usize % sc.budgets_ms.len()];
            sent += 1;
            let caller = caller.clone();
            let payload = payload.clone();
            let calls = calls.clone();
            tasks.push(tokio::spawn(async move {
                let mut hm = async_nats::HeaderMap::new();
                hm.insert(h::TIMEOUT_MS, budget.to_string().as_str());
                let req = async_nats::Request::new()
                    .payload(payload)
                    .headers(hm)
                    .timeout(Some(Duration::from_millis(budget)));
                let start = Instant::now();
                let r = caller.send_request("llm.infer", req).await;
                let took = start.elapsed();
                let code = match &r {
                    Ok(m) => m
                        .headers
                        .as_ref()
                        .and_then(|hm| hm.get(h::ERROR_CODE))
                        .map_or("ok".to_owned(), |v| v.as_str().to_owned()),
                    Err(_) => "caller_timeout".to_owned(),
                };
                calls
                    .lock()
                    .expect("lock")
                    .all
                    .push((budget, code, took, Instant::now()));
            }));
        }
    }
    let elapsed = t0.elapsed();
    for t in tasks {
        let _ = t.await;
    }
    let span = {
        let c = calls.lock().expect("lock");
        c.all
            .iter()
            .map(|x| x.3)
            .max()
            .map_or(elapsed, |last| last.duration_since(t0))
            .max(elapsed)
    };
    let s = adapter.stats();
    adapter.shutdown().await;
    let c = calls.lock().expect("lock");
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_budget: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut refusal_ms = Vec::new();
    let mut ok_in_time = 0u64;
    for (budget, code, took, _) in &c.all {
        *codes.entry(code.clone()).or_insert(0) += 1;
        let e = by_budget.entry(*budget).or_insert((0, 0));
        e.1 += 1;
        if code == "ok" && *took <= Duration::from_millis(*budget) {
            ok_in_time += 1;
            e.0 += 1;
        } else if code != "ok" && code != "caller_timeout" {
            refusal_ms.push(took.as_secs_f64() * 1000.0);
        }
    }
    Round {
        span_s: span.as_secs_f64(),
        ok_in_time,
        offered_rps: sent as f64 / elapsed.as_secs_f64(),
        ok_in_time_rps: ok_in_time as f64 / span.as_secs_f64(),
        ok_in_time_by_budget: by_budget,
        refusal_p50_ms: pct(&mut refusal_ms, 0.50),
        refusal_p99_ms: pct(&mut refusal_ms, 0.99),
        caller_timeouts: codes.get("caller_timeout").copied().unwrap_or(0),
        started_after_deadline: s
            .started_after_deadline
            .max(sim_handle.stats().started_after_deadline),
        useful_share: s.useful_backend_share(),
        estimate_ms: s
            .service_estimate
            .and_then(|e| e.service_time_ms)
            .unwrap_or(f64::NAN),
        codes,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

fn scenarios() -> Vec<Scenario> {
    let only = std::env::var("WEIR_BENCH_ONLY").unwrap_or_default();
    let base = "workers = 1\n[trace]\nlog = false\n";
    let fixed = Latency::Fixed(Duration::from_millis(50));
    let lognormal = Latency::LogNormal {
        median: Duration::from_millis(50),
        p99: Duration::from_millis(150),
    };
    // Mean of a log-normal with median m and p99 q: m·exp(σ²/2), σ = ln(q/m)/2.326.
    let sigma = (150.0f64 / 50.0).ln() / 2.326;
    let lognormal_mean = 50.0 * (sigma * sigma / 2.0).exp();
    let mut out = Vec::new();
    for (group, latency, mean) in [
        ("fixed", fixed, 50.0),
        ("lognormal", lognormal, lognormal_mean),
    ] {
        if !only.is_empty() && only != group {
            continue;
        }
        for factor in [0.5, 1.2, 2.0, 5.0] {
            out.push(Scenario {
                secs_factor: 1,
                name: format!("{group} {factor}x"),
                config: base.to_owned(),
                latency,
                workers: 1,
                mean_ms: mean,
                factor,
                budgets_ms: vec![2000],
            });
        }
    }
    if only.is_empty() || only == "mixed" {
        // (top-level keys before `base`, which ends in a section; sections after it)
        for (name, top, section) in [
            ("queue_order=edf (default)", "", ""),
            ("queue_order=fifo", "queue_order = \"fifo\"\n", ""),
            (
                "edf, overtake_share_pct=0",
                "",
                "[deadline]\novertake_share_pct = 0\n",
            ),
        ] {
            out.push(Scenario {
                secs_factor: 3,
                name: format!("mixed 500ms/5s 2x {name}"),
                config: format!("{top}{base}{section}"),
                latency: fixed,
                workers: 1,
                mean_ms: 50.0,
                factor: 2.0,
                budgets_ms: vec![500, 5000],
            });
        }
    }
    out
}

async fn bench() {
    let rounds = knob("WEIR_BENCH_ROUNDS", 3);
    let secs = knob("WEIR_BENCH_SECS", 5);
    install_metrics();
    let server =
        weir_testkit::NatsServer::start().expect("nats-server (scripts/ensure-nats-server)");
    println!("adapter defaults + workers = 1; {rounds} rounds of {secs} s; medians over rounds\n");
    println!(
        "| scenario | offered/s | ok in time/s | % of capacity | % of estimator capacity | refusal p50 / p99 ms | useful backend | caller timeouts | started after deadline | estimate ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for sc in scenarios() {
        let mut xs = Vec::new();
        let secs = secs * sc.secs_factor;
        for r in 0..rounds {
            let x = round(server.url(), &sc, secs, r + 1).await;
            eprintln!(
                "  {} round {r}: span {:.1} s ok in time {} offered {:.1}/s ok in time {:.1}/s refusal p50 {:.1} p99 {:.1} ms useful {:.1}% caller timeouts {} codes {:?} by budget {:?} estimate {:.1} ms",
                sc.name,
                x.span_s,
                x.ok_in_time,
                x.offered_rps,
                x.ok_in_time_rps,
                x.refusal_p50_ms,
                x.refusal_p99_ms,
                100.0 * x.useful_share,
                x.caller_timeouts,
                x.codes,
                x.ok_in_time_by_budget,
                x.estimate_ms
            );
            xs.push(x);
        }
        let m = |f: &dyn Fn(&Round) -> f64| median(&xs.iter().map(f).collect::<Vec<_>>());
        let ok = m(&|x| x.ok_in_time_rps);
        let est = m(&|x| x.estimate_ms);
        let est_capacity = sc.workers as f64 * 1000.0 / est;
        let timeouts: u64 = xs.iter().map(|x| x.caller_timeouts).sum();
        let late: u64 = xs.iter().map(|x| x.started_after_deadline).sum();
        println!(
            "| {} | {:.1} | {:.1} | {:.0} % | {:.0} % | {:.1} / {:.1} | {:.1} % | {} (all rounds) | {} | {:.1} |",
            sc.name,
            m(&|x| x.offered_rps),
            ok,
            100.0 * ok / sc.capacity(),
            100.0 * ok / est_capacity,
            m(&|x| x.refusal_p50_ms),
            m(&|x| x.refusal_p99_ms),
            100.0 * m(&|x| x.useful_share),
            timeouts,
            late,
            est
        );
        if sc.budgets_ms.len() > 1 {
            for b in &sc.budgets_ms {
                let share = m(&|x| {
                    let (ok, n) = x.ok_in_time_by_budget.get(b).copied().unwrap_or((0, 0));
                    ok as f64 / n.max(1) as f64
                });
                let rps =
                    m(&|x| x.ok_in_time_by_budget.get(b).map_or(0.0, |v| v.0 as f64) / x.span_s);
                println!(
                    "|   budget {b} ms | | {rps:.1} | {:.0} % of this class ok in time | | | | | | |",
                    100.0 * share
                );
            }
        }
    }
}
