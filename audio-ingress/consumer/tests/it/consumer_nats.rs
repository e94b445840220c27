//! Consumer core against a real nats-server: idle reaping of vanished producers, stream
//! affinity across two workers with disjoint partitions (producer-computed partitions
//! and a nats-server subject mapping), and loss / decode-error accounting.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::time::Duration;

use bytes::Bytes;
use weir_audio_consumer::testing::{
    Book, Recorder, client, connect_options, flush, pcm, publish, publish_raw, wait_until,
};
use weir_audio_consumer::{Consumer, ConsumerConfig, ConsumerEvent, ConsumerSettings};
use weir_protocol::audio::extension::headers;
use weir_protocol::audio::{Gap, GapReason, Packet};
use weir_protocol::{StreamId, SubjectTemplate, partition_of};
use weir_testkit::{NatsServer, NatsServerOptions};

const GRACE: Duration = Duration::from_secs(2);

async fn start(url: &str, settings: ConsumerSettings, label: &str, book: &Book) -> Consumer {
    tokio::time::timeout(
        Duration::from_secs(5),
        Consumer::connect_with(
            connect_options(),
            url,
            settings,
            Recorder::factory(label, book.clone()),
        ),
    )
    .await
    .expect("consumer starts in time")
    .expect("consumer starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanished_producer_is_reaped_after_idle_timeout() {
    let server = NatsServer::start().expect("nats-server");
    let idle = Duration::from_millis(400);
    let settings = ConsumerConfig {
        idle_timeout_ms: 400,
        max_pending_age_ms: 100,
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("valid");
    let book = Book::default();
    let consumer = start(server.url(), settings, "c", &book).await;
    let mut events = consumer.events();
    let nc = client(server.url()).await;

    // "done" ends properly; "gone" vanishes after 5 frames; "slow" sends a frame every
    // 100 ms for longer than the idle timeout and must not be reaped.
    for seq in 1..=5 {
        publish(
            &nc,
            "inference.whisper.stream.gone",
            Packet::frame(seq, pcm(seq)),
            &[],
        )
        .await;
        publish(
            &nc,
            "inference.whisper.stream.done",
            Packet::frame(seq, pcm(seq)),
            &[],
        )
        .await;
    }
    publish(&nc, "inference.whisper.stream.done", Packet::end(6), &[]).await;
    flush(&nc).await;
    let t0 = tokio::time::Instant::now();
    let slow_nc = nc.clone();
    let slow = tokio::spawn(async move {
        for seq in 1..=8 {
            publish(
                &slow_nc,
                "inference.whisper.stream.slow",
                Packet::frame(seq, pcm(seq)),
                &[],
            )
            .await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        publish(
            &slow_nc,
            "inference.whisper.stream.slow",
            Packet::end(9),
            &[],
        )
        .await;
        flush(&slow_nc).await;
    });

    let reaped = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match events.recv().await {
                Ok(ConsumerEvent::StreamReaped {
                    stream,
                    last_seq,
                    silent_ms,
                    ..
                }) => {
                    break (stream, last_seq, silent_ms);
                }
                Ok(_) => {}
                Err(e) => panic!("event channel: {e}"),
            }
        }
    })
    .await
    .expect("the vanished stream is reaped within 3 s");
    let elapsed = t0.elapsed();
    assert_eq!(reaped.0, "gone");
    assert_eq!(reaped.1, Some(5));
    assert!(reaped.2 >= 400, "reaped after {} ms of silence", reaped.2);
    // Not before the idle timeout (minus the few ms between our flush and the
    // consumer's receipt), and not much after it (one reap tick = idle / 4).
    assert!(
        elapsed + Duration::from_millis(20) >= idle,
        "reaped too early: {elapsed:?}"
    );
    assert!(
        elapsed <= idle + Duration::from_millis(600),
        "reaped too late: {elapsed:?}"
    );

    tokio::time::timeout(Duration::from_secs(3), slow)
        .await
        .expect("slow producer")
        .expect("task");
    assert!(
        wait_until(Duration::from_secs(2), || consumer
            .stats()
            .totals
            .streams_end_seen
            == 2)
        .await,
        "ends of done and slow arrive: {:?}",
        consumer.stats().totals
    );
    weir_audio_consumer::testing::wait_handlers_done(&consumer).await;
    let stats = consumer.stats();
    let gone = stats.stream("gone").next().expect("gone");
    assert!(gone.reaped && !gone.end_seen, "{gone:?}");
    assert_eq!(gone.ended_by.as_deref(), Some("idle"));
    assert_eq!(gone.counters.frames, 5);
    for name in ["done", "slow"] {
        let s = stats.stream(name).next().expect(name);
        assert!(s.end_seen && !s.reaped, "{s:?}");
        assert_eq!(s.ended_by.as_deref(), Some("producer"));
    }
    assert_eq!(stats.totals.streams_reaped, 1);
    let seen = book.lock().expect("book").clone();
    let gone_seen = seen
        .values()
        .find(|s| s.info.as_ref().is_some_and(|i| i.stream == "gone"))
        .expect("gone handler");
    assert_eq!(gone_seen.frames, vec![1, 2, 3, 4, 5]);
    assert_eq!(gone_seen.end.as_deref(), Some("idle"));
    let slow_seen = seen
        .values()
        .find(|s| s.info.as_ref().is_some_and(|i| i.stream == "slow"))
        .expect("slow handler");
    assert_eq!(slow_seen.frames, (1..=8).collect::<Vec<_>>());
    assert_eq!(slow_seen.end.as_deref(), Some("producer"));

    let final_stats = consumer.shutdown(GRACE).await;
    assert_eq!(final_stats.totals.streams_active, 0);
}

const PARTITIONS: u32 = 8;
const STREAMS: usize = 200;
const FRAMES: u64 = 25;

/// Publishes FRAMES frames + end for STREAMS streams, interleaved across streams
/// (frame k of every stream, then frame k + 1...), to `subject_of(stream)`.
async fn publish_streams(
    nc: &async_nats::Client,
    subject_of: impl Fn(&StreamId) -> String,
) -> Vec<StreamId> {
    let ids: Vec<StreamId> = (0..STREAMS)
        .map(|i| StreamId::parse(&format!("call-{i}")).expect("valid id"))
        .collect();
    let subjects: Vec<String> = ids.iter().map(&subject_of).collect();
    for seq in 1..=FRAMES + 1 {
        for subject in &subjects {
            let packet = if seq <= FRAMES {
                Packet::frame(seq, pcm(seq))
            } else {
                Packet::end(seq)
            };
            publish(nc, subject, packet, &[]).await;
        }
    }
    flush(nc).await;
    ids
}

/// Checks that each stream was handled by exactly one consumer — the owner of its
/// partition — completely and in order.
fn check_affinity(book: &Book, ids: &[StreamId], owner_of: impl Fn(u32) -> &'static str) {
    let seen = book.lock().expect("book").clone();
    let mut by_stream: HashMap<String, Vec<_>> = HashMap::new();
    for s in seen.values() {
        let info = s.info.clone().expect("info");
        by_stream
            .entry(info.stream.clone())
            .or_default()
            .push(s.clone());
    }
    let mut per_consumer: BTreeMap<String, usize> = BTreeMap::new();
    let n = NonZeroU32::new(PARTITIONS).expect("non-zero");
    for id in ids {
        let records = by_stream
            .get(id.as_str())
            .unwrap_or_else(|| panic!("{id} never arrived"));
        assert_eq!(
            records.len(),
            1,
            "{id} reached {} handlers: {records:?}",
            records.len()
        );
        let r = &records[0];
        let p = partition_of(id, n);
        assert_eq!(
            r.consumer,
            owner_of(p),
            "{id} (partition {p}) went to the wrong worker"
        );
        assert_eq!(r.info.as_ref().map(|i| i.partition), Some(p));
        assert_eq!(
            r.frames,
            (1..=FRAMES).collect::<Vec<_>>(),
            "{id}: frames out of order or missing"
        );
        assert!(r.gaps.is_empty(), "{id}: {:?}", r.gaps);
        assert_eq!(r.end.as_deref(), Some("producer"), "{id}");
        assert_eq!(r.after_end, 0);
        *per_consumer.entry(r.consumer.clone()).or_default() += 1;
    }
    assert_eq!(by_stream.len(), ids.len(), "unexpected streams");
    assert_eq!(
        per_consumer.len(),
        2,
        "both workers got streams: {per_consumer:?}"
    );
}

async fn two_workers(url: &str, subject: &str, book: &Book) -> (Consumer, Consumer) {
    let a = ConsumerConfig::partitioned(subject, PARTITIONS, 0..4)
        .validate()
        .expect("valid");
    let b = ConsumerConfig::partitioned(subject, PARTITIONS, 4..8)
        .validate()
        .expect("valid");
    (
        start(url, a, "a", book).await,
        start(url, b, "b", book).await,
    )
}

fn owner(p: u32) -> &'static str {
    if p < 4 { "a" } else { "b" }
}

async fn wait_for_all_ends(a: &Consumer, b: &Consumer) {
    let done = wait_until(Duration::from_secs(10), || {
        a.stats().totals.streams_end_seen + b.stats().totals.streams_end_seen == STREAMS as u64
    })
    .await;
    assert!(done, "a: {:?}\nb: {:?}", a.stats().totals, b.stats().totals);
    for c in [a, b] {
        weir_audio_consumer::testing::wait_handlers_done(c).await;
        let t = c.stats().totals;
        assert_eq!(t.counters.lost_frames, 0, "{t:?}");
        assert_eq!(t.counters.stale_packets, 0, "{t:?}");
        assert_eq!(t.misrouted, 0, "{t:?}");
        assert_eq!(t.unroutable_subjects, 0, "{t:?}");
        assert_eq!(t.slow_consumer_events, 0, "{t:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_partitioned_subjects_each_stream_at_exactly_one_in_order() {
    let server = NatsServer::start().expect("nats-server");
    let template = SubjectTemplate::parse("audio.{partition}.{stream}").expect("template");
    let book = Book::default();
    let (a, b) = two_workers(server.url(), template.as_str(), &book).await;
    let nc = client(server.url()).await;
    let n = NonZeroU32::new(PARTITIONS).expect("non-zero");
    let ids = publish_streams(&nc, |id| template.render(id, partition_of(id, n))).await;
    wait_for_all_ends(&a, &b).await;
    check_affinity(&book, &ids, owner);
    let (sa, sb) = tokio::join!(a.shutdown(GRACE), b.shutdown(GRACE));
    assert_eq!(
        sa.totals.counters.frames + sb.totals.counters.frames,
        STREAMS as u64 * FRAMES
    );
    assert_eq!(
        sa.totals.counters.frames_delivered + sb.totals.counters.frames_delivered,
        STREAMS as u64 * FRAMES
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_behind_a_server_mapping_of_the_deployed_subject() {
    let partitioned = "inference.whisper.part.{partition}.{stream}";
    let plain = SubjectTemplate::parse("inference.whisper.stream.{stream}").expect("template");
    let settings = ConsumerConfig::partitioned(partitioned, PARTITIONS, [0])
        .validate()
        .expect("valid");
    let mapping = settings.server_mapping_for(&plain).expect("mappable");
    assert_eq!(
        mapping,
        r#""inference.whisper.stream.*": "inference.whisper.part.{{partition(8,1)}}.{{wildcard(1)}}""#
    );
    let server = NatsServer::start_with(NatsServerOptions {
        config: Some(format!("mappings = {{ {mapping} }}\n")),
        ..Default::default()
    })
    .expect("nats-server with mapping");
    let book = Book::default();
    let (a, b) = two_workers(server.url(), partitioned, &book).await;
    let nc = client(server.url()).await;
    // Producers publish to the plain deployed subject; the server picks the partition.
    let ids = publish_streams(&nc, |id| plain.render(id, 0)).await;
    wait_for_all_ends(&a, &b).await;
    // `misrouted == 0` (checked above) means the server's partition() agreed with
    // FNV-1a for all 200 ids.
    check_affinity(&book, &ids, owner);
    let _ = tokio::join!(a.shutdown(GRACE), b.shutdown(GRACE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_declared_gaps_decode_errors_and_end_headers_are_accounted() {
    let server = NatsServer::start().expect("nats-server");
    let book = Book::default();
    let settings = ConsumerConfig::default().validate().expect("valid");
    let consumer = start(server.url(), settings, "c", &book).await;
    let nc = client(server.url()).await;
    let subject = "inference.whisper.stream.lossy";
    let version = [(headers::VERSION, "1")];
    for seq in [1, 2, 5, 6] {
        publish(&nc, subject, Packet::frame(seq, pcm(seq)), &version).await;
    }
    publish(
        &nc,
        subject,
        Packet::gap(Gap {
            first_seq: 7,
            last_seq: 9,
            samples: 960,
            reason: GapReason::MaxAge,
        }),
        &version,
    )
    .await;
    publish_raw(&nc, subject, Bytes::from_static(b"\x00\x00\x00\xff{"), &[]).await;
    publish(&nc, subject, Packet::frame(10, pcm(10)), &version).await;
    // Seq 11 is "lost"; the end carries weir's headers.
    publish(
        &nc,
        subject,
        Packet::end(12),
        &[
            (headers::VERSION, "1"),
            (headers::END_REASON, "producer_gone"),
        ],
    )
    .await;
    publish_raw(
        &nc,
        "inference.whisper.stream.x.y",
        Bytes::from_static(b"junk"),
        &[],
    )
    .await;
    flush(&nc).await;

    assert!(
        wait_until(Duration::from_secs(3), || consumer
            .stats()
            .totals
            .streams_end_seen
            == 1)
        .await,
        "{:?}",
        consumer.stats()
    );
    let stats = consumer.stats();
    let s = stats.stream("lossy").next().expect("record");
    assert_eq!(s.counters.frames, 5);
    assert_eq!(s.counters.lost_frames, 3, "3, 4 and 11");
    assert_eq!(s.counters.loss_events, 2);
    assert_eq!(s.counters.declared_gaps, 1);
    assert_eq!(s.counters.declared_gap_frames, 3);
    assert_eq!(s.counters.declared_gap_samples, 960);
    assert_eq!(s.counters.decode_errors, 1);
    assert_eq!(s.end_reason.as_deref(), Some("producer_gone"));
    assert_eq!(s.end_seq, Some(12));
    // Timeline identity: 11 seqs before the end, each accounted exactly once.
    assert_eq!(
        s.counters.leading_missing
            + s.counters.frames
            + s.counters.lost_frames
            + s.counters.declared_gap_frames,
        11
    );
    // Wildcard `*` matches one token, so the two-token subject never arrives; the
    // undecodable packet is counted by kind.
    assert_eq!(
        stats
            .totals
            .decode_errors_by_kind
            .get("meta_length_out_of_range"),
        Some(&1)
    );
    weir_audio_consumer::testing::wait_handlers_done(&consumer).await;
    let seen = book.lock().expect("book").clone();
    let rec = seen.values().next().expect("handler");
    assert_eq!(rec.frames, vec![1, 2, 5, 6, 10]);
    assert_eq!(
        rec.gaps,
        vec![
            (3, 4, "Lost".to_owned()),
            (7, 9, "Declared(MaxAge)".to_owned()),
            (11, 11, "Lost".to_owned())
        ]
    );
    assert_eq!(rec.end.as_deref(), Some("producer"));
    consumer.shutdown(GRACE).await;
}

/// The NATS client's buffer (`subscription_capacity`) overflows while the consumer's
/// runtime is blocked: the client drops messages and reports a slow consumer; the
/// consumer counts the event, and the dropped frames show up as lost — nothing goes
/// unaccounted.
#[tokio::test(flavor = "current_thread")]
async fn slow_consumer_drops_are_counted_and_show_as_lost_frames() {
    const SENT: u64 = 5_000;
    let server = NatsServer::start().expect("nats-server");
    let settings = ConsumerConfig {
        subscription_capacity: 64,
        max_pending_bytes: 1_920_000,
        max_pending_age_ms: 60_000,
        idle_timeout_ms: 120_000,
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("valid");
    let book = Book::default();
    let consumer = start(server.url(), settings, "c", &book).await;

    // Publish from another thread (own runtime) while this runtime is blocked, so that
    // nothing drains the subscription when the burst arrives.
    let url = server.url().to_owned();
    let publisher = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let nc = client(&url).await;
            for seq in 1..=SENT {
                publish(
                    &nc,
                    "inference.whisper.stream.burst",
                    Packet::frame(seq, pcm(seq)),
                    &[],
                )
                .await;
            }
            flush(&nc).await;
        });
    });
    std::thread::sleep(Duration::from_millis(1_500));
    publisher.join().expect("publisher thread");

    // Now let the consumer run until it has read the backlog the server held for it
    // (what it took or was told it lost stops changing for 500 ms; at most 15 s); then
    // send the end on its own, so that it does not meet a subscription still full of the
    // burst (a fixed 300 ms was too short on a loaded machine: the end was dropped too).
    let mut last = (u64::MAX, tokio::time::Instant::now());
    let settled = wait_until(Duration::from_secs(15), || {
        let t = consumer.stats().totals;
        let seen = t.messages + t.slow_consumer_events;
        if seen != last.0 {
            last = (seen, tokio::time::Instant::now());
        }
        last.1.elapsed() >= Duration::from_millis(500)
    })
    .await;
    assert!(
        settled,
        "the backlog kept arriving: {:?}",
        consumer.stats().totals
    );
    let nc = client(server.url()).await;
    publish(
        &nc,
        "inference.whisper.stream.burst",
        Packet::end(SENT + 1),
        &[],
    )
    .await;
    flush(&nc).await;
    assert!(
        wait_until(Duration::from_secs(5), || consumer
            .stats()
            .totals
            .streams_end_seen
            == 1)
        .await,
        "{:?}",
        consumer.stats().totals
    );
    let stats = consumer.stats();
    let t = &stats.totals;
    assert!(t.slow_consumer_events >= 1, "{t:?}");
    let k = &t.counters;
    assert!(k.lost_frames > 0, "{t:?}");
    assert_eq!(
        k.leading_missing + k.frames + k.lost_frames,
        SENT,
        "every frame received or counted lost: {t:?}"
    );
    consumer.shutdown(GRACE).await;
}

/// Tasks depend on streams, not frames: one handler task per live stream on top of a
/// constant, however many frames flow; they are gone once the streams end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_follow_streams_not_frames() {
    const LIVE: u64 = 40;
    let server = NatsServer::start().expect("nats-server");
    let nc = client(server.url()).await;
    let settings = ConsumerConfig {
        max_pending_bytes: 1_920_000,
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("valid");
    let book = Book::default();
    let consumer = start(server.url(), settings, "c", &book).await;
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let baseline = alive();
    let subject = |i: u64| format!("inference.whisper.stream.t{i}");

    let mut sent = 0u64;
    for round in 0..3u64 {
        // 40 streams × 50 frames per round: 6,000 frames in all.
        for seq in round * 50 + 1..=(round + 1) * 50 {
            for i in 0..LIVE {
                publish(&nc, &subject(i), Packet::frame(seq, pcm(seq)), &[]).await;
                sent += 1;
            }
        }
        flush(&nc).await;
        assert!(
            wait_until(Duration::from_secs(5), || consumer
                .totals()
                .counters
                .frames_delivered
                == sent)
            .await,
            "{:?}",
            consumer.totals()
        );
        assert_eq!(
            alive(),
            baseline + LIVE as usize,
            "after {sent} frames: one task per live stream"
        );
    }
    for i in 0..LIVE {
        publish(&nc, &subject(i), Packet::end(151), &[]).await;
    }
    flush(&nc).await;
    weir_audio_consumer::testing::wait_handlers_done(&consumer).await;
    assert!(
        wait_until(Duration::from_secs(2), || alive() == baseline).await,
        "handler tasks are gone after the ends: {} alive, baseline {baseline}",
        alive()
    );
    consumer.shutdown(GRACE).await;
}

/// The server is killed and restarted mid-stream: the consumer resubscribes on its own,
/// the stream continues in the same handler, and whatever was lost across the restart
/// is visible as sequence gaps — every seq before the end is received or counted lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_losses_show_as_sequence_gaps() {
    let server = NatsServer::start().expect("nats-server");
    let settings = ConsumerConfig {
        idle_timeout_ms: 10_000,
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("valid");
    let book = Book::default();
    let consumer = start(server.url(), settings, "c", &book).await;
    let nc = client(server.url()).await;
    let subject = "inference.whisper.stream.survivor";
    let mut seq = 0u64;
    for _ in 0..20 {
        seq += 1;
        publish(&nc, subject, Packet::frame(seq, pcm(seq)), &[]).await;
    }
    flush(&nc).await;
    assert!(
        wait_until(Duration::from_secs(3), || consumer.totals().counters.frames
            == 20)
        .await
    );

    server.kill().expect("kill");
    server.restart().expect("restart");

    // Keep streaming in real time (publish is bounded: while the client reconnects a
    // publish may be buffered or lost) until frames reach the consumer again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        seq += 1;
        let _ = tokio::time::timeout(
            Duration::from_millis(200),
            nc.publish(
                subject,
                Packet::frame(seq, pcm(seq)).encode().expect("encode"),
            ),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if consumer.totals().counters.frames > 20 && seq > 40 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the consumer did not receive frames again within 10 s of the restart: {:?}",
            consumer.totals()
        );
    }
    seq += 1;
    publish(&nc, subject, Packet::end(seq), &[]).await;
    flush(&nc).await;
    assert!(
        wait_until(Duration::from_secs(3), || consumer
            .totals()
            .streams_end_seen
            == 1)
        .await,
        "{:?}",
        consumer.totals()
    );
    weir_audio_consumer::testing::wait_handlers_done(&consumer).await;
    let stats = consumer.stats();
    let records: Vec<_> = stats.stream("survivor").collect();
    assert_eq!(records.len(), 1, "one stream instance across the restart");
    let c = &records[0].counters;
    assert_eq!(
        c.leading_missing + c.frames + c.lost_frames,
        seq - 1,
        "every seq before the end received or counted lost: {c:?}"
    );
    assert_eq!(c.stale_packets, 0);
    let seen = book.lock().expect("book").clone();
    let rec = seen.values().next().expect("handler");
    assert!(rec.frames.windows(2).all(|w| w[0] < w[1]), "in order");
    let lost_in_notices: u64 = rec.gaps.iter().map(|(a, b, _)| b - a + 1).sum();
    assert_eq!(
        lost_in_notices, c.lost_frames,
        "every loss was told to the handler"
    );
    assert_eq!(rec.end.as_deref(), Some("producer"));
    consumer.shutdown(GRACE).await;
}

/// Malformed messages on the audio subjects (a non-UTF-8 stream token under the
/// wildcard, a non-UTF-8 reply subject, a broken header block) from a publisher allowed
/// there cost the other streams nothing: the consumer keeps its connection (async-nats
/// 0.51 dropped it, and every frame buffered with it; vendor/README.md) and 20 real-time
/// streams arrive whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_lose_no_frame_of_other_streams() {
    const STREAMS: u64 = 20;
    const FRAMES: u64 = 100;
    const MALFORMED: usize = 10;
    let server = NatsServer::start().expect("nats-server");
    let book = Book::default();
    let settings = ConsumerConfig::default().validate().expect("valid");
    let consumer = start(server.url(), settings, "c", &book).await;
    let nc = client(server.url()).await;
    let prefix = "inference.whisper.stream";
    let mut bad = vec![weir_testkit::raw::non_utf8_subject(prefix)];
    bad.extend(weir_testkit::raw::malformed_messages(&format!(
        "{prefix}.evil"
    )));
    let port = server.port();
    let injector = tokio::task::spawn_blocking(move || {
        let mut raw = weir_testkit::raw::RawConnection::connect(port, None).expect("raw");
        for m in bad.iter().cycle().take(MALFORMED) {
            std::thread::sleep(Duration::from_millis(150));
            raw.send(m).expect("send");
        }
        raw.ping().expect("pong")
    });
    // One frame of every stream each 20 ms (real time), for 2 s.
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for seq in 1..=FRAMES + 1 {
        tick.tick().await;
        for k in 0..STREAMS {
            let packet = if seq <= FRAMES {
                Packet::frame(seq, pcm(seq))
            } else {
                Packet::end(seq)
            };
            publish(&nc, &format!("{prefix}.good-{k}"), packet, &[]).await;
        }
    }
    flush(&nc).await;
    let seen = injector.await.expect("injector");
    assert!(!seen.contains("-ERR"), "{seen}");
    // The core counts an end when it reads it; the handler records it a moment later:
    // wait for both.
    let ended = wait_until(Duration::from_secs(5), || {
        consumer.stats().totals.streams_end_seen >= STREAMS
            && book
                .lock()
                .expect("book")
                .values()
                .filter(|s| {
                    s.end.is_some()
                        && s.info
                            .as_ref()
                            .is_some_and(|i| i.stream.starts_with("good-"))
                })
                .count() as u64
                >= STREAMS
    })
    .await;
    let connects = consumer
        .client()
        .statistics()
        .connects
        .load(std::sync::atomic::Ordering::Relaxed);
    let book = book.lock().expect("book").clone();
    let good: Vec<_> = book
        .values()
        .filter(|s| {
            s.info
                .as_ref()
                .is_some_and(|i| i.stream.starts_with("good-"))
        })
        .collect();
    let frames: u64 = good.iter().map(|s| s.frames.len() as u64).sum();
    eprintln!(
        "good streams: {} instances, {frames} of {} frames, connects {connects}",
        good.len(),
        STREAMS * FRAMES
    );
    assert!(ended, "every stream's end arrives");
    assert_eq!(connects, 1, "one connection for the whole run");
    assert_eq!(good.len() as u64, STREAMS, "one instance per stream");
    for s in good {
        assert_eq!(s.end.as_deref(), Some("producer"), "{:?}", s.info);
        assert!(s.frames.iter().copied().eq(1..=FRAMES), "whole, in order");
        assert!(s.gaps.is_empty(), "{:?}", s.gaps);
    }
    consumer.shutdown(GRACE).await;
}
