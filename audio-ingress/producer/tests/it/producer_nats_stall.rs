//! NATS stopped (SIGSTOP) for 5 s while 10 streams push at real-time rate (one 640-byte
//! frame every 20 ms), against a real nats-server.
//!
//! - `close`: pending bytes per stream never exceed the budget; each stream overloads
//!   within `max_wait` + one frame of being continuously full (or earlier, on its age or
//!   publish-timeout bound); the producer is told why; each stream's `end` (with
//!   `Weir-End-Reason: overload` and the `Weir-Overload` report) reaches the consumer
//!   after the server resumes.
//! - `gap`: pending bytes never exceed the budget; the gap markers the consumer receives
//!   account for exactly the frames the producer dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use weir_audio_producer::config::Policy;
use weir_audio_producer::testing::{Collector, STEP, pcm, producer_client, sum};
use weir_audio_producer::{Ingress, PushError, StreamConfig, StreamHandle};
use weir_protocol::audio::extension::{EndReason, Overload, OverloadReason};
use weir_testkit::NatsServer;

const STREAMS: usize = 10;
const FRAME: Duration = Duration::from_millis(20);
const STALL: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Run {
    id: String,
    max_pending: u64,
    /// Start of the last continuous run of `Full` refusals before the overload.
    full_since: Option<Instant>,
    overload: Option<(Instant, Overload)>,
    offered: u64,
    handle: StreamHandle,
}

/// Pushes one frame every 20 ms until `until` (or the overload, if `stop_on_overload`).
async fn produce(handle: StreamHandle, until: Instant, stop_on_overload: bool) -> Run {
    let mut run = Run {
        id: handle.id().to_string(),
        max_pending: 0,
        full_since: None,
        overload: None,
        offered: 0,
        handle,
    };
    let mut tick = tokio::time::interval(FRAME);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < until {
        tick.tick().await;
        run.offered += 1;
        match run.handle.try_push(pcm(run.offered)) {
            Ok(_) => run.full_since = None,
            Err(PushError::Full { .. }) => {
                run.full_since.get_or_insert_with(Instant::now);
            }
            Err(PushError::Overloaded(o)) => {
                run.overload.get_or_insert((Instant::now(), o));
                if stop_on_overload {
                    break;
                }
            }
            Err(e) => panic!("{}: unexpected {e}", run.id),
        }
        run.max_pending = run.max_pending.max(run.handle.snapshot().pending_bytes);
    }
    run
}

/// Frames may arrive out of order across a reconnect (frames stuck in the server's
/// read buffer of the old connection are routed after the new connection's), so the
/// tests check for duplicates and seqs beyond the end, and report reordering.
fn assert_no_duplicates_and_end_last(id: &str, log: &weir_audio_producer::testing::StreamLog) {
    let end = log.end.as_ref().expect("end").packet.seq;
    let mut seen = std::collections::HashSet::new();
    for s in &log.frames {
        assert!(seen.insert(*s), "{id}: seq {s} twice");
        assert!(*s < end, "{id}: frame {s} beyond the end {end}");
    }
    let reordered = log.seqs.windows(2).filter(|w| w[0] > w[1]).count();
    if reordered > 0 {
        eprintln!("{id}: {reordered} out-of-order arrivals (across the reconnect)");
    }
}

async fn stall_for(server: &NatsServer, d: Duration) -> (Instant, Instant) {
    server.pause().expect("pause");
    let paused = Instant::now();
    tokio::time::sleep(d).await;
    server.resume().expect("resume");
    (paused, Instant::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stopped_5s_close_policy_overloads_within_max_wait_and_ends_reach_the_consumer() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let client = producer_client(server.url(), 64).await;
    let cfg = StreamConfig::default();
    let (max_bytes, max_wait) = (cfg.max_bytes() as u64, cfg.max_wait());
    let ingress = Ingress::new(client, cfg);

    let until = Instant::now() + Duration::from_secs(9);
    let producers: Vec<_> = (0..STREAMS)
        .map(|i| {
            let h = ingress
                .open(&format!("stall-close-{i}"), None)
                .expect("open");
            tokio::spawn(produce(h, until, true))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (paused, resumed) = stall_for(&server, STALL).await;

    let mut runs = Vec::new();
    for p in producers {
        runs.push(
            tokio::time::timeout(STEP, p)
                .await
                .expect("in time")
                .expect("task"),
        );
    }
    assert!(
        collector.wait_ends(STREAMS, Duration::from_secs(15)).await,
        "every stream's end reaches the consumer after resume"
    );
    let logs = collector.logs();
    for run in &runs {
        let snap = run.handle.snapshot();
        assert!(
            run.max_pending <= max_bytes,
            "{}: {} pending",
            run.id,
            run.max_pending
        );
        assert!(snap.pending_bytes_high_water <= max_bytes, "{snap:?}");
        let (at, report) = run.overload.clone().expect("the close policy fired");
        eprintln!(
            "{}: overload {:?} after pause ({:?}, {} bytes pending), full for {:?} before",
            run.id,
            at - paused,
            report.reason,
            report.pending_bytes,
            run.full_since.map(|f| at - f)
        );
        assert!(
            at > paused && at < resumed,
            "{}: overload during the stall",
            run.id
        );
        if let Some(full_since) = run.full_since {
            assert!(
                at - full_since <= max_wait + FRAME + Duration::from_millis(10),
                "{}: full for {:?} before the overload",
                run.id,
                at - full_since
            );
        }
        let log = &logs[&run.id];
        let end = log.end.as_ref().expect("end");
        assert_eq!(end.ext.end_reason, Some(EndReason::Overload), "{}", run.id);
        let header = end.ext.overload.clone().expect("Weir-Overload header");
        assert_eq!(header.reason, report.reason);
        assert_eq!((header.max_bytes, header.max_age_ms), (16_000, 500));
        // The end takes the next seq after the last admitted frame.
        assert_eq!(end.packet.seq, snap.frames.admitted + 1, "{}", run.id);
        // Producer accounting: every frame offered is published or counted with a reason.
        let f = &snap.frames;
        assert_eq!(f.offered, run.offered);
        assert_eq!(
            f.offered,
            f.published + f.possibly_lost + sum(&f.dropped),
            "{f:?}"
        );
        // Stall detection: when the publish timeout tripped the policy, the frames that
        // piled up meanwhile show how long the stream had been stuck: at most max_wait
        // plus one frame of cadence, plus the frame in flight (one more frame of slack
        // for scheduling jitter on a loaded machine).
        if report.reason == OverloadReason::PublishTimeout {
            let frames = (max_wait.as_millis() / FRAME.as_millis()) as u64 + 2;
            assert!(
                report.pending_bytes <= 640 * (frames + 1),
                "{}: {} bytes pending at the overload",
                run.id,
                report.pending_bytes
            );
        }
        assert_no_duplicates_and_end_last(&run.id, log);
    }
    let stats = ingress.stats();
    assert_eq!(stats.overloads, STREAMS as u64);
    assert_eq!(stats.pending_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stopped_5s_gap_policy_markers_account_for_exactly_the_dropped_frames() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let client = producer_client(server.url(), 64).await;
    let cfg = StreamConfig::builder()
        .policy(Policy::Gap)
        .extended_consumers(true)
        .build()
        .expect("cfg");
    let max_bytes = cfg.max_bytes() as u64;
    let ingress = Arc::new(Ingress::new(client, cfg));

    // 1 s before, 5 s stalled, 2 s after.
    let until = Instant::now() + Duration::from_secs(8);
    let producers: Vec<_> = (0..STREAMS)
        .map(|i| {
            let h = ingress.open(&format!("stall-gap-{i}"), None).expect("open");
            tokio::spawn(produce(h, until, false))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stall_for(&server, STALL).await;

    let mut summaries = Vec::new();
    for p in producers {
        let run = tokio::time::timeout(STEP, p)
            .await
            .expect("in time")
            .expect("task");
        assert!(
            run.max_pending <= max_bytes,
            "{}: {} pending",
            run.id,
            run.max_pending
        );
        assert!(run.overload.is_none());
        let summary = tokio::time::timeout(STEP, run.handle.finish())
            .await
            .expect("finish in time");
        summaries.push((run.id, run.offered, summary));
    }
    assert!(collector.wait_ends(STREAMS, Duration::from_secs(10)).await);
    let logs = collector.logs();
    let mut total_gap_frames = 0;
    for (id, offered, summary) in &summaries {
        let snap = &summary.snapshot;
        assert!(snap.pending_bytes_high_water <= max_bytes, "{snap:?}");
        let f = &snap.frames;
        assert_eq!(f.offered, *offered);
        assert_eq!(f.offered, f.admitted, "gap never refuses");
        // Every reason a `gap` stream drops an admitted frame into a marker: evicted from
        // the queue, too old, timed out, or (budget held by frames the server has not
        // confirmed yet) admitted straight into a marker.
        let dropped = f.dropped["evicted"]
            + f.dropped["max_age"]
            + f.dropped["publish_timeout"]
            + f.dropped["unconfirmed"];
        assert_eq!(f.published + f.possibly_lost + dropped, f.admitted, "{f:?}");
        let log = &logs[id];
        let end = log.end.as_ref().expect("end");
        assert_eq!(end.ext.end_reason, Some(EndReason::Producer));
        assert_eq!(end.packet.seq, f.admitted + 1);
        // The markers account for exactly the frames the producer dropped.
        assert_eq!(log.gap_frames(), dropped, "{id}: markers vs drops");
        for g in &log.gaps {
            assert_eq!(g.samples, g.frames() * 320, "{g:?}");
        }
        assert_no_duplicates_and_end_last(id, log);
        // Whatever else is missing was lost in transit (handed to the client, lost in
        // the socket across the reconnect): never more than what the ingress declared
        // possibly lost, and the `end` carries that total.
        let missing = log.missing().len() as u64;
        assert_eq!(
            log.frames.len() as u64 + missing,
            f.published + f.possibly_lost,
            "{id}"
        );
        assert!(missing <= f.possibly_lost, "{id}: undeclared loss {f:?}");
        assert_eq!(
            end.ext.possibly_lost.as_ref().map_or(0, |d| d.total_frames),
            f.possibly_lost,
            "{id}: the end reports the possible loss"
        );
        eprintln!(
            "{id}: offered {offered}, published {}, dropped into gaps {dropped} ({} markers), lost in transit {missing}",
            f.published,
            log.gaps.len()
        );
        total_gap_frames += dropped;
    }
    assert!(
        total_gap_frames > 0,
        "the gap policy fired during the stall"
    );
}
