//! The hidden `lease-worker` subcommand: one recognition worker with lease ownership,
//! as a process of its own, so that the `worker-failover` scenario can SIGKILL it for
//! real (see [`crate::scenario::failover`]).
//!
//! The worker runs weir's consumer core (`weir_audio_consumer`) with [`Ownership::Lease`]
//! and a handler that does no work but write what it was handed. It writes two logs,
//! one unbuffered `write` per line, so that a SIGKILL loses nothing that was written:
//!
//! - the frames log: `F <stream> <seq>` for every frame handed to a handler, and
//!   `G <cause> <stream> <first> <last>` for every gap notice (`cause` is `handover`,
//!   `lost`, or `other`);
//! - the leases log: `S <unix_ms>` once started, then `L <unix_ms> <partition> <held>
//!   <revision>` whenever a partition's lease as this worker sees it changes (held
//!   `1`/`0`, revision `0` when none), polled every [`LEASE_POLL`].
//!
//! Invariants: the handler never blocks on anything but its own log; the process ends
//! on SIGINT (graceful: drain, release), on SIGKILL, or after `--max-lifetime-s` (so
//! that a worker whose load test died does not stay behind).
//!
//! [`Ownership::Lease`]: weir_audio_consumer::Ownership::Lease

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use weir_audio_consumer::{
    Consumer, ConsumerConfig, GapCause, LeaseConfig, StreamEvent, StreamHandler, StreamInfo,
};

use crate::cli::LeaseWorkerArgs;
use crate::error::{Error, ErrorKind, io, nats};
use crate::timeliness::unix_ms;

/// How often the worker writes its view of the leases (the resolution of every
/// ownership time the scenarios report).
pub const LEASE_POLL: Duration = Duration::from_millis(50);

/// The client options of the workers and the failover producers, the same as the
/// consumer crate's lease tests: a dead node is noticed within about a second and
/// another one is tried at once.
pub(crate) fn connect_options() -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .ping_interval(Duration::from_secs(1))
        .retain_servers_order()
        .reconnect_delay_callback(|attempt| Duration::from_millis(50 * attempt.min(10) as u64))
}

type Log = Arc<Mutex<std::fs::File>>;

fn write_line(log: &Log, line: &str) {
    let mut out = log.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = out.write_all(line.as_bytes()) {
        eprintln!("lease-worker: cannot write its log: {e}");
    }
}

struct Recorder {
    stream: String,
    log: Log,
}

impl StreamHandler for Recorder {
    async fn on_event(&mut self, event: StreamEvent) {
        let line = match event {
            StreamEvent::Frame(f) => format!("F {} {}\n", self.stream, f.seq),
            StreamEvent::Gap(g) => {
                let cause = match g.cause {
                    GapCause::Handover => "handover",
                    GapCause::Lost => "lost",
                    _ => "other",
                };
                format!("G {cause} {} {} {}\n", self.stream, g.first_seq, g.last_seq)
            }
            _ => return,
        };
        write_line(&self.log, &line);
    }
}

fn open(path: &std::path::Path) -> Result<Log, Error> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(|f| Arc::new(Mutex::new(f)))
        .map_err(|e| io(path, e))
}

/// Runs the worker until SIGINT or its maximum lifetime.
pub async fn run(args: LeaseWorkerArgs) -> Result<(), Error> {
    let frames = open(&args.frames_log)?;
    let leases_log = open(&args.leases_log)?;
    let addrs = args
        .nats_urls
        .iter()
        .map(|u| {
            u.parse::<async_nats::ServerAddr>()
                .map_err(|e| Error::with_source(ErrorKind::Usage, format!("--nats-urls {u}"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let client = tokio::time::timeout(
        Duration::from_secs(10),
        connect_options()
            .subscription_capacity(65_536)
            .connect(addrs),
    )
    .await
    .map_err(|_| Error::new(ErrorKind::Nats, "cannot connect to NATS within 10 s"))?
    .map_err(|e| nats("cannot connect to NATS", e))?;
    let settings = ConsumerConfig {
        // Streams stay alive across the whole run; frames carry no capture time.
        idle_timeout_ms: 60_000,
        max_frame_age_ms: 0,
        ..ConsumerConfig::leased(
            &args.subject,
            args.partitions,
            LeaseConfig {
                bucket: args.bucket.clone(),
                replicas: args.replicas,
                ttl_ms: args.ttl_ms,
                // The consumer core's renewal interval (3 s), shorter for short TTLs.
                renew_interval_ms: (weir_audio_consumer::DEFAULT_LEASE_RENEW_INTERVAL.as_millis()
                    as u64)
                    .min(args.ttl_ms / 3),
                worker_id: Some(args.id.clone()),
                ..LeaseConfig::default()
            },
        )
    }
    .validate()
    .map_err(|e| Error::new(ErrorKind::Usage, e.to_string()))?;
    let consumer = tokio::time::timeout(
        Duration::from_secs(20),
        Consumer::start(client, settings, move |info: &StreamInfo| Recorder {
            stream: info.stream.clone(),
            log: frames.clone(),
        }),
    )
    .await
    .map_err(|_| Error::new(ErrorKind::Nats, "the consumer did not start within 20 s"))?
    .map_err(|e| Error::new(ErrorKind::Nats, e.to_string()))?;
    write_line(&leases_log, &format!("S {}\n", unix_ms()));
    // Partition → revision, for the partitions held here.
    let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
    let mut tick = crate::scenario::ticker(LEASE_POLL);
    let lifetime = tokio::time::sleep(Duration::from_secs(args.max_lifetime_s));
    tokio::pin!(lifetime);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // Bounded by the lifetime.
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut lifetime => break,
            _ = &mut ctrl_c => break,
        }
        let now = unix_ms();
        let mut lines = String::new();
        for l in consumer.leases() {
            let revision = l.revision.unwrap_or(0);
            // Only what this worker holds, and the moment it stops holding it.
            let held = l.held.then_some(revision);
            let before = match held {
                Some(rev) => seen.insert(l.partition, rev),
                None => seen.remove(&l.partition),
            };
            if before != held {
                lines.push_str(&format!(
                    "L {now} {} {} {revision}\n",
                    l.partition,
                    u8::from(l.held)
                ));
            }
        }
        if !lines.is_empty() {
            write_line(&leases_log, &lines);
        }
    }
    consumer.shutdown(Duration::from_secs(2)).await;
    Ok(())
}
