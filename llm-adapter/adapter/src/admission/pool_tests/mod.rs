//! Paused-clock tests of the backend pool: routing by predicted completion, refusal
//! only when no backend can make it, affinity and spills, stall ejection, back-off,
//! probe re-admission, failover in deadline order, one answer per request.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering as AtOrd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, sleep, timeout};
use weir_protocol::llm::ErrorCode;

use super::*;
use crate::backend::sim::{SimBackend, SimHandle};
use crate::backend::{BackendError, BackendErrorKind, BackendReply, BackendRequest, Call};

type Rx = oneshot::Receiver<Arc<Outcome>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A pool config: one member per `(name, slots)`, health as given.
fn pool_cfg(members: &[(&str, usize)], health: HealthConfig) -> AdmissionConfig {
    let pool: Vec<PoolSlots> = members
        .iter()
        .map(|(name, slots)| PoolSlots {
            name: (*name).into(),
            slots: NonZeroUsize::new(*slots).expect("non-zero"),
            timeout: Duration::from_secs(60),
            weight: 1,
        })
        .collect();
    let workers = members.iter().map(|(_, n)| n).sum();
    AdmissionConfig {
        workers: NonZeroUsize::new(workers).expect("non-zero"),
        queue_capacity: NonZeroUsize::new(256).expect("non-zero"),
        pool,
        health,
        ..AdmissionConfig::default()
    }
}

fn start(cfg: AdmissionConfig, backends: Vec<Arc<dyn Backend>>) -> Admission<ChannelSink> {
    Admission::start_pool(cfg, backends, Arc::new(ChannelSink), Tracer::disabled())
}

fn sims(latencies: &[u64]) -> (Vec<Arc<dyn Backend>>, Vec<SimHandle>) {
    let sims: Vec<SimBackend> = latencies
        .iter()
        .map(|l| SimBackend::fixed(ms(*l)))
        .collect();
    let handles = sims.iter().map(SimBackend::handle).collect();
    let backends = sims
        .into_iter()
        .map(|s| Arc::new(s) as Arc<dyn Backend>)
        .collect();
    (backends, handles)
}

async fn answer(rx: Rx) -> Arc<Outcome> {
    timeout(Duration::from_secs(3600), rx)
        .await
        .expect("answered in time")
        .expect("answered, not dropped")
}

fn started(h: &SimHandle) -> u64 {
    h.stats().started
}

/// Gives every member one sample: as many concurrent requests as members (the cold
/// pool spreads them by occupancy), awaited.
async fn warm(a: &Admission<ChannelSink>, n: usize) {
    let mut rxs = Vec::new();
    for i in 0..n {
        rxs.push(a.call(Submission::new(format!("warm {i}"))).await.1);
    }
    for rx in rxs {
        assert_eq!(answer(rx).await.code(), "ok");
    }
    for b in a.backends() {
        assert_eq!(b.estimate.samples, 1, "{} warmed once", b.name);
    }
}

#[tokio::test(start_paused = true)]
async fn a_request_goes_where_it_finishes_soonest_and_is_refused_only_when_none_can() {
    let (backends, h) = sims(&[50, 400]);
    let a = start(
        pool_cfg(&[("fast", 1), ("slow", 1)], HealthConfig::default()),
        backends,
    );
    warm(&a, 2).await;
    let before = (started(&h[0]), started(&h[1]));
    // 300 ms budgets (280 ms usable): the slow backend (400 ms) can never make it;
    // the fast one takes the five its queue lets finish in time. Then, as a single
    // backend does, the idle slow one takes one probe (its estimate must be able to
    // come down), and the rest is refused at once.
    let mut rxs = Vec::new();
    for i in 0..8 {
        let sub = Submission::new(format!("r{i}")).budget(ms(300));
        let (ad, rx) = a.call(sub).await;
        rxs.push((ad, rx));
    }
    let admitted = rxs.iter().filter(|(ad, _)| *ad == Admitted::Queued).count();
    assert_eq!(admitted, 6, "five in time on the fast backend, one probe");
    let mut codes = Vec::new();
    for (ad, rx) in rxs {
        let out = answer(rx).await;
        if ad != Admitted::Queued {
            assert_eq!(out.error_code(), Some(ErrorCode::DeadlineExceeded));
            assert_eq!(out.queue_time, Duration::ZERO, "refused at once");
        }
        codes.push(out.code());
    }
    assert_eq!(codes.iter().filter(|c| **c == "ok").count(), 5, "{codes:?}");
    assert_eq!(started(&h[0]) - before.0, 5);
    assert_eq!(started(&h[1]) - before.1, 1, "the probe");

    // With a long budget the slow backend takes what would finish later on the fast
    // one: about one request in nine.
    let mut rxs = Vec::new();
    for i in 0..20 {
        let sub = Submission::new(format!("long{i}")).budget(Duration::from_secs(5));
        let (ad, rx) = a.call(sub).await;
        assert_eq!(ad, Admitted::Queued);
        rxs.push(rx);
    }
    for rx in rxs {
        assert_eq!(answer(rx).await.code(), "ok");
    }
    let slow = started(&h[1]) - before.1;
    assert!(
        (1..=4).contains(&slow),
        "the slow backend took {slow} of 20"
    );
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_session_stays_on_its_backend_and_spills_only_when_late_there() {
    let (backends, h) = sims(&[100, 100]);
    let a = start(
        pool_cfg(&[("a", 1), ("b", 1)], HealthConfig::default()),
        backends,
    );
    warm(&a, 2).await;
    let turn = |i: u64, budget: u64| {
        Submission::new(format!("turn {i}"))
            .session("s")
            .budget(ms(budget))
    };
    let (_, rx) = a.call(turn(1, 1000)).await;
    assert_eq!(answer(rx).await.code(), "ok");
    let home = if started(&h[0]) == 2 { 0 } else { 1 };
    assert_eq!(started(&h[home]), 2, "turn 1 on one backend");
    // The home backend busy with another request: the soonest finish is the other
    // one, but turn 2 is still in time at home and stays there.
    let (_, busy) = a.call(Submission::new("busy").budget(ms(1000))).await;
    sleep(ms(1)).await;
    let (_, rx) = a.call(turn(2, 1000)).await;
    assert_eq!(answer(rx).await.code(), "ok");
    assert_eq!(answer(busy).await.code(), "ok");
    let homes = started(&h[home]);
    assert!(homes >= 3, "turn 2 at home");
    assert_eq!(a.backends()[home].spills, 0);
    // Home (member 0: both idle, the first wins the tie) busy past turn 3's deadline
    // (150 ms, 130 usable; 100 ms left of the call there): it spills to the other
    // backend, counted.
    assert_eq!(home, 0);
    let (_, load) = a
        .call(Submission::new("load").budget(Duration::from_secs(5)))
        .await;
    sleep(ms(1)).await;
    assert_eq!(a.backends()[home].busy, 1, "home busy");
    let (ad, rx) = a.call(turn(3, 150)).await;
    assert_eq!(ad, Admitted::Queued);
    assert_eq!(answer(rx).await.code(), "ok");
    assert_eq!(answer(load).await.code(), "ok");
    assert_eq!(started(&h[1]), 2, "turn 3 on the other backend");
    assert_eq!(a.backends()[home].spills, 1, "{:?}", a.backends());
    a.check_invariants();
    a.shutdown().await;
}

/// Health settings of the stall tests: stall at 3 estimates, at least 100 ms.
fn health() -> HealthConfig {
    HealthConfig {
        eject_after_errors: 3,
        stall_factor: 3,
        stall_floor: ms(100),
        backoff_base: ms(1000),
        backoff_max: ms(4000),
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_backend_is_ejected_at_once_and_its_requests_fail_over() {
    let (backends, h) = sims(&[100, 100, 100]);
    let a = start(
        pool_cfg(&[("a", 2), ("b", 2), ("c", 2)], health()),
        backends,
    );
    warm(&a, 3).await;
    let t0 = Instant::now();
    h[1].pause();
    // 1.5 s of requests, one every 25 ms (40/s; the pool does 60/s, two backends 40/s),
    // 2 s budgets.
    let mut rxs = Vec::new();
    let mut ejected_at = None;
    for i in 0..60 {
        let sub = Submission::new(format!("r{i}")).budget(Duration::from_secs(2));
        rxs.push(a.call(sub).await);
        sleep(ms(25)).await;
        if ejected_at.is_none() && a.backends()[1].ejections > 0 {
            ejected_at = Some(Instant::now() - t0);
        }
    }
    let ejected_at = ejected_at.expect("the paused backend was ejected");
    // The first call on it started at about 0 and is detectable at 3 × 100 ms.
    assert!(
        ejected_at <= ms(300) + Duration::from_secs(1),
        "ejected {ejected_at:?} after the pause"
    );
    let mut codes = std::collections::BTreeMap::new();
    for (ad, rx) in rxs {
        assert_eq!(ad, Admitted::Queued);
        *codes.entry(answer(rx).await.code()).or_insert(0) += 1;
    }
    assert_eq!(
        codes.get("ok"),
        Some(&60),
        "every request answered ok: {codes:?}"
    );
    let b = &a.backends()[1];
    assert!(b.failovers >= 1, "{b:?}");
    let s = a.stats();
    assert_eq!(s.offered, s.completed + s.refused.values().sum::<u64>());
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_ejected_backend_backs_off_and_is_readmitted_by_a_probe() {
    let (backends, h) = sims(&[100, 100]);
    let a = start(pool_cfg(&[("a", 1), ("b", 1)], health()), backends);
    warm(&a, 2).await;
    h[1].pause();
    let send = |i: usize| Submission::new(format!("r{i}")).budget(Duration::from_secs(3));
    // Keep one request at a time going until b is ejected (its stall is seen at
    // 300 ms).
    let mut i = 0;
    let mut rxs = Vec::new();
    while a.backends()[1].ejections == 0 {
        rxs.push(a.call(send(i)).await.1);
        i += 1;
        sleep(ms(50)).await;
        assert!(i < 40, "never ejected");
    }
    let first = Instant::now();
    assert_eq!(a.backends()[1].health, "ejected");
    // Still paused when the back-off (1 s) ends: the probe stalls, the back-off doubles.
    while a.backends()[1].ejections < 2 {
        rxs.push(a.call(send(i)).await.1);
        i += 1;
        sleep(ms(50)).await;
        assert!(i < 200, "never ejected twice");
    }
    let second = Instant::now() - first;
    assert!(
        second >= ms(1000) && second <= ms(1000 + 300 + 200),
        "second ejection after {second:?}"
    );
    let left = a.backends()[1].ejected_for_ms.expect("ejected");
    assert!(
        (1800..=2000).contains(&left),
        "back-off doubled: {left} ms left"
    );
    // Resumed: when the back-off ends the next request is b's probe; it succeeds and
    // b is healthy again and takes its share.
    h[1].resume();
    sleep(ms(2100)).await;
    assert_eq!(a.backends()[1].health, "probe_due");
    let before = started(&h[1]);
    let (_, rx) = a.call(send(i)).await;
    i += 1;
    assert_eq!(answer(rx).await.code(), "ok");
    assert_eq!(started(&h[1]), before + 1, "the probe ran on b");
    assert_eq!(a.backends()[1].health, "healthy");
    for _ in 0..4 {
        rxs.push(a.call(send(i)).await.1);
        i += 1;
    }
    for rx in rxs {
        assert_eq!(answer(rx).await.code(), "ok");
    }
    assert!(
        started(&h[1]) >= before + 2,
        "b serves again after its probe"
    );
    a.check_invariants();
    a.shutdown().await;
}

/// A backend that fails every call while `failing`, else answers after `ms` (± up to
/// `jitter` ms, drawn from the body); it records the bodies it was called with.
#[derive(Clone)]
struct Flaky {
    failing: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<String>>>,
    ms: u64,
    jitter: u64,
}

impl Flaky {
    fn new(ms: u64) -> Self {
        Self {
            failing: Arc::new(AtomicBool::new(false)),
            calls: Arc::default(),
            ms,
            jitter: 0,
        }
    }
}

impl Backend for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }

    fn call(&self, request: BackendRequest) -> Call {
        let body = String::from_utf8_lossy(&request.body).into_owned();
        let spread = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            body.hash(&mut h);
            h.finish() % (2 * self.jitter + 1)
        };
        self.calls.lock().expect("lock").push(body);
        let wait = ms(self.ms - self.jitter + spread);
        let failing = self.failing.clone();
        Box::pin(async move {
            sleep(wait).await;
            if failing.load(AtOrd::Relaxed) {
                return Err(BackendError::new(BackendErrorKind::Failed, "flaky"));
            }
            Ok(BackendReply::body(request.body))
        })
    }
}

#[tokio::test(start_paused = true)]
async fn queued_requests_of_an_ejected_backend_move_keeping_their_deadline_order() {
    let (x, y) = (Flaky::new(100), Flaky::new(100));
    let h = HealthConfig {
        eject_after_errors: 1,
        ..health()
    };
    let a = start(
        pool_cfg(&[("x", 1), ("y", 1)], h),
        vec![Arc::new(x.clone()), Arc::new(y.clone())],
    );
    x.failing.store(true, AtOrd::Relaxed);
    // Cold pool: requests alternate by occupancy; budgets out of order.
    let budgets = [9, 8, 7, 6, 5, 4, 3, 2];
    let mut rxs = Vec::new();
    for (i, b) in budgets.iter().enumerate() {
        let sub = Submission::new(format!("{b}")).budget(Duration::from_secs(*b));
        let (ad, rx) = a.call(sub).await;
        assert_eq!(ad, Admitted::Queued, "request {i}");
        rxs.push(rx);
    }
    let mut codes = Vec::new();
    for rx in rxs {
        codes.push(answer(rx).await.code());
    }
    // x failed its first call (ejected at once): that one is answered backend_error,
    // every other request is served by y.
    assert_eq!(x.calls.lock().expect("lock").len(), 1);
    assert_eq!(
        codes.iter().filter(|c| **c == "backend_error").count(),
        1,
        "{codes:?}"
    );
    assert_eq!(codes.iter().filter(|c| **c == "ok").count(), 7, "{codes:?}");
    let on_y: Vec<u64> = (y.calls.lock().expect("lock").iter())
        .map(|b| b.parse().expect("budget"))
        .collect();
    // y's first call started at once; after it, y serves the rest (its own and those
    // moved from x) by deadline.
    let rest = &on_y[1..];
    assert!(
        rest.windows(2).all(|w| w[0] < w[1]),
        "deadline order on y: {on_y:?}"
    );
    assert_eq!(a.backends()[0].ejections, 1);
    assert!(a.backends()[0].failovers >= 3, "{:?}", a.backends()[0]);
    let s = a.stats();
    assert_eq!(s.offered, 8);
    assert_eq!(
        s.completed + s.refused.values().sum::<u64>(),
        8,
        "one answer each"
    );
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_single_backend_keeps_its_workers_and_has_no_health() {
    let (backends, _h) = sims(&[10]);
    let cfg = AdmissionConfig {
        workers: NonZeroUsize::new(3).expect("non-zero"),
        ..AdmissionConfig::default()
    };
    let a = start(cfg, backends);
    let v = a.backends();
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].name.as_str(), v[0].slots), ("default", 3));
    let (_, rx) = a.call(Submission::new("x")).await;
    assert_eq!(answer(rx).await.code(), "ok");
    a.shutdown().await;
}

/// A [`StreamOut`] that counts `started` events and chunks.
#[derive(Default)]
struct Chunks {
    started: Mutex<u32>,
    chunks: Mutex<u32>,
}

impl StreamOut for Chunks {
    fn queued(&self, _: usize, _: Option<Duration>) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn started(&self, _: Duration) -> futures::future::BoxFuture<'_, ()> {
        *self.started.lock().expect("lock") += 1;
        Box::pin(async {})
    }

    fn chunk(
        &self,
        _: u64,
        _: bytes::Bytes,
    ) -> futures::future::BoxFuture<'_, Result<(), StreamStop>> {
        *self.chunks.lock().expect("lock") += 1;
        Box::pin(async { Ok(()) })
    }
}

/// Two streaming sims (first token after 50 ms, then 10 tokens at 100/s), warmed.
async fn stream_pool() -> (Admission<ChannelSink>, Vec<SimHandle>) {
    let sims: Vec<SimBackend> = (0..2)
        .map(|_| {
            SimBackend::new(crate::config::SimConfig {
                stream: crate::config::SimStream {
                    first_token: ms(50),
                    tokens: 10,
                    tokens_per_second: 100.0,
                },
                ..crate::config::SimConfig::default()
            })
        })
        .collect();
    let handles: Vec<SimHandle> = sims.iter().map(SimBackend::handle).collect();
    let backends = sims
        .into_iter()
        .map(|s| Arc::new(s) as Arc<dyn Backend>)
        .collect();
    let a = start(pool_cfg(&[("a", 1), ("b", 1)], health()), backends);
    let mut rxs = Vec::new();
    for _ in 0..2 {
        let out = Arc::new(Chunks::default());
        rxs.push(a.call(Submission::new("warm").stream(out)).await.1);
    }
    for rx in rxs {
        assert_eq!(answer(rx).await.code(), "ok");
    }
    (a, handles)
}

#[tokio::test(start_paused = true)]
async fn a_stream_stalled_before_its_first_chunk_is_retried_on_another_backend() {
    let (a, h) = stream_pool().await;
    h[0].pause();
    let out = Arc::new(Chunks::default());
    let sub = Submission::new("s")
        .budget(Duration::from_secs(3))
        .stream(out.clone());
    let (ad, rx) = a.call(sub).await;
    assert_eq!(ad, Admitted::Queued);
    let o = answer(rx).await;
    assert_eq!(o.code(), "ok", "{o:?}");
    assert_eq!(started(&h[0]), 2, "tried on a (stalled) ...");
    assert_eq!(started(&h[1]), 2, "... then on b");
    assert!(*out.chunks.lock().expect("lock") >= 1);
    assert_eq!(a.backends()[0].ejections, 1);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_stream_stalled_after_its_first_chunk_ends_with_a_clear_error() {
    let (a, h) = stream_pool().await;
    let out = Arc::new(Chunks::default());
    let sub = Submission::new("s")
        .budget(Duration::from_secs(3))
        .stream(out.clone());
    let (_, rx) = a.call(sub).await;
    // A chunk is out by 100 ms; then the backend stalls.
    timeout(Duration::from_secs(1), async {
        while *out.chunks.lock().expect("lock") == 0 {
            sleep(ms(5)).await;
        }
    })
    .await
    .expect("a chunk");
    let on = usize::from(started(&h[1]) == 2);
    h[on].pause();
    let o = answer(rx).await;
    let Err(e) = &o.result else {
        panic!("an error expected: {o:?}");
    };
    assert_eq!(e.code, ErrorCode::BackendError);
    assert!(
        e.message.contains("stalled after the stream began"),
        "{e:?}"
    );
    assert_eq!(a.backends()[on].ejections, 1);
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn with_every_backend_ejected_a_request_is_refused_at_once_until_a_probe() {
    let (x, y) = (Flaky::new(50), Flaky::new(50));
    let h = HealthConfig {
        eject_after_errors: 1,
        ..health()
    };
    let a = start(
        pool_cfg(&[("x", 1), ("y", 1)], h),
        vec![Arc::new(x.clone()), Arc::new(y.clone())],
    );
    x.failing.store(true, AtOrd::Relaxed);
    y.failing.store(true, AtOrd::Relaxed);
    let mut rxs = Vec::new();
    for i in 0..2 {
        rxs.push(a.call(Submission::new(format!("{i}"))).await.1);
    }
    for rx in rxs {
        assert_eq!(answer(rx).await.code(), "backend_error");
    }
    assert!(a.backends().iter().all(|b| b.health == "ejected"));
    let (ad, rx) = a.call(Submission::new("refused")).await;
    assert_eq!(ad, Admitted::Refused(ErrorCode::BackendError));
    let o = answer(rx).await;
    let Err(e) = &o.result else {
        panic!("refused: {o:?}")
    };
    let retry = e.details.retry_after_ms.expect("retry_after_ms");
    assert!((900..=1000).contains(&retry), "retry after {retry} ms");
    // Healthy again: after the back-off the next request is a probe and succeeds.
    x.failing.store(false, AtOrd::Relaxed);
    y.failing.store(false, AtOrd::Relaxed);
    sleep(ms(retry + 5)).await;
    let (_, rx) = a.call(Submission::new("probe")).await;
    assert_eq!(answer(rx).await.code(), "ok");
    assert!(a.backends().iter().any(|b| b.health == "healthy"));
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn requests_stranded_when_every_backend_was_ejected_are_served_after_the_probes() {
    let (x, y) = (Flaky::new(50), Flaky::new(50));
    let h = HealthConfig {
        eject_after_errors: 1,
        ..health()
    };
    let a = start(
        pool_cfg(&[("x", 1), ("y", 1)], h),
        vec![Arc::new(x.clone()), Arc::new(y.clone())],
    );
    x.failing.store(true, AtOrd::Relaxed);
    y.failing.store(true, AtOrd::Relaxed);
    let mut rxs = Vec::new();
    for i in 0..5 {
        rxs.push(a.call(Submission::new(format!("{i}"))).await.1);
    }
    // Both first calls fail: both ejected, the three others stranded on them.
    sleep(ms(60)).await;
    assert!(a.backends().iter().all(|b| b.health == "ejected"));
    let stranded: usize = a.backends().iter().map(|b| b.queued).sum();
    assert_eq!(stranded, 3);
    x.failing.store(false, AtOrd::Relaxed);
    y.failing.store(false, AtOrd::Relaxed);
    let mut codes = Vec::new();
    for rx in rxs {
        codes.push(answer(rx).await.code());
    }
    assert_eq!(codes.iter().filter(|c| **c == "ok").count(), 3, "{codes:?}");
    // The first probe to succeed takes the other's stranded requests: that one may
    // still wait for a request to probe with.
    let v = a.backends();
    assert!(v.iter().any(|b| b.health == "healthy"), "{v:?}");
    assert!(v.iter().all(|b| b.health != "ejected"), "{v:?}");
    a.check_invariants();
    a.shutdown().await;
}

mod scenarios;
mod served;

/// A [`StreamOut`] whose caller reads slowly: each chunk returns after `delay`; the
/// sequence numbers seen are kept.
struct SlowReader {
    delay: Duration,
    seqs: Mutex<Vec<u64>>,
}

impl StreamOut for SlowReader {
    fn queued(&self, _: usize, _: Option<Duration>) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn started(&self, _: Duration) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn chunk(
        &self,
        seq: u64,
        _: bytes::Bytes,
    ) -> futures::future::BoxFuture<'_, Result<(), StreamStop>> {
        self.seqs.lock().expect("lock").push(seq);
        let delay = self.delay;
        Box::pin(async move {
            sleep(delay).await;
            Ok(())
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_slow_reading_caller_is_not_a_stalled_backend() {
    let (a, _h) = stream_pool().await;
    let out = Arc::new(SlowReader {
        delay: Duration::from_secs(2),
        seqs: Mutex::new(Vec::new()),
    });
    let sub = Submission::new("s")
        .budget(Duration::from_secs(60))
        .stream(out.clone());
    let (ad, rx) = a.call(sub).await;
    assert_eq!(ad, Admitted::Queued);
    let o = answer(rx).await;
    assert_eq!(o.code(), "ok", "{o:?}");
    let seqs = out.seqs.lock().expect("lock").clone();
    assert!(seqs.len() >= 2, "{seqs:?}");
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1) && seqs[0] == 1,
        "each chunk once, in order: {seqs:?}"
    );
    for b in a.backends() {
        assert_eq!(
            (b.ejections, b.failovers),
            (0, 0),
            "{}: the caller's slowness is not the backend's",
            b.name
        );
    }
    a.check_invariants();
    a.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_call_stalled_during_the_shutdown_grace_is_answered_shutting_down() {
    let (backends, h) = sims(&[100, 100]);
    let mut cfg = pool_cfg(&[("a", 1), ("b", 1)], health());
    cfg.shutdown_grace = Duration::from_secs(5);
    let a = Arc::new(start(cfg, backends));
    warm(&a, 2).await;
    h[0].pause();
    h[1].pause();
    // One call on each backend, both stalled; shutdown starts at once, so neither may
    // be moved to the other backend (whose worker is leaving).
    let (_, r1) = a
        .call(Submission::new("x").budget(Duration::from_secs(30)))
        .await;
    let (_, r2) = a
        .call(Submission::new("y").budget(Duration::from_secs(30)))
        .await;
    sleep(ms(10)).await;
    let down = tokio::spawn({
        let a = a.clone();
        async move { a.shutdown().await }
    });
    for rx in [r1, r2] {
        let o = answer(rx).await;
        assert!(
            matches!(o.error_code(), Some(ErrorCode::ShuttingDown)),
            "answered shutting_down: {o:?}"
        );
    }
    down.await.expect("shutdown");
}
