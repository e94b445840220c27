//! Helpers shared by the benchmarks (real nats-server, in-process adapter).
#![allow(dead_code)]

use std::time::Duration;

use hdrhistogram::Histogram;

/// Connects with bench-friendly options.
pub async fn connect(url: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .subscription_capacity(1 << 16)
        .connect(url)
        .await
        .expect("connect")
}

/// A latency histogram in microseconds.
pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// The median of `v` (sorted copy).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if s.is_empty() {
        return f64::NAN;
    }
    if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    }
}

/// Reads a numeric environment knob.
pub fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Installs the Prometheus recorder so that metric calls cost what they cost in
/// production.
pub fn install_metrics() {
    let (recorder, _handle) = weir_llm_adapter::metrics::prometheus_recorder();
    let _ = metrics::set_global_recorder(recorder);
}

/// CPU time (user + system) of a process so far, in seconds (`None` where `/proc` is
/// not available). Resolution: one clock tick (usually 10 ms).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    weir_service::process::cpu_time_of(Some(pid)).map(|d| d.as_secs_f64())
}
