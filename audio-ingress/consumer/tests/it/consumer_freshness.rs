//! Consumer core against a real nats-server: the staleness guard
//! (`max_frame_age_ms`, capture time from the meta key `captured_at_ms` or the
//! `Weir-Captured-At-Ms` header) and declared possible loss (`Weir-Possibly-Lost`).
//! Hand-made packets published with async-nats; counters and events asserted exactly.

use std::time::Duration;

use tokio::sync::broadcast;
use weir_audio_consumer::testing::{
    Book, Recorder, client, connect_options, flush, pcm, publish, wait_until,
};
use weir_audio_consumer::{
    Consumer, ConsumerConfig, ConsumerEvent, ConsumerSettings, LossDeclaration,
};
use weir_protocol::audio::Packet;
use weir_protocol::audio::extension::{PossibleLoss, PossibleLossReason, headers};
use weir_testkit::NatsServer;

async fn start(url: &str, settings: ConsumerSettings, book: &Book) -> Consumer {
    tokio::time::timeout(
        Duration::from_secs(5),
        Consumer::connect_with(
            connect_options(),
            url,
            settings,
            Recorder::factory("c", book.clone()),
        ),
    )
    .await
    .expect("consumer starts in time")
    .expect("consumer starts")
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// The events of interest here, in order (others — none expected — are skipped).
fn drain_events(rx: &mut broadcast::Receiver<ConsumerEvent>) -> Vec<ConsumerEvent> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        if matches!(
            e,
            ConsumerEvent::FramesStale { .. }
                | ConsumerEvent::FramesLost { .. }
                | ConsumerEvent::FramesPossiblyLost { .. }
                | ConsumerEvent::PossibleLossDeclared { .. }
        ) {
            out.push(e);
        }
    }
    out
}

async fn wait_end(consumer: &Consumer) {
    assert!(
        wait_until(Duration::from_secs(5), || consumer
            .stats()
            .totals
            .streams_end_seen
            == 1)
        .await,
        "{:?}",
        consumer.stats()
    );
    weir_audio_consumer::testing::wait_handlers_done(consumer).await;
}

/// Frames captured a minute ago are dropped before the handler and declared as one
/// `Stale` notice per run; fresh frames, frames without a capture time, and the header
/// fallback behave as documented; the timeline identity holds with `stale_frames`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_frames_never_reach_the_handler() {
    let server = NatsServer::start().expect("nats-server");
    // 3 s: generous against a loaded test machine; the stale frames are 60 s old.
    let settings = ConsumerConfig {
        max_frame_age_ms: 3_000,
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("valid");
    let book = Book::default();
    let consumer = start(server.url(), settings, &book).await;
    let mut events = consumer.events();
    let nc = client(server.url()).await;
    let subject = "inference.whisper.stream.s1";
    let now = unix_ms();
    let old = now - 60_000;
    let frame = |seq: u64, at: Option<u64>| Packet::frame(seq, pcm(seq)).with_captured_at_ms(at);
    for seq in 1..=3 {
        publish(&nc, subject, frame(seq, Some(now)), &[]).await;
    }
    for seq in 4..=8 {
        publish(&nc, subject, frame(seq, Some(old)), &[]).await;
    }
    publish(&nc, subject, frame(9, Some(now)), &[]).await;
    // No meta key: the old header is the fallback.
    let old_header = old.to_string();
    publish(
        &nc,
        subject,
        frame(10, None),
        &[(headers::CAPTURED_AT_MS, &old_header)],
    )
    .await;
    // No capture time at all (a deployed Python producer): never judged.
    publish(&nc, subject, frame(11, None), &[]).await;
    publish(&nc, subject, Packet::end(12), &[]).await;
    flush(&nc).await;
    wait_end(&consumer).await;

    let seen = book.lock().expect("book").clone();
    let seen = seen.values().next().expect("one stream");
    assert_eq!(
        seen.timeline,
        vec![
            "f1",
            "f2",
            "f3",
            "Stale4-8",
            "f9",
            "Stale10-10",
            "f11",
            "end:producer"
        ]
    );
    assert_eq!(
        seen.captured,
        vec![Some(now), Some(now), Some(now), Some(now), None]
    );
    let stats = consumer.stats();
    let c = stats.stream("s1").next().expect("record").counters;
    assert_eq!((c.frames, c.samples), (5, 1_600));
    assert_eq!((c.stale_frames, c.stale_samples), (6, 1_920));
    assert_eq!(c.frames_delivered, 5);
    assert_eq!((c.lost_frames, c.possibly_lost_frames), (0, 0));
    assert_eq!(
        c.leading_missing
            + c.frames
            + c.stale_frames
            + c.lost_frames
            + c.possibly_lost_frames
            + c.declared_gap_frames,
        11
    );
    assert_eq!(stats.totals.counters.stale_frames, 6);
    let got = drain_events(&mut events);
    let ages: Vec<u64> = got
        .iter()
        .map(|e| match e {
            ConsumerEvent::FramesStale { max_age_ms, .. } => *max_age_ms,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ages.len(), 2, "{got:?}");
    assert!(
        ages.iter().all(|&a| (60_000..63_000).contains(&a)),
        "{ages:?}"
    );
    let ranges: Vec<(u64, u64, u64)> = got
        .iter()
        .map(|e| match e {
            ConsumerEvent::FramesStale {
                first_seq,
                last_seq,
                samples,
                ..
            } => (*first_seq, *last_seq, *samples),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(ranges, vec![(4, 8, 1_600), (10, 10, 320)]);
    consumer.shutdown(Duration::from_secs(2)).await;
}

fn possibly_lost(first_seq: u64, last_seq: u64, frames: u64, total_frames: u64) -> String {
    PossibleLoss {
        first_seq,
        last_seq,
        frames,
        total_frames,
        reason: PossibleLossReason::UnconfirmedAtDisconnect,
    }
    .to_header_value()
}

/// A hole, then a packet that declares it possibly lost: the hole moves from
/// `lost_frames` to `possibly_lost_frames`; a hole inside an earlier declaration is
/// possibly lost at once (and its undeclared part lost); the declaration repeated on
/// `end` moves nothing twice; an undeclared hole stays lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_possible_loss_over_nats() {
    let server = NatsServer::start().expect("nats-server");
    let settings = ConsumerConfig::default().validate().expect("valid");
    let book = Book::default();
    let consumer = start(server.url(), settings, &book).await;
    let mut events = consumer.events();
    let nc = client(server.url()).await;
    let subject = "inference.whisper.stream.p1";
    let frame = |seq: u64| Packet::frame(seq, pcm(seq));
    for seq in 1..=3 {
        publish(&nc, subject, frame(seq), &[]).await;
    }
    // 4..=6 never published (lost in the producer's connection).
    publish(&nc, subject, frame(7), &[]).await;
    let h = possibly_lost(4, 6, 3, 3);
    publish(&nc, subject, frame(8), &[(headers::POSSIBLY_LOST, &h)]).await;
    // A declaration that arrives before its hole.
    let h = possibly_lost(11, 12, 2, 5);
    publish(&nc, subject, frame(9), &[(headers::POSSIBLY_LOST, &h)]).await;
    // 10..=12 never published: 10 undeclared, 11..=12 declared.
    publish(&nc, subject, frame(13), &[]).await;
    // 14 never published, never declared; the end repeats the last declaration with
    // the cumulative total. (A range spanning every declaration, 4..=12, would also
    // re-label the undeclared hole 10: declarations are matched by range.)
    let h = possibly_lost(11, 12, 2, 5);
    publish(
        &nc,
        subject,
        Packet::end(15),
        &[(headers::POSSIBLY_LOST, &h)],
    )
    .await;
    flush(&nc).await;
    wait_end(&consumer).await;

    let seen = book.lock().expect("book").clone();
    let seen = seen.values().next().expect("one stream");
    assert_eq!(
        seen.timeline,
        vec![
            "f1",
            "f2",
            "f3",
            "Lost4-6",
            "f7",
            "declared4-6:3",
            "f8",
            "declared11-12:0",
            "f9",
            "Lost10-10",
            "PossiblyLost11-12",
            "f13",
            "declared11-12:0",
            "Lost14-14",
            "end:producer"
        ]
    );
    let stats = consumer.stats();
    let c = stats.stream("p1").next().expect("record").counters;
    assert_eq!(c.frames, 7);
    assert_eq!(c.lost_frames, 2, "10 and 14");
    assert_eq!(c.possibly_lost_frames, 5, "4..=6 and 11..=12");
    assert_eq!(c.loss_events, 3);
    assert_eq!(c.possible_loss_declarations, 3);
    assert_eq!((c.holes_forgotten, c.declarations_forgotten), (0, 0));
    assert_eq!(
        c.leading_missing
            + c.frames
            + c.stale_frames
            + c.lost_frames
            + c.possibly_lost_frames
            + c.declared_gap_frames,
        14
    );
    assert_eq!(stats.totals.counters.possibly_lost_frames, 5);
    let declared = |first_seq, last_seq, frames, total_frames, reclassified_frames| {
        ConsumerEvent::PossibleLossDeclared {
            stream: "p1".into(),
            declaration: LossDeclaration {
                first_seq,
                last_seq,
                frames,
                total_frames,
                reason: PossibleLossReason::UnconfirmedAtDisconnect,
                reclassified_frames,
            },
        }
    };
    let lost = |first_seq, last_seq| ConsumerEvent::FramesLost {
        stream: "p1".into(),
        first_seq,
        last_seq,
    };
    assert_eq!(
        drain_events(&mut events),
        vec![
            lost(4, 6),
            declared(4, 6, 3, 3, 3),
            declared(11, 12, 2, 5, 0),
            lost(10, 10),
            ConsumerEvent::FramesPossiblyLost {
                stream: "p1".into(),
                first_seq: 11,
                last_seq: 12
            },
            declared(11, 12, 2, 5, 0),
            lost(14, 14),
        ]
    );
    consumer.shutdown(Duration::from_secs(2)).await;
}
