//! The rate bound as the queue applies it ([`crate::rate`] hooked into
//! [`FrameQueue::offer`]): pure, with explicit instants (no NATS, no sleeping).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use weir_protocol::audio::GapReason;
use weir_protocol::audio::extension::{EndReason, OverloadReason};

use crate::config::{Policy, StreamConfig};
use crate::queue::{FrameQueue, Next, OfferMode, Refusal};
use crate::stats::{Counters, DropReason, Global};

fn queue(c: &StreamConfig) -> (FrameQueue, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let q = FrameQueue::new(c, Arc::clone(&counters), Arc::new(Global::new()));
    (q, counters)
}

fn pcm() -> Bytes {
    Bytes::from(vec![0u8; 640])
}

/// Drains the queue as a publisher that keeps up would (frames are dropped at once,
/// so the byte budget never fills: only the rate can refuse).
fn drain(q: &mut FrameQueue, now: Instant) -> Vec<Next> {
    let mut out = Vec::new();
    loop {
        match q.pop(now) {
            Next::Empty | Next::Done => return out,
            // Dropping the popped frame releases its bytes (the publisher's part).
            Next::Frame(f) => drop(f),
            other => out.push(other),
        }
    }
}

#[test]
fn hundred_times_real_time_overloads_with_reason_rate_in_close() {
    let c = StreamConfig::builder()
        .delivery(crate::config::Delivery::Unconfirmed)
        .build()
        .expect("defaults");
    assert_eq!(c.max_rate_permille(), 1500);
    let (mut q, counters) = queue(&c);
    let t0 = Instant::now();
    // 100x real time: a 20 ms frame every 200 us.
    let mut overloaded_at = None;
    for i in 0..5_000u32 {
        let now = t0 + Duration::from_micros(200) * i;
        match q.offer(&pcm(), now, OfferMode::Wait) {
            Ok(_) => {
                drain(&mut q, now);
            }
            Err(Refusal::Overloaded(o)) => {
                assert_eq!(o.reason, OverloadReason::Rate);
                overloaded_at = Some(now - t0);
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let at = overloaded_at.expect("overloaded");
    assert!(at < Duration::from_secs(1), "{at:?}");
    // The burst (one budget + 2 s of catch-up: 125 frames) plus what 1.5x refilled
    // meanwhile.
    let admitted = counters.snapshot().admitted;
    assert!((125..=128).contains(&admitted), "{admitted}");
    match q.pop(t0 + at) {
        Next::End(e) => {
            assert_eq!(e.reason, EndReason::Overload);
            assert_eq!(e.overload.map(|o| o.reason), Some(OverloadReason::Rate));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn hundred_times_real_time_is_gapped_with_reason_rate_in_gap() {
    let c = StreamConfig::builder()
        .policy(Policy::Gap)
        .extended_consumers(true)
        .delivery(crate::config::Delivery::Unconfirmed)
        .build()
        .expect("gap");
    let (mut q, counters) = queue(&c);
    let t0 = Instant::now();
    let mut first_gap = None;
    let mut gap_frames = 0;
    for i in 0..5_000u32 {
        // 1 s of offers at 100x.
        let now = t0 + Duration::from_micros(200) * i;
        assert!(q.offer(&pcm(), now, OfferMode::Wait).is_ok(), "gap admits");
        for n in drain(&mut q, now) {
            if let Next::Gap(g) = n {
                assert_eq!(g.reason, GapReason::Rate);
                first_gap.get_or_insert(now - t0);
                gap_frames += g.frames();
            }
        }
    }
    let at = first_gap.expect("gapped");
    assert!(at < Duration::from_secs(1), "{at:?}");
    let snap = counters.snapshot();
    assert_eq!(snap.dropped(DropReason::Rate), gap_frames);
    // 1 s at 1.5x = 75 frames + the 125-frame burst are published; the rest gapped.
    let published = 5_000 - gap_frames;
    assert!((199..=201).contains(&published), "{published}");
}

#[test]
fn real_time_and_a_catch_up_burst_are_not_limited() {
    let c = StreamConfig::builder()
        .delivery(crate::config::Delivery::Unconfirmed)
        .build()
        .expect("defaults");
    let (mut q, counters) = queue(&c);
    let t0 = Instant::now();
    // 30 s of real time, with a 400 ms network hiccup every 5 s (20 frames at once).
    for i in 0..1_500u32 {
        // Frames 0..20 of every 250 after the first arrive together at the 20th's time.
        let due = if i >= 250 && i % 250 < 20 {
            i - i % 250 + 20
        } else {
            i
        };
        let now = t0 + Duration::from_millis(20) * due;
        q.offer(&pcm(), now, OfferMode::Wait)
            .expect("real time is admitted");
        drain(&mut q, now);
    }
    assert_eq!(counters.snapshot().admitted, 1_500);
}

#[test]
fn max_rate_zero_is_no_bound() {
    let c = StreamConfig::builder()
        .delivery(crate::config::Delivery::Unconfirmed)
        .max_rate_permille(0)
        .build()
        .expect("off");
    let (mut q, counters) = queue(&c);
    let now = Instant::now();
    for _ in 0..1_000 {
        q.offer(&pcm(), now, OfferMode::Try).expect("no bound");
        drain(&mut q, now);
    }
    assert_eq!(counters.snapshot().admitted, 1_000);
}

#[test]
fn a_token_rate_class_can_only_lower_the_bound() {
    let c = StreamConfig::builder()
        .delivery(crate::config::Delivery::Unconfirmed)
        .build()
        .expect("defaults");
    let (mut q, counters) = queue(&c);
    q.limit_rate(5_000); // higher than 1.5x: ignored
    q.limit_rate(1_000); // 1.0x
    let t0 = Instant::now();
    // 1.2x real time for 20 s: over 1.0x once the 2.5 s burst is spent (0.2 s of audio
    // a second: after ~12.5 s).
    let mut overloaded = None;
    for i in 0..1_200u32 {
        let now = t0 + Duration::from_micros(16_667) * i;
        match q.offer(&pcm(), now, OfferMode::Wait) {
            Ok(_) => {
                drain(&mut q, now);
            }
            Err(Refusal::Overloaded(o)) => {
                assert_eq!(o.reason, OverloadReason::Rate);
                overloaded = Some(now - t0);
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let at = overloaded.expect("1.2x is over a 1.0x class");
    assert!(
        at > Duration::from_secs(12) && at < Duration::from_secs(13),
        "{at:?}"
    );
    assert!(counters.snapshot().admitted > 100);
}

/// Offers real-time frames (one per 20 ms) from `t0`, except that the frames due
/// during each stall `(at_frame, frames)` arrive together with the first frame after
/// it — what TCP delivers after a network hiccup. `Err` with the frame index and the
/// refusal at the first frame refused.
fn real_time_with_stalls(
    q: &mut FrameQueue,
    t0: Instant,
    frames: u32,
    stalls: &[(u32, u32)],
) -> Result<(), (u32, Refusal)> {
    for i in 0..frames {
        let due = stalls
            .iter()
            .find(|&&(at, n)| (at..at + n).contains(&i))
            .map_or(i, |&(at, n)| at + n);
        let now = t0 + Duration::from_millis(20) * due;
        q.offer(&pcm(), now, OfferMode::Wait).map_err(|e| (i, e))?;
        drain(q, now);
    }
    Ok(())
}

#[test]
fn a_real_time_producer_catches_up_after_a_two_second_stall() {
    let c = StreamConfig::builder()
        .delivery(crate::config::Delivery::Unconfirmed)
        .build()
        .expect("defaults");
    let (mut q, counters) = queue(&c);
    // 60 s of real time; stalls of 2 s (100 frames), 1 s and 2 s again, each flushed at
    // once with the frame that follows it (101, 51, 101 frames in one instant).
    let stalls = [(500, 100), (1_250, 50), (2_000, 100)];
    if let Err((i, e)) = real_time_with_stalls(&mut q, Instant::now(), 3_000, &stalls) {
        panic!("frame {i} refused after a stall: {e:?}");
    }
    assert_eq!(counters.snapshot().admitted, 3_000);
    assert_eq!(counters.snapshot().dropped(DropReason::Rate), 0);
}

#[test]
fn sustained_twice_real_time_is_still_closed_with_reason_rate() {
    let c = StreamConfig::builder()
        .delivery(crate::config::Delivery::Unconfirmed)
        .build()
        .expect("defaults");
    let (mut q, _) = queue(&c);
    let t0 = Instant::now();
    // 2x: a 20 ms frame every 10 ms. At 1.5x refill the bucket loses 0.5 s of audio a
    // second: the burst (the budget + the 2 s catch-up, 2.5 s) lasts about 5 s.
    let mut overloaded = None;
    for i in 0..2_000u32 {
        let now = t0 + Duration::from_millis(10) * i;
        match q.offer(&pcm(), now, OfferMode::Wait) {
            Ok(_) => {
                drain(&mut q, now);
            }
            Err(Refusal::Overloaded(o)) => {
                assert_eq!(o.reason, OverloadReason::Rate);
                overloaded = Some(now - t0);
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let at = overloaded.expect("2x sustained is over the bound");
    assert!(
        at > Duration::from_millis(4_500) && at < Duration::from_millis(5_500),
        "{at:?}"
    );
}
