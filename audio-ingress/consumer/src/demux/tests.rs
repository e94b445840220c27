//! Unit tests of the parent module.

use super::*;
use crate::config::{ConsumerConfig, ConsumerPolicy};
use crate::fence::Liveness;
use crate::handler::channel_factory;
use crate::stats::ConsumerStats;
use std::collections::HashMap as Map;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::sync::mpsc;
use weir_protocol::audio::extension::{EndReason, PossibleLoss, PossibleLossReason, headers};
use weir_protocol::audio::{Gap, GapReason};

type Rx = mpsc::Receiver<(StreamInfo, StreamEvent)>;

fn setup(cfg: ConsumerConfig) -> (Demux<impl HandlerFactory>, Arc<Shared>, Rx) {
    let shared = Arc::new(Shared::new(cfg.validate().expect("valid config")));
    let (tx, rx) = mpsc::channel(10_000);
    let demux = Demux::new(shared.clone(), Arc::new(channel_factory(tx)));
    (demux, shared, rx)
}

fn default_cfg() -> ConsumerConfig {
    ConsumerConfig {
        idle_timeout_ms: 1_000,
        ..ConsumerConfig::default()
    }
}

fn feed<F: HandlerFactory>(d: &mut Demux<F>, stream: &str, packet: Packet) {
    feed_with(d, stream, packet, &[]);
}

fn feed_with<F: HandlerFactory>(
    d: &mut Demux<F>,
    stream: &str,
    packet: Packet,
    hdrs: &[(&str, &str)],
) {
    let bytes = packet.encode().expect("encodable");
    let map: Map<&str, &str> = hdrs.iter().copied().collect();
    d.on_message(
        &format!("inference.whisper.stream.{stream}"),
        &bytes,
        |k| map.get(k).copied(),
        Instant::now(),
    );
}

fn frame(seq: u64) -> Packet {
    Packet::frame(seq, Bytes::from(vec![1u8; 640]))
}

/// Lets the handler tasks run, then drains what they forwarded.
async fn drain(rx: &mut Rx) -> Vec<(StreamInfo, StreamEvent)> {
    tokio::time::sleep(Duration::from_millis(1)).await;
    let mut out = Vec::new();
    while let Ok(x) = rx.try_recv() {
        out.push(x);
    }
    out
}

fn snapshot(shared: &Shared) -> ConsumerStats {
    shared.registry().snapshot(Instant::now())
}

#[tokio::test(start_paused = true)]
async fn in_order_stream_with_end() {
    let (mut d, shared, mut rx) = setup(default_cfg());
    for s in 1..=10 {
        feed(&mut d, "a", frame(s));
    }
    feed_with(
        &mut d,
        "a",
        Packet::end(11),
        &[(headers::END_REASON, "producer")],
    );
    let events = drain(&mut rx).await;
    assert_eq!(events.len(), 11);
    let seqs: Vec<u64> = events
        .iter()
        .filter_map(|(_, e)| match e {
            StreamEvent::Frame(f) => Some(f.seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    let StreamEvent::End(end) = &events[10].1 else {
        panic!("last event must be end");
    };
    assert_eq!(end.seq, Some(11));
    assert_eq!(
        end.cause,
        EndCause::Producer {
            reason: Some(EndReason::Producer),
            overload: None
        }
    );
    let snap = snapshot(&shared);
    let s = &snap.streams[0];
    assert_eq!(s.counters.frames, 10);
    assert_eq!(s.counters.frames_delivered, 10);
    assert_eq!(s.counters.samples, 3_200);
    assert!(s.end_seen);
    assert_eq!(s.end_reason.as_deref(), Some("producer"));
    assert_eq!(s.state, StreamState::Finished);
    assert_eq!((s.first_seq, s.last_seq), (Some(1), Some(11)));
    assert_eq!(d.active(), 0);
}

#[tokio::test(start_paused = true)]
async fn overload_end_headers_reach_handler_and_stats() {
    let (mut d, shared, mut rx) = setup(default_cfg());
    feed(&mut d, "o", frame(1));
    let report = r#"{"reason":"queue_full","dropped_frames":4,"dropped_samples":1280,"pending_bytes":16000,"max_bytes":16000,"max_age_ms":500}"#;
    feed_with(
        &mut d,
        "o",
        Packet::end(6),
        &[
            (headers::END_REASON, "overload"),
            (headers::OVERLOAD, report),
        ],
    );
    let got = drain(&mut rx).await;
    let Some((_, StreamEvent::End(end))) = got.last() else {
        panic!("{got:?}");
    };
    let EndCause::Producer {
        reason: Some(EndReason::Overload),
        overload: Some(o),
    } = &end.cause
    else {
        panic!("{end:?}");
    };
    assert_eq!((o.dropped_frames, o.dropped_samples), (4, 1_280));
    let snap = snapshot(&shared);
    let s = snap.stream("o").next().expect("record");
    assert_eq!(s.end_reason.as_deref(), Some("overload"));
    assert_eq!(
        s.producer_overload.as_ref().map(|o| o.dropped_frames),
        Some(4)
    );
    // Seqs 2..=5 never arrived and no gap packet declared them: counted as lost.
    assert_eq!(s.counters.lost_frames, 4);
}

/// The report names the seqs the overload dropped (ingresses since they could): the
/// hole they leave before the `end` is declared, not an undetected loss.
#[tokio::test(start_paused = true)]
async fn an_overload_report_with_dropped_seqs_declares_their_hole() {
    let (mut d, shared, mut rx) = setup(default_cfg());
    feed(&mut d, "o2", frame(1));
    feed(&mut d, "o2", frame(2));
    let report = r#"{"reason":"max_age","dropped_frames":6,"dropped_samples":1920,"pending_bytes":16000,"max_bytes":16000,"max_age_ms":500,"dropped_first_seq":3,"dropped_last_seq":5}"#;
    feed_with(
        &mut d,
        "o2",
        Packet::end(6),
        &[
            (headers::END_REASON, "overload"),
            (headers::OVERLOAD, report),
        ],
    );
    let _ = drain(&mut rx).await;
    let snap = snapshot(&shared);
    let s = snap.stream("o2").next().expect("record");
    assert_eq!(s.counters.lost_frames, 0, "{:?}", s.counters);
    assert_eq!(s.counters.possibly_lost_frames, 3, "{:?}", s.counters);
    assert_eq!(
        s.producer_overload.as_ref().map(|o| o.dropped_last_seq),
        Some(Some(5))
    );
}

#[tokio::test(start_paused = true)]
async fn loss_and_declared_gaps_are_distinguished() {
    let (mut d, shared, mut rx) = setup(default_cfg());
    feed(&mut d, "a", frame(1));
    feed(&mut d, "a", frame(4)); // 2..=3 lost
    feed(
        &mut d,
        "a",
        Packet::gap(Gap {
            first_seq: 5,
            last_seq: 7,
            samples: 960,
            reason: GapReason::QueueFull,
        }),
    );
    feed(&mut d, "a", frame(8));
    feed(&mut d, "a", frame(8)); // duplicate
    feed(&mut d, "a", Packet::end(10)); // 9 lost
    let kinds: Vec<String> = drain(&mut rx)
        .await
        .into_iter()
        .map(|(_, e)| match e {
            StreamEvent::Frame(f) => format!("f{}", f.seq),
            StreamEvent::Gap(g) => format!("{:?}{}-{}", g.cause, g.first_seq, g.last_seq),
            StreamEvent::End(_) => "end".into(),
            StreamEvent::LossDeclared(d) => format!("{d:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "f1",
            "Lost2-3",
            "f4",
            "Declared(QueueFull)5-7",
            "f8",
            "Lost9-9",
            "end"
        ]
    );
    let c = snapshot(&shared).totals.counters;
    assert_eq!(c.frames, 3);
    assert_eq!(c.lost_frames, 3);
    assert_eq!(c.loss_events, 2);
    assert_eq!(c.declared_gaps, 1);
    assert_eq!(c.declared_gap_frames, 3);
    assert_eq!(c.declared_gap_samples, 960);
    assert_eq!(c.stale_packets, 1);
    // Timeline identity: end seq 10 ⇒ 9 seqs accounted.
    assert_eq!(
        c.leading_missing + c.frames + c.lost_frames + c.declared_gap_frames,
        9
    );
}

#[tokio::test(start_paused = true)]
async fn silent_stream_is_reaped_after_idle_timeout() {
    let (mut d, shared, mut rx) = setup(default_cfg());
    let mut events = shared.events.subscribe();
    feed(&mut d, "gone", frame(1));
    feed(&mut d, "gone", frame(2));
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(d.reap(Instant::now()), 0, "not yet idle");
    feed(&mut d, "alive", frame(1));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(d.reap(Instant::now()), 1);
    let got = drain(&mut rx).await;
    let (info, StreamEvent::End(end)) = got.last().expect("events") else {
        panic!("last event must be the end: {got:?}");
    };
    assert_eq!(info.stream, "gone");
    assert_eq!(
        end.cause,
        EndCause::Idle {
            silent_for: Duration::from_millis(1_000)
        }
    );
    assert_eq!(
        events.try_recv().expect("reaped event"),
        ConsumerEvent::StreamReaped {
            stream: "gone".into(),
            partition: 0,
            last_seq: Some(2),
            silent_ms: 1_000
        }
    );
    let snap = snapshot(&shared);
    let gone = snap.stream("gone").next().expect("record");
    assert!(gone.reaped && !gone.end_seen);
    assert_eq!(gone.ended_by.as_deref(), Some("idle"));
    assert_eq!(snap.totals.streams_reaped, 1);
    assert_eq!(snap.totals.streams_active, 1);
    assert_eq!(d.active(), 1);
}

/// A handler that never returns: its queue fills and the bound fires.
struct Stuck;
impl StreamHandler for Stuck {
    async fn on_event(&mut self, _event: StreamEvent) {
        std::future::pending::<()>().await;
    }
}

#[tokio::test(start_paused = true)]
async fn close_policy_ends_stuck_stream_and_counts_the_rest() {
    let shared = Arc::new(Shared::new(default_cfg().validate().expect("valid")));
    let mut d = Demux::new(shared.clone(), Arc::new(|_: &StreamInfo| Stuck));
    // 16,000 bytes = 25 frames; the handler holds frame 1, so 26 fit in all.
    for s in 1..=40 {
        feed(&mut d, "slow", frame(s));
        tokio::task::yield_now().await;
    }
    feed(&mut d, "slow", Packet::end(41));
    let snap = snapshot(&shared);
    let s = snap.stream("slow").next().expect("record");
    assert_eq!(s.counters.frames, 40);
    assert_eq!(s.counters.overloads, 1);
    assert_eq!(s.ended_by.as_deref(), Some("overload"));
    assert!(s.end_seen);
    assert!(s.pending_bytes <= 16_000, "{}", s.pending_bytes);
    assert_eq!(
        s.counters.frames_dropped_closed + s.pending_frames as u64 + 1,
        40,
        "every frame is queued, held by the handler, or dropped: {s:?}"
    );
    assert_eq!(d.active(), 0);
    // Shutdown aborts the stuck handler at the deadline.
    d.shutdown(Instant::now() + Duration::from_millis(50)).await;
    let s = snapshot(&shared);
    let s = s.stream("slow").next().expect("record");
    assert_eq!(s.state, StreamState::Finished);
    assert_eq!(
        s.counters.frames_dropped_closed + s.counters.frames_dropped_handler_gone,
        40,
        "{s:?}"
    );
}

/// A handler that takes 100 ms per frame: 5× slower than real time.
struct Slow;
impl StreamHandler for Slow {
    async fn on_event(&mut self, event: StreamEvent) {
        if let StreamEvent::Frame(_) = event {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn gap_policy_keeps_the_timeline_and_the_bound() {
    let cfg = ConsumerConfig {
        policy: ConsumerPolicy::Gap,
        ..default_cfg()
    };
    let shared = Arc::new(Shared::new(cfg.validate().expect("valid")));
    let mut d = Demux::new(shared.clone(), Arc::new(|_: &StreamInfo| Slow));
    for s in 1..=200 {
        feed(&mut d, "slow", frame(s));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let snap = snapshot(&shared);
        let st = snap.stream("slow").next().expect("record");
        assert!(st.pending_bytes <= 16_000);
        assert!(st.oldest_pending_ms <= 521.0, "{}", st.oldest_pending_ms);
    }
    feed(&mut d, "slow", Packet::end(201));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let snap = snapshot(&shared);
    let s = snap.stream("slow").next().expect("record");
    assert_eq!(s.state, StreamState::Finished);
    assert!(s.counters.frames_dropped_overload > 0);
    assert_eq!(
        s.counters.frames_delivered + s.counters.frames_dropped_overload,
        200,
        "{s:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn restart_and_orphan_end() {
    let (mut d, shared, mut rx) = setup(default_cfg());
    for s in 1..=5 {
        feed(&mut d, "r", frame(s));
    }
    feed(&mut d, "r", frame(1));
    feed(&mut d, "r", Packet::end(2));
    feed(&mut d, "never-seen", Packet::end(7));
    let got = drain(&mut rx).await;
    let ends: Vec<(u64, &'static str)> = got
        .iter()
        .filter_map(|(i, e)| match e {
            StreamEvent::End(end) => Some((i.instance, end.cause.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(ends, vec![(1, "restarted"), (2, "producer")]);
    let snap = snapshot(&shared);
    assert_eq!(snap.totals.streams_started, 2);
    assert_eq!(snap.totals.orphan_ends, 1);
    assert_eq!(snap.totals.counters.frames, 6);
}

#[tokio::test(start_paused = true)]
async fn bad_packets_and_subjects_are_counted() {
    let (mut d, shared, _rx) = setup(default_cfg());
    let none = |_: &str| None::<&str>;
    let now = Instant::now();
    d.on_message(
        "inference.whisper.stream.a",
        &Bytes::from_static(b"\x00"),
        none,
        now,
    );
    d.on_message(
        "inference.whisper.stream.a",
        &Bytes::from_static(b"\x00\x00\x00\x02{}"),
        none,
        now,
    );
    d.on_message("other.subject", &frame(1).encode().expect("enc"), none, now);
    let t = snapshot(&shared).totals;
    assert_eq!(t.messages, 3);
    assert_eq!(t.unroutable_subjects, 1);
    assert_eq!(t.decode_errors_by_kind.get("truncated"), Some(&1));
    assert_eq!(t.decode_errors_by_kind.get("missing_field"), Some(&1));
    assert_eq!(t.streams_started, 0);
}

/// Beyond `max_streams` a new stream is refused: no handler, counted by reason, an
/// event, its frames counted as refused. It stays refused (sticky) until its `end`,
/// even when room appears, and the "sent" identity holds over all streams.
#[tokio::test(start_paused = true)]
async fn streams_over_max_streams_are_refused_and_accounted() {
    let (mut d, shared, mut rx) = setup(ConsumerConfig {
        max_streams: 2,
        ..default_cfg()
    });
    let mut events = shared.events.subscribe();
    for s in 1..=3 {
        feed(&mut d, "a", frame(s));
        feed(&mut d, "b", frame(s));
    }
    // "c" is the third live stream: refused, with a declared gap among its packets.
    feed(&mut d, "c", frame(1));
    feed(&mut d, "c", frame(2));
    feed(
        &mut d,
        "c",
        Packet::gap(Gap {
            first_seq: 3,
            last_seq: 5,
            samples: 960,
            reason: GapReason::QueueFull,
        }),
    );
    assert_eq!(d.active(), 2);
    assert_eq!(
        events.try_recv().expect("refused event"),
        ConsumerEvent::StreamRefused {
            stream: "c".into(),
            partition: 0,
            reason: RefuseReason::MaxStreams,
            seq: 1,
        }
    );
    assert!(events.try_recv().is_err(), "one event per refused stream");
    // "a" ends; once its handler has drained, its slot is free.
    feed(&mut d, "a", Packet::end(4));
    let got = drain(&mut rx).await;
    assert!(got.iter().all(|(i, _)| i.stream != "c"), "no handler for c");
    assert_eq!(shared.stream_slots.taken(), 1);
    // "c" stays refused although there is room now; its end forgets it.
    feed(&mut d, "c", frame(6));
    feed(&mut d, "c", Packet::end(7));
    assert_eq!(shared.refused_slots.taken(), 0);
    // A new stream takes the free slot.
    feed(&mut d, "d", frame(1));
    feed(&mut d, "d", Packet::end(2));
    feed(&mut d, "b", Packet::end(4));
    let got = drain(&mut rx).await;
    assert!(got.iter().all(|(i, _)| i.stream != "c"), "no handler for c");
    assert_eq!(d.active(), 0);
    assert_eq!(shared.stream_slots.taken(), 0, "every slot released");

    let t = snapshot(&shared).totals;
    assert_eq!(t.streams_started, 3);
    assert_eq!(t.streams_refused.get("max_streams"), Some(&1));
    assert_eq!(
        t.frames_refused, 6,
        "frames 1, 2, 6 and the 3 declared 3..=5"
    );
    assert_eq!(
        t.orphan_ends, 0,
        "the refused stream's end is not an orphan"
    );
    // Sent: a 3, b 3, c 6, d 1.
    let c = t.counters;
    assert_eq!(
        c.frames + c.lost_frames + c.declared_gap_frames + c.leading_missing + t.frames_refused,
        13
    );
}

/// A refused stream that goes silent is forgotten after the idle timeout; if it
/// comes back later and there is room, it starts (as a late join).
#[tokio::test(start_paused = true)]
async fn refused_stream_is_forgotten_after_the_idle_timeout() {
    let (mut d, shared, _rx) = setup(ConsumerConfig {
        max_streams: 1,
        ..default_cfg()
    });
    feed(&mut d, "a", frame(1));
    feed(&mut d, "b", frame(1));
    assert_eq!(shared.refused_slots.taken(), 1);
    tokio::time::advance(Duration::from_millis(1_000)).await;
    assert_eq!(d.reap(Instant::now()), 1, "a reaped");
    assert_eq!(shared.refused_slots.taken(), 0, "b forgotten");
    tokio::time::sleep(Duration::from_millis(1)).await;
    feed(&mut d, "b", frame(60));
    assert_eq!(d.active(), 1);
    let snap = snapshot(&shared);
    assert_eq!(snap.stream("b").count(), 1);
    assert_eq!(snap.totals.frames_refused, 1);
}

/// A refused stream that keeps sending has its refusal notified again at most once per
/// announcement interval (a notice can be lost on core NATS), and a producer retrying
/// the same id after its `end` was lost is notified too; a silent one gets nothing more.
#[tokio::test(start_paused = true)]
async fn a_refused_stream_that_keeps_sending_is_notified_once_per_interval() {
    let (mut d, shared, _rx) = setup(ConsumerConfig {
        max_streams: 1,
        idle_timeout_ms: 10_000,
        capacity: crate::CapacityConfig {
            interval_ms: 200,
            ..crate::CapacityConfig::default()
        },
        ..default_cfg()
    });
    let mut notes = shared.capacity.take_refused().expect("announce is on");
    feed(&mut d, "a", frame(1));
    let start = Instant::now();
    let mut at = Vec::new();
    // "b" streams at real-time pace for 0.5 s (2.5 intervals): a frame every 20 ms.
    for seq in 1..=26 {
        feed(&mut d, "b", frame(seq));
        while let Ok(note) = notes.try_recv() {
            assert_eq!((note.stream.as_str(), note.live_streams), ("b", 1));
            assert!(note.remembered);
            at.push((Instant::now() - start).as_millis());
        }
        tokio::time::advance(Duration::from_millis(20)).await;
    }
    assert_eq!(at, vec![0, 200, 400], "at once, then once per interval");
    // Silent (its end lost), then retried from seq 1 within the idle timeout: still
    // refused, and notified at its first packet since the last notice is old.
    tokio::time::advance(Duration::from_millis(300)).await;
    feed(&mut d, "b", frame(1));
    feed(&mut d, "b", frame(2));
    assert_eq!(
        notes.try_recv().map(|n| n.stream).ok().as_deref(),
        Some("b")
    );
    assert!(notes.try_recv().is_err(), "one notice, not one per packet");
    let t = snapshot(&shared).totals;
    assert_eq!(t.streams_refused.get("max_streams"), Some(&1));
    assert_eq!(t.frames_refused, 28);
}

/// A demultiplexer whose wall clock is the returned cell (Unix ms).
#[tokio::test(start_paused = true)]
async fn handover_declares_the_leading_seqs_and_the_fence_stops_delivery() {
    let cfg = ConsumerConfig::partitioned("inference.whisper.stream.{stream}", 1, [0]);
    let shared = Arc::new(Shared::new(cfg.validate().expect("valid config")));
    let (tx, mut rx) = mpsc::channel(10_000);
    let now = Instant::now();
    let fence = Arc::new(Fence::new(
        now,
        now + Duration::from_secs(9),
        Liveness::for_a_day(now),
    ));
    let mut d = Demux::leased(
        shared.clone(),
        Arc::new(channel_factory(tx)),
        fence.clone(),
        true,
    );
    // Picked up mid-stream after a takeover: seqs 1..=40 are a handover gap.
    feed(&mut d, "s1", frame(41));
    feed(&mut d, "s1", frame(42));
    let events = drain(&mut rx).await;
    let gap = events.iter().find_map(|(_, e)| match e {
        StreamEvent::Gap(g) => Some(g.clone()),
        _ => None,
    });
    assert_eq!(
        gap,
        Some(GapNotice {
            first_seq: 1,
            last_seq: 40,
            samples: None,
            cause: GapCause::Handover
        })
    );
    let c = snapshot(&shared).totals.counters;
    assert_eq!((c.leading_missing, c.handover_frames), (40, 40));
    assert_eq!(c.frames_delivered, 2);
    // The fence closes: what is queued or arrives later never reaches the handler,
    // and the end says handover.
    fence.revoke();
    feed(&mut d, "s1", frame(43));
    d.shutdown(Instant::now() + Duration::from_secs(1)).await;
    let events = drain(&mut rx).await;
    assert!(
        events
            .iter()
            .all(|(_, e)| !matches!(e, StreamEvent::Frame(_))),
        "{events:?}"
    );
    assert!(matches!(
        events.last(),
        Some((
            _,
            StreamEvent::End(End {
                cause: EndCause::Handover,
                ..
            })
        ))
    ));
    let c = snapshot(&shared).totals.counters;
    assert_eq!(c.frames_dropped_fenced, 1);
    assert_eq!(c.frames, c.frames_delivered + c.frames_dropped_fenced);
}

#[tokio::test(start_paused = true)]
async fn without_a_previous_owner_a_late_join_stays_leading_missing() {
    let cfg = ConsumerConfig::partitioned("inference.whisper.stream.{stream}", 1, [0]);
    let shared = Arc::new(Shared::new(cfg.validate().expect("valid config")));
    let (tx, mut rx) = mpsc::channel(10_000);
    let now = Instant::now();
    let fence = Arc::new(Fence::new(
        now,
        now + Duration::from_secs(9),
        Liveness::for_a_day(now),
    ));
    let mut d = Demux::leased(shared.clone(), Arc::new(channel_factory(tx)), fence, false);
    feed(&mut d, "s1", frame(5));
    let events = drain(&mut rx).await;
    assert!(
        events
            .iter()
            .all(|(_, e)| !matches!(e, StreamEvent::Gap(_)))
    );
    let c = snapshot(&shared).totals.counters;
    assert_eq!((c.leading_missing, c.handover_frames), (4, 0));
}

fn setup_clock(
    cfg: ConsumerConfig,
) -> (
    Demux<impl HandlerFactory>,
    Arc<Shared>,
    Rx,
    Arc<std::sync::atomic::AtomicU64>,
) {
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(NOW_MS));
    let read = clock.clone();
    let shared = Arc::new(Shared::with_clock(
        cfg.validate().expect("valid config"),
        Arc::new(move || read.load(Ordering::Relaxed)),
    ));
    let (tx, rx) = mpsc::channel(10_000);
    let demux = Demux::new(shared.clone(), Arc::new(channel_factory(tx)));
    (demux, shared, rx, clock)
}

const NOW_MS: u64 = 1_764_500_000_000;

/// A frame captured `age_ms` before [`NOW_MS`] (meta key).
fn aged(seq: u64, age_ms: u64) -> Packet {
    frame(seq).with_captured_at_ms(Some(NOW_MS - age_ms))
}

fn describe(events: &[(StreamInfo, StreamEvent)]) -> Vec<String> {
    events
        .iter()
        .map(|(_, e)| match e {
            StreamEvent::Frame(f) => format!("f{}", f.seq),
            StreamEvent::Gap(g) => format!("{:?}{}-{}", g.cause, g.first_seq, g.last_seq),
            StreamEvent::End(e) => format!("end:{}", e.cause.as_str()),
            StreamEvent::LossDeclared(d) => format!(
                "declared{}-{}:{}",
                d.first_seq, d.last_seq, d.reclassified_frames
            ),
        })
        .collect()
}

fn all_events(rx: &mut broadcast::Receiver<ConsumerEvent>) -> Vec<ConsumerEvent> {
    let mut out = Vec::new();
    while let Ok(e) = rx.try_recv() {
        out.push(e);
    }
    out
}

/// Frames older than `max_frame_age_ms` (default 1 s) are dropped before the
/// handler, coalesced into one `stale` notice per run, counted apart from `frames`;
/// the meta capture time wins over the header, frames without one are never judged,
/// a capture time in the future is fresh.
#[tokio::test(start_paused = true)]
async fn stale_frames_are_dropped_before_the_handler_and_declared() {
    let (mut d, shared, mut rx, _clock) = setup_clock(default_cfg());
    let mut events = shared.events.subscribe();
    feed(&mut d, "a", aged(1, 0));
    feed(&mut d, "a", aged(2, 999));
    feed(&mut d, "a", aged(3, 1_000)); // exactly the bound: still fresh
    feed(&mut d, "a", aged(4, 1_001));
    feed(&mut d, "a", aged(5, 6_000));
    feed(&mut d, "a", aged(6, 2_000));
    feed(
        &mut d,
        "a",
        frame(7).with_captured_at_ms(Some(NOW_MS + 5_000)),
    ); // skew
    let old = (NOW_MS - 3_000).to_string();
    // The old header as a fallback...
    feed_with(&mut d, "a", frame(8), &[(headers::CAPTURED_AT_MS, &old)]);
    // ...but the meta key wins over it.
    feed_with(&mut d, "a", aged(9, 10), &[(headers::CAPTURED_AT_MS, &old)]);
    feed(&mut d, "a", frame(10)); // no capture time: never judged
    feed(&mut d, "a", aged(11, 5_000));
    feed(&mut d, "a", Packet::end(12));
    let got = drain(&mut rx).await;
    assert_eq!(
        describe(&got),
        vec![
            "f1",
            "f2",
            "f3",
            "Stale4-6",
            "f7",
            "Stale8-8",
            "f9",
            "f10",
            "Stale11-11",
            "end:producer"
        ]
    );
    let StreamEvent::Gap(g) = &got[3].1 else {
        panic!()
    };
    assert_eq!(g.samples, Some(960));
    let StreamEvent::Frame(f9) = &got[6].1 else {
        panic!()
    };
    assert_eq!(f9.captured_at_ms, Some(NOW_MS - 10));
    assert_eq!(
        all_events(&mut events),
        vec![
            ConsumerEvent::FramesStale {
                stream: "a".into(),
                first_seq: 4,
                last_seq: 6,
                samples: 960,
                max_age_ms: 6_000
            },
            ConsumerEvent::FramesStale {
                stream: "a".into(),
                first_seq: 8,
                last_seq: 8,
                samples: 320,
                max_age_ms: 3_000
            },
            ConsumerEvent::FramesStale {
                stream: "a".into(),
                first_seq: 11,
                last_seq: 11,
                samples: 320,
                max_age_ms: 5_000
            },
        ]
    );
    let snap = snapshot(&shared);
    let c = snap.stream("a").next().expect("record").counters;
    assert_eq!((c.frames, c.samples), (6, 1_920));
    assert_eq!((c.stale_frames, c.stale_samples), (5, 1_600));
    assert_eq!(c.frames_delivered, 6);
    assert_eq!(c.lost_frames, 0, "a stale frame is not a loss");
    // Timeline identity: end seq 12 ⇒ 11 seqs.
    assert_eq!(
        c.leading_missing
            + c.frames
            + c.stale_frames
            + c.lost_frames
            + c.possibly_lost_frames
            + c.declared_gap_frames,
        11
    );
    assert_eq!(snap.totals.counters.stale_frames, 5);
}

/// A stale run is cut by a hole (its notice comes first, in seq order) and flushed
/// before the `End` of a reaped stream; `0` turns the guard off.
#[tokio::test(start_paused = true)]
async fn stale_runs_keep_seq_order_and_the_guard_can_be_off() {
    let (mut d, shared, mut rx, clock) = setup_clock(default_cfg());
    feed(&mut d, "a", aged(1, 1_500));
    feed(&mut d, "a", aged(2, 1_500));
    feed(&mut d, "a", aged(5, 1_500)); // 3..=4 lost
    feed(&mut d, "a", aged(6, 0));
    // The producer's clock is fine but this host's jumps ahead: 7 is now stale.
    clock.fetch_add(2_000, Ordering::Relaxed);
    feed(&mut d, "a", aged(7, 0));
    tokio::time::advance(Duration::from_millis(1_000)).await;
    assert_eq!(d.reap(Instant::now()), 1);
    assert_eq!(
        describe(&drain(&mut rx).await),
        vec![
            "Stale1-2", "Lost3-4", "Stale5-5", "f6", "Stale7-7", "end:idle"
        ]
    );
    let c = snapshot(&shared).totals.counters;
    assert_eq!((c.frames, c.stale_frames, c.lost_frames), (1, 4, 2));

    let (mut d, shared, mut rx, _clock) = setup_clock(ConsumerConfig {
        max_frame_age_ms: 0,
        ..default_cfg()
    });
    feed(&mut d, "a", aged(1, 60_000));
    feed(&mut d, "a", Packet::end(2));
    assert_eq!(describe(&drain(&mut rx).await), vec!["f1", "end:producer"]);
    assert_eq!(snapshot(&shared).totals.counters.stale_frames, 0);
}

fn possibly_lost(first_seq: u64, last_seq: u64, total: u64) -> String {
    PossibleLoss {
        first_seq,
        last_seq,
        frames: last_seq - first_seq + 1,
        total_frames: total,
        reason: PossibleLossReason::UnconfirmedAtDisconnect,
    }
    .to_header_value()
}

/// `Weir-Possibly-Lost` after the hole moves it from lost to possibly lost; a hole
/// inside an already declared range is possibly lost at once; the cumulative
/// declaration on `end` moves nothing twice; an undeclared hole stays lost.
#[tokio::test(start_paused = true)]
async fn declared_possible_loss_is_told_apart_from_undetected_holes() {
    let (mut d, shared, mut rx) = setup(default_cfg());
    let mut events = shared.events.subscribe();
    for s in 1..=3 {
        feed(&mut d, "a", frame(s));
    }
    feed(&mut d, "a", frame(7)); // 4..=6 missing: lost, for now
    let h = possibly_lost(4, 6, 3);
    feed_with(&mut d, "a", frame(8), &[(headers::POSSIBLY_LOST, &h)]);
    // Declared before its hole is seen (the declaring packet came first).
    let h = possibly_lost(10, 12, 6);
    feed_with(&mut d, "a", frame(9), &[(headers::POSSIBLY_LOST, &h)]);
    feed(&mut d, "a", frame(13)); // 10..=12 missing: declared
    let h = possibly_lost(4, 12, 6);
    feed_with(
        &mut d,
        "a",
        Packet::end(15),
        &[(headers::POSSIBLY_LOST, &h)],
    ); // 14 lost
    assert_eq!(
        describe(&drain(&mut rx).await),
        vec![
            "f1",
            "f2",
            "f3",
            "Lost4-6",
            "f7",
            "declared4-6:3",
            "f8",
            "declared10-12:0",
            "f9",
            "PossiblyLost10-12",
            "f13",
            "declared4-12:0",
            "Lost14-14",
            "end:producer"
        ]
    );
    let c = snapshot(&shared).totals.counters;
    assert_eq!(c.frames, 7);
    assert_eq!(c.lost_frames, 1);
    assert_eq!(c.possibly_lost_frames, 6);
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
    let got = all_events(&mut events);
    let declared = |first_seq, last_seq, frames, total_frames, reclassified_frames| {
        ConsumerEvent::PossibleLossDeclared {
            stream: "a".into(),
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
    assert_eq!(
        got,
        vec![
            ConsumerEvent::FramesLost {
                stream: "a".into(),
                first_seq: 4,
                last_seq: 6
            },
            declared(4, 6, 3, 3, 3),
            declared(10, 12, 3, 6, 0),
            ConsumerEvent::FramesPossiblyLost {
                stream: "a".into(),
                first_seq: 10,
                last_seq: 12
            },
            declared(4, 12, 9, 6, 0),
            ConsumerEvent::FramesLost {
                stream: "a".into(),
                first_seq: 14,
                last_seq: 14
            },
        ]
    );
}

/// A malformed `Weir-Possibly-Lost` changes nothing: the hole stays lost.
#[tokio::test(start_paused = true)]
async fn malformed_possible_loss_header_is_ignored() {
    let (mut d, shared, _rx) = setup(default_cfg());
    feed(&mut d, "a", frame(1));
    feed(&mut d, "a", frame(4));
    feed_with(&mut d, "a", frame(5), &[(headers::POSSIBLY_LOST, "[2,3]")]);
    let c = snapshot(&shared).totals.counters;
    assert_eq!((c.lost_frames, c.possibly_lost_frames), (2, 0));
    assert_eq!(c.possible_loss_declarations, 0);
}

/// Counts derived from network numbers (declared samples, seq jumps) saturate:
/// a hostile producer cannot overflow them and panic the dispatcher.
#[tokio::test(start_paused = true)]
async fn huge_declared_counts_saturate_instead_of_overflowing() {
    let (mut d, shared, _rx) = setup(default_cfg());
    let huge = |first_seq, last_seq| {
        Packet::gap(Gap {
            first_seq,
            last_seq,
            samples: u64::MAX,
            reason: GapReason::QueueFull,
        })
    };
    feed(&mut d, "h", frame(1));
    feed(&mut d, "h", huge(2, 3));
    feed(&mut d, "h", huge(4, u64::MAX - 1));
    // Restart with the same id, then jump: another instance with huge counts.
    feed(&mut d, "h", frame(1));
    feed(&mut d, "h", frame(u64::MAX - 1));
    // A second stream: the totals add two huge numbers.
    feed(&mut d, "k", huge(1, 10));
    let t = snapshot(&shared).totals;
    assert_eq!(t.counters.declared_gap_samples, u64::MAX);
    assert_eq!(t.counters.declared_gap_frames, u64::MAX);
    assert_eq!(t.counters.lost_frames, u64::MAX - 3);
    let lost_plus_gaps = t
        .counters
        .lost_frames
        .saturating_add(t.counters.declared_gap_frames);
    assert_eq!(lost_plus_gaps, u64::MAX);
}
