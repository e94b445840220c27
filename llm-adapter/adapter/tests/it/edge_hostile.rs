//! Hostile traffic at the adapter's NATS edge, over a real nats-server: bursts are answered or
//! counted (never dropped silently), invalid envelope ids are refused.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{STEP, eventually};
use futures::StreamExt;
use weir_llm_adapter::{AdapterHandle, Config};
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, ErrorCode};
use weir_testkit::NatsServer;

/// The adapter started like the binary does: its client counts its own events.
async fn adapter(server: &NatsServer, toml: &str) -> AdapterHandle {
    let config = Config::from_toml_str(toml).expect("valid config");
    common::adapter_like_the_binary(server, config, Duration::from_millis(50)).await
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

#[tokio::test]
async fn the_admin_listener_caps_connections_and_silent_ones_never_keep_probes_out() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = NatsServer::start().expect("nats-server");
    let a = adapter(
        &server,
        "[admin]\nmax_connections = 2\nheader_timeout_ms = 300\nidle_timeout_ms = 600\n",
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(weir_llm_adapter::admin::serve(
        listener,
        weir_llm_adapter::admin::AdminState {
            view: a.view(),
            prometheus: None,
        },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let probe = |path: &'static str| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut buf = Vec::new();
        tokio::time::timeout(STEP, s.read_to_end(&mut buf))
            .await
            .expect("in time")
            .expect("read");
        String::from_utf8_lossy(&buf).into_owned()
    };
    // Twice the cap's worth of silent connections: the last two took the slots of
    // the first two, which were closed without a response.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every probe is answered: each takes the slot of the longest-silent connection.
    for i in 0..20 {
        let (path, text) = if i % 2 == 0 {
            ("/healthz", probe("/healthz").await)
        } else {
            ("/readyz", probe("/readyz").await)
        };
        assert!(!text.contains("max_connections"), "{path}: {text}");
        if path == "/healthz" {
            assert!(text.starts_with("HTTP/1.1 200"), "{path}: {text}");
        } else {
            assert!(text.contains("\"ready\""), "{path}: {text}");
        }
    }
    // The silent ones are closed (evicted, or by the header timeout), without a
    // response.
    for mut s in silent {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("closed")
            .unwrap_or(0);
        assert_eq!(n, 0, "closed without a response");
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(STEP, task).await;
    a.shutdown().await;
}
