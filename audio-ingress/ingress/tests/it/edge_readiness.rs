//! Readiness gates admission, against the real binary and a real
//! nats-server: before the first connect and while NATS is down, a new WebSocket
//! stream is refused before the upgrade with 503 + `Retry-After` and the JSON body;
//! a stream already open follows the end-to-end bound (it overloads); once NATS is
//! back, streams are admitted again.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use support::{Binary, STEP};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use weir_testkit::NatsServer;

/// The refusal of an upgrade: (status, Retry-After, JSON body).
async fn refused(ws: SocketAddr, id: &str) -> (u16, Option<String>, Value) {
    let url = format!("ws://{ws}/v1/streams/{id}");
    let result = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .expect("answer in time");
    support::refusal(id, result)
}

fn assert_not_ready(r: &(u16, Option<String>, Value)) {
    assert_eq!(r.0, 503, "{r:?}");
    assert_eq!(r.1.as_deref(), Some("1"), "{r:?}");
    assert_eq!(r.2["error"]["code"], "not_ready", "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_first_connect_new_streams_get_503_not_ready() {
    // A port with no server behind it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let bin = Binary::start(&format!("nats://127.0.0.1:{port}"), &[]).await;
    assert!(bin.wait_ready(503).await, "/readyz is 503 without NATS");
    assert_not_ready(&refused(bin.ws, "early").await);
    assert_eq!(
        bin.metric("weir_ingress_admission_rejects_total{reason=\"not_ready\"}")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_nats_is_down_new_streams_get_503_and_open_ones_overload() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;
    let (mut open, _) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::connect_async(format!("ws://{}/v1/streams/open-1", bin.ws)),
    )
    .await
    .expect("in time")
    .expect("admitted while connected");
    open.send(Message::Binary(vec![0u8; 640].into()))
        .await
        .expect("frame");

    nats.kill().expect("kill nats-server");
    assert!(
        bin.wait_ready(503).await,
        "/readyz is 503 once NATS is gone"
    );
    assert_not_ready(&refused(bin.ws, "during-outage").await);

    // The open stream follows the end-to-end bound: real-time frames overload it.
    let deadline = Instant::now() + STEP;
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut overload = None;
    while overload.is_none() && Instant::now() < deadline {
        tokio::select! {
            _ = tick.tick() => {
                if open.send(Message::Binary(vec![0u8; 640].into())).await.is_err() {
                    break;
                }
            }
            msg = open.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("json");
                    if v["type"] == "overload" {
                        overload = Some(v);
                    }
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => break,
            }
        }
    }
    assert!(overload.is_some(), "the open stream overloaded");

    nats.restart().expect("restart nats-server");
    assert!(bin.wait_ready(200).await, "/readyz back to 200");
    let (mut again, _) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::connect_async(format!("ws://{}/v1/streams/after", bin.ws)),
    )
    .await
    .expect("in time")
    .expect("admitted after reconnect");
    again
        .send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("end");
}
