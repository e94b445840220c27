//! The scenarios on a paused clock, with their figures printed: a stalled
//! backend at 1.5× the pool's capacity, and session affinity at 0.7×.

use super::*;

/// The stall scenario on a paused clock: 3 sim backends (100 ms, 2 slots: 60/s
/// together), 1.5× that offered (90/s) with 2 s budgets for 30 s; one backend stalls
/// at 10 s for 10 s. Printed: the outcomes, split into refusals at admission and
/// answers after a wait.
#[tokio::test(start_paused = true)]
async fn the_stall_scenario_at_one_and_a_half_times_capacity() {
    let (backends, h) = sims(&[100, 100, 100]);
    let a = start(
        pool_cfg(&[("a", 2), ("b", 2), ("c", 2)], health()),
        backends,
    );
    warm(&a, 3).await;
    let t0 = Instant::now();
    let mut rxs = Vec::new();
    let period = Duration::from_secs(1) / 90;
    let mut i = 0u32;
    let mut paused = false;
    let mut resumed = false;
    while Instant::now() - t0 < Duration::from_secs(30) {
        let t = Instant::now() - t0;
        if !paused && t >= Duration::from_secs(10) {
            h[1].pause();
            paused = true;
        }
        if !resumed && t >= Duration::from_secs(20) {
            h[1].resume();
            resumed = true;
        }
        let sub = Submission::new(format!("r{i}")).budget(Duration::from_secs(2));
        let (ad, rx) = a.call(sub).await;
        rxs.push((t, ad, rx));
        i += 1;
        sleep(period).await;
    }
    let mut at_once = std::collections::BTreeMap::new();
    let mut after_wait = std::collections::BTreeMap::new();
    for (t, ad, rx) in rxs {
        let o = answer(rx).await;
        let bucket = if ad == Admitted::Queued {
            &mut after_wait
        } else {
            &mut at_once
        };
        let phase = match t.as_secs() {
            0..10 => "before",
            10..20 => "stalled",
            _ => "after",
        };
        *bucket.entry((phase, o.code())).or_insert(0u32) += 1;
    }
    println!("refused at once: {at_once:?}\nanswered after admission: {after_wait:?}");
    let b = &a.backends()[1];
    println!("b: {b:?}");
    // No caller gets an error of the backend: the stalled calls are retried elsewhere.
    // What b held queued when it stalled (its share of a full 2 s queue) no longer fits
    // on the two others, saturated as they are: those requests (and some behind them)
    // are answered `deadline_exceeded` while queued, before their deadline.
    for ((_, code), _) in at_once.iter().chain(&after_wait) {
        assert!(["ok", "deadline_exceeded"].contains(code), "{code}");
    }
    let ok_stalled = after_wait.get(&("stalled", "ok")).copied().unwrap_or(0);
    // Two backends do 2 × 2 / 100 ms = 40/s: 400 in the 10 s of the stall (less the
    // detection).
    assert!(
        ok_stalled >= 380,
        "goodput during the stall: {ok_stalled} of 400"
    );
    assert!(b.ejections >= 1 && b.health == "healthy", "{b:?}");
    a.check_invariants();
    a.shutdown().await;
}

/// The affinity scenario on a paused clock: 200 sessions × 10 turns over 3
/// healthy backends (2 slots × 60..=140 ms: about 60/s) at 0.7× (42 turns/s), 2 s budgets. Each
/// session's turns stay on one backend; the deadline results equal those of the same
/// load without sessions (no affinity).
#[tokio::test(start_paused = true)]
async fn sessions_stay_on_their_backend_at_seven_tenths_of_capacity() {
    let mut results = Vec::new();
    for with_sessions in [true, false] {
        let members: Vec<Flaky> = (0..3)
            .map(|_| Flaky {
                jitter: 40,
                ..Flaky::new(100)
            })
            .collect();
        let backends = (members.iter())
            .map(|f| Arc::new(f.clone()) as Arc<dyn Backend>)
            .collect();
        let a = start(
            pool_cfg(&[("a", 2), ("b", 2), ("c", 2)], health()),
            backends,
        );
        warm(&a, 3).await;
        // One turn every 200 / 42 s per session, the sessions spread over that period.
        let every = Duration::from_secs(200) / 42;
        let mut tasks = Vec::new();
        for s in 0..200u32 {
            let a = a.clone();
            tasks.push(tokio::spawn(async move {
                sleep(every * s / 200).await;
                let mut codes = Vec::new();
                for t in 0..10u32 {
                    let next = Instant::now() + every;
                    let mut sub =
                        Submission::new(format!("{s}:{t}")).budget(Duration::from_secs(2));
                    if with_sessions {
                        sub = sub.session(format!("s{s}"));
                    }
                    let (_, rx) = a.call(sub).await;
                    codes.push(answer(rx).await.code());
                    tokio::time::sleep_until(next).await;
                }
                codes
            }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += t
                .await
                .expect("task")
                .iter()
                .filter(|c| **c == "ok")
                .count();
        }
        // Per session: the share of its turns on the backend that served most of them.
        let mut on: std::collections::HashMap<String, [u32; 3]> = Default::default();
        for (b, f) in members.iter().enumerate() {
            for body in f.calls.lock().expect("lock").iter() {
                if let Some((s, _)) = body.split_once(':') {
                    on.entry(s.to_owned()).or_default()[b] += 1;
                }
            }
        }
        let sticky = on
            .values()
            .filter(|n| {
                let total: u32 = n.iter().sum();
                *n.iter().max().unwrap_or(&0) * 100 >= total * 95
            })
            .count();
        let spills: u64 = a.backends().iter().map(|b| b.spills).sum();
        println!(
            "sessions {with_sessions}: {ok} of 2000 ok, {sticky} of 200 sessions ≥ 95 % on one backend, {spills} spills"
        );
        results.push((ok, sticky));
        a.shutdown().await;
    }
    let ((ok_aff, sticky), (ok_plain, _)) = (results[0], results[1]);
    assert!(sticky >= 190, "{sticky} of 200 sessions on one backend");
    assert!(
        ok_aff.abs_diff(ok_plain) * 100 <= ok_plain * 2,
        "deadline results {ok_aff} with affinity, {ok_plain} without"
    );
}
