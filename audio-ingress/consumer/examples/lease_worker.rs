//! A recognition worker stand-in with lease ownership, for failover drills as a real
//! process (the `lease_process` test SIGKILLs it).
//!
//! ```text
//! lease_worker <worker-id> <log-file> <nats-url>[,<nats-url>...]
//! ```
//!
//! Subject `audio.{partition}.{stream}`, 64 partitions, bucket `weir_leases` with 3
//! replicas, default lease timing. Every frame handed to a handler is appended to the
//! log as `F <stream> <seq>`, every handover gap as `H <stream> <first> <last>`, one
//! unbuffered write per line, so a SIGKILL loses nothing that was handed over. The
//! process runs until it is killed.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_audio_consumer::{
    Consumer, ConsumerConfig, GapCause, LeaseConfig, StreamEvent, StreamHandler, StreamInfo,
};

struct Logger {
    stream: String,
    out: Arc<Mutex<std::fs::File>>,
}

impl StreamHandler for Logger {
    async fn on_event(&mut self, event: StreamEvent) {
        let line = match event {
            StreamEvent::Frame(f) => format!("F {} {}\n", self.stream, f.seq),
            StreamEvent::Gap(g) if g.cause == GapCause::Handover => {
                format!("H {} {} {}\n", self.stream, g.first_seq, g.last_seq)
            }
            _ => return,
        };
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = out.write_all(line.as_bytes()) {
            eprintln!("lease_worker: cannot write the log: {e}");
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The lease driver's decisions (claims, takeovers, fences) on stderr, as
    // `RUST_LOG` selects (the drill sets `weir_audio_consumer=info`).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let [_, id, log, urls] = args.as_slice() else {
        return Err("usage: lease_worker <worker-id> <log-file> <nats-url>[,...]".into());
    };
    let out = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?,
    ));
    let addrs = urls
        .split(',')
        .map(|u| u.parse::<async_nats::ServerAddr>())
        .collect::<Result<Vec<_>, _>>()?;
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .ping_interval(Duration::from_secs(1))
        .retain_servers_order()
        .reconnect_delay_callback(|attempt| Duration::from_millis(50 * attempt.min(10) as u64))
        .connect(addrs)
        .await?;
    let settings = ConsumerConfig {
        idle_timeout_ms: 30_000,
        max_frame_age_ms: 0,
        ..ConsumerConfig::leased(
            "audio.{partition}.{stream}",
            64,
            LeaseConfig {
                replicas: 3,
                worker_id: Some(id.clone()),
                ..LeaseConfig::default()
            },
        )
    }
    .validate()?;
    let consumer = Consumer::start(client, settings, move |info: &StreamInfo| Logger {
        stream: info.stream.clone(),
        out: out.clone(),
    })
    .await?;
    eprintln!("lease_worker {id}: started");
    // Until killed; a SIGTERM/SIGINT shuts down gracefully (drain, then release).
    let _ = tokio::signal::ctrl_c().await;
    consumer.shutdown(Duration::from_secs(2)).await;
    Ok(())
}
