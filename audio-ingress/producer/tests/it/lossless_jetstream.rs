//! Lossless mode end to end: nats-server with JetStream
//! and a **file** store is killed (SIGKILL) and restarted during a 50-stream run at the
//! real 20 ms cadence; the consumer core reads through ordered JetStream consumers.
//!
//! Asserted: every frame the ingress admitted and published (its stats: nothing
//! dropped) reaches the handler **exactly once and in order** per stream; every
//! stream's `end` arrives; the JetStream stream holds each packet once (the retries
//! with the same `Nats-Msg-Id` were deduplicated) with no hole in its sequence (the
//! file store survived the kill).
//!
//! The budget is sized for the outage: `max_age` 3 s and `max_bytes` 96,000 (3 s of
//! audio). The outage a stream sees is the kill→restart gap (750 ms) plus the client's
//! reconnect backoff and JetStream's recovery of the store (≈ 1.1 s measured); with the
//! default 500 ms budget every stream would (correctly) overload with `max_age` and the
//! test would measure the budget, not the delivery. Frames delayed by the outage are
//! ~1.1 s old when they arrive, so the consumer's staleness guard is set above the
//! ingress budget (10 s): in lossless mode late is not lost.
//!
//! Run against another server with `NATS_SERVER_BIN=/path/to/nats-server`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use tokio::time::Instant;
use weir_audio_consumer::{
    Consumer, ConsumerConfig, ConsumerSource, EndCause, StreamEvent, StreamHandler, StreamInfo,
};
use weir_audio_producer::jetstream::{JetStreamSettings, JetStreamSink};
use weir_audio_producer::{Delivery, Ingress, PushError, StreamConfig};
use weir_testkit::{NatsServer, NatsServerOptions};

use weir_audio_producer::testing::{STEP, pcm, producer_client};

const STREAMS: usize = 50;
const RUN: Duration = Duration::from_secs(8);
const KILL_AT: Duration = Duration::from_secs(3);
const DOWN_FOR: Duration = Duration::from_millis(750);
const CADENCE: Duration = Duration::from_millis(20);
const JS_STREAM: &str = "WEIR_AUDIO";
const SUBJECT: &str = "lossless.audio.{stream}";

/// What one stream's handler saw.
#[derive(Debug, Default)]
struct Seen {
    frames: Vec<u64>,
    gaps: Vec<(u64, u64)>,
    end: Option<(Option<u64>, EndCause)>,
    instances: u64,
    /// Worst capture → handler delay, ms.
    max_delay_ms: u64,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

type Log = Arc<Mutex<HashMap<String, Seen>>>;

struct Recorder {
    stream: String,
    log: Log,
}

impl StreamHandler for Recorder {
    async fn on_event(&mut self, event: StreamEvent) {
        let mut log = self.log.lock().expect("log");
        let seen = log.entry(self.stream.clone()).or_default();
        match event {
            StreamEvent::Frame(f) => {
                seen.frames.push(f.seq);
                if let Some(at) = f.captured_at_ms {
                    seen.max_delay_ms = seen.max_delay_ms.max(unix_ms().saturating_sub(at));
                }
            }
            StreamEvent::Gap(g) => seen.gaps.push((g.first_seq, g.last_seq)),
            StreamEvent::End(e) => seen.end = Some((e.seq, e.cause)),
            StreamEvent::LossDeclared(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_restart_with_file_store_loses_nothing_and_duplicates_nothing() {
    let server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("nats-server with JetStream (scripts/ensure-nats-server)");
    let version = weir_testkit::binary::version_of(server.binary()).expect("version");
    println!("nats-server {version} at {}", server.binary().display());
    let url = server.url().to_owned();

    // Producer side: the ingress publishing into JetStream (stream created here).
    let client = producer_client(&url, 2_048).await;
    let cfg = StreamConfig::builder()
        .subject(SUBJECT)
        .delivery(Delivery::JetStream)
        .jetstream_stream(JS_STREAM)
        .max_bytes(96_000)
        .max_age(Duration::from_secs(3))
        .publish_timeout(Duration::from_millis(250))
        .build()
        .expect("stream config");
    let settings: JetStreamSettings = cfg.jetstream();
    let sink = tokio::time::timeout(
        STEP,
        JetStreamSink::new(client.clone(), &settings, Duration::from_secs(2)),
    )
    .await
    .expect("stream created in time")
    .expect("JetStream stream created (get_or_create_stream)");
    let ingress = Ingress::new(sink, cfg);

    // Consumer side: ordered JetStream consumer, own connection, short timeouts.
    let log: Log = Arc::default();
    let consumer_cfg = ConsumerConfig {
        subject: SUBJECT.into(),
        source: ConsumerSource::jetstream(JS_STREAM),
        idle_timeout_ms: 30_000,
        max_frame_age_ms: 10_000,
        max_pending_bytes: 1_920_000,
        max_pending_age_ms: 10_000,
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("consumer config");
    let factory_log = log.clone();
    let consumer = tokio::time::timeout(
        STEP,
        Consumer::connect_with(
            async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_millis(500))
                .ping_interval(Duration::from_secs(1)),
            &url,
            consumer_cfg,
            move |info: &StreamInfo| {
                factory_log
                    .lock()
                    .expect("log")
                    .entry(info.stream.clone())
                    .or_default()
                    .instances += 1;
                Recorder {
                    stream: info.stream.clone(),
                    log: factory_log.clone(),
                }
            },
        ),
    )
    .await
    .expect("consumer started in time")
    .expect("consumer started");

    // 50 streams at the real cadence, pushed the way a real-time producer must: never
    // waiting (try_push); a refusal is recorded, not retried.
    let handles: Vec<_> = (0..STREAMS)
        .map(|i| ingress.open(&format!("call-{i:02}"), None).expect("open"))
        .collect();
    let mut admitted: Vec<Vec<u64>> = vec![Vec::new(); STREAMS];
    let mut refused: HashMap<&'static str, u64> = HashMap::new();
    let start = Instant::now();
    let mut tick = tokio::time::interval(CADENCE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut killed = false;
    let mut restart: Option<tokio::task::JoinHandle<()>> = None;
    let server = Arc::new(server);
    let mut n: u64 = 0;
    while start.elapsed() < RUN {
        tick.tick().await;
        n += 1;
        for (h, seqs) in handles.iter().zip(admitted.iter_mut()) {
            match h.try_push(pcm(n)) {
                Ok(seq) => seqs.push(seq),
                Err(e) => {
                    let kind = match e {
                        PushError::Full { .. } => "full",
                        PushError::Overloaded(_) => "overloaded",
                        PushError::Closed(_) => "closed",
                        PushError::InvalidFrame(_) => "invalid",
                    };
                    *refused.entry(kind).or_default() += 1;
                }
            }
        }
        if !killed && start.elapsed() >= KILL_AT {
            killed = true;
            server.kill().expect("kill");
            println!(
                "t={:.2}s server killed (SIGKILL)",
                start.elapsed().as_secs_f64()
            );
            let server = server.clone();
            restart = Some(tokio::spawn(async move {
                tokio::time::sleep(DOWN_FOR).await;
                tokio::task::spawn_blocking(move || server.restart().expect("restart"))
                    .await
                    .expect("restart task");
            }));
        }
    }
    let restart = restart.expect("the server was killed");
    tokio::time::timeout(STEP, restart)
        .await
        .expect("restart in time")
        .expect("restart");

    // End every stream (bounded by end_timeout inside finish).
    let mut published_total = 0;
    let mut dropped_total = 0;
    let mut per_stream = Vec::with_capacity(STREAMS);
    for h in handles {
        let summary = tokio::time::timeout(STEP, h.finish())
            .await
            .expect("finish in time");
        assert!(
            summary.finished,
            "{}: publisher did not finish",
            summary.snapshot.stream_id
        );
        assert!(
            summary.snapshot.end_delivered,
            "{}: end not stored",
            summary.snapshot.stream_id
        );
        published_total += summary.snapshot.frames.published;
        dropped_total += summary.snapshot.frames.dropped.values().sum::<u64>();
        per_stream.push(summary.snapshot);
    }
    let stats = ingress.stats();

    // Wait (bounded) until the consumer saw every stream's end.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ends = log
            .lock()
            .expect("log")
            .values()
            .filter(|s| s.end.is_some())
            .count();
        if ends == STREAMS || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let final_stats = consumer.shutdown(Duration::from_secs(2)).await;
    let c = &final_stats.totals.counters;

    // What JetStream stored: each packet once, no hole.
    let js = jetstream::new(client.clone());
    let info = tokio::time::timeout(STEP, async {
        js.get_stream(JS_STREAM)
            .await
            .expect("stream")
            .info()
            .await
            .expect("info")
            .clone()
    })
    .await
    .expect("stream info in time");

    let log = log.lock().expect("log");
    let delivered: usize = log.values().map(|s| s.frames.len()).sum();
    let admitted_total: usize = admitted.iter().map(Vec::len).sum();
    println!(
        "ingress: offered {} admitted {} published {} dropped {:?} refused at push {:?} overloads {}",
        stats.frames.offered,
        stats.frames.admitted,
        stats.frames.published,
        stats.frames.dropped,
        refused,
        stats.overloads,
    );
    println!(
        "consumer: delivered {delivered} frames to handlers, lost {}, stale {}, duplicates/out-of-order refused {}, gaps declared {}, ends {}/{STREAMS}, messages {}",
        c.lost_frames,
        c.stale_frames,
        c.stale_packets,
        c.declared_gaps,
        final_stats.totals.streams_end_seen,
        final_stats.totals.messages,
    );
    let max_delay = log.values().map(|s| s.max_delay_ms).max().unwrap_or(0);
    let high_water = per_stream
        .iter()
        .map(|s| s.pending_bytes_high_water)
        .max()
        .unwrap_or(0);
    println!(
        "outage as felt: worst capture->handler delay {max_delay} ms, highest pending bytes of a stream {high_water} (budget 96000)"
    );
    println!(
        "JetStream {JS_STREAM}: {} messages, seq {}..={}",
        info.state.messages, info.state.first_sequence, info.state.last_sequence
    );

    assert!(
        max_delay >= DOWN_FOR.as_millis() as u64,
        "the outage must have held frames back ({max_delay} ms)"
    );
    assert_eq!(
        dropped_total, 0,
        "the 3 s budget covers the outage: nothing may be dropped ({:?})",
        stats.frames.dropped
    );
    assert_eq!(admitted_total as u64, stats.frames.admitted);
    assert_eq!(
        published_total, stats.frames.admitted,
        "every admitted frame published"
    );
    for (i, seqs) in admitted.iter().enumerate() {
        let id = format!("call-{i:02}");
        let seen = log.get(&id).unwrap_or_else(|| panic!("{id}: never seen"));
        assert_eq!(seen.instances, 1, "{id}: one stream instance");
        assert!(
            seen.frames.windows(2).all(|w| w[0] < w[1]),
            "{id}: out of order or duplicated"
        );
        assert_eq!(
            &seen.frames, seqs,
            "{id}: delivered != admitted (exactly once, in order)"
        );
        assert!(seen.gaps.is_empty(), "{id}: gaps {:?}", seen.gaps);
        let last = seqs.last().copied().unwrap_or(0);
        match &seen.end {
            Some((Some(end_seq), EndCause::Producer { .. })) => {
                assert_eq!(*end_seq, last + 1, "{id}: end seq")
            }
            other => panic!("{id}: end {other:?}"),
        }
        assert_eq!(per_stream[i].frames.published, seqs.len() as u64, "{id}");
    }
    assert_eq!(delivered as u64, published_total);
    assert_eq!(c.lost_frames, 0);
    assert_eq!(c.stale_packets, 0, "no duplicate reached the consumer");
    assert_eq!(final_stats.totals.streams_end_seen, STREAMS as u64);
    // Stored once each: frames + one end per stream, sequence without holes.
    assert_eq!(info.state.messages, published_total + STREAMS as u64);
    assert_eq!(info.state.first_sequence, 1);
    assert_eq!(info.state.last_sequence, info.state.messages);
}
