//! Per-key token budgets over a real nats-server: the adapter in-process with the sim
//! backend (whose echo carries a `usage`), callers with the Rust client and raw NATS.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use axum::routing::post;
use bytes::Bytes;
use common::{Rig, STEP};
use futures::StreamExt;
use weir_llm_adapter::backend::openai::OpenAiBackend;
use weir_llm_adapter::config::{BackendKind, Config};
use weir_llm_client::{ClientErrorKind, LlmClient, LlmEvent};
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, ErrorCode};

/// 1,200 tokens per minute = 20 per second.
const CONFIG: &str = r#"
workers = 4
[[limits]]
key = "client"
limit = 100
on_busy = "reject"
tokens_per_minute = 1200
default_max_tokens = 100
"#;

/// 500 completion tokens + "user" "hello" (9 bytes → 3 tokens) = 503 reserved.
const BODY: &str =
    r#"{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hello"}]}"#;

#[tokio::test]
async fn a_key_over_its_token_budget_is_refused_with_retry_after_over_nats() {
    let mut rig = Rig::with_sim(CONFIG, Duration::from_millis(20)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    for _ in 0..2 {
        let ok = llm
            .request(BODY)
            .client_key("tenant-a")
            .timeout(STEP)
            .send()
            .await;
        let reply = ok.expect("within the budget");
        let v: serde_json::Value = serde_json::from_slice(&reply.body).expect("JSON");
        // The sim reports 20 prompt tokens (77 bytes / 4, rounded up) + 500.
        assert_eq!(v["usage"]["total_tokens"], 520);
    }
    // 1,200 − 2 × 520 = 160 left (plus a little refill): 503 do not fit.
    let refused = llm
        .request(BODY)
        .client_key("tenant-a")
        .timeout(STEP)
        .send()
        .await;
    let e = refused.expect_err("over budget");
    assert_eq!(
        e.kind(),
        ClientErrorKind::Server(ErrorCode::TokenBudgetExceeded)
    );
    let d = e.details();
    assert_eq!(d.key.as_deref(), Some("client:tenant-a"));
    assert_eq!((d.limit, d.tokens_requested), (Some(1200), Some(503)));
    let available = d.tokens_available.expect("tokens_available");
    assert!((160..200).contains(&available), "{available}");
    // retry_after_ms = the missing tokens at 20 per second.
    let retry = d.retry_after_ms.expect("retry_after_ms");
    let expected = (503 - available) * 50;
    assert!(retry.abs_diff(expected) <= 50, "{retry} vs {expected}");
    assert_eq!(e.retry_after(), Some(Duration::from_millis(retry)));

    // The same refusal on the wire: service error headers and the JSON body.
    let mut hm = HeaderMap::new();
    hm.insert(h::CLIENT_KEY, "tenant-a");
    let req = async_nats::Request::new()
        .payload(BODY.into())
        .headers(hm)
        .timeout(Some(STEP));
    let m = rig
        .caller
        .send_request("llm.infer".to_owned(), req)
        .await
        .expect("reply");
    let header = |n: &str| {
        m.headers
            .as_ref()
            .and_then(|hs| hs.get(n))
            .map(|v| v.as_str().to_owned())
    };
    assert_eq!(header("Nats-Service-Error-Code").as_deref(), Some("429"));
    let body: ErrorBody = serde_json::from_slice(&m.payload).expect("error body");
    assert_eq!(body.code, ErrorCode::TokenBudgetExceeded);
    assert!(body.details.retry_after_ms.is_some_and(|r| r > 0));

    // Another key has its own budget; no key, no budget.
    let other = llm
        .request(BODY)
        .client_key("tenant-b")
        .timeout(STEP)
        .send()
        .await;
    assert!(other.is_ok(), "{other:?}");
    assert!(llm.request(BODY).timeout(STEP).send().await.is_ok());

    // Reconciled with the reported usage: 3 × 503 reserved, 3 × 520 used.
    let t = rig.adapter().stats().tokens["client"].clone();
    assert_eq!(
        (t.reserved, t.used, t.overcharged),
        (3 * 503, 3 * 520, 3 * 17)
    );
    assert_eq!(
        (t.refused, t.usage_reported, t.outstanding, t.keys),
        (2, 3, 0, 2)
    );
    let limits = rig.adapter().limits(5);
    assert_eq!(
        limits.tokens[0].key, "client:tenant-a",
        "{:?}",
        limits.tokens
    );
    assert_eq!(limits.tokens[0].tokens_per_minute, 1200);
    rig.shutdown().await;
}

/// 100 callers at once on one key with 10,000 tokens per minute, over NATS: the tokens
/// reserved stay within the budget (plus the refill of the run), what the sim reports
/// as used overshoots it by at most one request's `max_tokens`, and every refusal
/// carries `retry_after_ms`.
#[tokio::test]
async fn a_hundred_concurrent_callers_on_one_key_stay_within_its_budget_over_nats() {
    let config = "workers = 8\n[[limits]]\nkey = \"client\"\nlimit = 1000\non_busy = \"reject\"\ntokens_per_minute = 10000\n";
    let mut rig = Rig::with_sim(config, Duration::from_millis(20)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    // 500 + "user" "hi" (6 bytes → 2 tokens) = 502 reserved; the sim reports 19 + 500.
    let body = r#"{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}"#;
    let t0 = std::time::Instant::now();
    let calls: Vec<_> = (0..100)
        .map(|_| {
            let llm = llm.clone();
            tokio::spawn(async move {
                llm.request(body)
                    .client_key("tenant")
                    .timeout(STEP)
                    .send()
                    .await
            })
        })
        .collect();
    let (mut ok, mut refused) = (0u64, 0u64);
    for c in calls {
        match c.await.expect("join") {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(
                    e.kind(),
                    ClientErrorKind::Server(ErrorCode::TokenBudgetExceeded)
                );
                assert!(e.details().retry_after_ms.is_some_and(|r| r > 0), "{e}");
                refused += 1;
            }
        }
    }
    let refill = (t0.elapsed().as_secs_f64() * 10_000.0 / 60.0).ceil() as u64;
    let t = rig.adapter().stats().tokens["client"].clone();
    assert_eq!(ok + refused, 100);
    assert!(ok >= 19, "{ok}");
    assert_eq!(t.reserved, ok * 502);
    assert!(t.reserved <= 10_000 + refill, "{t:?}, refill {refill}");
    assert_eq!((t.used, t.usage_reported), (ok * 519, ok));
    assert!(t.used <= 10_000 + refill + 500, "{t:?}, refill {refill}");
    eprintln!(
        "100 concurrent over NATS: {ok} ok, {refused} refused, {} reserved, {} used, refill {refill} in {:?}",
        t.reserved,
        t.used,
        t0.elapsed()
    );
    rig.shutdown().await;
}

/// An OpenAI-compatible server whose `usage` is chosen by the body: `"u":"ok"` → 30
/// tokens, `garbage` → a negative count, `huge` → `u64::MAX`, `oversized` → a usage
/// object of 2 KiB; a streaming body gets SSE events, the last data event with 12.
async fn usage_server() -> (String, tokio::task::JoinHandle<()>) {
    async fn completions(body: Bytes) -> axum::response::Response {
        use axum::response::IntoResponse;
        let text = String::from_utf8_lossy(&body).into_owned();
        if text.contains(r#""stream":true"#) {
            let sse = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n\
                       data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,\"total_tokens\":12}}\n\n\
                       data: [DONE]\n\n";
            return ([("content-type", "text/event-stream")], sse).into_response();
        }
        let usage = match () {
            _ if text.contains("garbage") => serde_json::json!({"total_tokens": -7}),
            _ if text.contains("huge") => serde_json::json!({"total_tokens": u64::MAX}),
            _ if text.contains("oversized") => {
                serde_json::json!({"pad": "x".repeat(2048), "total_tokens": 1})
            }
            _ => {
                serde_json::json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30})
            }
        };
        axum::Json(serde_json::json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
            "usage": usage,
        }))
        .into_response()
    }
    let app = axum::Router::new().route("/v1/chat/completions", post(completions));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), task)
}

/// Through the HTTP backend: a usage that is garbage or oversized leaves the
/// reservation charged, an absurd one is clamped at 4 × the reservation, a valid one
/// (unary or the stream's last event) replaces it.
#[tokio::test]
async fn an_http_backends_usage_is_reconciled_and_its_garbage_cannot_corrupt_the_budget() {
    let (base, _srv) = usage_server().await;
    let toml = format!(
        "workers = 2\n[[limits]]\nkey = \"client\"\nlimit = 10\ntokens_per_minute = 60000\n\
         [backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"{base}\""
    );
    let config = Config::from_toml_str(&toml).expect("config");
    let BackendKind::OpenAi(oc) = &config.backend.kind else {
        panic!("openai")
    };
    let backend = OpenAiBackend::new(oc, config.backend.timeout).expect("backend");
    let mut rig = Rig::with_backend(&toml, Arc::new(backend)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    // Each costs 100 + "x" (1 byte → 1 token) = 101.
    for mode in ["ok", "garbage", "huge", "oversized"] {
        let body = format!(r#"{{"u":"{mode}","max_tokens":100,"prompt":"x"}}"#);
        let r = llm.request(body).client_key("k").timeout(STEP).send().await;
        assert!(r.is_ok(), "{mode}: {r:?}");
    }
    let body = r#"{"stream":true,"max_tokens":100,"prompt":"x"}"#;
    let mut s = llm
        .request(body)
        .client_key("k")
        .timeout(STEP)
        .stream()
        .await
        .expect("stream");
    let mut text = Vec::new();
    while let Some(ev) = s.next().await {
        match ev.expect("event") {
            LlmEvent::Chunk { data, .. } => text.extend_from_slice(&data),
            LlmEvent::End(_) => break,
            _ => {}
        }
    }
    assert!(
        text.ends_with(b"data: [DONE]\n\n"),
        "the stream passed through unchanged"
    );
    let t = rig.adapter().stats().tokens["client"].clone();
    assert_eq!(t.reserved, 5 * 101);
    // ok 30 + garbage 101 + huge 404 (clamped) + oversized 101 + stream 12.
    assert_eq!(t.used, 30 + 101 + 404 + 101 + 12);
    assert_eq!(
        (
            t.usage_reported,
            t.usage_clamped,
            t.usage_missing,
            t.outstanding
        ),
        (3, 1, 2, 0)
    );
    let left = rig.adapter().limits(1).tokens[0].available;
    assert!((60_000.0 - 648.0..=60_000.0).contains(&left), "{left}");
    rig.shutdown().await;
}
