//! Priority classes on a paused clock: the rules one at a time (batch displaced first
//! when the queue is full, interactive ahead of batch within the delay, batch ageing,
//! displacement on the prediction, the class of a key), then the scenario —
//! interactive at 0.5× capacity plus batch at 1.5×, over one backend and over a pool
//! of three — with its figures printed.

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
    Admission::start(
        c,
        backend,
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
    let a = Admission::start(
        c,
        backend,
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
    let a = Admission::start(
        c,
        backend,
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

// ------------------------------------------------------------------- the scenario

/// One load: Poisson arrivals of each class (their own seeded streams, so the
/// interactive arrivals are the same with and without batch), for `secs` seconds.
#[derive(Debug, Clone, Copy)]
struct Load {
    interactive_per_s: f64,
    batch_per_s: f64,
    interactive_budget: Duration,
    batch_budget: Duration,
    secs: u64,
}

/// One answered request: its class, when it was sent and answered, how.
struct Done {
    class: Priority,
    sent: Duration,
    answered: Duration,
    outcome: Arc<Outcome>,
}

/// `classless`: every request is sent as interactive (no priority classes), the
/// class kept only to tell the figures apart.
async fn offer(a: &Admission<ChannelSink>, load: Load, classless: bool) -> Vec<Done> {
    let arrivals = |rate: f64, seed: u64| {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut t = 0.0f64;
        let mut out = Vec::new();
        while rate > 0.0 && out.len() < 1_000_000 {
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            if t >= load.secs as f64 {
                break;
            }
            out.push(Duration::from_secs_f64(t));
        }
        out
    };
    let mut all: Vec<(Duration, Priority)> = (arrivals(load.interactive_per_s, 7).into_iter())
        .map(|t| (t, Priority::Interactive))
        .chain(
            arrivals(load.batch_per_s, 11)
                .into_iter()
                .map(|t| (t, Priority::Batch)),
        )
        .collect();
    all.sort();
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(all.len());
    for (i, (at, class)) in all.into_iter().enumerate() {
        sleep_until(t0 + at).await;
        let budget = match class {
            Priority::Interactive => load.interactive_budget,
            Priority::Batch => load.batch_budget,
        };
        let sent_as = if classless {
            Priority::Interactive
        } else {
            class
        };
        let sub = Submission::new(format!("{i}"))
            .budget(budget)
            .priority(sent_as);
        let (_, rx) = a.call(sub).await;
        tasks.push(tokio::spawn(async move {
            let outcome = answer(rx).await;
            Done {
                class,
                sent: at,
                answered: Instant::now() - t0,
                outcome,
            }
        }));
    }
    let mut done = Vec::with_capacity(tasks.len());
    for t in tasks {
        done.push(t.await.expect("joined"));
    }
    done
}

/// The p-th percentile of `v` (sorted in place).
fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or_default()
}

/// The figures of one run.
#[derive(Debug)]
struct Figures {
    interactive_p99: Duration,
    interactive_p50: Duration,
    interactive: BTreeMap<&'static str, usize>,
    batch: BTreeMap<&'static str, usize>,
    /// `ok` answers inside the measurement window, per class.
    interactive_ok_window: usize,
    batch_ok_window: usize,
    displaced: u64,
}

fn figures(done: &[Done], window: (Duration, Duration), displaced: u64) -> Figures {
    let of = |c: Priority| done.iter().filter(move |d| d.class == c);
    let mut waits: Vec<Duration> = (of(Priority::Interactive))
        .filter(|d| d.outcome.result.is_ok())
        .map(|d| d.outcome.queue_time)
        .collect();
    let codes = |c: Priority| {
        let mut m = BTreeMap::new();
        for d in of(c) {
            *m.entry(d.outcome.code()).or_insert(0) += 1;
        }
        m
    };
    let in_window = |c: Priority| {
        of(c)
            .filter(|d| d.outcome.result.is_ok())
            .filter(|d| d.answered >= window.0 && d.answered < window.1)
            .count()
    };
    Figures {
        interactive_p99: pct(&mut waits, 0.99),
        interactive_p50: pct(&mut waits, 0.50),
        interactive: codes(Priority::Interactive),
        batch: codes(Priority::Batch),
        interactive_ok_window: in_window(Priority::Interactive),
        batch_ok_window: in_window(Priority::Batch),
        displaced,
    }
}

/// Runs the priority scenario on the admission core `make` builds, whose
/// capacity is `capacity` requests per second: interactive alone at 0.5×, then
/// interactive at 0.5× plus batch at 1.5×. Checks the three criteria and
/// returns the figures (alone, mixed).
async fn scenario(
    label: &str,
    make: impl Fn() -> Admission<ChannelSink>,
    capacity: f64,
    load: Load,
) -> (Figures, Figures) {
    let window = (Duration::from_secs(5), Duration::from_secs(load.secs));
    let alone_load = Load {
        batch_per_s: 0.0,
        ..load
    };
    let a = make();
    let done = offer(&a, alone_load, false).await;
    let alone = figures(&done, window, a.stats().priority["batch"].displaced);
    a.check_invariants();
    a.shutdown().await;
    let a = make();
    let naive = figures(&offer(&a, load, true).await, window, 0);
    a.shutdown().await;
    println!(
        "{label}: without classes: interactive p50 {:?} p99 {:?} {:?}; batch {:?}",
        naive.interactive_p50, naive.interactive_p99, naive.interactive, naive.batch
    );
    let a = make();
    let done = offer(&a, load, false).await;
    let mixed = figures(&done, window, a.stats().priority["batch"].displaced);
    // No batch request waits past its deadline without an answer: every answer came
    // by its deadline (the reply margin before it, as for every request).
    let late: Vec<_> = (done.iter())
        .filter(|d| d.class == Priority::Batch)
        .filter(|d| d.answered.saturating_sub(d.sent) > load.batch_budget)
        .map(|d| (d.sent, d.answered, d.outcome.code()))
        .collect();
    let stats = a.stats();
    a.check_invariants();
    a.shutdown().await;
    let span = (window.1 - window.0).as_secs_f64();
    let left_over = capacity * span - mixed.interactive_ok_window as f64;
    let batch_share = mixed.batch_ok_window as f64 / left_over;
    println!(
        "{label}: interactive alone p50 {:?} p99 {:?} {:?}\n\
         {label}: with batch  p50 {:?} p99 {:?} {:?} (p99 ratio {:.2})\n\
         {label}: batch {:?}; served {} in the window = {:.1} % of the {:.0} left over; \
         displaced {}; answered after the deadline {}\n\
         {label}: stats.priority {:?}",
        alone.interactive_p50,
        alone.interactive_p99,
        alone.interactive,
        mixed.interactive_p50,
        mixed.interactive_p99,
        mixed.interactive,
        mixed.interactive_p99.as_secs_f64() / alone.interactive_p99.as_secs_f64().max(1e-9),
        mixed.batch,
        mixed.batch_ok_window,
        100.0 * batch_share,
        left_over,
        mixed.displaced,
        late.len(),
        stats.priority,
    );
    assert!(
        late.is_empty(),
        "batch answered after its deadline: {late:?}"
    );
    assert!(
        mixed.interactive_p99.as_secs_f64() <= 1.5 * alone.interactive_p99.as_secs_f64() + 1e-3,
        "{label}: interactive p99 {:?} with batch, {:?} alone",
        mixed.interactive_p99,
        alone.interactive_p99
    );
    assert_eq!(
        mixed.interactive.get("ok"),
        alone.interactive.get("ok"),
        "{label}: interactive answers"
    );
    assert!(
        batch_share >= 0.8,
        "{label}: batch served {batch_share:.3} of the rest"
    );
    (alone, mixed)
}

/// One backend of 4 slots × 100 ms (40/s): interactive 20/s with 2 s budgets, batch
/// 60/s with the default 30 s budget, for 60 s.
#[tokio::test(start_paused = true)]
async fn interactive_half_plus_batch_one_and_a_half_over_one_backend() {
    let load = Load {
        interactive_per_s: 20.0,
        batch_per_s: 60.0,
        interactive_budget: Duration::from_secs(2),
        batch_budget: Duration::from_secs(30),
        secs: 60,
    };
    scenario("one backend", || one(4, 256, ms(100)), 40.0, load).await;
}

/// A pool of 3 backends × 2 slots × 100 ms (60/s): interactive 30/s, batch 90/s.
#[tokio::test(start_paused = true)]
async fn interactive_half_plus_batch_one_and_a_half_over_a_pool_of_three() {
    let load = Load {
        interactive_per_s: 30.0,
        batch_per_s: 90.0,
        interactive_budget: Duration::from_secs(2),
        batch_budget: Duration::from_secs(30),
        secs: 60,
    };
    scenario("pool of 3", || pool(3, 2, ms(100)), 60.0, load).await;
}

/// Batch with the interactive budget (2 s each; one backend, 4 × 100 ms; 0.5× + 1.5×):
/// what `priority.batch_delay_ms` buys. A batch request goes ahead of interactive
/// requests that arrive once it has waited `batch budget + delay − interactive
/// budget`; with a delay of at least the interactive budget it never does while it
/// lives. Whatever the delay, every interactive request is answered `ok` (batch is
/// displaced for it), no batch request is answered after its deadline, batch gets all
/// the capacity left over, and the interactive p99 falls as the delay grows.
#[tokio::test(start_paused = true)]
async fn equal_budgets_the_delay_sets_how_far_interactive_goes_first() {
    let load = Load {
        interactive_per_s: 20.0,
        batch_per_s: 60.0,
        interactive_budget: Duration::from_secs(2),
        batch_budget: Duration::from_secs(2),
        secs: 60,
    };
    let window = (Duration::from_secs(5), Duration::from_secs(60));
    let mut p99s = Vec::new();
    for delay in [0, 1_000, 2_000] {
        let mut c = AdmissionConfig {
            workers: NonZeroUsize::new(4).expect("non-zero"),
            ..AdmissionConfig::default()
        };
        c.estimator.initial = Some(ms(100));
        c.priority.batch_delay = ms(delay);
        let backend: Arc<dyn crate::backend::Backend> = Arc::new(SimBackend::fixed(ms(100)));
        let a = Admission::start(
            c,
            backend,
            Arc::new(ChannelSink),
            crate::trace::Tracer::disabled(),
        );
        let done = offer(&a, load, false).await;
        let f = figures(&done, window, a.stats().priority["batch"].displaced);
        let late = (done.iter())
            .filter(|d| d.answered.saturating_sub(d.sent) > load.batch_budget)
            .count();
        let left_over = 40.0 * 55.0 - f.interactive_ok_window as f64;
        println!(
            "equal budgets, delay {delay} ms: interactive p50 {:?} p99 {:?} {:?}; batch {:?}, \
             {:.1} % of the {left_over:.0} left over; displaced {}; late {late}",
            f.interactive_p50,
            f.interactive_p99,
            f.interactive,
            f.batch,
            100.0 * f.batch_ok_window as f64 / left_over,
            f.displaced,
        );
        assert_eq!(late, 0, "answered after the deadline");
        assert_eq!(f.interactive.get("ok"), Some(&f.interactive.values().sum()));
        assert!(f.batch_ok_window as f64 >= 0.8 * left_over, "{f:?}");
        a.check_invariants();
        a.shutdown().await;
        p99s.push(f.interactive_p99);
    }
    assert!(p99s.windows(2).all(|w| w[1] <= w[0]), "{p99s:?}");
    assert!(
        p99s[2] <= ms(150),
        "a delay of the interactive budget: {p99s:?}"
    );
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
        let a = Admission::start(
            c,
            backend,
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
