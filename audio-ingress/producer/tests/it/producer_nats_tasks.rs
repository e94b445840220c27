//! Task count and recovery against a real nats-server.
//!
//! - 100,000 frames through 10 streams: the tokio task count (runtime metrics
//!   `num_alive_tasks`) stays at streams + a constant while the frames flow, and falls
//!   back when the streams end; every frame is published and received.
//! - The server is killed and restarted mid-stream: publishers recover (frames after the
//!   restart arrive on every stream), whatever was lost is visible to the consumer as
//!   missing sequence numbers, and the producer's own accounting is complete.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use weir_audio_producer::testing::{Collector, STEP, pcm, producer_client, sum, wait_until};
use weir_audio_producer::{Ingress, StreamConfig};
use weir_protocol::audio::extension::EndReason;
use weir_testkit::NatsServer;

const STREAMS: usize = 10;
const FRAMES_PER_STREAM: u64 = 10_000;

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_frames_through_ten_streams_keep_tasks_at_streams_plus_a_constant() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let client = producer_client(server.url(), 1024).await;
    // A generous wait so a loaded CI machine does not turn a scheduling hiccup into an
    // overload; this test is about tasks, not budgets.
    let cfg = StreamConfig::builder()
        .max_wait(Duration::from_millis(500))
        .publish_timeout(Duration::from_millis(500))
        // Pushed as fast as possible, far above real time: no rate bound here.
        .max_rate_permille(0)
        .build()
        .expect("cfg");
    let ingress = Ingress::new(client, cfg);

    // Sample the task count in a dedicated task (counted in the baseline).
    let max_seen = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (max_seen, stop) = (Arc::clone(&max_seen), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                max_seen.fetch_max(alive_tasks(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let baseline = alive_tasks();
    max_seen.store(baseline, Ordering::Relaxed);

    let handles: Vec<_> = (0..STREAMS)
        .map(|i| ingress.open(&format!("tasks-{i}"), None).expect("open"))
        .collect();
    let with_streams = alive_tasks();
    // All producers run inside this one test task (no task per producer either).
    let pushes = handles.iter().map(|h| async move {
        for seq in 1..=FRAMES_PER_STREAM {
            h.push(pcm(seq)).await.expect("admitted");
        }
    });
    tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(pushes))
        .await
        .expect("pushed in time");
    let during = max_seen.load(Ordering::Relaxed);
    let mut published = 0;
    for h in handles {
        let summary = tokio::time::timeout(STEP, h.finish())
            .await
            .expect("finish");
        assert!(summary.snapshot.end_delivered);
        published += summary.snapshot.frames.published;
    }
    stop.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    let after = alive_tasks();
    eprintln!(
        "tasks: baseline {baseline}, with {STREAMS} streams {with_streams}, max while pushing {during}, after {after}"
    );
    // One task per stream, plus the connection's confirmation-window task.
    assert_eq!(with_streams, baseline + STREAMS + 1, "one task per stream");
    assert!(
        during <= baseline + STREAMS + 3,
        "task count depends on streams, not frames: max {during} vs baseline {baseline}"
    );
    assert!(
        after <= baseline + 1,
        "publisher tasks exit with their streams (the window task lives with the ingress)"
    );
    assert_eq!(published, STREAMS as u64 * FRAMES_PER_STREAM);

    let stats = ingress.stats();
    assert_eq!(stats.frames.offered, STREAMS as u64 * FRAMES_PER_STREAM);
    assert_eq!(stats.frames.published, stats.frames.offered);
    assert_eq!(sum(&stats.frames.dropped), 0);
    assert_eq!(
        stats.queue_wait_ms.count,
        STREAMS as u64 * FRAMES_PER_STREAM
    );
    assert!(collector.wait_ends(STREAMS, STEP).await);
    let expected = STREAMS as u64 * (FRAMES_PER_STREAM + 1);
    assert!(wait_until(STEP, || collector.total() >= expected).await);
    for (id, log) in collector.logs() {
        assert_eq!(log.frames.len() as u64, FRAMES_PER_STREAM, "{id}");
        assert!(log.in_order(), "{id}");
        assert!(log.missing().is_empty(), "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted_mid_stream_publishers_recover_and_losses_are_visible() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    // A budget of 3 s: the outage (500 ms + reconnect) fits in it, so the streams
    // survive and the test is about recovery and loss accounting. (With the default
    // 500 ms budget the same outage overloads them: audio that old is stale.)
    let client = producer_client(server.url(), 1024).await;
    let cfg = StreamConfig::builder()
        .max_age(Duration::from_secs(3))
        .max_bytes(96_000)
        .max_rate_permille(0) // faster than real time on purpose
        .build()
        .expect("cfg");
    let ingress = Arc::new(Ingress::new(client, cfg));
    let streams = 5;
    let run_for = Duration::from_secs(4);
    let producers: Vec<_> = (0..streams)
        .map(|i| {
            let h = ingress.open(&format!("restart-{i}"), None).expect("open");
            tokio::spawn(async move {
                let until = tokio::time::Instant::now() + run_for;
                let mut tick = tokio::time::interval(Duration::from_millis(20));
                let mut seq = 0;
                let mut refused = 0;
                while tokio::time::Instant::now() < until {
                    tick.tick().await;
                    seq += 1;
                    if h.try_push(pcm(seq)).is_err() {
                        refused += 1;
                    }
                }
                (h, seq, refused)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before_kill: Vec<u64> = (0..streams)
        .map(|i| {
            collector
                .log(&format!("restart-{i}"))
                .frames
                .last()
                .copied()
                .unwrap_or(0)
        })
        .collect();
    server.kill().expect("kill");
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.restart().expect("restart");

    for (i, p) in producers.into_iter().enumerate() {
        let (h, offered, refused) = tokio::time::timeout(STEP, p)
            .await
            .expect("in time")
            .expect("task");
        let summary = tokio::time::timeout(STEP, h.finish())
            .await
            .expect("finish");
        let f = &summary.snapshot.frames;
        assert_eq!(f.offered, offered);
        assert_eq!(
            f.offered,
            f.published + f.possibly_lost + sum(&f.dropped),
            "{f:?}"
        );
        assert_eq!(
            sum(&f.dropped),
            refused,
            "every producer-side drop is a counted refusal: {f:?}"
        );
        assert!(summary.snapshot.end_delivered, "restart-{i}");
    }
    assert!(
        collector.wait_ends(streams, STEP).await,
        "every end arrives after the restart"
    );
    for (i, before) in before_kill.iter().enumerate() {
        let id = format!("restart-{i}");
        let log = collector.log(&id);
        let end = log.end.as_ref().expect("end");
        assert_eq!(end.ext.end_reason, Some(EndReason::Producer));
        // Publishers recovered: frames published after the restart arrived.
        let after_restart = log.frames.iter().filter(|s| **s > before + 50).count();
        assert!(
            after_restart > 50,
            "{id}: {after_restart} frames after the restart"
        );
        // Whatever did not arrive is visible to the consumer as missing seqs, and the
        // ingress declared a possible loss around them (the end carries the total and
        // the last range). The collector's own connection went down with the server
        // too: frames the restarted server received (and confirmed) before the
        // collector re-subscribed are missing for it alone — NATS does not buffer for
        // absent subscribers — so the check is that the declared range overlaps the
        // missing run, not that it covers every missing seq.
        // Every declaration counts, not only the end's: a consumer re-labels holes by
        // each packet's `Weir-Possibly-Lost` as it arrives.
        let missing = log.missing();
        let declared = end.ext.possibly_lost.clone();
        let total_declared = declared.as_ref().map_or(0, |d| d.total_frames);
        if let (Some(first), Some(last)) = (missing.first(), missing.last()) {
            assert!(declared.is_some(), "{id}: a loss was declared on the end");
            assert!(
                log.declarations
                    .iter()
                    .any(|(_, d)| d.first_seq <= *last && *first <= d.last_seq),
                "{id}: missing {first}..={last}, declarations (carrier seq, range): {:?}",
                log.declarations
            );
        }
        assert_eq!(
            log.frames.len() + missing.len() + log.gap_frames() as usize,
            end.packet.seq as usize - 1,
            "{id}"
        );
        eprintln!(
            "{id}: end seq {}, received {}, missing (lost in transit) {}, declared possibly lost {total_declared}",
            end.packet.seq,
            log.frames.len(),
            missing.len()
        );
    }
}
