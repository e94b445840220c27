//! Issue 10 at the adapter's NATS edge, over a real nats-server: bursts are answered or
//! counted (never dropped silently), invalid envelope ids are refused.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{STEP, eventually};
use futures::StreamExt;
use weir_llm_adapter::backend::sim::SimBackend;
use weir_llm_adapter::{AdapterHandle, Config, NatsEvents};
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, ErrorCode};
use weir_testkit::NatsServer;

/// The adapter started like the binary does: its client counts its own events.
async fn adapter(server: &NatsServer, toml: &str) -> AdapterHandle {
    let mut config = Config::from_toml_str(toml).expect("valid config");
    config.nats.url = server.url().to_owned();
    config.nats.connection_timeout = Duration::from_millis(500);
    config.nats.ping_interval = Duration::from_secs(1);
    let events = NatsEvents::new();
    let client = tokio::time::timeout(
        STEP,
        weir_llm_adapter::connect_with_events(&config.nats, &events),
    )
    .await
    .expect("connect in time")
    .expect("connect");
    let sim = SimBackend::fixed(Duration::from_millis(50));
    tokio::time::timeout(
        STEP,
        weir_llm_adapter::start_with_events(client, events, config, Arc::new(sim)),
    )
    .await
    .expect("start in time")
    .expect("start")
}

/// Publishes `n` requests at once (no waiting between them) and counts the answers.
async fn burst(caller: &async_nats::Client, n: u64) -> Arc<AtomicU64> {
    let inbox = caller.new_inbox();
    let mut sub = caller
        .subscribe(format!("{inbox}.*"))
        .await
        .expect("subscribe");
    caller.flush().await.expect("flush");
    let answered = Arc::new(AtomicU64::new(0));
    tokio::spawn({
        let answered = answered.clone();
        async move {
            while let Some(m) = sub.next().await {
                let code = m
                    .headers
                    .as_ref()
                    .and_then(|hm| hm.get(h::ERROR_CODE))
                    .map_or("ok", |v| v.as_str());
                // An answer is ok or a refusal code; nothing else may arrive.
                if code == "ok" || ErrorCode::ALL.iter().any(|c| c.as_str() == code) {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    for i in 0..n {
        caller
            .publish_with_reply(
                "llm.infer",
                format!("{inbox}.{i}"),
                Bytes::from_static(b"{}"),
            )
            .await
            .expect("publish");
    }
    caller.flush().await.expect("flush");
    answered
}

#[tokio::test]
async fn a_burst_over_the_subscription_is_counted_answered_plus_dropped_equals_sent() {
    let server = NatsServer::start().expect("nats-server");
    // A deliberately small subscription: the client must drop part of the burst.
    let a = adapter(
        &server,
        "workers = 2\nqueue_capacity = 16\n[nats]\nsubscription_capacity = 16\n",
    )
    .await;
    let caller = common::connect(server.url()).await;
    let sent = 3_000;
    let answered = burst(&caller, sent).await;
    // At rest every message is answered or counted as not taken by the adapter.
    eventually(STEP, || {
        let s = a.stats();
        answered.load(Ordering::Relaxed) + s.nats.not_taken == sent && s.queued_now == 0
    })
    .await;
    let s = a.stats();
    assert!(s.nats.not_taken > 0, "the burst overflowed: {:?}", s.nats);
    assert_eq!(s.nats.in_messages, sent);
    assert_eq!(s.nats.taken, answered.load(Ordering::Relaxed));
    // Events are counted too, possibly fewer (async-nats drops events past 128).
    assert!(
        (1..=s.nats.not_taken).contains(&s.nats.dropped),
        "{:?}",
        s.nats
    );
    assert_eq!(s.nats.dropped_by_sid.values().sum::<u64>(), s.nats.dropped);
    a.shutdown().await;
}

#[tokio::test]
async fn a_burst_of_20000_at_the_default_sizing_is_answered_in_full() {
    let server = NatsServer::start().expect("nats-server");
    let a = adapter(&server, "").await;
    let caller = common::connect(server.url()).await;
    let sent = 20_000;
    let answered = burst(&caller, sent).await;
    eventually(Duration::from_secs(30), || {
        answered.load(Ordering::Relaxed) == sent
    })
    .await;
    let s = a.stats();
    assert_eq!((s.nats.not_taken, s.nats.dropped), (0, 0), "{:?}", s.nats);
    assert_eq!(s.offered, sent);
    a.shutdown().await;
}

#[tokio::test]
async fn invalid_envelope_ids_are_refused_naming_the_field() {
    let server = NatsServer::start().expect("nats-server");
    let a = adapter(&server, "").await;
    let caller = common::connect(server.url()).await;
    for (body, field) in [
        (
            r#"{"trace_id":"t","request_id":"r x","session_id":"s","ts_ms":1,"data":{}}"#,
            "request_id",
        ),
        (
            r#"{"trace_id":"t","request_id":"r","session_id":"sé","ts_ms":1,"data":{}}"#,
            "session_id",
        ),
    ] {
        let m = tokio::time::timeout(STEP, caller.request("llm.infer", Bytes::from(body)))
            .await
            .expect("in time")
            .expect("reply");
        let code = m.headers.as_ref().and_then(|hm| hm.get(h::ERROR_CODE));
        assert_eq!(code.map(|v| v.as_str()), Some("invalid_request"), "{body}");
        let env: serde_json::Value = serde_json::from_slice(&m.payload).expect("json");
        let err: ErrorBody = serde_json::from_value(env["error"].clone()).expect("error");
        assert!(
            err.message.contains(&format!("envelope field {field}")),
            "{}",
            err.message
        );
    }
    let s = a.stats();
    assert_eq!(s.admitted, 0, "nothing admitted with an invalid id");
    a.shutdown().await;
}
