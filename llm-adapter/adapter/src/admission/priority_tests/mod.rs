//! Priority classes on a paused clock: the rules one at a time (batch displaced first
//! when the queue is full, interactive ahead of batch within the delay, batch ageing,
//! displacement on the prediction, the class of a key) and a randomized workload;
//! the scenario — interactive at 0.5× capacity plus batch at 1.5×, over one
//! backend and over a pool of three — with its figures printed, in `scenarios.rs`.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout};
use weir_protocol::llm::ErrorCode;

use super::*;
use crate::backend::sim::SimBackend;
use crate::config::{KeySource, OnBusy};

type Rx = oneshot::Receiver<Arc<Outcome>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `workers` slots over one fixed-latency backend, the estimate seeded at it.
fn one(workers: usize, capacity: usize, latency: Duration) -> Admission<ChannelSink> {
    let mut c = AdmissionConfig {
        workers: NonZeroUsize::new(workers).expect("non-zero"),
        queue_capacity: NonZeroUsize::new(capacity).expect("non-zero"),
        ..AdmissionConfig::default()
    };
    c.estimator.initial = Some(latency);
    let backend: Arc<dyn crate::backend::Backend> = Arc::new(SimBackend::fixed(latency));
    Admission::start_pool(
        c,
        vec![backend],
        Arc::new(ChannelSink),
        crate::trace::Tracer::disabled(),
    )
}

/// `members` backends of `slots` slots each (a pool), fixed latency, seeded estimate.
fn pool(members: usize, slots: usize, latency: Duration) -> Admission<ChannelSink> {
    let mut c = AdmissionConfig {
        workers: NonZeroUsize::new(members * slots).expect("non-zero"),
        pool: (0..members)
            .map(|i| PoolSlots {
                name: format!("b{i}"),
                slots: NonZeroUsize::new(slots).expect("non-zero"),
                timeout: Duration::from_secs(60),
                weight: 1,
            })
            .collect(),
        ..AdmissionConfig::default()
    };
    c.estimator.initial = Some(latency);
    let backends = (0..members)
        .map(|_| Arc::new(SimBackend::fixed(latency)) as Arc<dyn crate::backend::Backend>)
        .collect();
    Admission::start_pool(
        c,
        backends,
        Arc::new(ChannelSink),
        crate::trace::Tracer::disabled(),
    )
}

async fn answer(rx: Rx) -> Arc<Outcome> {
    timeout(Duration::from_secs(3600), rx)
        .await
        .expect("answered in time")
        .expect("answered, not dropped")
}

/// The answer if it was delivered already.
fn answered_now(rx: &mut Rx) -> Option<Arc<Outcome>> {
    rx.try_recv().ok()
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn batch(name: &str, budget: Duration) -> Submission {
    Submission::new(name.to_owned())
        .budget(budget)
        .priority(Priority::Batch)
}

fn interactive(name: &str, budget: Duration) -> Submission {
    Submission::new(name.to_owned())
        .budget(budget)
        .priority(Priority::Interactive)
}

#[tokio::test(start_paused = true)]
async fn batch_is_displaced_first_when_the_queue_is_full() {
    let a = one(1, 3, ms(1000));
    let (_, running) = a.call(batch("run", ms(60_000))).await;
    settle().await;
    let mut queued = Vec::new();
    for i in 0..3 {
        let (ad, rx) = a.call(batch(&format!("b{i}"), ms(60_000))).await;
        assert_eq!(ad, Admitted::Queued);
        queued.push(rx);
    }
    // Full: a batch request is refused as before ...
    let (ad, _) = a.call(batch("b3", ms(60_000))).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::QueueFull));
    // ... an interactive one displaces the latest queued batch request (b2).
    let (ad, i0) = a.call(interactive("i0", ms(60_000))).await;
    assert_eq!(ad, Admitted::Queued);
    let mut b2 = queued.pop().expect("b2");
    let o = answered_now(&mut b2).expect("b2 is answered at once");
    let e = o.result.as_ref().expect_err("displaced");
    assert_eq!(e.code, ErrorCode::QueueFull);
    assert!(
        e.message.contains("displaced by interactive work"),
        "{}",
        e.message
    );
    assert!(e.details.retry_after_ms.is_some_and(|r| r > 0), "{e:?}");
    println!("displaced: {} ({:?})", e.message, e.details.retry_after_ms);
    // Queue = b0, b1, i0; the next interactive request displaces b1, then b0; then the
    // queue holds interactive requests only and the next one is refused.
    let (_, i1) = a.call(interactive("i1", ms(60_000))).await;
    let (_, i2) = a.call(interactive("i2", ms(60_000))).await;
    for rx in queued.drain(..) {
        assert_eq!(answer(rx).await.error_code(), Some(ErrorCode::QueueFull));
    }
    let (ad, _) = a.call(interactive("i3", ms(60_000))).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::QueueFull));
    let s = a.stats();
    assert_eq!(s.priority["batch"].displaced, 3);
    assert_eq!(s.priority["batch"].refused, 1);
    assert_eq!(s.priority["interactive"].refused, 1);
    assert_eq!(s.priority["interactive"].admitted, 3);
    a.check_invariants();
    for rx in [running, i0, i1, i2] {
        assert_eq!(answer(rx).await.code(), "ok");
    }
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn interactive_goes_ahead_of_batch_within_the_delay_and_batch_ages() {
    // One worker, 100 ms calls, the default delay (2 s).
    assert_eq!(DEFAULT_BATCH_DELAY, ms(2_000));
    let a = one(1, 64, ms(100));
    let (_, run) = a.call(interactive("run", ms(10_000))).await;
    settle().await;
    // b due at 5 s (ordered at 7 s); `near` due at 6.5 s goes ahead of it; `far` due
    // at 7.5 s goes behind it (b has aged past it).
    let (_, b) = a.call(batch("b", ms(5_000))).await;
    let (_, far) = a.call(interactive("far", ms(7_500))).await;
    let (_, near) = a.call(interactive("near", ms(6_500))).await;
    let (b, far, near) = (answer(b).await, answer(far).await, answer(near).await);
    assert_eq!((b.code(), far.code(), near.code()), ("ok", "ok", "ok"));
    println!(
        "queue waits: near {:?}, batch {:?}, far {:?}",
        near.queue_time, b.queue_time, far.queue_time
    );
    assert!(
        near.queue_time < b.queue_time,
        "interactive first within the delay"
    );
    assert!(
        b.queue_time < far.queue_time,
        "batch ahead of a later interactive"
    );
    assert_eq!(answer(run).await.code(), "ok");
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_interactive_request_is_not_refused_for_the_slack_of_a_batch_one() {
    // One worker, 100 ms calls. b (batch, 400 ms) fits behind the running call but
    // would keep less than one estimate of slack with one more request ahead: an
    // interactive newcomer would go behind it (and be late there) if b were
    // interactive. As batch, b is overtaken.
    for (b_class, i_admitted) in [(Priority::Interactive, false), (Priority::Batch, true)] {
        let a = one(1, 64, ms(100));
        let (_, run) = a.call(interactive("run", ms(10_000))).await;
        settle().await;
        let (ad, b) = a
            .call(Submission::new("b").budget(ms(400)).priority(b_class))
            .await;
        assert_eq!(ad, Admitted::Queued);
        let (ad, i) = a.call(interactive("i", ms(250))).await;
        println!("b {b_class}: i {ad:?}");
        assert_eq!(ad == Admitted::Queued, i_admitted, "b {b_class}");
        if i_admitted {
            assert_eq!(answer(i).await.code(), "ok");
        }
        assert_eq!(answer(b).await.code(), "ok", "b {b_class} still in time");
        assert_eq!(answer(run).await.code(), "ok");
        a.check_invariants();
        a.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_interactive_request_late_only_because_of_batch_displaces_the_latest() {
    // No delay: batch and interactive of the same deadline in plain EDF order, so the
    // batch requests are ahead of a later interactive request.
    let mut c = AdmissionConfig {
        workers: NonZeroUsize::MIN,
        ..AdmissionConfig::default()
    };
    c.estimator.initial = Some(ms(100));
    c.priority.batch_delay = Duration::ZERO;
    let backend: Arc<dyn crate::backend::Backend> = Arc::new(SimBackend::fixed(ms(100)));
    let a = Admission::start_pool(
        c,
        vec![backend],
        Arc::new(ChannelSink),
        crate::trace::Tracer::disabled(),
    );
    let (_, run) = a.call(interactive("run", ms(10_000))).await;
    settle().await;
    // Eight batch requests fit in 1 s (the last starts at 800 ms, ends at 900 ms).
    let mut bs = Vec::new();
    for i in 0..8 {
        let (ad, rx) = a.call(batch(&format!("b{i}"), ms(1_000))).await;
        assert_eq!(ad, Admitted::Queued, "b{i}");
        bs.push(rx);
    }
    // A batch request like them is predicted late and refused at once ...
    let (ad, _) = a.call(batch("b8", ms(1_000))).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::DeadlineExceeded));
    // ... an interactive one displaces the latest batch requests ahead of it instead.
    let (ad, i) = a.call(interactive("i", ms(1_000))).await;
    assert_eq!(ad, Admitted::Queued);
    let mut displaced = 0;
    let mut kept = Vec::new();
    for mut rx in bs.drain(..) {
        let Some(o) = answered_now(&mut rx) else {
            kept.push(rx);
            continue;
        };
        let e = o.result.as_ref().expect_err("displaced");
        assert_eq!(e.code, ErrorCode::DeadlineExceeded);
        assert!(
            e.message.contains("displaced by interactive work"),
            "{}",
            e.message
        );
        assert!(e.details.retry_after_ms.is_some(), "{e:?}");
        displaced += 1;
    }
    assert_eq!(displaced, 1, "the fewest needed");
    for rx in kept {
        assert_eq!(answer(rx).await.code(), "ok");
    }
    assert_eq!(answer(i).await.code(), "ok");
    assert_eq!(answer(run).await.code(), "ok");
    assert_eq!(a.stats().priority["batch"].displaced, 1);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_key_configured_batch_makes_its_requests_batch_unless_the_header_says() {
    let mut c = AdmissionConfig {
        workers: NonZeroUsize::new(2).expect("non-zero"),
        limits: vec![KeyLimit {
            name: "client".into(),
            key: KeySource::Client,
            limit: NonZeroUsize::new(100).expect("non-zero"),
            on_busy: OnBusy::Reject,
            tokens: None,
            priority: Some(Priority::Batch),
        }],
        ..AdmissionConfig::default()
    };
    c.estimator.initial = Some(ms(10));
    let backend: Arc<dyn crate::backend::Backend> = Arc::new(SimBackend::fixed(ms(10)));
    let a = Admission::start_pool(
        c,
        vec![backend],
        Arc::new(ChannelSink),
        crate::trace::Tracer::disabled(),
    );
    let subs = [
        Submission::new("keyed").client_key("etl"),
        Submission::new("keyed, says interactive")
            .client_key("etl")
            .priority(Priority::Interactive),
        Submission::new("no key"),
    ];
    for sub in subs {
        let (_, rx) = a.call(sub).await;
        assert_eq!(answer(rx).await.code(), "ok");
    }
    let s = a.stats();
    assert_eq!(s.priority["batch"].admitted, 1);
    assert_eq!(s.priority["interactive"].admitted, 2);
    assert_eq!(s.priority["batch"].queue_wait_ms.count, 1);
    a.shutdown().await;
}

/// Random classes, budgets, sessions and cancels over one worker and a queue of 4 (so
/// that displacement is frequent), under both orders: after each step the invariants
/// hold; at the end every submission got exactly one answer, nothing started after
/// its deadline, and batch requests were displaced along the way.
#[tokio::test(start_paused = true)]
async fn random_classes_keep_invariants_and_answer_everyone_once() {
    use crate::config::QueueOrder;
    let mut displaced = 0;
    for (seed, order) in (0..4u64).flat_map(|s| [(s, QueueOrder::Fifo), (s, QueueOrder::Edf)]) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut c = AdmissionConfig {
            workers: NonZeroUsize::MIN,
            queue_capacity: NonZeroUsize::new(4).expect("non-zero"),
            queue_order: order,
            ..AdmissionConfig::default()
        };
        c.estimator.initial = Some(ms(50));
        c.priority.batch_delay = ms(rng.random_range(0..400));
        let backend: Arc<dyn crate::backend::Backend> = Arc::new(SimBackend::fixed(ms(50)));
        let a = Admission::start_pool(
            c,
            vec![backend],
            Arc::new(ChannelSink),
            crate::trace::Tracer::disabled(),
        );
        let mut rxs: Vec<Rx> = Vec::new();
        for step in 0..300 {
            match rng.random_range(0..10) {
                0..=6 => {
                    let class = if rng.random_bool(0.6) {
                        Priority::Batch
                    } else {
                        Priority::Interactive
                    };
                    let budget = ms(rng.random_range(1..1_000));
                    let mut sub = Submission::new(format!("{step}"))
                        .budget(budget)
                        .priority(class)
                        .request_id(format!("r{}", rng.random_range(0..20)));
                    if rng.random_bool(0.5) {
                        sub = sub.session(format!("s{}", rng.random_range(0..3)));
                    }
                    rxs.push(a.call(sub).await.1);
                }
                7 => {
                    let _ = a.cancel(&format!("r{}", rng.random_range(0..20))).await;
                }
                _ => sleep_until(Instant::now() + ms(rng.random_range(1..80))).await,
            }
            settle().await;
            a.check_invariants();
        }
        sleep_until(Instant::now() + Duration::from_secs(5)).await;
        settle().await;
        let n = rxs.len();
        for mut rx in rxs {
            assert!(
                answered_now(&mut rx).is_some(),
                "seed {seed}: never answered"
            );
        }
        let s = a.stats();
        assert_eq!(s.offered as usize, n, "seed {seed}");
        assert_eq!(s.completed + s.refused_total(), s.offered, "seed {seed}");
        assert_eq!((s.queued_now, s.running_now), (0, 0));
        assert_eq!(s.started_after_deadline, 0);
        displaced += s.priority["batch"].displaced;
        a.check_invariants();
        a.shutdown().await;
    }
    println!("batch requests displaced over the seeds: {displaced}");
    assert!(displaced > 0);
}

mod scenarios;

#[tokio::test(start_paused = true)]
async fn nothing_is_displaced_for_an_interactive_request_a_key_gate_then_refuses() {
    // One worker, a queue of 1, key "k" limited to 1 at a time (refuse when busy).
    let mut c = AdmissionConfig {
        workers: NonZeroUsize::new(1).expect("non-zero"),
        queue_capacity: NonZeroUsize::new(1).expect("non-zero"),
        limits: vec![KeyLimit {
            name: "client".into(),
            key: KeySource::Client,
            limit: NonZeroUsize::new(1).expect("non-zero"),
            on_busy: OnBusy::Reject,
            tokens: None,
            priority: None,
        }],
        ..AdmissionConfig::default()
    };
    c.estimator.initial = Some(ms(100));
    let backend: Arc<dyn crate::backend::Backend> =
        Arc::new(SimBackend::fixed(Duration::from_secs(1)));
    let a = Admission::start_pool(
        c,
        vec![backend],
        Arc::new(ChannelSink),
        crate::trace::Tracer::disabled(),
    );
    let budget = Duration::from_secs(30);
    let (_, running) = a
        .call(interactive("k running", budget).client_key("k"))
        .await;
    tokio::time::sleep(ms(10)).await;
    let (_, mut queued) = a
        .call(batch("other key, queued", budget).client_key("o"))
        .await;
    // The queue is full; this one would displace the batch request, but key "k" is busy.
    let (ad, refused) = a.call(interactive("k again", budget).client_key("k")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::ConcurrencyLimitExceeded));
    assert_eq!(
        answer(refused).await.error_code(),
        Some(ErrorCode::ConcurrencyLimitExceeded)
    );
    let early = answered_now(&mut queued);
    assert!(
        early.is_none(),
        "the batch request was not displaced for a refused request: {early:?}"
    );
    let s = a.stats();
    assert_eq!(
        (
            s.priority["interactive"].admitted,
            s.priority["interactive"].refused
        ),
        (1, 1),
        "the refused request counted once, as refused"
    );
    assert_eq!(s.priority["batch"].displaced, 0);
    assert_eq!(answer(running).await.code(), "ok");
    assert_eq!(answer(queued).await.code(), "ok");
    a.check_invariants();
    a.shutdown().await;
}
