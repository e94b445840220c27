//! Lease ownership on a real 3-node nats-server cluster (JetStream R3 bucket): a worker
//! crash, a worker joining, and the KV stream's leader node SIGKILLed.
//!
//! Each worker is a separate [`Consumer`] on its own NATS connection (to a different
//! node first). A crash is [`Consumer::abort`]: every task of the worker stops at once
//! and its connection is dropped, so it stops heartbeating, renewing and delivering
//! without releasing anything — what the rest of the cluster sees of a SIGKILL.
//!
//! Every handler writes what it was handed into one shared log: (worker, stream
//! instance, stream, seq) for frames and the range of every handover gap. The checks
//! use the frames' own (stream, seq): a pair handed to two workers is a double
//! delivery; a seq neither handed to anyone nor inside a declared gap is an undetected
//! hole.
//!
//! The scenarios run one after another (nextest test group `lease-cluster`,
//! `.config/nextest.toml`): each starts a cluster and several hundred streams against
//! 1.5 s heartbeat timeouts, and two at once on 2 cores would measure the machine. Alone:
//! `cargo nextest run -p weir-audio-consumer -E 'test(/^lease_cluster::/)' --no-capture`

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use weir_audio_consumer::testing::pcm;
use weir_audio_consumer::{
    Consumer, ConsumerConfig, GapCause, LeaseConfig, StreamEvent, StreamHandler, StreamInfo,
};
use weir_protocol::audio::Packet;
use weir_protocol::fnv1a_32;
use weir_testkit::NatsCluster;

const PARTITIONS: u32 = 64;
const SUBJECT: &str = "audio.{partition}.{stream}";
/// Streams publishing during every scenario.
const STREAMS: usize = 200;
/// One frame per stream per tick (10 frames/s per stream: 2,000 messages/s in all,
/// which this 2-core machine sustains next to 3 servers and 4 workers in debug builds).
const FRAME_EVERY: Duration = Duration::from_millis(100);
const BUCKET: &str = "weir_leases";

#[derive(Debug, Clone)]
enum Rec {
    Frame {
        worker: usize,
        instance: u64,
        stream: String,
        seq: u64,
        at: Instant,
    },
    Handover {
        stream: String,
        first: u64,
        last: u64,
    },
}

type Log = Arc<Mutex<Vec<Rec>>>;

struct Recorder {
    worker: usize,
    info: StreamInfo,
    log: Log,
}

impl StreamHandler for Recorder {
    async fn on_event(&mut self, event: StreamEvent) {
        let rec = match event {
            StreamEvent::Frame(f) => Rec::Frame {
                worker: self.worker,
                instance: self.info.instance,
                stream: self.info.stream.clone(),
                seq: f.seq,
                at: Instant::now(),
            },
            StreamEvent::Gap(g) if g.cause == GapCause::Handover => Rec::Handover {
                stream: self.info.stream.clone(),
                first: g.first_seq,
                last: g.last_seq,
            },
            _ => return,
        };
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
    }
}

fn options() -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .ping_interval(Duration::from_secs(1))
        .retain_servers_order()
        .reconnect_delay_callback(|attempt| Duration::from_millis(50 * attempt.min(10) as u64))
}

/// The cluster's URLs starting at node `first` (so workers spread over the nodes).
fn addrs(cluster: &NatsCluster, first: usize) -> Vec<async_nats::ServerAddr> {
    let urls = cluster.urls();
    (0..urls.len())
        .map(|i| urls[(first + i) % urls.len()].parse().expect("url"))
        .collect()
}

async fn start_worker(cluster: &NatsCluster, worker: usize, log: &Log) -> Consumer {
    start_worker_with(cluster, worker, log, LeaseConfig::default()).await
}

async fn start_worker_with(
    cluster: &NatsCluster,
    worker: usize,
    log: &Log,
    base: LeaseConfig,
) -> Consumer {
    let lease = LeaseConfig {
        bucket: BUCKET.into(),
        replicas: 3,
        worker_id: Some(format!("w{worker}")),
        ..base
    };
    let settings = ConsumerConfig {
        idle_timeout_ms: 30_000,
        // Loopback, one host: frames carry no capture time anyway.
        max_frame_age_ms: 0,
        ..ConsumerConfig::leased(SUBJECT, PARTITIONS, lease)
    }
    .validate()
    .expect("valid");
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        options().connect(addrs(cluster, worker % cluster.len())),
    )
    .await
    .expect("connect in time")
    .expect("connect");
    let log = log.clone();
    tokio::time::timeout(
        Duration::from_secs(15),
        Consumer::start(client, settings, move |info: &StreamInfo| Recorder {
            worker,
            info: info.clone(),
            log: log.clone(),
        }),
    )
    .await
    .expect("start in time")
    .expect("start")
}

/// Held partitions per live worker (`None` for a worker that was aborted).
fn spread(workers: &[Option<Consumer>]) -> Vec<Option<Vec<u32>>> {
    workers
        .iter()
        .map(|w| w.as_ref().map(|c| c.owned_now()))
        .collect()
}

/// Waits (bounded) until the live workers hold every partition exactly once with
/// counts in `lo..=hi`.
async fn wait_spread(workers: &[Option<Consumer>], lo: usize, hi: usize, bound: Duration) {
    let deadline = Instant::now() + bound;
    loop {
        let s = spread(workers);
        let counts: Vec<usize> = s.iter().flatten().map(|p| p.len()).collect();
        let all: BTreeSet<u32> = s.iter().flatten().flatten().copied().collect();
        let total: usize = counts.iter().sum();
        if total == PARTITIONS as usize
            && all.len() == PARTITIONS as usize
            && counts.iter().all(|c| (lo..=hi).contains(c))
        {
            println!("spread {counts:?}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no spread within {lo}..={hi} after {bound:?}: {counts:?}, {} distinct",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes one frame per stream every [`FRAME_EVERY`] until `stop`, then an `end`
/// per stream; returns the last frame seq of every stream.
fn start_producers(
    cluster: &NatsCluster,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<HashMap<String, u64>> {
    let addrs = addrs(cluster, 0);
    tokio::spawn(async move {
        let client = options().connect(addrs).await.expect("producer connects");
        let streams: Vec<(String, String)> = (0..STREAMS)
            .map(|i| {
                let id = format!("call-{i:03}");
                let p = fnv1a_32(id.as_bytes()) % PARTITIONS;
                (id.clone(), format!("audio.{p}.{id}"))
            })
            .collect();
        let mut seq = 0u64;
        let mut tick = tokio::time::interval(FRAME_EVERY);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            seq += 1;
            for (_, subject) in &streams {
                let payload = Packet::frame(seq, pcm(seq)).encode().expect("encodable");
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    client.publish(subject.clone(), payload),
                )
                .await;
            }
        }
        for (_, subject) in &streams {
            let payload = Packet::end(seq + 1).encode().expect("encodable");
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                client.publish(subject.clone(), payload),
            )
            .await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), client.flush()).await;
        streams.into_iter().map(|(id, _)| (id, seq)).collect()
    })
}

#[derive(Debug, Default)]
struct Audit {
    frames_handed: usize,
    double_deliveries: usize,
    handover_declared: u64,
    /// Seqs handed to nobody and inside no handover gap.
    undeclared: u64,
    /// Seqs handed to nobody, inside a handover gap: what the handover really lost
    /// (the gap also covers what the previous owner handled before it).
    lost_in_handover: u64,
    /// Windows of two workers' instances of one stream that overlap in time.
    concurrent_instances: usize,
}

/// First and last hand-over time of each (worker, instance) of one stream.
type Windows = BTreeMap<(usize, u64), (Instant, Instant)>;

fn audit(log: &Log, last_seq: &HashMap<String, u64>) -> Audit {
    let recs = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut handed: HashMap<(&str, u64), BTreeSet<usize>> = HashMap::new();
    let mut declared: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    let mut windows: HashMap<&str, Windows> = HashMap::new();
    let mut a = Audit::default();
    for r in &recs {
        match r {
            Rec::Frame {
                worker,
                instance,
                stream,
                seq,
                at,
            } => {
                a.frames_handed += 1;
                handed
                    .entry((stream.as_str(), *seq))
                    .or_default()
                    .insert(*worker);
                let w = windows
                    .entry(stream.as_str())
                    .or_default()
                    .entry((*worker, *instance))
                    .or_insert((*at, *at));
                w.0 = w.0.min(*at);
                w.1 = w.1.max(*at);
            }
            Rec::Handover {
                stream,
                first,
                last,
                ..
            } => {
                a.handover_declared += last - first + 1;
                declared
                    .entry(stream.as_str())
                    .or_default()
                    .push((*first, *last));
            }
        }
    }
    a.double_deliveries = handed.values().filter(|w| w.len() > 1).count();
    // Where the undetected holes are, for the reader of a failure.
    let mut holes: BTreeMap<(u32, &str), (u64, u64)> = BTreeMap::new();
    for (stream, &last) in last_seq {
        let ranges = declared.get(stream.as_str());
        for seq in 1..=last {
            let got = handed.contains_key(&(stream.as_str(), seq));
            let covered = ranges.is_some_and(|r| r.iter().any(|(f, l)| (*f..=*l).contains(&seq)));
            if !got && !covered {
                a.undeclared += 1;
                let p = fnv1a_32(stream.as_bytes()) % PARTITIONS;
                let e = holes.entry((p, stream.as_str())).or_insert((seq, seq));
                e.1 = seq;
            }
            if !got && covered {
                a.lost_in_handover += 1;
            }
        }
    }
    for ((p, stream), (first, last)) in holes.iter().take(12) {
        let who: BTreeSet<usize> = handed
            .iter()
            .filter(|((s, _), _)| s == stream)
            .flat_map(|(_, w)| w.iter().copied())
            .collect();
        println!(
            "undeclared: {stream} (partition {p}) seqs within {first}..={last}, handed by {who:?}, gaps {:?}",
            declared.get(stream)
        );
    }
    for per_stream in windows.values() {
        let mut w: Vec<(Instant, Instant, usize)> = per_stream
            .iter()
            .map(|((wk, _), (s, e))| (*s, *e, *wk))
            .collect();
        w.sort();
        for pair in w.windows(2) {
            if pair[1].0 < pair[0].1 && pair[1].2 != pair[0].2 {
                a.concurrent_instances += 1;
            }
        }
    }
    a
}

async fn finish(
    workers: Vec<Option<Consumer>>,
    stop: Arc<AtomicBool>,
    producers: tokio::task::JoinHandle<HashMap<String, u64>>,
) -> HashMap<String, u64> {
    stop.store(true, Ordering::Relaxed);
    let last = tokio::time::timeout(Duration::from_secs(10), producers)
        .await
        .expect("producers stop in time")
        .expect("producers");
    // Let the ends arrive and the handlers drain.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for w in workers.into_iter().flatten() {
        w.shutdown(Duration::from_secs(2)).await;
    }
    last
}

/// Three lease workers on `cluster`, balanced (⌈64/3⌉ ± 1, and nobody two below
/// another: 22 + 21 + 21), then the producers: the start of the failover and join
/// scenarios.
async fn three_balanced_workers_and_producers(
    cluster: &NatsCluster,
    log: &Log,
) -> (
    Vec<Option<Consumer>>,
    Arc<AtomicBool>,
    tokio::task::JoinHandle<HashMap<String, u64>>,
) {
    let mut workers = Vec::new();
    for w in 0..3 {
        workers.push(Some(start_worker(cluster, w, log).await));
    }
    wait_spread(&workers, 21, 22, Duration::from_secs(15)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let producers = start_producers(cluster, stop.clone());
    (workers, stop, producers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_s_partitions_are_taken_over_within_3_s_without_double_delivery() {
    let cluster = NatsCluster::start(3).expect("cluster");
    let log: Log = Arc::default();
    let (mut workers, stop, producers) = three_balanced_workers_and_producers(&cluster, &log).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // SIGKILL-equivalent of worker 0.
    let victim = workers[0].take().expect("worker 0");
    let orphans: BTreeSet<u32> = victim.owned_now().into_iter().collect();
    let killed_at = Instant::now();
    victim.abort();
    let mut owned_again: BTreeMap<u32, Duration> = BTreeMap::new();
    let deadline = killed_at + Duration::from_secs(15);
    while owned_again.len() < orphans.len() {
        for w in workers.iter().flatten() {
            for p in w.owned_now() {
                if orphans.contains(&p) && !owned_again.contains_key(&p) {
                    owned_again.insert(p, killed_at.elapsed());
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "orphans not owned again: {:?}",
            orphans
                .difference(&owned_again.keys().copied().collect())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let times: Vec<Duration> = owned_again.values().copied().collect();
    let max = times.iter().max().copied().unwrap_or_default();
    let min = times.iter().min().copied().unwrap_or_default();
    println!(
        "worker 0 killed holding {} partitions; owned again after min {min:?}, max {max:?}",
        orphans.len()
    );
    wait_spread(&workers, 32, 32, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let last = finish(workers, stop, producers).await;
    let a = audit(&log, &last);
    println!("{a:?}");
    assert!(max <= Duration::from_secs(3), "takeover took {max:?}");
    assert_eq!(a.double_deliveries, 0, "{a:?}");
    assert_eq!(a.concurrent_instances, 0, "{a:?}");
    assert_eq!(
        a.undeclared, 0,
        "every frame not handed over is declared: {a:?}"
    );
    assert!(
        a.handover_declared > 0,
        "the takeover declared its gaps: {a:?}"
    );
    assert!(a.frames_handed > STREAMS * 30, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_worker_takes_its_share_gradually_without_concurrent_handling() {
    let cluster = NatsCluster::start(3).expect("cluster");
    let log: Log = Arc::default();
    let (mut workers, stop, producers) = three_balanced_workers_and_producers(&cluster, &log).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let joined_at = Instant::now();
    workers.push(Some(start_worker(&cluster, 3, &log).await));
    // ⌈64/4⌉ ± 1.
    wait_spread(&workers, 15, 17, Duration::from_secs(20)).await;
    println!(
        "4th worker joined; spread converged after {:?}",
        joined_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    let last = finish(workers, stop, producers).await;
    let a = audit(&log, &last);
    println!("{a:?}");
    assert_eq!(a.double_deliveries, 0, "{a:?}");
    assert_eq!(a.concurrent_instances, 0, "{a:?}");
    assert_eq!(a.undeclared, 0, "{a:?}");
    assert!(
        a.handover_declared > 0,
        "moved streams declared their gaps: {a:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_kv_leader_node_changes_no_owner_and_renewals_resume() {
    let cluster = NatsCluster::start(3).expect("cluster");
    let log: Log = Arc::default();
    let mut workers = Vec::new();
    // The default timing (TTL 15 s): on nats-server 2.9.10 no KV write succeeded for
    // up to ~8.7 s after the leader's SIGKILL, which the former default of 10 s did not
    // always ride out (8 runs of 23 fenced). See docs/scale-out.md.
    let lease = LeaseConfig::default();
    for w in 0..3 {
        workers.push(Some(
            start_worker_with(&cluster, w, &log, lease.clone()).await,
        ));
    }
    // ⌈64/3⌉ ± 1, and nobody two below another (22 + 21 + 21).
    wait_spread(&workers, 21, 22, Duration::from_secs(15)).await;
    let owners = |ws: &[Option<Consumer>]| -> BTreeMap<u32, (usize, u64)> {
        ws.iter()
            .enumerate()
            .filter_map(|(i, w)| w.as_ref().map(|w| (i, w)))
            .flat_map(|(i, w)| {
                w.leases()
                    .into_iter()
                    .filter(|l| l.held)
                    .map(move |l| (l.partition, (i, l.revision.unwrap_or(0))))
            })
            .collect()
    };
    let before = owners(&workers);
    assert_eq!(before.len(), PARTITIONS as usize);
    let leader = cluster
        .wait_stream_leader(&format!("KV_{BUCKET}"), Duration::from_secs(5))
        .expect("KV leader");
    println!("KV_{BUCKET} led by {}; SIGKILL", cluster.name(leader));
    let killed_at = Instant::now();
    cluster.node(leader).kill().expect("kill");

    // For longer than the TTL: never an owner change, and every lease renewed again.
    // A partition's renewals resumed once its revision changed twice after the kill
    // (the first change may be a renewal sent before it).
    let mut changes: BTreeMap<u32, (u64, usize)> =
        before.iter().map(|(p, (_, rev))| (*p, (*rev, 0))).collect();
    let mut resumed: BTreeMap<u32, Duration> = BTreeMap::new();
    while killed_at.elapsed() < Duration::from_secs(16) {
        let now = owners(&workers);
        for (p, (w, rev)) in &now {
            let (w0, _) = before[p];
            assert_eq!(
                *w,
                w0,
                "partition {p} changed owner after {:?}",
                killed_at.elapsed()
            );
            let c = changes.entry(*p).or_insert((*rev, 0));
            if *rev != c.0 {
                *c = (*rev, c.1 + 1);
            }
            if c.1 >= 2 && !resumed.contains_key(p) {
                resumed.insert(*p, killed_at.elapsed());
            }
        }
        if now.len() != PARTITIONS as usize {
            let missing: Vec<(u32, usize)> = before
                .iter()
                .filter(|(p, _)| !now.contains_key(p))
                .map(|(p, (w, _))| (*p, *w))
                .collect();
            let w = missing[0].1;
            let view = workers[w].as_ref().map(|c| c.leases()).unwrap_or_default();
            panic!(
                "fenced after {:?}: {missing:?}; worker {w} sees {:?}",
                killed_at.elapsed(),
                &view[..4.min(view.len())]
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let max = resumed.values().max().copied().unwrap_or_default();
    println!(
        "renewals resumed on {}/{} partitions, the last after {max:?}",
        resumed.len(),
        PARTITIONS
    );
    assert_eq!(
        resumed.len(),
        PARTITIONS as usize,
        "renewals resumed everywhere"
    );
    for w in workers.into_iter().flatten() {
        w.shutdown(Duration::from_secs(2)).await;
    }
}
