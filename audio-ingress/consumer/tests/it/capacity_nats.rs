//! Capacity announcements and refusal notices against a real nats-server: a static
//! worker announces its fields at once and its slow streams' lag and real-time factor;
//! a worker at `max_streams` sends one refusal per refused stream instance within an
//! interval, and again each interval while the stream keeps sending; a
//! lease worker announces the partitions it delivers and its bucket; shutdown sends an
//! empty last announcement, abort nothing; `announce = false` sends nothing; two lease
//! workers with different slots split the partitions in proportion.

use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use weir_audio_consumer::testing::{client, connect_options, flush, pcm, publish};
use weir_audio_consumer::{
    CapacityConfig, Consumer, ConsumerConfig, LeaseConfig, StreamEvent, StreamHandler, StreamInfo,
};
use weir_protocol::audio::Packet;
use weir_protocol::capacity::{Announcement, OwnershipKind, Refusal, RefusalReason};
use weir_protocol::{StreamId, partition_of};
use weir_testkit::{NatsServer, NatsServerOptions};

const INTERVAL_MS: u64 = 100;

/// A recogniser that spends `per_frame` of wall time on each frame (a GPU waits).
struct Slow(Duration);

impl StreamHandler for Slow {
    async fn on_event(&mut self, event: StreamEvent) {
        if let StreamEvent::Frame(_) = event {
            tokio::time::sleep(self.0).await;
        }
    }
}

fn capacity(worker_id: Option<&str>) -> CapacityConfig {
    CapacityConfig {
        interval_ms: INTERVAL_MS,
        worker_id: worker_id.map(str::to_owned),
        ..CapacityConfig::default()
    }
}

/// A static worker on `cap.{partition}.{stream}` (4 partitions, all owned).
fn static_config(max_streams: usize, worker: &str) -> ConsumerConfig {
    ConsumerConfig {
        max_streams,
        max_frame_age_ms: 0,
        max_pending_bytes: 1_920_000,
        max_pending_age_ms: 10_000,
        idle_timeout_ms: 20_000,
        capacity: capacity(Some(worker)),
        ..ConsumerConfig::partitioned("cap.{partition}.{stream}", 4, [0, 1, 2, 3])
    }
}

fn subject(stream: &str) -> String {
    let four = std::num::NonZeroU32::new(4).expect("non-zero");
    let p = partition_of(&StreamId::parse(stream).expect("stream id"), four);
    format!("cap.{p}.{stream}")
}

async fn start(url: &str, cfg: ConsumerConfig, per_frame: Duration) -> Consumer {
    let settings = cfg.validate().expect("valid");
    tokio::time::timeout(
        Duration::from_secs(10),
        Consumer::connect_with(connect_options(), url, settings, move |_: &StreamInfo| {
            Slow(per_frame)
        }),
    )
    .await
    .expect("consumer starts in time")
    .expect("consumer starts")
}

/// The next announcement on `sub` within `bound`, decoded and checked fresh.
async fn next(sub: &mut async_nats::Subscriber, bound: Duration) -> Option<Announcement> {
    let msg = tokio::time::timeout(bound, sub.next()).await.ok()??;
    let a = Announcement::decode(msg.subject.as_str(), &msg.payload).expect("a valid announcement");
    a.check_fresh(weir_service::clock::unix_ms_now())
        .expect("fresh");
    Some(a)
}

/// Announcements until one satisfies `cond` (within `bound`).
async fn until(
    sub: &mut async_nats::Subscriber,
    bound: Duration,
    mut cond: impl FnMut(&Announcement) -> bool,
) -> Vec<Announcement> {
    let deadline = Instant::now() + bound;
    let mut seen = Vec::new();
    while let Some(a) = next(sub, deadline.saturating_duration_since(Instant::now())).await {
        let done = cond(&a);
        seen.push(a);
        if done {
            return seen;
        }
    }
    panic!("no matching announcement within {bound:?}: {seen:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_worker_announces_its_fields_then_its_slow_streams_lag_and_rtf() {
    let server = NatsServer::start().expect("nats-server");
    let nc = client(server.url()).await;
    let mut sub = nc
        .subscribe("weir.capacity.announce.cap-s")
        .await
        .expect("sub");
    flush(&nc).await;
    // 30 ms of work per 20 ms frame: 1.5 × real time.
    let consumer = start(
        server.url(),
        static_config(8, "cap-s"),
        Duration::from_millis(30),
    )
    .await;
    let first = next(&mut sub, Duration::from_millis(3 * INTERVAL_MS))
        .await
        .expect("the first announcement within an interval or so");
    assert_eq!(first.v, 1);
    assert_eq!(first.worker, "cap-s");
    assert_eq!(first.seq, 1);
    assert_eq!(first.interval_ms, INTERVAL_MS);
    assert_eq!(first.subject, "cap.{partition}.{stream}");
    assert_eq!(first.partitions_total, 4);
    assert_eq!(first.ownership, OwnershipKind::Static);
    assert_eq!(first.lease_bucket, None);
    assert_eq!(first.partitions, vec![0, 1, 2, 3]);
    assert_eq!((first.max_streams, first.live_streams), (8, 0));
    assert_eq!((first.lag_ms, first.rtf_p95), (0, 0.0));
    assert!(first.streams.is_empty() && !first.streams_truncated);
    assert_eq!(first.instance.len(), 16);

    // One slow stream, 2 s of audio at real-time pace.
    let producer = {
        let nc = nc.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            for seq in 1..=100 {
                tick.tick().await;
                publish(&nc, &subject("slow1"), Packet::frame(seq, pcm(seq)), &[]).await;
            }
        })
    };
    let seen = until(&mut sub, Duration::from_secs(4), |a| {
        a.live_streams == 1 && a.lag_ms >= 200 && a.rtf_p95 > 1.0
    })
    .await;
    let last = seen.last().expect("one");
    assert_eq!(last.streams.len(), 1);
    assert_eq!(last.streams[0].id, "slow1");
    assert!(last.streams[0].lag_ms >= 200, "{last:?}");
    assert!((1.2..2.5).contains(&last.rtf_p95), "rtf {}", last.rtf_p95);
    // Seq counts up by one, the instance stays.
    let mut seqs = vec![first.seq];
    seqs.extend(seen.iter().map(|a| a.seq));
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert!(seen.iter().all(|a| a.instance == first.instance));
    // `capacity()` says what the next one would.
    let next_one = consumer.capacity();
    assert!(next_one.seq > last.seq);
    assert_eq!(next_one.worker, "cap-s");
    producer.abort();

    // Shutdown: a last announcement with no partition and no live stream, right away.
    let before = consumer.capacity().seq;
    let stopping = tokio::spawn(consumer.shutdown(Duration::from_millis(200)));
    let seen = until(&mut sub, Duration::from_secs(2), |a| {
        a.partitions.is_empty()
    })
    .await;
    let bye = seen.last().expect("one");
    assert!(bye.seq >= before);
    assert_eq!((bye.live_streams, bye.lag_ms), (0, 0));
    assert!(bye.streams.is_empty());
    stopping.await.expect("shutdown");
    assert!(
        next(&mut sub, Duration::from_millis(3 * INTERVAL_MS))
            .await
            .is_none(),
        "nothing after the last one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_worker_sends_one_refusal_per_refused_stream_instance_within_an_interval() {
    let server = NatsServer::start().expect("nats-server");
    let nc = client(server.url()).await;
    let mut refusals = nc.subscribe("weir.capacity.refused.*").await.expect("sub");
    flush(&nc).await;
    // An interval of 1 s: each burst below lies within one, so one notice each.
    let mut cfg = static_config(1, "cap-r");
    cfg.capacity.interval_ms = 1_000;
    let consumer = start(server.url(), cfg, Duration::ZERO).await;
    publish(&nc, &subject("kept"), Packet::frame(1, pcm(1)), &[]).await;
    flush(&nc).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // "over" sends a burst of 30 frames: one refusal.
    for seq in 1..=30 {
        publish(&nc, &subject("over"), Packet::frame(seq, pcm(seq)), &[]).await;
    }
    flush(&nc).await;
    let msg = tokio::time::timeout(Duration::from_secs(2), refusals.next())
        .await
        .expect("a refusal in time")
        .expect("a message");
    let r = Refusal::decode(msg.subject.as_str(), &msg.payload).expect("a valid refusal");
    assert_eq!(msg.subject.as_str(), "weir.capacity.refused.over");
    assert_eq!(r.worker, "cap-r");
    assert_eq!(r.stream, "over");
    assert_eq!(r.reason, RefusalReason::MaxStreams);
    assert_eq!((r.max_streams, r.live_streams), (1, 1));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), refusals.next())
            .await
            .is_err(),
        "exactly one refusal for the burst"
    );
    // Its end, then a new instance (seq 1 again): refused again, notified again.
    publish(&nc, &subject("over"), Packet::end(31), &[]).await;
    for seq in 1..=5 {
        publish(&nc, &subject("over"), Packet::frame(seq, pcm(seq)), &[]).await;
    }
    flush(&nc).await;
    let msg = tokio::time::timeout(Duration::from_secs(2), refusals.next())
        .await
        .expect("a second refusal in time")
        .expect("a message");
    assert_eq!(msg.subject.as_str(), "weir.capacity.refused.over");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), refusals.next())
            .await
            .is_err()
    );
    assert_eq!(
        consumer.stats().totals.streams_refused.get("max_streams"),
        Some(&2)
    );
    consumer.shutdown(Duration::from_millis(200)).await;
}

/// A refused stream that keeps sending at real-time pace gets its refusal again once
/// per interval (the first notice may have been lost); when it stops, the notices stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_that_keeps_sending_is_notified_again_each_interval() {
    let server = NatsServer::start().expect("nats-server");
    let nc = client(server.url()).await;
    let mut refusals = nc.subscribe("weir.capacity.refused.*").await.expect("sub");
    flush(&nc).await;
    let consumer = start(server.url(), static_config(1, "cap-rr"), Duration::ZERO).await;
    publish(&nc, &subject("kept"), Packet::frame(1, pcm(1)), &[]).await;
    flush(&nc).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // 0.5 s of audio (5 intervals of 100 ms), a frame every 20 ms.
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for seq in 1..=25 {
        tick.tick().await;
        publish(&nc, &subject("over"), Packet::frame(seq, pcm(seq)), &[]).await;
    }
    flush(&nc).await;
    let sending = started.elapsed();
    let mut sent_at = Vec::new();
    while let Ok(Some(msg)) =
        tokio::time::timeout(Duration::from_millis(400), refusals.next()).await
    {
        let r = Refusal::decode(msg.subject.as_str(), &msg.payload).expect("a valid refusal");
        assert_eq!((r.worker.as_str(), r.stream.as_str()), ("cap-rr", "over"));
        sent_at.push(r.sent_at_ms);
    }
    // At least two; at most one per interval the stream was sending (+ the first, +
    // one interval of slack for the delivery of its last frames).
    let most = sending.as_millis() as usize / INTERVAL_MS as usize + 2;
    assert!(
        (2..=most).contains(&sent_at.len()),
        "{} notices in {sending:?}: {sent_at:?}",
        sent_at.len()
    );
    assert_eq!(
        consumer.stats().totals.streams_refused.get("max_streams"),
        Some(&1),
        "one refused instance, notified repeatedly"
    );
    consumer.shutdown(Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announce_false_sends_nothing_and_abort_sends_no_goodbye() {
    let server = NatsServer::start().expect("nats-server");
    let nc = client(server.url()).await;
    let mut all = nc.subscribe("weir.capacity.>").await.expect("sub");
    flush(&nc).await;
    let mut cfg = static_config(1, "cap-off");
    cfg.capacity.announce = false;
    let off = start(server.url(), cfg, Duration::ZERO).await;
    for stream in ["one", "two"] {
        publish(&nc, &subject(stream), Packet::frame(1, pcm(1)), &[]).await;
    }
    flush(&nc).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(4 * INTERVAL_MS), all.next())
            .await
            .is_err(),
        "announce = false: no announcement, no refusal"
    );
    assert_eq!(off.capacity().live_streams, 1, "capacity() still answers");
    off.shutdown(Duration::from_millis(200)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(2 * INTERVAL_MS), all.next())
            .await
            .is_err(),
        "and no last one"
    );

    // A crash drill: the announcements stop, no empty last one is sent.
    let crashing = start(server.url(), static_config(1, "cap-crash"), Duration::ZERO).await;
    let first = next(&mut all, Duration::from_secs(1)).await.expect("one");
    assert_eq!(first.worker, "cap-crash");
    crashing.abort();
    let deadline = Instant::now() + Duration::from_millis(5 * INTERVAL_MS);
    while let Some(a) = next(&mut all, deadline.saturating_duration_since(Instant::now())).await {
        assert!(!a.partitions.is_empty(), "no goodbye after abort: {a:?}");
    }
}

fn lease_config(worker: &str, bucket: &str, partitions: u32, max_streams: usize) -> ConsumerConfig {
    ConsumerConfig {
        max_streams,
        max_frame_age_ms: 0,
        capacity: capacity(None),
        ..ConsumerConfig::leased(
            "capl.{partition}.{stream}",
            partitions,
            LeaseConfig {
                bucket: bucket.into(),
                ttl_ms: 3_000,
                renew_interval_ms: 1_000,
                margin_ms: 500,
                heartbeat_interval_ms: 100,
                heartbeat_timeout_ms: 300,
                replicas: 1,
                worker_id: Some(worker.into()),
            },
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_worker_announces_the_partitions_it_delivers_and_its_bucket() {
    let server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..NatsServerOptions::default()
    })
    .expect("nats-server");
    let nc = client(server.url()).await;
    let mut sub = nc
        .subscribe("weir.capacity.announce.lw-a")
        .await
        .expect("sub");
    flush(&nc).await;
    let consumer = start(
        server.url(),
        lease_config("lw-a", "cap_leases", 4, 5),
        Duration::ZERO,
    )
    .await;
    let seen = until(&mut sub, Duration::from_secs(4), |a| {
        a.partitions.len() == 4
    })
    .await;
    let first = &seen[0];
    assert_eq!(first.seq, 1);
    assert_eq!(first.ownership, OwnershipKind::Lease);
    assert_eq!(first.lease_bucket.as_deref(), Some("cap_leases"));
    assert_eq!(first.max_streams, 5);
    let full = seen.last().expect("one");
    assert_eq!(full.partitions, vec![0, 1, 2, 3]);
    // Never more than what it delivered at the time (grown, never shrunk here).
    assert!(
        seen.windows(2)
            .all(|w| w[0].partitions.len() <= w[1].partitions.len())
    );
    let mut owned = consumer.owned_now();
    owned.sort_unstable();
    assert_eq!(owned, full.partitions);
    let stopping = tokio::spawn(consumer.shutdown(Duration::from_millis(200)));
    let seen = until(&mut sub, Duration::from_secs(2), |a| {
        a.partitions.is_empty()
    })
    .await;
    assert_eq!(seen.last().map(|a| a.live_streams), Some(0));
    stopping.await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lease_workers_split_the_partitions_in_proportion_to_their_slots() {
    let server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..NatsServerOptions::default()
    })
    .expect("nats-server");
    // 8 partitions, 2 and 6 slots: shares ⌈8 × 2/8⌉ = 2 and ⌈8 × 6/8⌉ = 6.
    let small = start(
        server.url(),
        lease_config("small", "cap_weighted", 8, 2),
        Duration::ZERO,
    )
    .await;
    let big = start(
        server.url(),
        lease_config("big", "cap_weighted", 8, 6),
        Duration::ZERO,
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let split = (small.owned_now().len(), big.owned_now().len());
        if split == (2, 6) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "split {split:?}: {:?}",
            big.leases()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And it stays.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!((small.owned_now().len(), big.owned_now().len()), (2, 6));
    small.shutdown(Duration::from_millis(200)).await;
    big.shutdown(Duration::from_millis(200)).await;
}
