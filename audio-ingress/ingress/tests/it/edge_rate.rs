//! Rate in audio time, against the real binary and a real
//! nats-server with the default configuration (`max_rate = 1.5`): a WebSocket producer
//! pushing 100× real time is overloaded (`close`, reason `rate`) or gapped (`gap`,
//! reason `rate`) within 1 s; a real-time producer is not, even when it flushes the
//! backlog of a 2 s network stall at once.

use crate::support;

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use support::{Binary, STEP};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use weir_testkit::NatsServer;

/// Pushes 640-byte frames at `per_2ms` frames every 2 ms (10 = 100× real time) for at
/// most `bound`, until an event of `kind` with reason `rate` arrives; returns (time to
/// it, event). (In `gap`, markers for `queue_full` may come first: at 100× the byte
/// budget fills before the rate bound's burst — the budget + 2 s of audio — is spent.)
async fn push_until(
    ws: std::net::SocketAddr,
    id: &str,
    per_2ms: usize,
    kind: &str,
    bound: Duration,
) -> Option<(Duration, Value)> {
    let (mut socket, _) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::connect_async(format!("ws://{ws}/v1/streams/{id}")),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    while t0.elapsed() < bound {
        tokio::select! {
            biased;
            msg = socket.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(t.as_str()).expect("json");
                    if v["type"] == kind && v["reason"] == "rate" {
                        return Some((t0.elapsed(), v));
                    }
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return None,
            },
            _ = tick.tick() => {
                for _ in 0..per_2ms {
                    if socket.send(Message::Binary(vec![0u8; 640].into())).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_at_100x_real_time_is_overloaded_with_reason_rate_within_1s() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;
    let (after, ev) = push_until(bin.ws, "fast", 10, "overload", Duration::from_secs(3))
        .await
        .expect("overloaded");
    eprintln!("edge_rate close: overload after {after:?}: {ev}");
    assert_eq!(ev["reason"], "rate", "{ev}");
    assert!(after < Duration::from_secs(1), "{after:?}");
    assert_eq!(
        bin.metric("weir_ingress_overloads_total{reason=\"rate\"}")
            .await,
        1.0
    );
    // Real time (one frame per 20 ms; 1 per 2 ms tick would be 10x) is not limited:
    // 1.5 s of it sees no overload.
    let real = tokio::spawn(async move {
        let (mut socket, _) =
            tokio_tungstenite::connect_async(format!("ws://{}/v1/streams/real-time", bin.ws))
                .await
                .expect("upgrade");
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        for _ in 0..75 {
            tick.tick().await;
            socket
                .send(Message::Binary(vec![0u8; 640].into()))
                .await
                .expect("frame");
        }
        socket
            .send(Message::Text(r#"{"type":"end"}"#.into()))
            .await
            .expect("end");
        let mut closed = None;
        while let Some(Ok(m)) = socket.next().await {
            if let Message::Text(t) = m {
                let v: Value = serde_json::from_str(t.as_str()).expect("json");
                assert_ne!(v["type"], "overload", "{v}");
                if v["type"] == "closed" {
                    closed = Some(v);
                }
            }
        }
        closed.expect("closed event")
    });
    let closed = tokio::time::timeout(STEP, real)
        .await
        .expect("in time")
        .expect("task");
    assert_eq!(closed["reason"], "producer", "{closed}");
    assert_eq!(closed["frames_published"], 75, "{closed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_at_100x_real_time_is_gapped_with_reason_rate_within_1s() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[("policy", "gap"), ("extended_consumers", "true")],
    )
    .await;
    let (after, ev) = push_until(bin.ws, "fast-gap", 10, "gap", Duration::from_secs(3))
        .await
        .expect("gapped");
    eprintln!("edge_rate gap: first gap after {after:?}: {ev}");
    assert_eq!(ev["reason"], "rate", "{ev}");
    assert!(after < Duration::from_secs(1), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_time_producer_flushing_a_two_second_stall_is_not_closed() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;
    let (mut socket, _) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::connect_async(format!("ws://{}/v1/streams/stalled", bin.ws)),
    )
    .await
    .expect("in time")
    .expect("upgrade");
    let frame = || Message::Binary(vec![0u8; 640].into());
    // 1 s of real time, a 2 s network stall, its 100-frame backlog at once (what TCP
    // delivers after the hiccup), then 1 s of real time and `end`.
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for _ in 0..50 {
        tick.tick().await;
        socket.send(frame()).await.expect("frame");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..100 {
        socket.feed(frame()).await.expect("backlog");
    }
    socket.flush().await.expect("flush");
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    for _ in 0..50 {
        tick.tick().await;
        socket.send(frame()).await.expect("frame");
    }
    socket
        .send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("end");
    let mut events = Vec::new();
    while let Some(Ok(m)) = tokio::time::timeout(STEP, socket.next())
        .await
        .expect("in time")
    {
        if let Message::Text(t) = m {
            events.push(serde_json::from_str::<Value>(t.as_str()).expect("json"));
        }
    }
    eprintln!("edge_rate stall: {events:?}");
    assert!(events.iter().all(|e| e["type"] != "overload"), "{events:?}");
    let closed = events
        .iter()
        .find(|e| e["type"] == "closed")
        .expect("closed");
    assert_eq!(closed["reason"], "producer", "{closed}");
    assert_eq!(closed["frames_published"], 200, "{closed}");
    assert_eq!(
        bin.metric("weir_ingress_overloads_total{reason=\"rate\"}")
            .await,
        0.0
    );
}
