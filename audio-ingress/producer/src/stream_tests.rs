//! Paused-clock tests of the producer core (stream handle + publisher task) against an
//! in-memory sink that can be stalled like a stopped NATS server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use tokio::sync::watch;
use weir_protocol::WireName;
use weir_protocol::audio::extension::{EndReason, Extensions, OverloadReason};
use weir_protocol::audio::{DecodeOptions, Packet, PacketBody, decode};

use crate::config::{Policy, StreamConfig};
use crate::error::{OpenErrorKind, PushError};
use crate::publisher::{Sink, SinkError, SinkErrorKind, SinkResult};
use crate::stats::DropReason;
use crate::stream::Ingress;

#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub subject: String,
    pub packet: Packet,
    pub ext: Extensions,
}

/// Records every message; `stall(true)` makes `publish` wait until `stall(false)`
/// (cancel-safe: a cancelled publish records nothing), `fail(true)` returns errors.
#[derive(Clone)]
pub(crate) struct MemorySink {
    sent: Arc<Mutex<Vec<Sent>>>,
    stalled: watch::Sender<bool>,
    failing: Arc<Mutex<bool>>,
    confirm: Option<Arc<MemoryConfirmer>>,
}

/// A confirmer whose rounds can be held (a stalled server that still let the client
/// queue) and whose epoch can be bumped (a reconnect).
pub(crate) struct MemoryConfirmer {
    held: watch::Sender<bool>,
    epoch: std::sync::atomic::AtomicU64,
}

impl crate::confirm::Confirmer for MemoryConfirmer {
    fn round(&self) -> futures::future::BoxFuture<'_, SinkResult> {
        Box::pin(async move {
            let mut rx = self.held.subscribe();
            let _ = rx.wait_for(|h| !*h).await;
            Ok(())
        })
    }
    fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl MemorySink {
    fn new() -> Self {
        Self {
            sent: Arc::default(),
            stalled: watch::channel(false).0,
            failing: Arc::default(),
            confirm: None,
        }
    }
    /// A sink whose hand-overs the "server" confirms (see [`MemoryConfirmer`]).
    pub(crate) fn confirming() -> Self {
        Self {
            confirm: Some(Arc::new(MemoryConfirmer {
                held: watch::channel(false).0,
                epoch: std::sync::atomic::AtomicU64::new(1),
            })),
            ..Self::new()
        }
    }
    /// Holds (or releases) confirmations: publishes still succeed.
    pub(crate) fn hold_confirm(&self, on: bool) {
        if let Some(c) = &self.confirm {
            c.held.send_replace(on);
        }
    }
    /// A reconnect: rounds in flight and batches opened before it lose their frames.
    pub(crate) fn reconnect(&self) {
        if let Some(c) = &self.confirm {
            c.epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn stall(&self, on: bool) {
        self.stalled.send_replace(on);
    }
    pub(crate) fn sent(&self) -> Vec<Sent> {
        self.sent.lock().expect("lock").clone()
    }
}

impl Sink for MemorySink {
    async fn publish(&self, subject: Subject, headers: HeaderMap, payload: Bytes) -> SinkResult {
        let mut rx = self.stalled.subscribe();
        let _ = rx.wait_for(|s| !*s).await;
        if *self.failing.lock().expect("lock") {
            return Err(SinkError::new(SinkErrorKind::Publish, "failing"));
        }
        let packet = decode(&payload, &DecodeOptions::default())
            .map_err(|e| SinkError::with_source(SinkErrorKind::Publish, "undecodable", e))?;
        let ext = Extensions::read(|k| headers.get(k).map(|v| v.as_str()));
        self.sent.lock().expect("lock").push(Sent {
            subject: subject.to_string(),
            packet,
            ext,
        });
        Ok(())
    }

    fn confirmer(&self) -> Option<Arc<dyn crate::confirm::Confirmer>> {
        self.confirm
            .clone()
            .map(|c| c as Arc<dyn crate::confirm::Confirmer>)
    }
}

pub(crate) fn pcm() -> Bytes {
    Bytes::from(vec![1u8; 640])
}

pub(crate) const FRAME: Duration = Duration::from_millis(20);

async fn settle() {
    // Let spawned tasks run (paused clock: no real time passes).
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

pub(crate) fn frames_of(sent: &[Sent]) -> Vec<u64> {
    sent.iter()
        .filter(|s| matches!(s.packet.body, PacketBody::Frame { .. }))
        .map(|s| s.packet.seq)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn frames_then_end_in_order_with_headers() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let s = ingress.open("call-1", Some("sess".into())).expect("open");
    assert_eq!(s.subject(), "inference.whisper.stream.call-1");
    for i in 1..=10 {
        assert_eq!(s.try_push(pcm()), Ok(i));
        tokio::time::advance(FRAME).await;
    }
    let summary = s.finish().await;
    assert!(summary.finished);
    assert!(summary.snapshot.end_delivered);
    assert_eq!(summary.snapshot.frames.published, 10);
    let sent = sink.sent();
    assert_eq!(frames_of(&sent), (1..=10).collect::<Vec<_>>());
    let end = sent.last().expect("end");
    assert_eq!(
        (end.packet.body.clone(), end.packet.seq),
        (PacketBody::End, 11)
    );
    assert_eq!(end.ext.end_reason, Some(EndReason::Producer));
    assert_eq!(end.packet.session_id.as_deref(), Some("sess"));
    // Frames carry no headers by default: the capture time is in the meta.
    assert!(sent[..10].iter().all(|m| m.ext.version.is_none()));
    assert_eq!(end.ext.version, Some(1));
    assert!(
        sent.iter()
            .all(|m| m.subject == "inference.whisper.stream.call-1")
    );
    assert!(sent[0].packet.captured_at_ms.is_some());
    assert!(sent[0].ext.captured_at_ms.is_none());
    assert_eq!(ingress.active_streams(), 0);
    let stats = ingress.stats();
    assert_eq!(stats.frames.published, 10);
    assert_eq!(stats.pending_bytes, 0);
    assert_eq!(stats.queue_wait_ms.count, 10);
}

#[tokio::test(start_paused = true)]
async fn ids_are_exclusive_and_capped_and_released_after_end() {
    let sink = MemorySink::new();
    let ingress = Ingress::with_max_streams(sink.clone(), StreamConfig::default(), 2);
    let a = ingress.open("a", None).expect("a");
    assert_eq!(
        ingress.open("a", None).map_err(|e| e.kind()).err(),
        Some(OpenErrorKind::AlreadyActive)
    );
    assert_eq!(
        ingress.open("a.b", None).map_err(|e| e.kind()).err(),
        Some(OpenErrorKind::InvalidId)
    );
    let _b = ingress.open("b", None).expect("b");
    assert_eq!(
        ingress.open("c", None).map_err(|e| e.kind()).err(),
        Some(OpenErrorKind::TooManyStreams)
    );
    assert_eq!(ingress.stats().admission_rejects, 3);
    a.finish().await;
    assert!(
        ingress.open("a", None).is_ok(),
        "the id is free again once the end is out"
    );
}

#[tokio::test(start_paused = true)]
async fn a_view_outlives_finish_and_changes_nothing() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let s = ingress.open("viewed", Some("sess".into())).expect("open");
    let view = s.view();
    assert_eq!(view.id().as_str(), "viewed");
    assert_eq!(view.subject(), s.subject());
    assert_eq!(view.session_id(), Some("sess"));
    // Dropping a view does not end the stream.
    drop(s.view());
    assert_eq!(s.try_push(pcm()), Ok(1));
    let summary = s.finish().await;
    assert!(summary.finished);
    // The view still reads the finished stream, and holds no slot.
    assert!(view.status().borrow().finished);
    assert_eq!(view.snapshot().frames.published, 1);
    assert!(view.wait_finished(Duration::from_millis(1)).await.finished);
    assert!(
        ingress.open("viewed", None).is_ok(),
        "the view holds no slot"
    );
}

#[tokio::test(start_paused = true)]
async fn dropped_handle_ends_with_producer_gone_after_draining() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let s = ingress.open("gone", None).expect("open");
    for _ in 0..3 {
        s.try_push(pcm()).expect("room");
    }
    drop(s);
    ingress.wait_idle().await;
    let sent = sink.sent();
    assert_eq!(frames_of(&sent), vec![1, 2, 3]);
    let end = sent.last().expect("end");
    assert_eq!(end.packet.seq, 4);
    assert_eq!(end.ext.end_reason, Some(EndReason::ProducerGone));
}

/// NATS stalls: in `close` the stream overloads within max_wait (+ a frame), the
/// producer learns why, and the `end` is delivered once NATS is back.
#[tokio::test(start_paused = true)]
async fn close_policy_under_a_stall_overloads_and_delivers_end_after_resume() {
    let sink = MemorySink::new();
    let cfg = StreamConfig::builder()
        .publish_timeout(Duration::from_millis(500)) // so the byte bound trips first
        .build()
        .expect("cfg");
    let ingress = Ingress::new(sink.clone(), cfg);
    let s = ingress.open("stall", None).expect("open");
    let status = s.status();
    sink.stall(true);
    let mut first_full = None;
    let mut overload_at = None;
    let start = tokio::time::Instant::now();
    for _ in 0..100 {
        match s.try_push(pcm()) {
            Ok(_) => {}
            Err(PushError::Full { .. }) => {
                first_full.get_or_insert(tokio::time::Instant::now());
            }
            Err(PushError::Overloaded(o)) => {
                overload_at = Some((tokio::time::Instant::now(), o));
                break;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(s.snapshot().pending_bytes <= 16_000);
        // Twice real time, so the byte bound trips before the age bound.
        tokio::time::advance(FRAME / 2).await;
    }
    let first_full = first_full.expect("became full");
    let (at, report) = overload_at.expect("overloaded");
    assert!(
        at - first_full <= Duration::from_millis(100) + FRAME,
        "{:?}",
        at - first_full
    );
    assert!(at - start < Duration::from_secs(1));
    assert_eq!(report.reason, OverloadReason::QueueFull);
    assert_eq!(report.max_bytes, 16_000);
    assert!(s.snapshot().pending_bytes_high_water <= 16_000);
    // The producer sees it on the status watch too.
    assert_eq!(status.borrow().end_reason, Some(EndReason::Overload));
    assert!(matches!(s.try_push(pcm()), Err(PushError::Overloaded(_))));

    // NATS back after 5 s: the end goes out with the overload report.
    tokio::time::advance(Duration::from_secs(5)).await;
    sink.stall(false);
    let summary = s.wait_finished(Duration::from_secs(15)).await;
    assert!(summary.finished && summary.snapshot.end_delivered);
    let sent = sink.sent();
    let end = sent.last().expect("end");
    assert_eq!(end.packet.body, PacketBody::End);
    assert_eq!(end.ext.end_reason, Some(EndReason::Overload));
    let o = end.ext.overload.clone().expect("Weir-Overload header");
    assert_eq!(o.reason, OverloadReason::QueueFull);
    // Accounting: every offered frame is published or dropped/refused with a reason.
    let f = &summary.snapshot.frames;
    let not_published: u64 = f.dropped.values().sum();
    assert_eq!(f.offered, f.published + not_published);
    assert_eq!(end.packet.seq, f.admitted + 1);
}

/// A publish that times out in `close` overloads the stream with `publish_timeout`.
#[tokio::test(start_paused = true)]
async fn close_policy_publish_timeout_is_an_overload() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let s = ingress.open("pt", None).expect("open");
    sink.stall(true);
    s.try_push(pcm()).expect("room");
    settle().await;
    tokio::time::advance(Duration::from_millis(101)).await;
    settle().await;
    match s.try_push(pcm()) {
        Err(PushError::Overloaded(o)) => {
            assert_eq!(o.reason, OverloadReason::PublishTimeout);
            assert_eq!(o.dropped_frames, 1);
        }
        other => panic!("{other:?}"),
    }
    sink.stall(false);
    let summary = s.finish().await;
    assert!(summary.snapshot.end_delivered);
    assert_eq!(summary.snapshot.frames.dropped["overload"], 1);
}

/// `push` waits at most max_wait for room, then the stream overloads.
#[tokio::test(start_paused = true)]
async fn push_waits_at_most_max_wait() {
    let sink = MemorySink::new();
    let cfg = StreamConfig::builder()
        .publish_timeout(Duration::from_millis(500))
        .max_rate_permille(0) // frames at one instant: no rate bound here
        .build()
        .expect("cfg");
    let ingress = Ingress::new(sink.clone(), cfg);
    let s = ingress.open("w", None).expect("open");
    sink.stall(true);
    for _ in 0..25 {
        s.try_push(pcm()).expect("room");
    }
    let t0 = tokio::time::Instant::now();
    let r = s.push(pcm()).await;
    assert!(matches!(r, Err(PushError::Overloaded(_))), "{r:?}");
    assert_eq!(tokio::time::Instant::now() - t0, Duration::from_millis(100));
    // With room appearing, push returns as soon as the publisher takes a frame.
    sink.stall(false);
    let s2 = ingress.open("w2", None).expect("open");
    for _ in 0..25 {
        s2.try_push(pcm()).expect("room");
    }
    let t0 = tokio::time::Instant::now();
    assert_eq!(s2.push(pcm()).await, Ok(26));
    assert!(tokio::time::Instant::now() - t0 < Duration::from_millis(100));
}

/// `gap` under a stall: pending stays in budget; the markers account for exactly the
/// frames dropped; every seq is either published or inside a marker.
#[tokio::test(start_paused = true)]
async fn gap_policy_under_a_stall_marks_exactly_what_was_dropped() {
    let sink = MemorySink::new();
    let cfg = StreamConfig::builder()
        .policy(Policy::Gap)
        .extended_consumers(true)
        .build()
        .expect("cfg");
    let ingress = Ingress::new(sink.clone(), cfg);
    let s = ingress.open("g", None).expect("open");
    for _ in 0..10 {
        s.try_push(pcm()).expect("room");
        tokio::time::advance(FRAME).await;
    }
    sink.stall(true);
    for _ in 0..250 {
        s.try_push(pcm()).expect("gap never refuses");
        assert!(s.snapshot().pending_bytes <= 16_000);
        tokio::time::advance(FRAME).await;
    }
    sink.stall(false);
    for _ in 0..10 {
        s.try_push(pcm()).expect("room");
        tokio::time::advance(FRAME).await;
    }
    let summary = s.finish().await;
    let sent = sink.sent();
    let mut covered = vec![false; 271];
    let mut gap_frames = 0;
    for m in &sent {
        match &m.packet.body {
            PacketBody::Frame { .. } => covered[m.packet.seq as usize] = true,
            PacketBody::Gap(g) => {
                gap_frames += g.frames();
                for seq in g.first_seq..=g.last_seq {
                    assert!(!covered[seq as usize], "seq {seq} twice");
                    covered[seq as usize] = true;
                }
                assert_eq!(g.samples, g.frames() * 320);
            }
            PacketBody::End => assert_eq!(m.packet.seq, 271),
        }
    }
    assert!(
        covered[1..].iter().all(|c| *c),
        "every seq published or in a marker"
    );
    let f = &summary.snapshot.frames;
    let dropped: u64 = ["evicted", "max_age", "publish_timeout"]
        .iter()
        .map(|k| f.dropped[*k])
        .sum();
    assert_eq!(gap_frames, dropped);
    assert!(gap_frames > 200, "{gap_frames}");
    assert_eq!(f.published + dropped, 270);
    assert!(summary.snapshot.gaps >= 1);
    // Ordering: sequence numbers on the wire never go backwards.
    let seqs: Vec<u64> = sent.iter().map(|m| m.packet.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_finishes_every_stream_within_grace() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let handles: Vec<_> = (0..5)
        .map(|i| {
            let h = ingress.open(&format!("s{i}"), None).expect("open");
            h.try_push(pcm()).expect("room");
            h
        })
        .collect();
    let report = ingress.shutdown(Duration::from_secs(2)).await;
    assert_eq!((report.streams, report.unfinished), (5, 0));
    assert_eq!(
        ingress.open("late", None).map_err(|e| e.kind()).err(),
        Some(OpenErrorKind::ShuttingDown)
    );
    let ends: Vec<_> = sink
        .sent()
        .into_iter()
        .filter(|m| m.packet.body == PacketBody::End)
        .collect();
    assert_eq!(ends.len(), 5);
    assert!(
        ends.iter()
            .all(|e| e.ext.end_reason == Some(EndReason::Shutdown) && e.packet.seq == 2)
    );
    for h in &handles {
        assert!(matches!(
            h.try_push(pcm()),
            Err(PushError::Closed(EndReason::Shutdown))
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn shutdown_with_nats_stalled_gives_up_at_the_grace_period() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let h = ingress.open("stuck", None).expect("open");
    sink.stall(true);
    h.try_push(pcm()).expect("room");
    let t0 = tokio::time::Instant::now();
    let report = ingress.shutdown(Duration::from_secs(1)).await;
    assert!(tokio::time::Instant::now() - t0 <= Duration::from_millis(1300));
    assert_eq!(report.unfinished, 0);
    assert_eq!(ingress.global().control_packets_lost(), 1);
    let snap = h.snapshot();
    let f = &snap.frames;
    assert_eq!(f.offered, f.published + f.dropped.values().sum::<u64>());
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_but_does_not_refuse() {
    let sink = MemorySink::new();
    let cfg = StreamConfig::builder()
        .shadow(true)
        .publish_timeout(Duration::from_millis(500))
        .build()
        .expect("cfg");
    let ingress = Ingress::new(sink.clone(), cfg);
    let s = ingress.open("sh", None).expect("open");
    sink.stall(true);
    for _ in 0..40 {
        s.try_push(pcm()).expect("shadow admits beyond the budget");
    }
    assert!(s.snapshot().pending_bytes > 16_000);
    assert!(ingress.stats().frames.would_reject >= 15);
    sink.stall(false);
    let summary = s.finish().await;
    assert_eq!(summary.snapshot.frames.published, 40);
}

#[tokio::test(start_paused = true)]
async fn publish_errors_in_close_end_the_stream_with_reason_error() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let s = ingress.open("err", None).expect("open");
    *sink.failing.lock().expect("lock") = true;
    s.try_push(pcm()).expect("room");
    settle().await;
    *sink.failing.lock().expect("lock") = false;
    tokio::time::advance(Duration::from_millis(200)).await;
    let summary = s.wait_finished(Duration::from_secs(15)).await;
    assert!(summary.finished);
    assert_eq!(
        summary.snapshot.frames.dropped[DropReason::PublishError.as_str()],
        1
    );
    let end = sink.sent().pop().expect("end");
    assert_eq!(end.ext.end_reason, Some(EndReason::Error));
}

#[tokio::test(start_paused = true)]
async fn frame_headers_can_be_turned_off_but_end_keeps_them() {
    let sink = MemorySink::new();
    let cfg = StreamConfig::builder()
        .frame_headers(false)
        .build()
        .expect("cfg");
    let ingress = Ingress::new(sink.clone(), cfg);
    let s = ingress.open("nh", None).expect("open");
    s.try_push(pcm()).expect("room");
    s.finish().await;
    let sent = sink.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0].ext,
        Extensions::default(),
        "a frame without weir headers"
    );
    assert_eq!(sent[1].ext.version, Some(1));
    assert_eq!(sent[1].ext.end_reason, Some(EndReason::Producer));
}

/// The direct path: with the publisher parked and NATS keeping up, `try_push` hands the
/// frame to the sink itself, before it returns (no task wake-up). When the sink stalls
/// the frames queue for the publisher; direct and queued hand-overs never reorder a
/// stream, and every frame is accounted once.
#[tokio::test(start_paused = true)]
async fn direct_path_hands_over_in_the_producers_call_and_never_reorders() {
    let sink = MemorySink::new();
    let ingress = Ingress::new(sink.clone(), StreamConfig::default());
    let s = ingress.open("direct", None).expect("open");
    settle().await; // the publisher runs once and parks
    for seq in 1..=5 {
        assert_eq!(s.try_push(pcm()), Ok(seq));
        assert_eq!(
            frames_of(&sink.sent()).last(),
            Some(&seq),
            "handed over inside try_push"
        );
        tokio::time::advance(FRAME).await;
    }
    // NATS stalls: frames wait in the queue (the publisher takes them), none is sent.
    sink.stall(true);
    for seq in 6..=10 {
        assert_eq!(s.try_push(pcm()), Ok(seq));
        tokio::time::advance(FRAME / 4).await;
    }
    settle().await;
    assert_eq!(frames_of(&sink.sent()).len(), 5);
    assert!(s.snapshot().pending_frames >= 5);
    // Back: the publisher drains 6..=10, then the direct path takes over again.
    sink.stall(false);
    settle().await;
    for seq in 11..=15 {
        assert_eq!(s.try_push(pcm()), Ok(seq));
        tokio::time::advance(FRAME).await;
        settle().await;
    }
    let summary = s.finish().await;
    assert_eq!(frames_of(&sink.sent()), (1..=15).collect::<Vec<_>>());
    let f = &summary.snapshot.frames;
    assert_eq!((f.offered, f.published), (15, 15), "{f:?}");
    assert_eq!(summary.snapshot.pending_bytes, 0);
    assert_eq!(
        ingress.stats().queue_wait_ms.count,
        15,
        "every hand-over timed once"
    );
}

/// The publisher's batch: frames queued while the sink stalls go out in order once it
/// recovers, also when the connection's window is full part-way (the rest goes back
/// to the queue and waits there under the age bound).
#[tokio::test(start_paused = true)]
async fn publisher_batches_keep_order_when_the_window_fills_part_way() {
    let sink = MemorySink::confirming();
    let cfg = StreamConfig::builder()
        .confirm_window_min_bytes(16_000)
        .build()
        .expect("cfg");
    let ingress = Ingress::new(sink.clone(), cfg);
    let a = ingress.open("a", None).expect("a");
    let b = ingress.open("b", None).expect("b");
    settle().await;
    sink.hold_confirm(true); // the server keeps frames unconfirmed: the window fills
    sink.stall(true);
    for _ in 0..20 {
        a.try_push(pcm()).expect("a room");
        b.try_push(pcm()).expect("b room");
        tokio::time::advance(Duration::from_millis(5)).await;
    }
    sink.stall(false);
    settle().await;
    // 40 frames queued, 25 fit the window (16,000 B): the rest wait in their queues.
    let sent = frames_of(&sink.sent()).len();
    assert!(sent <= 25, "{sent} frames handed over past the window");
    sink.hold_confirm(false);
    let (sa, sb) = (a.finish().await, b.finish().await);
    for (id, s) in [("a", sa), ("b", sb)] {
        let seqs: Vec<u64> = sink
            .sent()
            .iter()
            .filter(|m| {
                m.subject.ends_with(id) && matches!(m.packet.body, PacketBody::Frame { .. })
            })
            .map(|m| m.packet.seq)
            .collect();
        assert_eq!(seqs, (1..=20).collect::<Vec<_>>(), "{id} in order");
        assert_eq!(s.snapshot.frames.published, 20, "{id}");
    }
}
