//! The priority scenario on a paused clock, with its figures printed:
//! interactive at 0.5× capacity plus batch at 1.5×, over one backend and over a pool
//! of three (against interactive alone and against the same load without classes),
//! and batch with the interactive budget under three `priority.batch_delay_ms`.

use super::*;

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
        let a = Admission::start_pool(
            c,
            vec![backend],
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
