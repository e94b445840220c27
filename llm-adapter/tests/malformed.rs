//! Issue 10, finding 3 over a real nats-server: one malformed message on a subscribed
//! subject makes async-nats (0.51, the newest release; nats.rs #1572 / PR #1573) drop
//! its connection. These tests show the effect per case with a raw TCP publisher, that
//! the disconnect is counted, that the service answers again after the forced
//! reconnect, and that the subject permissions of `deploy/nats-server.conf` refuse the
//! bad publisher before anything reaches the adapter.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{STEP, eventually};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use weir_llm_adapter::{AdapterHandle, Config};
use weir_service::nats::NatsAuth;
use weir_testkit::{NatsServer, NatsServerOptions};

const EXAMPLE_CONF: &str = include_str!("../../deploy/nats-server.conf");

async fn adapter(server: &NatsServer, toml: &str, user: Option<(&str, &str)>) -> AdapterHandle {
    let mut config = Config::from_toml_str(toml).expect("valid config");
    if let Some((u, p)) = user {
        config.nats.client.auth = NatsAuth::UserPassword {
            user: u.into(),
            password: p.into(),
        };
    }
    common::adapter_like_the_binary(server, config, Duration::from_millis(1)).await
}

/// A raw NATS connection: sends `CONNECT` (with `user`), then `frames` verbatim, then
/// `PING`, and returns what the server answered up to the `PONG`.
async fn raw_publish(port: u16, user: Option<(&str, &str)>, frames: &[u8]) -> String {
    let stream = tokio::time::timeout(STEP, TcpStream::connect(("127.0.0.1", port)))
        .await
        .expect("connect in time")
        .expect("connect");
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let mut line = String::new();
    r.read_line(&mut line).await.expect("INFO");
    assert!(line.starts_with("INFO"), "{line}");
    let connect = match user {
        Some((u, p)) => format!(
            "CONNECT {{\"verbose\":false,\"headers\":true,\"user\":\"{u}\",\"pass\":\"{p}\"}}\r\n"
        ),
        None => "CONNECT {\"verbose\":false,\"headers\":true}\r\n".to_owned(),
    };
    w.write_all(connect.as_bytes()).await.expect("write");
    w.write_all(frames).await.expect("write");
    w.write_all(b"PING\r\n").await.expect("write");
    let mut seen = String::new();
    tokio::time::timeout(STEP, async {
        loop {
            let mut l = String::new();
            if r.read_line(&mut l).await.unwrap_or(0) == 0 {
                break;
            }
            seen.push_str(&l);
            if l.starts_with("PONG") {
                break;
            }
        }
    })
    .await
    .expect("PONG in time");
    seen
}

/// Requests until one is answered (the adapter may still be reconnecting).
async fn answered_again(caller: &async_nats::Client, subject: &str) {
    let t0 = std::time::Instant::now();
    loop {
        let r = tokio::time::timeout(
            Duration::from_millis(500),
            caller.request(subject.to_owned(), Bytes::from_static(b"{}")),
        )
        .await;
        if matches!(r, Ok(Ok(_))) {
            return;
        }
        assert!(t0.elapsed() < STEP, "no answer after the reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One case: the bad frame makes the adapter's client drop its connection (counted);
/// the service comes back and answers.
async fn case(toml: &str, subject: &str, frame: &[u8]) {
    let server = NatsServer::start().expect("nats-server");
    let a = adapter(&server, toml, None).await;
    let caller = common::connect(server.url()).await;
    answered_again(&caller, subject).await;
    assert_eq!(a.stats().nats.disconnects, 0);
    raw_publish(server.port(), None, frame).await;
    eventually(STEP, || a.stats().nats.disconnects >= 1).await;
    answered_again(&caller, subject).await;
    a.shutdown().await;
}

#[tokio::test]
async fn a_non_utf8_reply_subject_drops_the_connection_and_the_service_comes_back() {
    case(
        "",
        "llm.infer",
        b"PUB llm.infer _INBOX.\xff\xfe 2\r\n{}\r\n",
    )
    .await;
}

#[tokio::test]
async fn a_malformed_header_block_drops_the_connection_and_the_service_comes_back() {
    // 12 header bytes that are not a `NATS/1.0` status line.
    case(
        "",
        "llm.infer",
        b"HPUB llm.infer _INBOX.x 12 14\r\nGARBAGE\xff\r\n\r\n{}\r\n",
    )
    .await;
}

#[tokio::test]
async fn a_non_utf8_subject_under_a_wildcard_drops_the_connection_and_it_comes_back() {
    case(
        "[service]\nsubject = \"wild.*\"\n",
        "wild.a",
        b"PUB wild.\xff _INBOX.x 2\r\n{}\r\n",
    )
    .await;
}

#[tokio::test]
async fn the_example_permissions_refuse_the_bad_publisher_and_the_adapter_stays_up() {
    let server = NatsServer::start_with(NatsServerOptions {
        config: Some(EXAMPLE_CONF.to_owned()),
        ..Default::default()
    })
    .expect("nats-server with the example configuration");
    // Each user with its own inbox prefix, as the example requires.
    let a = adapter(
        &server,
        "[service]\nsubject = \"llm.infer\"\n[nats]\ninbox_prefix = \"_INBOX.llm-adapter\"\n",
        Some(("llm-adapter", "adapter-secret")),
    )
    .await;
    let caller =
        async_nats::ConnectOptions::with_user_and_password("caller".into(), "caller-secret".into())
            .custom_inbox_prefix("_INBOX.caller")
            .connect(server.url())
            .await
            .expect("caller connects");
    answered_again(&caller, "llm.infer").await;
    // A client without publish rights on the service subjects: every case is refused.
    for frame in [
        &b"PUB llm.infer _INBOX.\xff 2\r\n{}\r\n"[..],
        b"HPUB llm.infer _INBOX.x 12 14\r\nGARBAGE\xff\r\n\r\n{}\r\n",
        b"PUB llm.\xff _INBOX.x 2\r\n{}\r\n",
    ] {
        let seen = raw_publish(server.port(), Some(("guest", "guest-secret")), frame).await;
        assert!(seen.contains("Permissions Violation"), "{seen}");
    }
    // The trusted caller may publish only the exact service subjects: no wildcard hole.
    let seen = raw_publish(
        server.port(),
        Some(("caller", "caller-secret")),
        b"PUB llm.\xff _INBOX.x 2\r\n{}\r\n",
    )
    .await;
    assert!(seen.contains("Permissions Violation"), "{seen}");
    answered_again(&caller, "llm.infer").await;
    assert_eq!(a.stats().nats.disconnects, 0, "the adapter never lost NATS");
    // The trusted caller streams through the example permissions: its acknowledgements
    // are allowed (40 tokens make more chunks than the default window of 16), and the
    // status subject is served.
    let llm = weir_llm_adapter::client::LlmClient::new(caller.clone(), "llm.infer");
    let mut st = llm
        .request(common::stream_body(40))
        .request_id("perm-1")
        .timeout(Duration::from_secs(10))
        .stream()
        .await
        .expect("stream");
    let mut end = None;
    while let Some(ev) = st.next().await {
        if let weir_llm_adapter::client::LlmEvent::End(e) = ev.expect("event") {
            end = Some(e);
        }
    }
    let end = end.expect("end");
    assert!(end.chunks > 16, "{end:?}");
    let status = caller
        .request("llm.status", "perm-1".into())
        .await
        .expect("status answered");
    let v: serde_json::Value = serde_json::from_slice(&status.payload).expect("json");
    assert_eq!(v["status"], "done");
    a.shutdown().await;
}
