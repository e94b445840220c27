//! RSS growth of the producer during a 10 s NATS stall (SIGSTOP) at 50 streams, against
//! the bound 50 × the byte budget (+ a small constant).
//!
//! `cargo bench -p weir-audio-producer --bench stall_rss` (runs `gap`, `close` and
//! `shadow`, each in a fresh child process so one scenario's heap does not hide
//! another's; `-- gap` runs one).
//!
//! Each scenario: a fresh nats-server; the service's default NATS settings (ping 10 s,
//! client capacity 1,024 messages, publish timeout 100 ms); 50 streams pushing a freshly
//! allocated 640-byte frame every 20 ms (as frames arriving from sockets would be);
//! 3 s of steady state, then the server is stopped for 10 s, then resumed for 2 s. RSS
//! (`VmRSS`) is sampled every 50 ms. Growth = max RSS during the stall − max RSS during
//! the last second of steady state. `STALL_RSS_CLIENT_CAPACITY=128` changes the
//! async-nats command channel size (the part of the constant that is NATS's buffer).

use std::time::Duration;

use bytes::Bytes;
use weir_audio_producer::config::Policy;
use weir_audio_producer::{Ingress, StreamConfig};
use weir_service::nats::NatsConfig;
use weir_testkit::NatsServer;

const STREAMS: usize = 50;
/// The name the bench's NATS client connects with (shown by the server).
const CLIENT_NAME: &str = "weir-stall-rss";

fn rss_bytes() -> u64 {
    weir_service::process::resident_memory_bytes().unwrap_or(0)
}

async fn scenario(name: &str) {
    let cfg = match name {
        "gap" => StreamConfig::builder()
            .policy(Policy::Gap)
            .extended_consumers(true)
            .build(),
        "shadow" => StreamConfig::builder().shadow(true).build(),
        _ => StreamConfig::builder().build(),
    }
    .expect("config");
    let budget = cfg.max_bytes() as u64;
    let server = NatsServer::start().expect("nats-server (scripts/ensure-nats-server)");
    let mut nats = NatsConfig {
        urls: vec![server.url().to_owned()],
        retry_initial_connect: false,
        ..NatsConfig::named(CLIENT_NAME)
    };
    if let Some(c) = std::env::var("STALL_RSS_CLIENT_CAPACITY")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        nats.client_capacity = c;
    }
    let client = weir_audio_producer::nats::connect(&nats)
        .await
        .expect("connect");
    let ingress = Ingress::new(client, cfg);
    let streams: Vec<_> = (0..STREAMS)
        .map(|i| ingress.open(&format!("rss-{i}"), None).expect("open"))
        .collect();

    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let start = tokio::time::Instant::now();
    let (mut baseline, mut during, mut pending_max) = (0u64, 0u64, 0u64);
    let mut paused_at = None;
    let mut refused = 0u64;
    loop {
        tick.tick().await;
        let t = start.elapsed();
        for s in &streams {
            if s.try_push(Bytes::from(vec![1u8; 640])).is_err() {
                refused += 1;
            }
        }
        if t.as_millis() % 50 < 20 {
            let rss = rss_bytes();
            if t >= Duration::from_secs(2) && t < Duration::from_secs(3) {
                baseline = baseline.max(rss);
            }
            if paused_at.is_some() {
                during = during.max(rss);
                pending_max = pending_max.max(ingress.global().pending_bytes());
            }
        }
        if t >= Duration::from_secs(3) && paused_at.is_none() {
            server.pause().expect("pause");
            paused_at = Some(t);
        }
        if t >= Duration::from_secs(13) && server.is_paused() {
            server.resume().expect("resume");
        }
        if t >= Duration::from_secs(15) {
            break;
        }
    }
    let stats = ingress.stats();
    for s in streams {
        let _ = tokio::time::timeout(Duration::from_secs(15), s.finish()).await;
    }
    let growth = during.saturating_sub(baseline);
    let bound = STREAMS as u64 * budget;
    println!(
        "stall_rss {name} (client_capacity {}): baseline RSS {:.1} MiB, max during 10 s stall {:.1} MiB, growth {:.0} KiB; \
         50 x budget = {:.0} KiB; growth / (50 x budget) = {:.2}; max pending {:.0} KiB; \
         overloads {}, gap markers {}, frames refused {refused}, would_reject {}",
        nats.client_capacity,
        baseline as f64 / 1048576.0,
        during as f64 / 1048576.0,
        growth as f64 / 1024.0,
        bound as f64 / 1024.0,
        growth as f64 / bound as f64,
        pending_max as f64 / 1024.0,
        stats.overloads,
        stats.gaps,
        stats.frames.would_reject,
    );
}

fn main() {
    let arg = std::env::args()
        .skip(1)
        .find(|a| ["gap", "close", "shadow"].contains(&a.as_str()));
    match arg {
        Some(name) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(scenario(&name));
        }
        None => {
            let exe = std::env::current_exe().expect("current exe");
            for name in ["gap", "close", "shadow"] {
                let status = std::process::Command::new(&exe)
                    .arg(name)
                    .status()
                    .expect("run scenario");
                assert!(status.success(), "{name} failed");
            }
        }
    }
}
