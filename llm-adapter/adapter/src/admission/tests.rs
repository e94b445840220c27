//! Paused-clock tests of the admission core (no NATS).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};
use weir_protocol::llm::{AdmissionPolicy, ErrorCode};

use super::*;
use crate::backend::sim::SimBackend;
use crate::backend::{BackendError, BackendErrorKind, BackendReply, BackendRequest};
use crate::config::{IdempotencyConfig, KeyLimit, KeySource, Mode, OnBusy};
use crate::trace::{TraceEvent, TraceKind};

type Rx = oneshot::Receiver<Arc<Outcome>>;

/// A backend driven by the body: `ok:<ms>` sleeps then echoes, `fail:<ms>` sleeps then
/// fails. It records the order of calls.
#[derive(Clone, Default)]
struct Script {
    calls: Arc<Mutex<Vec<String>>>,
}

impl Script {
    fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("lock").clone()
    }
}

impl Backend for Script {
    fn name(&self) -> &'static str {
        "script"
    }

    fn call(
        &self,
        request: BackendRequest,
    ) -> BoxFuture<'static, Result<BackendReply, BackendError>> {
        let body = String::from_utf8_lossy(&request.body).into_owned();
        self.calls.lock().expect("lock").push(body.clone());
        Box::pin(async move {
            let (kind, rest) = body.split_once(':').unwrap_or(("ok", "0"));
            let ms: u64 = rest
                .split(':')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            sleep(Duration::from_millis(ms)).await;
            if kind == "fail" {
                Err(BackendError::new(
                    BackendErrorKind::Failed,
                    "scripted failure",
                ))
            } else {
                Ok(BackendReply::body(request.body))
            }
        })
    }
}

fn cfg(workers: usize, capacity: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: NonZeroUsize::new(workers).expect("non-zero"),
        queue_capacity: NonZeroUsize::new(capacity).expect("non-zero"),
        // The rules these tests were written for: FIFO order, a fixed start budget of 0
        // and no reply margin (the defaults — EDF, adaptive — have their own tests
        // below; the randomized workload runs under both orders).
        queue_order: QueueOrder::Fifo,
        deadline: DeadlineConfig {
            default: None,
            max: Duration::from_secs(600),
            min_start_budget: Some(Duration::ZERO),
            reply_margin: Duration::ZERO,
            predict: true,
            overtake_share_pct: 50,
        },
        ..AdmissionConfig::default()
    }
}

fn start(c: AdmissionConfig, backend: impl Backend) -> Admission<ChannelSink> {
    Admission::start_pool(
        c,
        vec![Arc::new(backend)],
        Arc::new(ChannelSink),
        Tracer::disabled(),
    )
}

async fn answer(rx: Rx) -> Arc<Outcome> {
    timeout(Duration::from_secs(3600), rx)
        .await
        .expect("answered in time")
        .expect("answered, not dropped")
}

async fn code(rx: Rx) -> Option<ErrorCode> {
    answer(rx).await.error_code()
}

fn is_pending(rx: &mut Rx) -> bool {
    matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty))
}

/// Lets spawned tasks run without advancing the paused clock much.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn limit(name: &str, key: KeySource, n: usize, on_busy: OnBusy) -> KeyLimit {
    KeyLimit {
        name: name.into(),
        key,
        limit: NonZeroUsize::new(n).expect("non-zero"),
        on_busy,
        tokens: None,
        priority: None,
    }
}

#[tokio::test(start_paused = true)]
async fn session_cap_five_refuses_the_sixth_and_admits_other_sessions() {
    let a = start(cfg(4, 64), Script::default());
    let mut rxs = Vec::new();
    for i in 0..5 {
        let (ad, rx) = a
            .call(Submission::new(format!("ok:100:{i}")).session("s1"))
            .await;
        assert_eq!(ad, Admitted::Queued);
        rxs.push(rx);
    }
    settle().await;
    let v = a.limits_view(10);
    assert_eq!(v.sessions[0].pending, 5);
    assert_eq!(v.sessions[0].waiting, 4, "1 running + 4 queued");

    let (ad, rx) = a.call(Submission::new("ok:100:6").session("s1")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::SessionQueueFull));
    let out = answer(rx).await;
    let err = out.result.as_ref().expect_err("refused");
    assert_eq!(err.details.limit, Some(5));
    assert_eq!(err.details.pending, Some(5));
    assert!(err.details.retry_after_ms.is_some());

    let (ad, rx_other) = a.call(Submission::new("ok:100:other").session("s2")).await;
    assert_eq!(ad, Admitted::Queued);

    // After one settles, the next one for s1 is accepted.
    let first = rxs.remove(0);
    assert_eq!(code(first).await, None);
    let (ad, rx7) = a.call(Submission::new("ok:100:7").session("s1")).await;
    assert_eq!(ad, Admitted::Queued);
    for rx in rxs.into_iter().chain([rx_other, rx7]) {
        assert_eq!(code(rx).await, None);
    }
    a.check_invariants();
    let s = a.stats();
    assert_eq!(s.slots_acquired, s.slots_released);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn slot_released_exactly_once_on_every_outcome() {
    let mut c = cfg(2, 64);
    c.session.pending_cap = NonZeroUsize::new(10);
    c.limits = vec![limit(
        "client",
        KeySource::Client,
        1,
        OnBusy::Wait {
            max_wait: Duration::from_secs(60),
            max_waiters: 100,
        },
    )];
    let script = Script::default();
    let a = start(c, script.clone());

    // Success, backend error, deadline in queue, deadline in inference, cancel queued,
    // cancel running — each in its own session, sharing one client key.
    let sub = |body: &str, s: &str| Submission::new(body.to_owned()).session(s).client_key("c");
    let (_, ok) = a.call(sub("ok:10", "a")).await;
    let (_, fail) = a.call(sub("fail:10", "b")).await;
    let (_, late_queue) = a
        .call(sub("ok:10", "c").budget(Duration::from_millis(5)))
        .await;
    let (_, late_run) = a
        .call(sub("ok:5000", "d").budget(Duration::from_millis(100)))
        .await;
    let (_, cancel_queued) = a.call(sub("ok:10", "e").request_id("cq")).await;
    let (_, cancel_running) = a.call(sub("ok:5000", "f").request_id("cr")).await;
    assert_eq!(a.cancel("cq").await, CancelResult::Queued);
    assert_eq!(code(ok).await, None);
    assert_eq!(code(fail).await, Some(ErrorCode::BackendError));
    assert_eq!(code(late_queue).await, Some(ErrorCode::DeadlineExceeded));
    assert_eq!(code(late_run).await, Some(ErrorCode::DeadlineExceeded));
    assert_eq!(code(cancel_queued).await, Some(ErrorCode::Cancelled));
    // The request behind the failures still runs.
    settle().await;
    assert_eq!(a.cancel("cr").await, CancelResult::Running);
    assert_eq!(code(cancel_running).await, Some(ErrorCode::Cancelled));

    settle().await;
    a.check_invariants();
    let s = a.stats();
    // Six session slots; four client slots (the request that expired and the one
    // cancelled while waiting for the client slot never held one).
    assert_eq!(s.slots_acquired, 6 + 4);
    assert_eq!(s.slots_acquired, s.slots_released);
    assert_eq!((s.queued_now, s.running_now), (0, 0));
    assert_eq!(a.limits_view(10).sessions.len(), 0);
    // Neither the expired nor the cancelled-while-queued request reached the backend.
    assert_eq!(
        script.calls(),
        vec!["ok:10", "fail:10", "ok:5000", "ok:5000"]
    );
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_request_does_not_block_its_session() {
    let a = start(cfg(1, 8), Script::default());
    let (_, r1) = a.call(Submission::new("fail:10").session("s")).await;
    let (_, r2) = a.call(Submission::new("ok:10").session("s")).await;
    assert_eq!(code(r1).await, Some(ErrorCode::BackendError));
    assert_eq!(code(r2).await, None);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn expired_in_queue_never_reaches_the_backend_and_is_answered_at_the_deadline() {
    let sim = SimBackend::fixed(Duration::from_secs(1));
    let h = sim.handle();
    let a = start(cfg(1, 8), sim);
    let t0 = Instant::now();
    let (_, r1) = a.call(Submission::new("first")).await;
    let (_, r2) = a
        .call(Submission::new("second").budget(Duration::from_millis(200)))
        .await;
    let out = answer(r2).await;
    assert_eq!(out.error_code(), Some(ErrorCode::DeadlineExceeded));
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(200),
        "answered at its deadline"
    );
    let err = out.result.as_ref().expect_err("refused");
    assert_eq!(err.details.waited_ms, Some(200));
    assert_eq!(code(r1).await, None);
    settle().await;
    assert_eq!(h.stats().started, 1);
    assert_eq!(h.stats().started_after_deadline, 0);
    assert_eq!(a.stats().started_after_deadline, 0);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn already_expired_or_too_short_budgets_are_refused_before_the_backend() {
    let mut c = cfg(1, 8);
    c.deadline.min_start_budget = Some(Duration::from_millis(50));
    let sim = SimBackend::fixed(Duration::from_millis(100));
    let h = sim.handle();
    let a = start(c, sim);
    let (ad, r0) = a.call(Submission::new("x").budget(Duration::ZERO)).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::DeadlineExceeded));
    assert_eq!(code(r0).await, Some(ErrorCode::DeadlineExceeded));
    // 120 ms budget behind a 100 ms call: 20 ms left when a worker is free (< 50 ms).
    let (_, r1) = a.call(Submission::new("a")).await;
    let (_, r2) = a
        .call(Submission::new("b").budget(Duration::from_millis(120)))
        .await;
    assert_eq!(code(r1).await, None);
    let out = answer(r2).await;
    assert_eq!(out.error_code(), Some(ErrorCode::DeadlineExceeded));
    assert!(out.inference_time.is_none());
    assert_eq!(h.stats().started, 1);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn deadline_during_inference_aborts_the_backend_call() {
    let sim = SimBackend::fixed(Duration::from_secs(10));
    let h = sim.handle();
    let a = start(cfg(1, 8), sim);
    let t0 = Instant::now();
    let (_, rx) = a
        .call(Submission::new("x").budget(Duration::from_millis(300)))
        .await;
    let out = answer(rx).await;
    assert_eq!(out.error_code(), Some(ErrorCode::DeadlineExceeded));
    assert_eq!(t0.elapsed(), Duration::from_millis(300));
    assert_eq!(out.inference_time, Some(Duration::from_millis(300)));
    settle().await;
    assert_eq!(h.stats().aborted, 1);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn backend_timeout_is_distinct_from_the_deadline() {
    let mut c = cfg(1, 8);
    c.backend_timeout = Duration::from_millis(50);
    let a = start(c, SimBackend::fixed(Duration::from_secs(10)));
    let (_, rx) = a
        .call(Submission::new("x").budget(Duration::from_secs(1)))
        .await;
    assert_eq!(code(rx).await, Some(ErrorCode::BackendTimeout));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn default_and_maximum_deadlines_apply() {
    let mut c = cfg(1, 8);
    c.deadline.default = Some(Duration::from_millis(100));
    c.deadline.max = Duration::from_millis(200);
    let a = start(c, SimBackend::fixed(Duration::from_secs(10)));
    let t0 = Instant::now();
    let (_, r1) = a.call(Submission::new("no deadline")).await;
    assert_eq!(code(r1).await, Some(ErrorCode::DeadlineExceeded));
    assert_eq!(t0.elapsed(), Duration::from_millis(100));
    let t1 = Instant::now();
    let (_, r2) = a
        .call(Submission::new("long").budget(Duration::from_secs(60)))
        .await;
    assert_eq!(code(r2).await, Some(ErrorCode::DeadlineExceeded));
    assert_eq!(t1.elapsed(), Duration::from_millis(200));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn full_queue_refuses_at_once_with_a_retry_hint() {
    let a = start(cfg(1, 2), SimBackend::fixed(Duration::from_millis(100)));
    let (_, r1) = a.call(Submission::new("1")).await;
    settle().await;
    let (_, r2) = a.call(Submission::new("2")).await;
    let (_, r3) = a.call(Submission::new("3")).await;
    let (ad, r4) = a.call(Submission::new("4")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::QueueFull));
    let out = answer(r4).await;
    let err = out.result.as_ref().expect_err("refused");
    assert_eq!(err.details.limit, Some(2));
    assert_eq!(err.details.pending, Some(2));
    assert!(err.details.retry_after_ms.is_some_and(|ms| ms > 0));
    assert_eq!(out.queue_time, Duration::ZERO, "refused at once");
    for rx in [r1, r2, r3] {
        assert_eq!(code(rx).await, None);
    }
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn paused_backend_refuses_the_excess_and_memory_stays_bounded() {
    let sim = SimBackend::fixed(Duration::from_millis(10));
    let h = sim.handle();
    h.pause();
    let a = start(cfg(4, 16), sim);
    let mut admitted = Vec::new();
    let mut refused = 0;
    for i in 0..1000 {
        let (ad, rx) = a.call(Submission::new(format!("{i}"))).await;
        match ad {
            Admitted::Queued => admitted.push(rx),
            Admitted::Refused(ErrorCode::QueueFull) => refused += 1,
            other => panic!("unexpected {other:?}"),
        }
        if i % 100 == 0 {
            settle().await;
            let s = a.stats();
            assert!(s.queued_now <= 16 && s.running_now <= 4, "{s:?}");
        }
    }
    settle().await;
    assert_eq!(admitted.len(), 4 + 16);
    assert_eq!(refused, 980);
    assert_eq!(h.stats().in_progress, 4);
    h.resume();
    for rx in admitted {
        assert_eq!(code(rx).await, None);
    }
    let s = a.stats();
    assert_eq!(s.completed, 20);
    assert_eq!(s.refused_of(ErrorCode::QueueFull), 980);
    assert_eq!(s.offered, 1000);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn key_limit_waits_fifo_refuses_over_max_waiters_and_after_max_wait() {
    let mut c = cfg(8, 64);
    c.limits = vec![limit(
        "per-client",
        KeySource::Client,
        2,
        OnBusy::Wait {
            max_wait: Duration::from_millis(500),
            max_waiters: 3,
        },
    )];
    let script = Script::default();
    let a = start(c, script.clone());
    let sub = |b: &str| Submission::new(b.to_owned()).client_key("k");

    // 2 in flight, 3 waiting, the 6th refused at once.
    let mut rxs = Vec::new();
    for b in ["ok:300:a", "ok:300:b", "ok:100:c", "ok:100:d", "ok:1000:e"] {
        let (ad, rx) = a.call(sub(b)).await;
        assert_eq!(ad, Admitted::Queued);
        rxs.push(rx);
    }
    settle().await;
    let (ad, r6) = a.call(sub("ok:1:f")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::ConcurrencyLimitExceeded));
    let err = answer(r6).await.result.clone().expect_err("refused");
    assert_eq!(
        (
            err.details.limit,
            err.details.in_flight,
            err.details.waiting
        ),
        (Some(2), Some(2), Some(3))
    );
    assert_eq!(err.details.key.as_deref(), Some("client:k"));
    let view = a.limits_view(5);
    assert_eq!((view.keys[0].in_flight, view.keys[0].waiting), (2, 3));

    // Another client is not affected.
    let (ad, other) = a.call(Submission::new("ok:1:other").client_key("z")).await;
    assert_eq!(ad, Admitted::Queued);

    // a, b finish at 300 ms → c, d start in FIFO order and finish at 400 ms; e waits
    // from 0 and would get a slot at 400 ms — within its 500 ms max_wait.
    let mut it = rxs.into_iter();
    for _ in 0..5 {
        assert_eq!(code(it.next().expect("rx")).await, None);
    }
    assert_eq!(code(other).await, None);
    assert_eq!(
        script.calls(),
        vec![
            "ok:300:a",
            "ok:300:b",
            "ok:1:other",
            "ok:100:c",
            "ok:100:d",
            "ok:1000:e"
        ]
    );

    // Now hold both slots for long; a waiter is refused after max_wait with waited_ms.
    let (_, l1) = a.call(sub("ok:5000:l1")).await;
    let (_, l2) = a.call(sub("ok:5000:l2")).await;
    settle().await;
    let t0 = Instant::now();
    let (_, w) = a.call(sub("ok:1:w")).await;
    let out = answer(w).await;
    assert_eq!(t0.elapsed(), Duration::from_millis(500));
    let err = out.result.as_ref().expect_err("refused");
    assert_eq!(err.code, ErrorCode::ConcurrencyLimitExceeded);
    assert_eq!(err.details.waited_ms, Some(500));
    assert_eq!(code(l1).await, None);
    assert_eq!(code(l2).await, None);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn reject_policy_limits_and_chained_limits() {
    let mut c = cfg(8, 64);
    c.limits = vec![
        limit("client", KeySource::Client, 1, OnBusy::Reject),
        limit(
            "service",
            KeySource::Service,
            2,
            OnBusy::Wait {
                max_wait: Duration::from_secs(10),
                max_waiters: 10,
            },
        ),
    ];
    let script = Script::default();
    let a = start(c, script.clone());
    let (_, a1) = a.call(Submission::new("ok:100:a1").client_key("a")).await;
    let (ad, a2) = a.call(Submission::new("ok:100:a2").client_key("a")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::ConcurrencyLimitExceeded));
    assert_eq!(code(a2).await, Some(ErrorCode::ConcurrencyLimitExceeded));
    let (_, b1) = a.call(Submission::new("ok:100:b1").client_key("b")).await;
    // The service limit (2) is full: c1 waits at the second gate while holding its
    // client slot, so a second request of client c is refused by the first gate.
    let (ad, c1) = a.call(Submission::new("ok:100:c1").client_key("c")).await;
    assert_eq!(ad, Admitted::Queued);
    let (ad, c2) = a.call(Submission::new("ok:100:c2").client_key("c")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::ConcurrencyLimitExceeded));
    assert_eq!(code(c2).await, Some(ErrorCode::ConcurrencyLimitExceeded));
    settle().await;
    assert_eq!(script.calls().len(), 2);
    for rx in [a1, b1, c1] {
        assert_eq!(code(rx).await, None);
    }
    a.check_invariants();
    let s = a.stats();
    assert_eq!(s.slots_acquired, s.slots_released);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn body_pointer_keys_limit_per_value() {
    let mut c = cfg(8, 64);
    c.limits = vec![limit(
        "model",
        KeySource::Body("/model".into()),
        1,
        OnBusy::Reject,
    )];
    let a = start(c, SimBackend::fixed(Duration::from_millis(100)));
    let (ad, _r1) = a.call(Submission::new(r#"{"model":"big","x":1}"#)).await;
    assert_eq!(ad, Admitted::Queued);
    let (ad, _) = a.call(Submission::new(r#"{"model":"big","x":2}"#)).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::ConcurrencyLimitExceeded));
    let (ad, _) = a.call(Submission::new(r#"{"model":"small"}"#)).await;
    assert_eq!(ad, Admitted::Queued);
    // No such member, or not JSON: the rule does not apply.
    let (ad, _) = a.call(Submission::new(r#"{"x":1}"#)).await;
    assert_eq!(ad, Admitted::Queued);
    let (ad, _) = a.call(Submission::new("plain text")).await;
    assert_eq!(ad, Admitted::Queued);
    let long = format!(r#"{{"model":"{}"}}"#, "m".repeat(300));
    let (ad, _) = a.call(Submission::new(long)).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::InvalidRequest));
    assert_eq!(a.limits_view(5).keys[0].key, "body:/model=big");
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn session_ordering_is_fifo_and_reject_policy_refuses_when_busy() {
    let script = Script::default();
    let a = start(cfg(4, 64), script.clone());
    let mut rxs = Vec::new();
    for i in 0..3 {
        let (_, rx) = a
            .call(Submission::new(format!("ok:50:s{i}")).session("s"))
            .await;
        rxs.push(rx);
    }
    let (ad, rej) = a
        .call(
            Submission::new("ok:1:r")
                .session("s")
                .policy(AdmissionPolicy::Reject),
        )
        .await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::ConcurrencyLimitExceeded));
    let err = answer(rej).await.result.clone().expect_err("refused");
    assert_eq!(err.details.key.as_deref(), Some("session:s"));
    assert_eq!(err.details.waiting, Some(2));
    let (_, other) = a.call(Submission::new("ok:50:t").session("t")).await;
    settle().await;
    // One running per session: s0 and t run concurrently.
    assert_eq!(script.calls(), vec!["ok:50:s0", "ok:50:t"]);
    let t0 = Instant::now();
    for rx in rxs {
        assert_eq!(code(rx).await, None);
    }
    assert_eq!(
        t0.elapsed(),
        Duration::from_millis(150),
        "serialised per session"
    );
    assert_eq!(code(other).await, None);
    assert_eq!(
        script.calls(),
        vec!["ok:50:s0", "ok:50:t", "ok:50:s1", "ok:50:s2"]
    );
    // With the session idle, `reject` is admitted.
    let (ad, r) = a
        .call(
            Submission::new("ok:1:r2")
                .session("s")
                .policy(AdmissionPolicy::Reject),
        )
        .await;
    assert_eq!(ad, Admitted::Queued);
    assert_eq!(code(r).await, None);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn idempotent_retry_joins_then_hits_the_cache_and_conflicts_are_refused() {
    let mut c = cfg(2, 16);
    c.idempotency = Some(IdempotencyConfig {
        window: Duration::from_secs(30),
        max_entries: NonZeroUsize::new(100).expect("non-zero"),
        max_bytes: NonZeroUsize::new(1 << 20).expect("non-zero"),
    });
    let sim = SimBackend::fixed(Duration::from_millis(100));
    let h = sim.handle();
    let a = start(c, sim);
    let sub = || Submission::new("same body").request_id("r1").session("s");
    let (ad1, r1) = a.call(sub()).await;
    let (ad2, r2) = a.call(sub()).await;
    assert_eq!((ad1, ad2), (Admitted::Queued, Admitted::Joined));
    let (ad, c1) = a
        .call(Submission::new("other body").request_id("r1").session("s"))
        .await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::RequestIdConflict));
    assert_eq!(code(c1).await, Some(ErrorCode::RequestIdConflict));
    let (ad, c2) = a
        .call(
            Submission::new("same body")
                .request_id("r1")
                .session("other"),
        )
        .await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::RequestIdConflict));
    drop(c2);
    let o1 = answer(r1).await;
    let o2 = answer(r2).await;
    assert!(Arc::ptr_eq(&o1, &o2), "both waiters get the same outcome");
    // Within the window: cached.
    let (ad, r3) = a.call(sub()).await;
    assert_eq!(ad, Admitted::Cached);
    assert_eq!(answer(r3).await.result, o1.result);
    let (ad, _) = a
        .call(Submission::new("x").request_id("r1").session("s"))
        .await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::RequestIdConflict));
    assert_eq!(h.stats().started, 1, "inference ran once");
    // After the window: runs again.
    sleep(Duration::from_secs(31)).await;
    let (ad, r4) = a.call(sub()).await;
    assert_eq!(ad, Admitted::Queued);
    assert_eq!(code(r4).await, None);
    assert_eq!(h.stats().started, 2);
    let s = a.stats();
    assert_eq!((s.joined, s.cached), (1, 1));
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn failures_are_not_cached_so_a_retry_runs_again() {
    let mut c = cfg(1, 4);
    c.idempotency = Some(IdempotencyConfig {
        window: Duration::from_secs(30),
        max_entries: NonZeroUsize::new(10).expect("non-zero"),
        max_bytes: NonZeroUsize::new(1 << 20).expect("non-zero"),
    });
    let script = Script::default();
    let a = start(c, script.clone());
    let (_, r1) = a.call(Submission::new("fail:1").request_id("x")).await;
    assert_eq!(code(r1).await, Some(ErrorCode::BackendError));
    let (ad, r2) = a.call(Submission::new("fail:1").request_id("x")).await;
    assert_eq!(ad, Admitted::Queued);
    assert_eq!(code(r2).await, Some(ErrorCode::BackendError));
    assert_eq!(script.calls().len(), 2);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn cancel_queued_keeps_the_order_of_the_rest_and_cancel_running_aborts() {
    let script = Script::default();
    let a = start(cfg(1, 16), script.clone());
    let (_, r0) = a.call(Submission::new("ok:100:0").request_id("0")).await;
    let (_, r1) = a.call(Submission::new("ok:100:1").request_id("1")).await;
    let (_, r2) = a.call(Submission::new("ok:100:2").request_id("2")).await;
    let (_, r3) = a.call(Submission::new("ok:100:3").request_id("3")).await;
    settle().await;
    assert_eq!(a.cancel("2").await, CancelResult::Queued);
    assert_eq!(a.cancel("2").await, CancelResult::NotFound);
    assert_eq!(a.cancel("nope").await, CancelResult::NotFound);
    assert_eq!(code(r2).await, Some(ErrorCode::Cancelled));
    assert_eq!(a.cancel("0").await, CancelResult::Running);
    let out = answer(r0).await;
    assert_eq!(out.error_code(), Some(ErrorCode::Cancelled));
    assert!(out.inference_time.is_some());
    assert_eq!(code(r1).await, None);
    assert_eq!(code(r3).await, None);
    assert_eq!(script.calls(), vec!["ok:100:0", "ok:100:1", "ok:100:3"]);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn queue_wait_and_inference_time_are_measured_separately() {
    let a = start(cfg(1, 4), SimBackend::fixed(Duration::from_millis(100)));
    let (_, r1) = a.call(Submission::new("1")).await;
    let (_, r2) = a.call(Submission::new("2")).await;
    let o1 = answer(r1).await;
    let o2 = answer(r2).await;
    assert_eq!(
        (o1.queue_time, o1.inference_time),
        (Duration::ZERO, Some(Duration::from_millis(100)))
    );
    assert_eq!(
        (o2.queue_time, o2.inference_time),
        (Duration::from_millis(100), Some(Duration::from_millis(100)))
    );
    let s = a.stats();
    assert_eq!(s.queue_wait_ms.count, 2);
    assert!((s.queue_wait_ms.max - 100.0).abs() < 1.0, "{s:?}");
    assert!((s.inference_ms.p50 - 100.0).abs() < 1.0, "{s:?}");
    assert!((s.useful_backend_share() - 1.0).abs() < 1e-9);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_would_reject_and_admits() {
    let mut c = cfg(4, 64);
    c.mode = Mode::Shadow;
    c.session.pending_cap = NonZeroUsize::new(1);
    c.limits = vec![limit("client", KeySource::Client, 1, OnBusy::Reject)];
    let script = Script::default();
    let a = start(c, script.clone());
    let mut rxs = Vec::new();
    for (body, session, key, policy) in [
        ("ok:100:a", "s0", Some("k"), AdmissionPolicy::Enqueue),
        ("ok:100:b", "s0", Some("k"), AdmissionPolicy::Enqueue), // session cap 1
        ("ok:50:c", "s1", Some("k"), AdmissionPolicy::Enqueue),  // client limit 1
        ("ok:10:d", "s0", None, AdmissionPolicy::Reject),        // cap + session busy
    ] {
        let mut sub = Submission::new(body).session(session).policy(policy);
        if let Some(k) = key {
            sub = sub.client_key(k);
        }
        let (ad, rx) = a.call(sub).await;
        assert_eq!(ad, Admitted::Queued, "{body}");
        rxs.push(rx);
    }
    settle().await;
    assert_eq!(
        script.calls(),
        vec!["ok:100:a", "ok:50:c"],
        "not enforced: a and c run together"
    );
    for rx in rxs {
        assert_eq!(code(rx).await, None);
    }
    let s = a.stats();
    assert_eq!(s.would_reject.get("session_cap"), Some(&2));
    assert_eq!(s.would_reject.get("client"), Some(&1));
    assert_eq!(s.would_reject.get("session_order"), Some(&1));
    assert_eq!(s.refused_total(), 0);
    assert_eq!(s.slots_acquired, s.slots_released);
    // Ordering is behaviour, not a limit: s0 still ran one at a time, in order.
    assert_eq!(
        script.calls(),
        vec!["ok:100:a", "ok:50:c", "ok:100:b", "ok:10:d"]
    );
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_queued_finishes_running_then_refuses() {
    let mut c = cfg(1, 8);
    c.shutdown_grace = Duration::from_secs(1);
    let a = start(c, SimBackend::fixed(Duration::from_millis(300)));
    let (_, running) = a.call(Submission::new("1")).await;
    let (_, queued) = a.call(Submission::new("2")).await;
    settle().await;
    let report = a.shutdown().await;
    assert_eq!(
        report,
        ShutdownReport {
            answered_queued: 1,
            aborted_running: 0
        }
    );
    assert_eq!(code(queued).await, Some(ErrorCode::ShuttingDown));
    assert_eq!(code(running).await, None);
    let (ad, late) = a.call(Submission::new("3")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::ShuttingDown));
    assert_eq!(code(late).await, Some(ErrorCode::ShuttingDown));
    assert!(a.is_shutting_down());
}

#[tokio::test(start_paused = true)]
async fn shutdown_aborts_what_outlives_the_grace_period() {
    let mut c = cfg(2, 8);
    c.shutdown_grace = Duration::from_millis(500);
    let sim = SimBackend::fixed(Duration::from_secs(60));
    let h = sim.handle();
    let a = start(c, sim);
    let (_, r1) = a.call(Submission::new("1")).await;
    settle().await;
    let t0 = Instant::now();
    let report = a.shutdown().await;
    assert_eq!(report.aborted_running, 1);
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(code(r1).await, Some(ErrorCode::ShuttingDown));
    assert_eq!(h.stats().aborted, 1);
    let s = a.stats();
    assert_eq!(s.slots_acquired, s.slots_released);
}

#[tokio::test(start_paused = true)]
async fn trace_events_follow_the_lifecycle() {
    let mut c = cfg(1, 8);
    c.session.pending_cap = NonZeroUsize::new(1);
    c.limits = vec![limit(
        "client",
        KeySource::Client,
        1,
        OnBusy::Wait {
            max_wait: Duration::from_secs(1),
            max_waiters: 4,
        },
    )];
    let (tracer, mut events) = Tracer::with_channel(false, 256);
    let a = Admission::start_pool(
        c,
        vec![Arc::new(SimBackend::fixed(Duration::from_millis(10)))],
        Arc::new(ChannelSink),
        tracer,
    );
    let (_, r1) = a
        .call(
            Submission::new("1")
                .session("a")
                .client_key("k")
                .request_id("one"),
        )
        .await;
    let (_, r2) = a
        .call(
            Submission::new("2")
                .session("b")
                .client_key("k")
                .request_id("two"),
        )
        .await;
    let (_, r3) = a.call(Submission::new("3").session("a")).await;
    for rx in [r1, r2] {
        assert_eq!(code(rx).await, None);
    }
    assert_eq!(code(r3).await, Some(ErrorCode::SessionQueueFull));
    a.shutdown().await;
    let mut got: Vec<TraceEvent> = Vec::new();
    while let Ok(ev) = events.try_recv() {
        got.push(ev);
    }
    let of = |rid: &str| -> Vec<&'static str> {
        got.iter()
            .filter(|e| e.request_id.as_deref() == Some(rid))
            .map(|e| e.event.as_str())
            .collect()
    };
    assert_eq!(
        of("one"),
        vec![
            "queued",
            "slot_acquired",
            "slot_acquired",
            "admitted",
            "started",
            "finished",
            "slot_released",
            "slot_released"
        ]
    );
    assert_eq!(
        of("two"),
        vec![
            "queued",
            "slot_acquired",
            "slot_waiting",
            "slot_granted",
            "admitted",
            "started",
            "finished",
            "slot_released",
            "slot_released"
        ]
    );
    let granted = got
        .iter()
        .find(|e| e.event == TraceKind::SlotGranted)
        .expect("granted");
    assert_eq!(granted.waited_ms, Some(10.0));
    assert_eq!(granted.rule.as_deref(), Some("client"));
    assert!(
        got.iter()
            .any(|e| e.event == TraceKind::SlotBusy && e.rule.as_deref() == Some("session_cap"))
    );
}

/// Random operations over a paused clock; after each step the invariants hold, and at
/// the end every submission got exactly one answer and every slot was released.
#[tokio::test(start_paused = true)]
async fn random_workload_keeps_invariants_and_answers_everyone_once() {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    for (seed, order) in (0..4u64).flat_map(|s| [(s, QueueOrder::Fifo), (s, QueueOrder::Edf)]) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut c = cfg(3, 12);
        c.queue_order = order;
        c.session.pending_cap = NonZeroUsize::new(3);
        c.idempotency = Some(IdempotencyConfig {
            window: Duration::from_millis(200),
            max_entries: NonZeroUsize::new(8).expect("non-zero"),
            max_bytes: NonZeroUsize::new(1 << 20).expect("non-zero"),
        });
        c.limits = vec![
            limit(
                "client",
                KeySource::Client,
                2,
                OnBusy::Wait {
                    max_wait: Duration::from_millis(150),
                    max_waiters: 3,
                },
            ),
            limit("service", KeySource::Service, 4, OnBusy::Reject),
        ];
        let a = start(c, Script::default());
        let mut rxs: Vec<Rx> = Vec::new();
        let mut counts: HashMap<&'static str, usize> = HashMap::new();
        for step in 0..400 {
            match rng.random_range(0..10) {
                0..=6 => {
                    let kind = if rng.random_bool(0.2) { "fail" } else { "ok" };
                    let ms = rng.random_range(0..120);
                    let mut sub =
                        Submission::new(format!("{kind}:{ms}:{}", rng.random_range(0..3)));
                    if rng.random_bool(0.8) {
                        sub = sub.session(format!("s{}", rng.random_range(0..4)));
                    }
                    if rng.random_bool(0.7) {
                        sub = sub.client_key(format!("c{}", rng.random_range(0..3)));
                    }
                    if rng.random_bool(0.5) {
                        sub = sub.budget(Duration::from_millis(rng.random_range(0..400)));
                    }
                    if rng.random_bool(0.3) {
                        sub = sub.request_id(format!("r{}", rng.random_range(0..6)));
                    }
                    if rng.random_bool(0.2) {
                        sub = sub.policy(AdmissionPolicy::Reject);
                    }
                    if rng.random_bool(0.4) {
                        sub = sub.priority(Priority::Batch);
                    }
                    let (ad, rx) = a.call(sub).await;
                    *counts
                        .entry(match ad {
                            Admitted::Queued => "queued",
                            Admitted::Joined => "joined",
                            Admitted::Cached => "cached",
                            Admitted::Refused(_) => "refused",
                        })
                        .or_default() += 1;
                    rxs.push(rx);
                }
                7 => {
                    let _ = a.cancel(&format!("r{}", rng.random_range(0..6))).await;
                }
                _ => sleep(Duration::from_millis(rng.random_range(1..60))).await,
            }
            settle().await;
            a.check_invariants();
            if step % 97 == 0 {
                let _ = a.limits_view(3);
            }
        }
        sleep(Duration::from_secs(5)).await;
        settle().await;
        let n = rxs.len();
        let mut answered = 0;
        for mut rx in rxs {
            assert!(
                !is_pending(&mut rx),
                "seed {seed}: a submission was never answered"
            );
            answered += 1;
        }
        assert_eq!(answered, n);
        let s = a.stats();
        assert_eq!(s.offered as usize, n, "seed {seed}");
        assert_eq!(
            s.completed + s.refused_total(),
            s.offered,
            "seed {seed}: {s:?}"
        );
        assert_eq!(s.slots_acquired, s.slots_released, "seed {seed}");
        assert_eq!((s.queued_now, s.running_now), (0, 0));
        assert_eq!(s.started_after_deadline, 0);
        assert!(
            counts.get("queued").copied().unwrap_or(0) > 20,
            "seed {seed}: {counts:?}"
        );
        a.check_invariants();
        a.shutdown().await;
    }
}

// ------------------------------------------------------------- the predictor
//
// These run with the adapter's defaults (adaptive start budget, 20 ms reply margin,
// prediction on, FIFO) and only `workers` set, like the deployment the overload check models.

fn defaults(workers: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: NonZeroUsize::new(workers).expect("non-zero"),
        ..AdmissionConfig::default()
    }
}

/// Submits `n` requests at the same instant; returns (admitted receivers, refusals).
async fn burst(
    a: &Admission<ChannelSink>,
    n: usize,
    budget_ms: u64,
) -> (Vec<Rx>, Vec<Arc<Outcome>>) {
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for i in 0..n {
        let (ad, rx) = a
            .call(Submission::new(format!("ok:50:{i}")).budget(Duration::from_millis(budget_ms)))
            .await;
        match ad {
            Admitted::Queued => admitted.push(rx),
            Admitted::Refused(_) => refused.push(answer(rx).await),
            other => panic!("unexpected {other:?}"),
        }
    }
    (admitted, refused)
}

#[tokio::test(start_paused = true)]
async fn predictor_cold_start_admits_until_measured_then_refuses_at_once() {
    let sim = SimBackend::fixed(Duration::from_millis(50));
    let h = sim.handle();
    let a = start(defaults(1), sim);
    assert_eq!(a.estimate().service_time_ms, None, "no seed, no sample");

    // Cold start: no estimate, so 60 requests of 2 s are all admitted ...
    let (admitted, refused) = burst(&a, 60, 2000).await;
    assert_eq!((admitted.len(), refused.len()), (60, 0));
    // ... and once the first call measured 50 ms, those that cannot start by
    // 1980 − 50 ms are answered then, not at the deadline; nothing is aborted.
    let mut ok = 0;
    for rx in admitted {
        let out = answer(rx).await;
        match out.error_code() {
            None => ok += 1,
            Some(ErrorCode::DeadlineExceeded) => {
                assert!(out.inference_time.is_none(), "never started");
                // Answered when 49 ms (< the 50 ms estimate) were left before 1980 ms.
                assert_eq!(out.queue_time, Duration::from_millis(1931));
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Starts at 0, 50, …: the k-th finishes at 50(k+1) ≤ 1980 ms for k ≤ 38.
    assert_eq!(ok, 39);
    assert_eq!(h.stats().aborted, 0);
    assert_eq!(a.stats().started_after_deadline, 0);
    assert_eq!(a.estimate().service_time_ms, Some(50.0));

    // Measured: the same burst is refused at once beyond what fits.
    let (admitted, refused) = burst(&a, 60, 2000).await;
    assert_eq!((admitted.len(), refused.len()), (39, 21));
    let first = refused[0].result.as_ref().expect_err("refused");
    assert_eq!(first.code, ErrorCode::DeadlineExceeded);
    assert_eq!(first.details.predicted_start_ms, Some(39 * 50));
    assert_eq!(first.details.budget_ms, Some(2000));
    assert_eq!(first.details.estimate_ms, Some(50));
    // 1950 + 50 − 1980: the queue must shrink by 20 ms before this would fit.
    assert_eq!(first.details.retry_after_ms, Some(20));
    for out in &refused {
        assert_eq!(out.queue_time, Duration::ZERO, "refused at receipt");
    }
    for rx in admitted {
        assert_eq!(code(rx).await, None);
    }

    // A seed predicts from the first request on.
    let mut c = defaults(1);
    c.estimator.initial = Some(Duration::from_millis(50));
    let b = start(c, SimBackend::fixed(Duration::from_millis(50)));
    let (admitted, refused) = burst(&b, 60, 2000).await;
    assert_eq!((admitted.len(), refused.len()), (39, 21));
    for rx in admitted {
        assert_eq!(code(rx).await, None);
    }
    a.check_invariants();
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn predictor_a_stale_high_estimate_still_lets_a_probe_through() {
    let mut c = defaults(1);
    c.estimator.initial = Some(Duration::from_secs(5));
    let a = start(c, SimBackend::fixed(Duration::from_millis(50)));
    // Predicted 0 + 5 s > 2 s, but the backend is idle: admitted as a probe.
    let (ad, rx) = a
        .call(Submission::new("p").budget(Duration::from_secs(2)))
        .await;
    assert_eq!(ad, Admitted::Queued);
    // With the probe queued, the next is refused on the prediction.
    let (ad, _) = a
        .call(Submission::new("q").budget(Duration::from_secs(2)))
        .await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::DeadlineExceeded));
    assert_eq!(code(rx).await, None);
    assert_eq!(a.estimate().service_time_ms, Some(50.0), "measured now");
    let (ad, rx) = a
        .call(Submission::new("r").budget(Duration::from_secs(2)))
        .await;
    assert_eq!(ad, Admitted::Queued);
    assert_eq!(code(rx).await, None);
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn predictor_latency_change_mid_run_answers_everyone_before_the_deadline() {
    let script = Script::default();
    let a = start(defaults(1), script.clone());
    // Warm up at 50 ms.
    for i in 0..64 {
        let (_, rx) = a.call(Submission::new(format!("ok:50:w{i}"))).await;
        assert_eq!(code(rx).await, None);
    }
    assert_eq!(a.estimate().service_time_ms, Some(50.0));
    // The backend slows to 100 ms while a queue admitted on the 50 ms estimate waits.
    let mut rxs = Vec::new();
    for i in 0..60 {
        let (ad, rx) = a
            .call(Submission::new(format!("ok:100:{i}")).budget(Duration::from_secs(2)))
            .await;
        if ad == Admitted::Queued {
            rxs.push(rx);
        }
    }
    assert_eq!(rxs.len(), 39, "admitted on the 50 ms estimate");
    let (mut ok, mut late) = (0, 0);
    for rx in rxs {
        let out = answer(rx).await;
        // Every answer, ok or not, is out by deadline − reply margin.
        let at = out.queue_time + out.inference_time.unwrap_or_default();
        assert!(at <= Duration::from_millis(1980), "{at:?}");
        match out.error_code() {
            None => ok += 1,
            Some(ErrorCode::DeadlineExceeded) => late += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    // Three slow calls lift the p90 to 100 ms; from then on the queue is cut to what
    // fits: 19 calls of 100 ms start by 1880 ms.
    assert_eq!(a.estimate().service_time_ms, Some(100.0));
    assert_eq!(ok, 19);
    assert_eq!(late, 20);
    assert_eq!(a.stats().started_after_deadline, 0);
    // And new arrivals are now predicted with 100 ms.
    sleep(Duration::from_secs(1)).await;
    let mut refused = None;
    let mut admitted = 0;
    for i in 0..30 {
        let (ad, rx) = a
            .call(Submission::new(format!("ok:100:n{i}")).budget(Duration::from_secs(2)))
            .await;
        match ad {
            Admitted::Queued => admitted += 1,
            _ => {
                refused.get_or_insert(answer(rx).await);
            }
        }
    }
    assert_eq!(admitted, 19);
    let err = refused
        .expect("some refused")
        .result
        .clone()
        .expect_err("refused");
    assert_eq!(err.details.estimate_ms, Some(100));
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn predictor_sees_the_busier_of_two_key_gates_whatever_their_order() {
    let wait = OnBusy::Wait {
        max_wait: Duration::from_secs(10),
        max_waiters: 10,
    };
    for client_first in [true, false] {
        let client = limit("client", KeySource::Client, 1, wait);
        let service = limit("service", KeySource::Service, 1, wait);
        let mut c = defaults(8);
        c.estimator.initial = Some(Duration::from_millis(100));
        c.limits = if client_first {
            vec![client, service]
        } else {
            vec![service, client]
        };
        let a = start(c, SimBackend::fixed(Duration::from_millis(100)));
        // X holds client c1 and the service slot; Y (client c2) waits for the service.
        let (_, x) = a.call(Submission::new("x").client_key("c1")).await;
        let (_, y) = a.call(Submission::new("y").client_key("c2")).await;
        settle().await;
        // Z (client c1): 1 round behind X at the client gate, 2 behind X and Y at the
        // service gate. The busier gate decides: starts in 200 ms, done at 300 ms.
        let (ad, z) = a
            .call(
                Submission::new("z")
                    .client_key("c1")
                    .budget(Duration::from_millis(300)),
            )
            .await;
        assert_eq!(
            ad,
            Admitted::Refused(ErrorCode::DeadlineExceeded),
            "client_first {client_first}"
        );
        let err = answer(z).await.result.clone().expect_err("refused");
        assert_eq!(err.details.predicted_start_ms, Some(200));
        assert_eq!(
            err.details.retry_after_ms,
            Some(20),
            "300 ms − 20 ms margin"
        );
        let (ad, z2) = a
            .call(
                Submission::new("z2")
                    .client_key("c1")
                    .budget(Duration::from_millis(320)),
            )
            .await;
        assert_eq!(ad, Admitted::Queued);
        let t0 = Instant::now();
        for rx in [x, y, z2] {
            assert_eq!(code(rx).await, None);
        }
        assert_eq!(t0.elapsed(), Duration::from_millis(300), "as predicted");
        a.check_invariants();
        a.shutdown().await;
    }
}

// ------------------------------------------------- EDF within a bound (the default)
//
// The defaults (EDF, overtake share 50 %, adaptive start budget, 20 ms reply margin)
// with only `workers` set and the estimate seeded at the backend's 50 ms.

fn edf(workers: usize) -> AdmissionConfig {
    let mut c = defaults(workers);
    assert_eq!(c.queue_order, QueueOrder::Edf, "the default order");
    c.estimator.initial = Some(Duration::from_millis(50));
    c
}

fn long(name: &str) -> Submission {
    Submission::new(format!("ok:50:{name}")).budget(Duration::from_secs(5))
}

#[tokio::test(start_paused = true)]
async fn edf_a_short_request_overtakes_long_ones_that_have_room() {
    let script = Script::default();
    let a = start(edf(1), script.clone());
    let (_, l1) = a.call(long("l1")).await;
    settle().await;
    let (_, l2) = a.call(long("l2")).await;
    let (_, l3) = a.call(long("l3")).await;
    // Due in 500 ms, ahead of l2 and l3 (due in 5 s, with seconds of slack): it is
    // predicted to start when l1 is done, not behind l2 and l3.
    let (ad, s) = a
        .call(Submission::new("ok:50:short").budget(Duration::from_millis(500)))
        .await;
    assert_eq!(ad, Admitted::Queued);
    a.check_invariants();
    let t0 = Instant::now();
    for rx in [l1, s, l2, l3] {
        assert_eq!(code(rx).await, None, "nobody refused");
    }
    assert_eq!(t0.elapsed(), Duration::from_millis(200));
    assert_eq!(
        script.calls(),
        ["ok:50:l1", "ok:50:short", "ok:50:l2", "ok:50:l3"]
    );
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn edf_a_short_request_never_displaces_an_admitted_one_into_a_refusal() {
    let script = Script::default();
    let a = start(edf(1), script.clone());
    let (_, r) = a.call(long("running")).await;
    settle().await;
    // `tight` starts at 50 ms and must be done by 120 − 20 = 100 ms: it fits, with no
    // slack left.
    let (ad, tight) = a
        .call(Submission::new("ok:50:tight").budget(Duration::from_millis(120)))
        .await;
    assert_eq!(ad, Admitted::Queued);
    // `short` is due earlier (110 ms) but overtaking `tight` would make it late: it
    // goes behind it, where it cannot finish (start 100 ms, done 150 ms > 90 ms), and
    // is refused at once with the details — `tight` is not displaced.
    let (ad, short) = a
        .call(Submission::new("ok:50:short").budget(Duration::from_millis(110)))
        .await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::DeadlineExceeded));
    let out = answer(short).await;
    assert_eq!(out.queue_time, Duration::ZERO, "refused at receipt");
    let err = out.result.as_ref().expect_err("refused");
    assert_eq!(err.details.predicted_start_ms, Some(100));
    assert_eq!(err.details.budget_ms, Some(110));
    assert_eq!(err.details.estimate_ms, Some(50));
    assert_eq!(
        err.details.retry_after_ms,
        Some(60),
        "100 + 50 − (110 − 20)"
    );
    // A short one with room after `tight` is due overtakes the long queued ones only.
    let (_, l2) = a.call(long("l2")).await;
    let (ad, s2) = a
        .call(Submission::new("ok:50:s2").budget(Duration::from_millis(300)))
        .await;
    assert_eq!(ad, Admitted::Queued);
    for rx in [r, tight, s2, l2] {
        assert_eq!(code(rx).await, None);
    }
    assert_eq!(
        script.calls(),
        ["ok:50:running", "ok:50:tight", "ok:50:s2", "ok:50:l2"]
    );
    assert_eq!(a.stats().started_after_deadline, 0);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn edf_keeps_session_fifo_and_key_gates() {
    let script = Script::default();
    let mut c = edf(2);
    c.limits = vec![limit(
        "client",
        KeySource::Client,
        1,
        OnBusy::Wait {
            max_wait: Duration::from_secs(10),
            max_waiters: 10,
        },
    )];
    let a = start(c, script.clone());
    // Session s: a long request, then a short one — the short one's earlier deadline
    // does not let it pass its own session's earlier request.
    let (_, s1) = a
        .call(
            Submission::new("ok:50:s1")
                .session("s")
                .budget(Duration::from_secs(5)),
        )
        .await;
    let (_, s2) = a
        .call(
            Submission::new("ok:50:s2")
                .session("s")
                .budget(Duration::from_millis(400)),
        )
        .await;
    // Client k: the same at a key gate (limit 1, FIFO per key).
    let (_, k1) = a
        .call(
            Submission::new("ok:50:k1")
                .client_key("k")
                .budget(Duration::from_secs(5)),
        )
        .await;
    let (_, k2) = a
        .call(
            Submission::new("ok:50:k2")
                .client_key("k")
                .budget(Duration::from_millis(400)),
        )
        .await;
    a.check_invariants();
    for rx in [s1, s2, k1, k2] {
        assert_eq!(code(rx).await, None);
    }
    let calls = script.calls();
    let at = |b: &str| calls.iter().position(|c| c == b).expect("called");
    assert!(at("ok:50:s1") < at("ok:50:s2"), "session FIFO: {calls:?}");
    assert!(at("ok:50:k1") < at("ok:50:k2"), "key FIFO: {calls:?}");
    a.check_invariants();
    a.shutdown().await;
}

/// Half the requests with 500 ms budgets, half with 5 s, at twice the capacity (one
/// worker, 50 ms): both classes get a share, a long one is refused only when the
/// queue holds more than it may fill, and every refusal is at receipt.
#[tokio::test(start_paused = true)]
async fn edf_mixed_budgets_at_twice_the_capacity_share_the_backend() {
    let a = start(edf(1), SimBackend::fixed(Duration::from_millis(50)));
    let mut rxs = Vec::new();
    for i in 0..400u64 {
        let budget = if i % 2 == 0 { 500 } else { 5000 };
        let (_, rx) = a
            .call(Submission::new(format!("{i}")).budget(Duration::from_millis(budget)))
            .await;
        rxs.push((budget, rx));
        sleep(Duration::from_millis(25)).await;
    }
    let mut ok: HashMap<u64, usize> = HashMap::new();
    let mut refused_long = None;
    for (budget, rx) in rxs {
        let out = answer(rx).await;
        match out.error_code() {
            None => *ok.entry(budget).or_default() += 1,
            Some(ErrorCode::DeadlineExceeded) => {
                assert!(out.inference_time.is_none(), "never started");
                assert_eq!(out.queue_time, Duration::ZERO, "refused at receipt");
                if budget == 5000 {
                    refused_long.get_or_insert(out);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let (short, long) = (ok[&500], ok[&5000]);
    // 10 s at 20/s: ~200 answered ok plus the drained queue, about half each.
    // (Measured here: 149 short, 100 long.)
    assert!(short >= 100 && long >= 80, "short {short} long {long}");
    assert!(short + long >= 195, "short {short} long {long}");
    // A long one is refused by the share kept for earlier deadlines, not because it
    // could not start in time: its predicted start was well inside its budget.
    let err = refused_long.expect("some long refused");
    let err = err.result.as_ref().expect_err("refused");
    assert!(
        err.message.contains("kept for earlier deadlines"),
        "{}",
        err.message
    );
    assert!(err.details.predicted_start_ms.expect("predicted") < 4000);
    assert!(err.details.retry_after_ms.is_some());
    assert_eq!(a.stats().started_after_deadline, 0);
    a.check_invariants();
    a.shutdown().await;
}

/// A [`StreamOut`] that records what it is told; chunk `stall_at` never gets credit
/// (it waits until the request's stop condition ends the stream).
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<(String, Instant)>>,
    stall_at: Option<u64>,
}

impl Recorder {
    fn names(&self) -> Vec<String> {
        self.events
            .lock()
            .expect("lock")
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }
}

impl StreamOut for Recorder {
    fn queued(&self, position: usize, _: Option<Duration>) -> BoxFuture<'_, ()> {
        self.events
            .lock()
            .expect("lock")
            .push((format!("queued:{position}"), Instant::now()));
        Box::pin(async {})
    }

    fn started(&self, _: Duration) -> BoxFuture<'_, ()> {
        self.events
            .lock()
            .expect("lock")
            .push(("started".into(), Instant::now()));
        Box::pin(async {})
    }

    fn chunk(&self, seq: u64, data: bytes::Bytes) -> BoxFuture<'_, Result<(), StreamStop>> {
        self.events.lock().expect("lock").push((
            format!(
                "chunk:{seq}:{}",
                String::from_utf8_lossy(&data).matches("tok").count()
            ),
            Instant::now(),
        ));
        let stall = self.stall_at == Some(seq);
        Box::pin(async move {
            if stall {
                std::future::pending::<()>().await;
            }
            Ok(())
        })
    }
}

fn sim_stream(first_token_ms: u64, tokens_per_second: f64) -> SimBackend {
    SimBackend::new(crate::config::SimConfig {
        stream: crate::config::SimStream {
            first_token: Duration::from_millis(first_token_ms),
            tokens: 10,
            tokens_per_second,
        },
        ..Default::default()
    })
}

#[tokio::test(start_paused = true)]
async fn streamed_requests_get_queued_positions_at_most_once_a_second_then_chunks() {
    // One worker, tokens every 100 ms after 100 ms: each stream runs ~1.1 s.
    let a = start(cfg(1, 8), sim_stream(100, 10.0));
    let recs: Vec<Arc<Recorder>> = (0..3).map(|_| Arc::new(Recorder::default())).collect();
    let mut rxs = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let (ad, rx) = a
            .call(
                Submission::new(format!(r#"{{"max_tokens":10,"i":{i}}}"#))
                    .request_id(format!("r{i}"))
                    .stream(r.clone()),
            )
            .await;
        assert_eq!(ad, Admitted::Queued);
        rxs.push(rx);
        settle().await;
    }
    // The first started at once (no queued event); the others were told 1 and 2.
    assert_eq!(recs[0].names().first().map(String::as_str), Some("started"));
    assert_eq!(recs[1].names(), vec!["queued:1"]);
    assert_eq!(recs[2].names(), vec!["queued:2"]);
    match a.status("r2") {
        RequestStatus::Queued { position, .. } => assert_eq!(position, 2),
        other => panic!("{other:?}"),
    }
    assert!(matches!(a.status("r0"), RequestStatus::Running { .. }));
    assert_eq!(a.status("nope"), RequestStatus::NotFound);
    a.check_invariants();
    for rx in rxs {
        let o = answer(rx).await;
        assert!(o.result.is_ok(), "{:?}", o.result);
        let h: HashMap<_, _> = o
            .result
            .as_ref()
            .expect("ok")
            .headers
            .iter()
            .cloned()
            .collect();
        assert!(h.contains_key(weir_protocol::llm::stream::TTFT_MS));
    }
    // r2 moved from 2 to 1 when r0 finished (after ≥ 1 s): told once more, not more.
    let n2 = recs[2].names();
    assert_eq!(&n2[..3], ["queued:2", "queued:1", "started"], "{n2:?}");
    let ev = recs[2].events.lock().expect("lock").clone();
    assert!(
        ev[1].1 - ev[0].1 >= Duration::from_secs(1),
        "≤ one queued event per second"
    );
    // Chunks: 10 tokens + [DONE] over all chunks, numbered from 1; at 10 tokens/s with
    // a 20 ms interval each token is its own chunk.
    let chunks: Vec<String> = recs[0]
        .names()
        .into_iter()
        .filter(|n| n.starts_with("chunk"))
        .collect();
    assert_eq!(chunks.first().map(String::as_str), Some("chunk:1:1"));
    let toks: usize = chunks
        .iter()
        .map(|c| {
            c.rsplit(':')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(toks, 10);
    assert_eq!(a.stats().stream.started, 3);
    assert_eq!(a.status("r1"), RequestStatus::Done, "cached after ok");
}

#[tokio::test(start_paused = true)]
async fn a_stalled_stream_ends_at_its_deadline_and_frees_the_worker() {
    let a = start(cfg(1, 8), sim_stream(10, 100.0));
    let rec = Arc::new(Recorder {
        stall_at: Some(3),
        ..Default::default()
    });
    let t0 = Instant::now();
    let (_, rx) = a
        .call(
            Submission::new(r#"{"max_tokens":1000}"#)
                .budget(Duration::from_millis(500))
                .stream(rec.clone()),
        )
        .await;
    assert_eq!(code(rx).await, Some(ErrorCode::DeadlineExceeded));
    assert!(t0.elapsed() <= Duration::from_millis(501));
    // The backend call was dropped with the stream: the worker serves the next.
    let (_, rx) = a.call(Submission::new("x")).await;
    assert!(answer(rx).await.result.is_ok());
    a.check_invariants();
}

#[test]
fn request_status_names_are_unchanged() {
    let queued = RequestStatus::Queued {
        position: 1,
        predicted_start: None,
        waited: Duration::ZERO,
    };
    let running = RequestStatus::Running {
        elapsed: Duration::ZERO,
    };
    let all = [
        queued,
        running,
        RequestStatus::Done,
        RequestStatus::NotFound,
    ];
    let names: Vec<_> = all.iter().map(RequestStatus::as_str).collect();
    assert_eq!(names, ["queued", "running", "done", "not_found"]);
}

/// A worker busy with a long call must not hold a wake-up meant for an idle one: with
/// two workers, one busy for 2 s (streamed or unary) and the other idle again after a
/// short call, the next request starts at once.
#[tokio::test(start_paused = true)]
async fn a_long_call_never_holds_back_a_queued_request_while_a_worker_is_idle() {
    for streamed in [false, true] {
        // The sim streams 10 tokens at 5/s: ~2 s; the script sleeps 2 s.
        let a = if streamed {
            start(cfg(2, 8), sim_stream(0, 5.0))
        } else {
            start(cfg(2, 8), Script::default())
        };
        // Both workers idle and waiting, as in a service that has run for a while.
        settle().await;
        let long = if streamed {
            Submission::new(r#"{"max_tokens":10}"#).stream(Arc::new(Recorder::default()))
        } else {
            Submission::new("ok:2000")
        };
        let (_, long_rx) = a.call(long).await;
        settle().await;
        assert_eq!(a.stats().running_now, 1);
        // The other worker serves a short call and goes idle again.
        let (_, rx) = a.call(Submission::new("ok:10")).await;
        assert!(answer(rx).await.result.is_ok());
        settle().await;
        // The next request finds that worker idle: it starts without waiting.
        let (_, rx) = a.call(Submission::new("ok:0")).await;
        let o = answer(rx).await;
        assert!(o.result.is_ok(), "{:?}", o.result);
        assert!(
            o.queue_time < Duration::from_millis(5),
            "streamed={streamed}: queued {:?} behind a busy worker",
            o.queue_time
        );
        assert!(answer(long_rx).await.result.is_ok());
        a.check_invariants();
        a.shutdown().await;
    }
}

mod barge_in;
