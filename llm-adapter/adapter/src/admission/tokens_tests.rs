//! The per-key token budgets through the whole admission core (no NATS): concurrent
//! callers on one key, reconciliation with the sim backend's `usage` (unary and
//! streamed), refunds of requests that never ran.

use std::num::{NonZeroU64, NonZeroUsize};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::timeout;
use weir_protocol::llm::ErrorCode;

use super::*;
use crate::backend::sim::SimBackend;
use crate::config::{KeyLimit, KeySource, OnBusy, SimConfig, SimStream, TokenBudget};

const TPM: u64 = 10_000;
const MAX_TOKENS: u64 = 500;

fn budget_cfg(workers: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: NonZeroUsize::new(workers).expect("non-zero"),
        queue_capacity: NonZeroUsize::new(256).expect("non-zero"),
        limits: vec![KeyLimit {
            name: "client".into(),
            key: KeySource::Client,
            limit: NonZeroUsize::new(1000).expect("non-zero"),
            on_busy: OnBusy::Reject,
            tokens: Some(TokenBudget {
                tokens_per_minute: NonZeroU64::new(TPM).expect("non-zero"),
                default_max_tokens: 100,
                max_keys: NonZeroUsize::new(64).expect("non-zero"),
            }),
            priority: None,
        }],
        ..AdmissionConfig::default()
    }
}

fn start_with(c: AdmissionConfig, backend: SimBackend) -> Admission<ChannelSink> {
    Admission::start_pool(
        c,
        vec![Arc::new(backend)],
        Arc::new(ChannelSink),
        crate::trace::Tracer::disabled(),
    )
}

fn chat(max_tokens: u64) -> String {
    format!(
        r#"{{"model":"m","max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hi"}}]}}"#
    )
}

async fn answer(rx: oneshot::Receiver<Arc<Outcome>>) -> Arc<Outcome> {
    timeout(Duration::from_secs(3600), rx)
        .await
        .expect("answered in time")
        .expect("answered")
}

/// 100 callers on one key at once, on a multi-threaded runtime (real contention for
/// the state lock): the tokens admitted stay within the budget (plus the refill of
/// the run's few milliseconds), so the overshoot is at most one request's
/// `max_tokens`, and every refusal says when to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_concurrent_callers_cannot_overshoot_one_keys_budget() {
    let a = Arc::new(start_with(
        budget_cfg(8),
        SimBackend::fixed(Duration::from_millis(5)),
    ));
    let body = chat(MAX_TOKENS);
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let t0 = std::time::Instant::now();
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let (a, body, barrier) = (a.clone(), body.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let (_, rx) = a.call(Submission::new(body).client_key("tenant")).await;
                answer(rx).await
            })
        })
        .collect();
    let mut ok = 0u64;
    let mut refused = 0u64;
    for c in calls {
        let out = c.await.expect("task");
        match &out.result {
            Ok(reply) => {
                let v: serde_json::Value = serde_json::from_slice(&reply.body).expect("JSON");
                assert!(v["usage"]["total_tokens"].as_u64().is_some());
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e.code, ErrorCode::TokenBudgetExceeded, "{e:?}");
                let retry = e.details.retry_after_ms.expect("retry_after_ms");
                assert!((1..=60_000).contains(&retry), "{retry}");
                assert_eq!(e.details.key.as_deref(), Some("client:tenant"));
                refused += 1;
            }
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let t = a.stats().tokens["client"].clone();
    // Cost per request: 500 + "user" "hi" (6 bytes → 2 tokens).
    let cost = MAX_TOKENS + 2;
    let refill = (elapsed * TPM as f64 / 60.0).ceil() as u64;
    assert_eq!(ok + refused, 100);
    assert_eq!(t.reserved, ok * cost);
    assert!(t.reserved <= TPM + refill, "{t:?} refill {refill}");
    assert!(ok >= TPM / cost, "{ok} admitted of {}", TPM / cost);
    // Reconciled with the sim's usage: what was used overshoots by at most one
    // request's max_tokens.
    assert_eq!(t.usage_reported, ok);
    assert_eq!(t.outstanding, 0);
    assert!(t.used <= TPM + refill + MAX_TOKENS, "{t:?}");
    assert_eq!(t.refused, refused);
    assert_eq!(
        a.stats().refused_of(ErrorCode::TokenBudgetExceeded),
        refused
    );
    a.check_invariants();
}

/// The same burst on a paused clock is exact: 19 requests of 502 tokens fit in
/// 10,000; each refusal's `retry_after_ms` is when one more fits.
#[tokio::test(start_paused = true)]
async fn a_burst_on_a_paused_clock_admits_exactly_what_fits_and_retry_after_is_exact() {
    let a = start_with(budget_cfg(8), SimBackend::fixed(Duration::from_millis(50)));
    let mut rxs = Vec::new();
    for _ in 0..100 {
        let sub = Submission::new(chat(MAX_TOKENS)).client_key("tenant");
        rxs.push(a.call(sub).await.1);
    }
    let mut retries = Vec::new();
    let mut ok = 0;
    for rx in rxs {
        match &answer(rx).await.result {
            Ok(_) => ok += 1,
            Err(e) => retries.push(e.details.retry_after_ms.expect("retry_after_ms")),
        }
    }
    assert_eq!(ok, 19);
    // Sim usage: prompt = 74 body bytes / 4 = 19, completion = 500 → 17 more each.
    let t = a.stats().tokens["client"].clone();
    assert_eq!(
        (t.reserved, t.used, t.overcharged),
        (19 * 502, 19 * 519, 19 * 17)
    );
    // At the burst, 10,000 − 19 × 502 = 462 were left: 40 more in 240 ms.
    assert!(
        retries.iter().all(|&r| (240..=241).contains(&r)),
        "{retries:?}"
    );
    // The last settled at 150 ms (8 workers, 50 ms each), with 19 × 17 charged on
    // top: 462 + 25 − 323 = 164 left.
    let view = a.limits_view(10);
    assert_eq!(view.tokens.len(), 1);
    assert_eq!(view.tokens[0].key, "client:tenant");
    assert_eq!(view.tokens[0].outstanding, 0);
    let left = view.tokens[0].available;
    assert!((160.0..=170.0).contains(&left), "{left}");
    // 502 fit once the bucket holds them again: refused 1 ms before
    // `retry_after_ms`, admitted at it.
    let (_, rx) = a
        .call(Submission::new(chat(MAX_TOKENS)).client_key("tenant"))
        .await;
    let e = answer(rx).await.result.clone().expect_err("still short");
    let retry = e.details.retry_after_ms.expect("retry");
    let available = e.details.tokens_available.expect("available") as f64;
    let wait_ms = (502.0 - available) / (TPM as f64 / 60.0) * 1000.0;
    assert!(
        (retry as f64 - wait_ms).abs() <= 7.0,
        "{retry} vs {wait_ms}"
    );
    tokio::time::sleep(Duration::from_millis(retry - 1)).await;
    let (_, rx) = a
        .call(Submission::new(chat(MAX_TOKENS)).client_key("tenant"))
        .await;
    let e = answer(rx).await.result.clone().expect_err("1 ms early");
    assert_eq!(e.details.retry_after_ms, Some(1));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let (_, rx) = a
        .call(Submission::new(chat(MAX_TOKENS)).client_key("tenant"))
        .await;
    assert!(answer(rx).await.result.is_ok());
    a.check_invariants();
}

/// Requests that never ran give their tokens back; one without a body key is not
/// budgeted; an unreadable body costs the default plus its length.
#[tokio::test(start_paused = true)]
async fn cancelled_and_refused_requests_refund_what_they_did_not_use() {
    let a = start_with(budget_cfg(1), SimBackend::fixed(Duration::from_secs(1)));
    let (_, running) = a.call(Submission::new(chat(1_000)).client_key("k")).await;
    let (_, queued) = a
        .call(Submission::new(chat(1_000)).client_key("k").request_id("q"))
        .await;
    let t = a.stats().tokens["client"].clone();
    assert_eq!((t.reserved, t.outstanding), (2 * 1_002, 2 * 1_002));
    a.check_invariants();
    assert_eq!(a.cancel("q").await, CancelResult::Queued);
    assert_eq!(
        answer(queued).await.error_code(),
        Some(ErrorCode::Cancelled)
    );
    let t = a.stats().tokens["client"].clone();
    assert_eq!((t.refunded, t.outstanding), (1_002, 1_002));
    // Not JSON: the default (100) + 3 bytes → 1 token.
    let (_, garbage) = a.call(Submission::new("{x]").client_key("k")).await;
    assert!(answer(running).await.result.is_ok());
    assert!(answer(garbage).await.result.is_ok());
    let t = a.stats().tokens["client"].clone();
    assert_eq!(t.reserved, 2 * 1_002 + 101);
    // The echo of garbage has no usage: its reservation stands.
    assert_eq!((t.usage_reported, t.usage_missing), (1, 1));
    // No client key: not under the budget.
    let (_, free) = a.call(Submission::new(chat(1_000_000))).await;
    assert!(answer(free).await.result.is_ok());
    assert_eq!(a.stats().tokens["client"].reserved, 2 * 1_002 + 101);
    a.check_invariants();
}

/// A stream sink that keeps the chunks.
#[derive(Default)]
struct Chunks(std::sync::Mutex<Vec<bytes::Bytes>>);

impl StreamOut for Chunks {
    fn queued(&self, _: usize, _: Option<Duration>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn started(&self, _: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn chunk(&self, _: u64, data: bytes::Bytes) -> BoxFuture<'_, Result<(), StreamStop>> {
        self.0.lock().expect("lock").push(data);
        Box::pin(async { Ok(()) })
    }
}

/// A streamed request is reconciled from its last `usage` event; the caller's answer
/// still has an empty body (the tail read for it is not passed on).
#[tokio::test(start_paused = true)]
async fn a_stream_is_reconciled_from_its_last_usage_event() {
    let sim = SimBackend::new(SimConfig {
        stream: SimStream {
            first_token: Duration::from_millis(10),
            tokens: 4,
            tokens_per_second: 100.0,
        },
        ..SimConfig::default()
    });
    let a = start_with(budget_cfg(2), sim);
    let body = r#"{"max_tokens":40,"stream":true,"stream_options":{"include_usage":true},"prompt":"abcd"}"#;
    let out = Arc::new(Chunks::default());
    let (_, rx) = a
        .call(Submission::new(body).client_key("s").stream(out.clone()))
        .await;
    let reply = answer(rx).await.result.clone().expect("streamed");
    assert!(reply.body.is_empty());
    let text: String = (out.0.lock().expect("lock").iter())
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    assert!(text.contains("\"usage\""), "{text}");
    let t = a.stats().tokens["client"].clone();
    // Reserved 40 + 1 ("abcd"); the sim reports 22 prompt (body / 4) + 40.
    assert_eq!((t.reserved, t.usage_reported, t.used), (41, 1, 62));
    // Without `include_usage`: the reservation stands, and the body is still empty.
    let out = Arc::new(Chunks::default());
    let (_, rx) = a
        .call(
            Submission::new(r#"{"max_tokens":3}"#)
                .client_key("s")
                .stream(out),
        )
        .await;
    assert!(answer(rx).await.result.clone().expect("ok").body.is_empty());
    let t = a.stats().tokens["client"].clone();
    assert_eq!((t.usage_missing, t.used), (1, 62 + 3));
}

/// Shadow mode counts what the budget would refuse and admits it, tokens reserved
/// anyway (the bucket goes into debt, at most one budget deep).
#[tokio::test(start_paused = true)]
async fn shadow_mode_counts_would_reject_and_admits() {
    let mut c = budget_cfg(8);
    c.mode = crate::config::Mode::Shadow;
    let a = start_with(c, SimBackend::fixed(Duration::from_millis(10)));
    let mut rxs = Vec::new();
    for _ in 0..25 {
        let sub = Submission::new(chat(MAX_TOKENS)).client_key("tenant");
        rxs.push(a.call(sub).await.1);
    }
    for rx in rxs {
        assert!(answer(rx).await.result.is_ok());
    }
    let s = a.stats();
    assert_eq!(s.would_reject.get("client.tokens"), Some(&6));
    let t = &s.tokens["client"];
    assert_eq!((t.reserved, t.refused), (25 * 502, 0));
    let left = a.limits_view(1).tokens[0].available;
    assert!((-(TPM as f64)..0.0).contains(&left), "{left}");
    a.check_invariants();
}

/// A request refused by the key's concurrency limit after its reservation (the slot
/// is checked once it is queued) gets its tokens back at once.
#[tokio::test(start_paused = true)]
async fn a_concurrency_refusal_after_the_reservation_refunds_it() {
    let mut c = budget_cfg(4);
    c.limits[0].limit = NonZeroUsize::new(1).expect("non-zero");
    let a = start_with(c, SimBackend::fixed(Duration::from_millis(100)));
    let (_, first) = a.call(Submission::new(chat(100)).client_key("k")).await;
    let (_, second) = a.call(Submission::new(chat(100)).client_key("k")).await;
    let e = answer(second).await.result.clone().expect_err("busy");
    assert_eq!(e.code, ErrorCode::ConcurrencyLimitExceeded);
    let t = a.stats().tokens["client"].clone();
    assert_eq!((t.reserved, t.refunded, t.outstanding), (2 * 102, 102, 102));
    a.check_invariants();
    assert!(answer(first).await.result.is_ok());
    a.check_invariants();
}
