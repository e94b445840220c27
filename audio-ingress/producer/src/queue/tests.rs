//! Unit tests of the parent module.

use super::*;

fn cfg(
    f: impl FnOnce(crate::config::StreamConfigBuilder) -> crate::config::StreamConfigBuilder,
) -> StreamConfig {
    // No rate bound unless a test asks for one: these tests offer frames at one
    // instant, i.e. infinitely faster than real time.
    f(StreamConfig::builder().max_rate_permille(0))
        .build()
        .expect("valid config")
}

fn queue(c: &StreamConfig) -> (FrameQueue, Arc<Counters>, Arc<Global>) {
    let counters = Arc::new(Counters::default());
    let global = Arc::new(Global::new());
    (
        FrameQueue::new(c, Arc::clone(&counters), Arc::clone(&global)),
        counters,
        global,
    )
}

fn pcm() -> Bytes {
    Bytes::from(vec![0u8; 640])
}

const MS: Duration = Duration::from_millis(1);

/// offered = admitted + rejected; admitted = published + dropped + pending.
fn assert_accounted(q: &FrameQueue, c: &Counters, published: u64) {
    let s = c.snapshot();
    assert_eq!(s.offered, s.admitted + s.rejected_total(), "{s:?}");
    assert_eq!(
        s.admitted,
        published + s.dropped_admitted_total() + q.budget().frames(),
        "{s:?}"
    );
}

#[test]
fn seq_starts_at_one_and_end_takes_the_next() {
    let c = cfg(|b| b);
    let (mut q, counters, g) = queue(&c);
    let t = Instant::now();
    assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(1));
    assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(2));
    assert_eq!(q.budget().bytes(), 1280);
    assert_eq!(g.pending_bytes(), 1280);
    q.finish(EndReason::Producer, t, None, None);
    assert!(matches!(
        q.offer(&pcm(), t, OfferMode::Try),
        Err(Refusal::Closed(EndReason::Producer))
    ));
    let Next::Frame(f1) = q.pop(t) else {
        panic!("frame")
    };
    assert_eq!(f1.seq, 1);
    drop(f1);
    assert_eq!(
        q.budget().bytes(),
        640,
        "published frame released its bytes"
    );
    let Next::Frame(f2) = q.pop(t) else {
        panic!("frame")
    };
    drop(f2);
    match q.pop(t) {
        Next::End(e) => assert_eq!(
            (e.seq, e.reason, e.overload),
            (3, EndReason::Producer, None)
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(q.pop(t), Next::Done));
    assert_eq!(
        (q.budget().bytes(), g.pending_bytes(), g.pending_frames()),
        (0, 0, 0)
    );
    assert_accounted(&q, &counters, 2);
}

#[test]
fn tiny_frames_are_charged_the_floor_so_the_frame_count_is_bounded() {
    // The byte budget alone (the rate bound's burst is larger: budget + catch-up).
    let c = StreamConfig::builder()
        .max_rate_permille(0)
        .build()
        .expect("cfg");
    let (mut q, _, _) = queue(&c);
    let t0 = Instant::now();
    let tiny = Bytes::from_static(&[0, 0]);
    let mut admitted = 0;
    while q.offer(&tiny, t0, OfferMode::Try).is_ok() {
        admitted += 1;
        assert!(admitted <= 1_000, "unbounded");
    }
    assert_eq!(admitted, 16_000 / MIN_FRAME_CHARGE);
    assert_eq!(q.budget().bytes(), 16_000);
    assert_eq!(q.budget().frames(), admitted as u64);
}

#[test]
fn tiny_frames_are_charged_the_floor_by_the_rate_bound_too() {
    // A roomy budget so only the rate bound (1.5x, burst = the budget + 2 s of
    // catch-up) can refuse: frames are popped (released) as they come.
    let c = StreamConfig::builder()
        .max_bytes(1_600_000)
        .delivery(crate::config::Delivery::Unconfirmed)
        .build()
        .expect("cfg");
    let (mut q, counters, _) = queue(&c);
    let t0 = Instant::now();
    let tiny = Bytes::from_static(&[0, 0]);
    // Burst: 800,000 + 32,000 samples = 10,400 frames at the 80-sample floor.
    let mut admitted = 0u64;
    while q.offer(&tiny, t0, OfferMode::Try).is_ok() {
        admitted += 1;
        assert!(admitted <= 20_000, "the rate bound never refused");
        while let Next::Frame(f) = q.pop(t0) {
            drop(f);
        }
    }
    assert_eq!(
        admitted,
        crate::rate::burst_samples(1_600_000) / (MIN_FRAME_CHARGE as u64 / 2)
    );
    assert_eq!(q.state(), StreamState::Ending, "over rate: overloaded");
    assert_eq!(counters.snapshot().admitted, admitted);
}

#[test]
fn invalid_frames_change_nothing() {
    let c = cfg(|b| b);
    let (mut q, counters, _) = queue(&c);
    let t = Instant::now();
    for bad in [
        Bytes::new(),
        Bytes::from_static(&[0; 3]),
        Bytes::from(vec![0; 3202]),
    ] {
        assert!(matches!(
            q.offer(&bad, t, OfferMode::Try),
            Err(Refusal::Invalid(_))
        ));
    }
    assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(1));
    assert_eq!(counters.snapshot().dropped(DropReason::Invalid), 3);
    assert_accounted(&q, &counters, 0);
}

#[test]
fn close_refuses_when_full_then_overloads_after_max_wait() {
    let c = cfg(|b| b); // 16,000 bytes = 25 frames, max_wait 100 ms
    let (mut q, counters, g) = queue(&c);
    let t0 = Instant::now();
    for i in 0..25 {
        assert_eq!(q.offer(&pcm(), t0, OfferMode::Try), Ok(i + 1));
    }
    assert_eq!(q.budget().bytes(), 16_000);
    let t1 = t0 + 10 * MS;
    match q.offer(&pcm(), t1, OfferMode::Try) {
        Err(Refusal::Full {
            pending_bytes,
            max_bytes,
            overload_at,
        }) => {
            assert_eq!((pending_bytes, max_bytes), (16_000, 16_000));
            assert_eq!(overload_at, t1 + 100 * MS);
        }
        other => panic!("{other:?}"),
    }
    // A Wait-mode full is not a refusal.
    assert!(matches!(
        q.offer(&pcm(), t1 + 50 * MS, OfferMode::Wait),
        Err(Refusal::Full { .. })
    ));
    assert_eq!(counters.snapshot().dropped(DropReason::QueueFull), 1);
    // Still full at max_wait: overload.
    let r = q.offer(&pcm(), t1 + 100 * MS, OfferMode::Wait);
    let Err(Refusal::Overloaded(o)) = r else {
        panic!("{r:?}")
    };
    assert_eq!(o.reason, OverloadReason::QueueFull);
    assert_eq!(o.dropped_frames, 25 + 2, "25 queued + 2 refused");
    assert_eq!(
        (o.dropped_first_seq, o.dropped_last_seq),
        (Some(1), Some(25)),
        "the queued frames' seqs (refused ones have none)"
    );
    assert_eq!(o.dropped_samples, 27 * 320);
    assert_eq!(
        (o.pending_bytes, o.max_bytes, o.max_age_ms),
        (16_000, 16_000, 500)
    );
    assert_eq!(q.budget().bytes(), 0, "the queue was emptied");
    assert_eq!(g.overloads(), 1);
    // Later offers are refused with the same report; the next item is the end.
    assert!(matches!(
        q.offer(&pcm(), t1 + 200 * MS, OfferMode::Try),
        Err(Refusal::Overloaded(_))
    ));
    match q.pop(t1 + 200 * MS) {
        Next::End(e) => {
            assert_eq!(e.seq, 26);
            assert_eq!(e.reason, EndReason::Overload);
            assert_eq!(e.overload, Some(o));
        }
        other => panic!("{other:?}"),
    }
    assert!(q.control_deadline().is_some());
    assert_accounted(&q, &counters, 0);
}

#[test]
fn close_wait_restarts_when_room_appears() {
    let c = cfg(|b| b);
    let (mut q, _, _) = queue(&c);
    let t0 = Instant::now();
    for _ in 0..25 {
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    }
    assert!(matches!(
        q.offer(&pcm(), t0, OfferMode::Try),
        Err(Refusal::Full { .. })
    ));
    let Next::Frame(f) = q.pop(t0 + 90 * MS) else {
        panic!("frame")
    };
    drop(f);
    assert_eq!(q.offer(&pcm(), t0 + 95 * MS, OfferMode::Try), Ok(26));
    // Full again at 120 ms: a fresh wait, no overload at 150 ms.
    assert!(matches!(
        q.offer(&pcm(), t0 + 120 * MS, OfferMode::Try),
        Err(Refusal::Full { .. })
    ));
    assert!(matches!(
        q.offer(&pcm(), t0 + 150 * MS, OfferMode::Try),
        Err(Refusal::Full { .. })
    ));
    assert!(matches!(
        q.offer(&pcm(), t0 + 220 * MS, OfferMode::Try),
        Err(Refusal::Overloaded(_))
    ));
}

#[test]
fn close_overloads_on_age_instead_of_publishing_late() {
    let c = cfg(|b| b);
    let (mut q, counters, _) = queue(&c);
    let t0 = Instant::now();
    q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    q.offer(&pcm(), t0 + 400 * MS, OfferMode::Try)
        .expect("room");
    match q.pop(t0 + 501 * MS) {
        Next::End(e) => {
            let o = e.overload.expect("report");
            assert_eq!(o.reason, OverloadReason::MaxAge);
            assert_eq!(o.dropped_frames, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(counters.snapshot().dropped(DropReason::Overload), 2);
    assert_accounted(&q, &counters, 0);
}

fn gap_cfg() -> StreamConfig {
    cfg(|b| b.policy(WhenFull::Gap).extended_consumers(true))
}

#[test]
fn gap_evicts_oldest_and_marks_the_exact_range() {
    let c = gap_cfg();
    let (mut q, counters, _) = queue(&c);
    let t0 = Instant::now();
    for i in 1..=25 {
        assert_eq!(q.offer(&pcm(), t0, OfferMode::Try), Ok(i));
    }
    // Three more: evict 1, 2, 3.
    for i in 26..=28 {
        assert_eq!(q.offer(&pcm(), t0 + MS, OfferMode::Try), Ok(i));
    }
    assert!(q.budget().bytes() <= 16_000);
    assert_eq!(q.budget().high_water(), 16_000);
    match q.pop(t0 + 2 * MS) {
        Next::Gap(g) => assert_eq!(
            g,
            Gap {
                first_seq: 1,
                last_seq: 3,
                samples: 960,
                reason: GapReason::QueueFull
            }
        ),
        other => panic!("{other:?}"),
    }
    let Next::Frame(f) = q.pop(t0 + 2 * MS) else {
        panic!("frame")
    };
    assert_eq!(f.seq, 4);
    assert_eq!(counters.snapshot().dropped(DropReason::Evicted), 3);
    drop(f);
    assert_accounted(&q, &counters, 1);
}

#[test]
fn gap_expires_old_frames_into_a_marker_and_merges_with_the_inflight_frame() {
    let c = gap_cfg();
    let (mut q, counters, _) = queue(&c);
    let t0 = Instant::now();
    for i in 0..5u32 {
        q.offer(&pcm(), t0 + i * 20 * MS, OfferMode::Try)
            .expect("room");
    }
    let Next::Frame(f1) = q.pop(t0 + 100 * MS) else {
        panic!("frame")
    };
    assert_eq!(f1.seq, 1);
    // Frames 2..=5 outlive max_age while frame 1 is in flight.
    assert_eq!(q.oldest_enqueued_at(), Some(t0));
    let now = t0 + 700 * MS;
    assert_eq!(q.offer(&pcm(), now, OfferMode::Try), Ok(6));
    // The publish of frame 1 times out: it joins the front marker.
    assert!(matches!(
        q.inflight_failed(f1, Failure::Timeout, now),
        AfterFailure::Dropped
    ));
    match q.pop(now) {
        Next::Gap(g) => {
            assert_eq!((g.first_seq, g.last_seq, g.samples), (1, 5, 1600));
            assert_eq!(g.reason, GapReason::PublishFailed);
        }
        other => panic!("{other:?}"),
    }
    let s = counters.snapshot();
    assert_eq!(s.dropped(DropReason::MaxAge), 4);
    assert_eq!(s.dropped(DropReason::PublishTimeout), 1);
    assert_accounted(&q, &counters, 0);
}

#[test]
fn a_gap_in_flight_absorbs_later_drops() {
    let c = gap_cfg();
    let (mut q, _, _) = queue(&c);
    let t0 = Instant::now();
    for _ in 0..26 {
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    }
    let Next::Gap(mut g) = q.pop(t0) else {
        panic!("gap")
    };
    assert_eq!((g.first_seq, g.last_seq), (1, 1));
    // While the marker is being retried, frames 2..=3 are evicted.
    q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    q.merge_into_gap(&mut g, t0);
    assert_eq!((g.first_seq, g.last_seq, g.samples), (1, 3, 960));
    let Next::Frame(f) = q.pop(t0) else {
        panic!("frame")
    };
    assert_eq!(f.seq, 4);
}

#[test]
fn close_publish_timeout_overloads_and_counts_the_inflight_frame() {
    let c = cfg(|b| b);
    let (mut q, counters, _) = queue(&c);
    let t0 = Instant::now();
    for _ in 0..3 {
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    }
    let Next::Frame(f) = q.pop(t0) else {
        panic!("frame")
    };
    let _ = q.inflight_failed(f, Failure::Timeout, t0 + 100 * MS);
    match q.pop(t0 + 100 * MS) {
        Next::End(e) => {
            let o = e.overload.expect("report");
            assert_eq!(o.reason, OverloadReason::PublishTimeout);
            assert_eq!(o.dropped_frames, 3);
            assert_eq!(e.seq, 4);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(counters.snapshot().dropped(DropReason::Overload), 3);
    assert_accounted(&q, &counters, 0);
}

#[test]
fn shadow_counts_would_reject_and_enforces_only_the_ceiling() {
    let c = cfg(|b| b.shadow(true));
    let (mut q, counters, _) = queue(&c);
    let t0 = Instant::now();
    for i in 1..=30 {
        assert_eq!(q.offer(&pcm(), t0, OfferMode::Try), Ok(i));
    }
    assert_eq!(
        counters.snapshot().would_reject,
        5,
        "frames 26..=30 over the budget"
    );
    // The ceiling (8 x 16,000) still applies.
    for _ in 30..200 {
        let _ = q.offer(&pcm(), t0, OfferMode::Try);
    }
    assert!(q.budget().bytes() <= 8 * 16_000);
    assert!(q.budget().high_water() <= 8 * 16_000);
    // A publish timeout is retried, not enforced.
    let Next::Frame(f) = q.pop(t0) else {
        panic!("frame")
    };
    assert!(matches!(
        q.inflight_failed(f, Failure::Timeout, t0 + 100 * MS),
        AfterFailure::Retry(_)
    ));
}

#[test]
fn shutdown_drain_deadline_drops_what_is_left() {
    let c = cfg(|b| b);
    let (mut q, counters, _) = queue(&c);
    let t0 = Instant::now();
    for _ in 0..3 {
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    }
    q.finish(
        EndReason::Shutdown,
        t0,
        Some(t0 + 50 * MS),
        Some(t0 + 100 * MS),
    );
    let Next::Frame(f) = q.pop(t0 + 10 * MS) else {
        panic!("frame")
    };
    drop(f);
    match q.pop(t0 + 60 * MS) {
        Next::End(e) => assert_eq!((e.seq, e.reason), (4, EndReason::Shutdown)),
        other => panic!("{other:?}"),
    }
    assert_eq!(counters.snapshot().dropped(DropReason::Shutdown), 2);
    assert_eq!(q.control_deadline(), Some(t0 + 100 * MS));
    assert_accounted(&q, &counters, 1);
}

#[test]
fn reservations_are_released_exactly_once_on_every_path() {
    let c = gap_cfg();
    let (mut q, _, g) = queue(&c);
    let t0 = Instant::now();
    for _ in 0..40 {
        q.offer(&pcm(), t0, OfferMode::Try).expect("room");
    }
    let Next::Gap(_) = q.pop(t0) else {
        panic!("gap")
    };
    let Next::Frame(f) = q.pop(t0) else {
        panic!("frame")
    };
    let _ = q.inflight_failed(f, Failure::Error, t0);
    q.finish(EndReason::Shutdown, t0, Some(t0), None);
    while !matches!(q.pop(t0 + MS), Next::Done) {}
    assert_eq!((g.pending_bytes(), g.pending_frames()), (0, 0));
    drop(q);
    assert_eq!((g.pending_bytes(), g.pending_frames()), (0, 0));
}

#[test]
fn a_resume_loss_takes_the_next_seqs_and_its_marker_follows_the_queued_frames() {
    let c = gap_cfg();
    let (mut q, counters, _) = queue(&c);
    let t = Instant::now();
    for i in 1..=3 {
        assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(i));
    }
    assert_eq!((q.last_seq(), q.last_frame_samples()), (3, 320));
    let gap = q
        .skip(2, 640, Lost::Resume)
        .expect("open")
        .expect("a marker");
    assert_eq!(
        (gap.first_seq, gap.last_seq, gap.samples, gap.reason),
        (4, 5, 640, GapReason::Resume)
    );
    assert_eq!(
        q.offer(&pcm(), t, OfferMode::Try),
        Ok(6),
        "seq goes on after it"
    );
    // Wire order is seq order: frames 1..=3, the marker 4..=5, then frame 6.
    let mut order = Vec::new();
    loop {
        match q.pop(t) {
            Next::Frame(f) => order.push(f.seq),
            Next::Gap(g) => order.push(g.last_seq * 100),
            Next::Empty => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(order, vec![1, 2, 3, 500, 6]);
    let s = counters.snapshot();
    assert_eq!(s.dropped(DropReason::Resume), 2);
    assert_eq!((s.offered, s.admitted), (6, 6));
    assert_eq!(
        q.skip(0, 0, Lost::Resume),
        Ok(None),
        "nothing lost, nothing declared"
    );
}

#[test]
fn without_gap_packets_a_resume_loss_is_declared_on_the_next_packet() {
    let c = cfg(|b| b);
    let (mut q, counters, _) = queue(&c);
    let t = Instant::now();
    assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(1));
    assert!(!q.gap_packets());
    assert!(q.skip(3, 960, Lost::Resume).expect("open").is_some());
    assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(5));
    let d = q.take_declaration(5).expect("declared");
    assert_eq!(
        (d.first_seq, d.last_seq, d.frames, d.reason),
        (2, 4, 3, PossibleLossReason::Resume)
    );
    let s = counters.snapshot();
    assert_eq!((s.dropped(DropReason::Resume), s.possibly_lost), (3, 0));
    q.finish(EndReason::Producer, t, None, None);
    assert!(matches!(
        q.skip(1, 320, Lost::Resume),
        Err(Refusal::Closed(EndReason::Producer))
    ));
}

#[test]
fn markers_stay_in_seq_order_when_older_frames_expire_behind_a_resume_marker() {
    let c = gap_cfg();
    let (mut q, _, _) = queue(&c);
    let t = Instant::now();
    for i in 1..=3 {
        assert_eq!(q.offer(&pcm(), t, OfferMode::Try), Ok(i));
    }
    q.skip(2, 640, Lost::Resume).expect("open");
    // Frames 1..=3 expire while the resume marker waits behind them.
    let later = t + Duration::from_secs(3600);
    let mut order = Vec::new();
    loop {
        match q.pop(later) {
            Next::Gap(g) => order.push((g.first_seq, g.last_seq, g.reason)),
            Next::Empty => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        order,
        vec![(1, 3, GapReason::MaxAge), (4, 5, GapReason::Resume)]
    );
}
