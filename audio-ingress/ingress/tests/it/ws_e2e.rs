//! The WebSocket front door end to end: a real WebSocket client (tokio-tungstenite), the
//! service running in process (`service::start`) against a real nats-server, and a NATS
//! subscriber that decodes what comes out.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use weir_audio_ingress::config::{Config, ConfigSources};
use weir_audio_ingress::service::{self, RunningService};
use weir_audio_producer::testing::{Collector, STEP, pcm, wait_until};
use weir_protocol::audio::extension::EndReason;
use weir_testkit::NatsServer;

use crate::support;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn start_service(
    nats_url: &str,
    extra: &[(&str, &str)],
) -> RunningService<weir_audio_producer::jetstream::NatsSink> {
    let mut overrides = vec![
        ("nats_url".to_owned(), nats_url.to_owned()),
        ("listen".to_owned(), "127.0.0.1:0".to_owned()),
        ("admin".to_owned(), "127.0.0.1:0".to_owned()),
        ("nats_connection_timeout_ms".to_owned(), "500".to_owned()),
        ("nats_ping_interval_ms".to_owned(), "1000".to_owned()),
    ];
    overrides.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let config = Config::load(&ConfigSources {
        overrides,
        ..Default::default()
    })
    .expect("config");
    let handle = support::prometheus();
    let svc = tokio::time::timeout(STEP, service::start(config, Some(handle)))
        .await
        .expect("start in time")
        .expect("start");
    let ingress = svc.ingress().clone();
    assert!(
        wait_until(STEP, || async_nats_connected(&ingress)).await,
        "service connected to NATS"
    );
    svc
}

fn async_nats_connected(
    ingress: &weir_audio_producer::Ingress<weir_audio_producer::jetstream::NatsSink>,
) -> bool {
    use weir_audio_producer::publisher::Sink;
    ingress.sink().is_connected()
}

async fn connect(
    svc: &RunningService<weir_audio_producer::jetstream::NatsSink>,
    path: &str,
) -> Result<Ws, tungstenite::Error> {
    let url = format!("ws://{}{path}", svc.ws_addr());
    tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .map(|(ws, _)| ws)
}

/// The HTTP status (and `Retry-After`, body) of a refused upgrade.
async fn refused(
    svc: &RunningService<weir_audio_producer::jetstream::NatsSink>,
    path: &str,
) -> (u16, Option<String>, Value) {
    support::refusal(path, connect(svc, path).await)
}

/// Reads until the close frame: (text events, close code).
async fn events_until_close(ws: &mut Ws) -> (Vec<Value>, Option<u16>) {
    let mut events = Vec::new();
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("message in time");
        match msg {
            Some(Ok(Message::Text(t))) => {
                let ev: Value = serde_json::from_str(t.as_str()).expect("JSON event");
                if !support::is_lifecycle(&ev) {
                    events.push(ev);
                }
            }
            Some(Ok(Message::Close(frame))) => return (events, frame.map(|f| u16::from(f.code))),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return (events, None),
        }
    }
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::time::timeout(STEP, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut buf))
        .await
        .expect("read in time")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_pcm_in_decodable_packets_out_end_closes_1000() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let svc = start_service(server.url(), &[]).await;
    let mut ws = connect(&svc, "/v1/streams/ws-1?session_id=sess-1")
        .await
        .expect("upgrade");
    for seq in 1..=20 {
        ws.send(Message::Binary(pcm(seq))).await.expect("send");
    }
    ws.send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("send end");
    let (events, code) = events_until_close(&mut ws).await;
    assert_eq!(code, Some(1000));
    let closed = events
        .iter()
        .find(|e| e["type"] == "closed")
        .expect("closed event");
    assert_eq!(closed["reason"], "producer");
    assert_eq!(closed["frames_published"], 20);
    assert_eq!(closed["frames_dropped"], 0);
    assert_eq!(closed["end_delivered"], true);

    assert!(collector.wait_ends(1, STEP).await);
    let log = collector.log("ws-1");
    assert_eq!(log.frames, (1..=20).collect::<Vec<u64>>());
    let end = log.end.expect("end");
    assert_eq!(end.packet.seq, 21);
    assert_eq!(end.packet.session_id.as_deref(), Some("sess-1"));
    assert_eq!(end.ext.end_reason, Some(EndReason::Producer));
    assert_eq!(end.ext.version, Some(1));

    // Admin: health, readiness, stats (contract shape), metrics.
    let admin = svc.admin_addr();
    assert_eq!(http_get(admin, "/healthz").await.0, 200);
    let (status, body) = http_get(admin, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_get(admin, "/v1/stats").await;
    assert_eq!(status, 200);
    let stats: Value = serde_json::from_str(&body).expect("stats JSON");
    for key in weir_audio_producer::stats::STATS_CONTRACT_KEYS {
        assert!(stats.get(key).is_some(), "stats lacks {key}: {body}");
    }
    assert_eq!(stats["frames"]["published"], 20);
    // The shared type the load test reads: every field the ingress writes is there.
    let typed: weir_protocol::admin::IngressStats = serde_json::from_str(&body)
        .expect("/v1/stats decodes as weir_protocol::admin::IngressStats");
    assert_eq!(typed.frames.published, 20);
    assert_eq!(typed.frames.handed_over, Some(20));
    assert_eq!(typed.pending_bytes_limit_per_stream, Some(16_000));
    assert_eq!(
        typed.window.as_ref().and_then(|w| w.mode.as_deref()),
        Some("confirmed")
    );
    assert_eq!(typed.queue_wait_ms.count, 20);
    assert_eq!(
        serde_json::to_value(&typed).expect("encodes"),
        stats,
        "decoding and encoding the shared type loses nothing the ingress wrote"
    );
    assert_eq!(stats["queue_wait_ms"]["count"], 20);
    assert_eq!(stats["pending_bytes_limit_per_stream"], 16_000);
    assert_eq!(stats["nats_connected"], true);
    let (status, metrics) = http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        weir_audio_producer::metrics::FRAMES_TOTAL,
        weir_audio_producer::metrics::QUEUE_WAIT_SECONDS,
        weir_audio_producer::metrics::PENDING_BYTES,
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    let (status, limits) = http_get(admin, "/v1/limits").await;
    assert_eq!(status, 200);
    assert!(limits.contains("\"max_bytes\":16000"), "{limits}");
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_refuses_bad_ids_400_active_ids_409_and_over_the_cap_503_before_upgrade() {
    let server = NatsServer::start().expect("nats-server");
    let svc = start_service(
        server.url(),
        &[("max_streams", "2"), ("retry_after_s", "3")],
    )
    .await;
    for bad in [
        "/v1/streams/bad.id",
        "/v1/streams/a%20b",
        "/v1/streams/%2A",
        "/v1/streams/caf%C3%A9",
    ] {
        let (status, _, body) = refused(&svc, bad).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(body["error"]["code"], "invalid_stream_id", "{bad}: {body}");
    }
    let long_session = format!("/v1/streams/ok-1?session_id={}", "s".repeat(300));
    assert_eq!(refused(&svc, &long_session).await.0, 400);

    let _a = connect(&svc, "/v1/streams/ws-a").await.expect("a");
    let (status, _, body) = refused(&svc, "/v1/streams/ws-a").await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "stream_active");
    let _b = connect(&svc, "/v1/streams/ws-b").await.expect("b");
    let (status, retry_after, body) = refused(&svc, "/v1/streams/ws-c").await;
    assert_eq!(status, 503);
    assert_eq!(retry_after.as_deref(), Some("3"));
    assert_eq!(body["error"]["code"], "max_streams");
    let stats = svc.ingress().stats();
    assert_eq!(stats.active_streams, 2);
    assert!(stats.admission_rejects >= 7, "{}", stats.admission_rejects);
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_bad_frame_closes_1008_bad_text_1003_and_nothing_else_changes() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let svc = start_service(server.url(), &[]).await;
    let mut good = connect(&svc, "/v1/streams/ws-good").await.expect("good");
    let mut bad = connect(&svc, "/v1/streams/ws-bad").await.expect("bad");
    for seq in 1..=2 {
        good.send(Message::Binary(pcm(seq))).await.expect("send");
        bad.send(Message::Binary(pcm(seq))).await.expect("send");
    }
    bad.send(Message::Binary(bytes::Bytes::from_static(&[1, 2, 3])))
        .await
        .expect("send odd");
    let (events, code) = events_until_close(&mut bad).await;
    assert_eq!(code, Some(1008));
    assert_eq!(events[0]["type"], "error");
    assert_eq!(events[0]["code"], "bad_frame");
    assert!(
        events[0]["message"]
            .as_str()
            .unwrap_or("")
            .contains("3 bytes"),
        "{events:?}"
    );
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some("closed".into())
    );

    // Too large: over max_frame_bytes (3,200).
    let mut big = connect(&svc, "/v1/streams/ws-big").await.expect("big");
    big.send(Message::Binary(bytes::Bytes::from(vec![0u8; 3202])))
        .await
        .expect("send big");
    assert_eq!(events_until_close(&mut big).await.1, Some(1008));

    let mut text = connect(&svc, "/v1/streams/ws-text").await.expect("text");
    text.send(Message::Text("hello".into()))
        .await
        .expect("send text");
    let (events, code) = events_until_close(&mut text).await;
    assert_eq!(code, Some(1003));
    assert_eq!(events[0]["code"], "bad_message");

    // The other stream is unaffected.
    for seq in 3..=5 {
        good.send(Message::Binary(pcm(seq))).await.expect("send");
    }
    good.send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("end");
    assert_eq!(events_until_close(&mut good).await.1, Some(1000));

    assert!(collector.wait_ends(4, STEP).await);
    let bad_log = collector.log("ws-bad");
    assert_eq!(
        bad_log.frames,
        vec![1, 2],
        "frames before the bad one are still published"
    );
    let end = bad_log.end.expect("end");
    assert_eq!(
        (end.packet.seq, end.ext.end_reason),
        (3, Some(EndReason::Error))
    );
    assert_eq!(collector.log("ws-good").frames, vec![1, 2, 3, 4, 5]);
    let stats = svc.ingress().stats();
    assert_eq!(stats.frames.dropped["invalid"], 2);
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_overload_sends_an_overload_event_and_closes_1013() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    // A small client channel and a short ping, so the stalled server is felt fast.
    let svc = start_service(
        server.url(),
        &[
            ("nats_client_capacity", "16"),
            ("nats_ping_interval_ms", "200"),
        ],
    )
    .await;
    let ws = connect(&svc, "/v1/streams/ws-ov").await.expect("upgrade");
    let (tx, mut rx) = ws.split();
    let sender = real_time_frames(tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.pause().expect("pause");
    // `closed` follows once the `end` is delivered (or given up at `end_timeout_ms`):
    // the server is resumed at the `overload` event.
    let (events, code) = overload_then_close(&mut rx, &server).await;
    sender.abort();
    assert_eq!(code, Some(1013), "{events:?}");
    let overload = events
        .iter()
        .find(|e| e["type"] == "overload")
        .expect("overload event");
    for key in [
        "reason",
        "dropped_frames",
        "dropped_samples",
        "pending_bytes",
        "max_bytes",
        "max_age_ms",
    ] {
        assert!(
            overload.get(key).is_some(),
            "overload event lacks {key}: {overload}"
        );
    }
    assert_eq!(overload["max_bytes"], 16_000);
    let closed = events
        .iter()
        .find(|e| e["type"] == "closed")
        .expect("closed event");
    assert_eq!(closed["reason"], "overload");
    // The consumer gets a proper end once NATS is back.
    assert!(collector.wait_ends(1, Duration::from_secs(15)).await);
    let end = collector.log("ws-ov").end.expect("end");
    assert_eq!(end.ext.end_reason, Some(EndReason::Overload));
    assert!(end.ext.overload.is_some());
    svc.shutdown().await;
}

/// Reads events until the close frame; resumes the paused `server` at the `overload`
/// event: (text events, close code).
async fn overload_then_close(
    rx: &mut futures::stream::SplitStream<Ws>,
    server: &NatsServer,
) -> (Vec<Value>, Option<u16>) {
    let mut events = Vec::new();
    let mut resumed = false;
    let code = loop {
        match tokio::time::timeout(STEP, rx.next())
            .await
            .expect("event in time")
        {
            Some(Ok(Message::Text(t))) => {
                let v = serde_json::from_str::<Value>(t.as_str()).expect("json");
                if v["type"] == "overload" && !resumed {
                    server.resume().expect("resume");
                    resumed = true;
                }
                events.push(v);
            }
            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => break None,
        }
    };
    if !resumed {
        server.resume().expect("resume");
    }
    (events, code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_closed_after_an_overload_reports_what_the_subscriber_received() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    // A long ping, so that the short stall below is not taken for a dead connection
    // (no reconnect: nothing is declared possibly lost, every count is exact).
    let svc = start_service(server.url(), &[("nats_ping_interval_ms", "10000")]).await;
    let ws = connect(&svc, "/v1/streams/ws-ov-count")
        .await
        .expect("upgrade");
    let (tx, mut rx) = ws.split();
    let sender = real_time_frames(tx);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Stopped: the budget's frames are handed to the client, unconfirmed, until the
    // stream overloads (max_age); they reach the subscriber once the server resumes.
    server.pause().expect("pause");
    let (events, code) = overload_then_close(&mut rx, &server).await;
    sender.abort();
    assert_eq!(code, Some(1013), "{events:?}");
    let closed = events
        .iter()
        .find(|e| e["type"] == "closed")
        .expect("closed event")
        .clone();
    assert_eq!(closed["reason"], "overload", "{closed}");
    assert!(collector.wait_ends(1, STEP).await, "the end reached NATS");
    let log = collector.log("ws-ov-count");
    let received = log.frames.len() as u64;
    let declared = log
        .end
        .as_ref()
        .and_then(|e| e.ext.possibly_lost.as_ref())
        .map_or(0, |d| d.total_frames);
    let published = closed["frames_published"].as_u64().expect("count");
    eprintln!(
        "closed after overload: {closed}; subscriber: {received} frames, end {}, {declared} declared",
        log.end.is_some()
    );
    assert!(received > 0);
    // `frames_published` = confirmed by the server: each of them reached the
    // subscriber; a frame received beyond them must have been declared possibly lost.
    assert!(
        published <= received && received <= published + declared,
        "{closed}: subscriber got {received}, {declared} declared"
    );
    assert_eq!(declared, 0, "no reconnect at a 10 s ping: exact counts");
    assert_eq!(
        closed["end_delivered"],
        log.end.is_some(),
        "{closed}: the subscriber got the end"
    );
    svc.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_socket_dropped_without_end_publishes_producer_gone() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let svc = start_service(server.url(), &[]).await;
    let mut ws = connect(&svc, "/v1/streams/ws-gone").await.expect("upgrade");
    for seq in 1..=3 {
        ws.send(Message::Binary(pcm(seq))).await.expect("send");
    }
    ws.flush().await.expect("flush");
    // Give the server time to read the frames, then vanish without a close frame.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(ws);
    assert!(collector.wait_ends(1, STEP).await);
    let log = collector.log("ws-gone");
    assert_eq!(log.frames, vec![1, 2, 3]);
    let end = log.end.expect("end");
    assert_eq!(
        (end.packet.seq, end.ext.end_reason),
        (4, Some(EndReason::ProducerGone))
    );
    assert!(wait_until(STEP, || svc.ingress().active_streams() == 0).await);
    svc.shutdown().await;
}

/// The door closes `ws` with 1001 (going away), its last event naming reason `idle`.
async fn assert_closed_idle(ws: &mut Ws) {
    let (events, code) = events_until_close(ws).await;
    assert_eq!(code, Some(1001));
    assert_eq!(
        events.last().map(|e| e["reason"].clone()),
        Some("idle".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_idle_stream_is_ended_with_reason_idle() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let svc = start_service(server.url(), &[("idle_timeout_ms", "300")]).await;
    let mut ws = connect(&svc, "/v1/streams/ws-idle").await.expect("upgrade");
    ws.send(Message::Binary(pcm(1))).await.expect("send");
    assert_closed_idle(&mut ws).await;
    assert!(collector.wait_ends(1, STEP).await);
    let end = collector.log("ws-idle").end.expect("end");
    assert_eq!(
        (end.packet.seq, end.ext.end_reason),
        (2, Some(EndReason::Idle))
    );
    svc.shutdown().await;
}

/// Frames keep a connection alive: the idle timer only fires `idle_timeout` after the
/// *last* frame (the timer is moved lazily when it fires, not reset per frame).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_frames_sent_more_often_than_the_idle_timeout_keep_the_stream_open() {
    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let svc = start_service(server.url(), &[("idle_timeout_ms", "1000")]).await;
    let mut ws = connect(&svc, "/v1/streams/ws-busy").await.expect("upgrade");
    // 1.5 s of frames, one per 100 ms: longer than the timeout, never silent for it.
    for i in 1..=15 {
        ws.send(Message::Binary(pcm(i))).await.expect("send");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_closed_idle(&mut ws).await;
    assert!(collector.wait_ends(1, STEP).await);
    let log = collector.log("ws-busy");
    assert_eq!(log.frames, (1..=15).collect::<Vec<u64>>());
    let end = log.end.expect("end");
    assert_eq!(
        (end.packet.seq, end.ext.end_reason),
        (16, Some(EndReason::Idle))
    );
    svc.shutdown().await;
}

/// The real binary: ready line on stdout, SIGTERM → every stream ends with `shutdown`
/// (an `end` reaches NATS, the client gets `closed` + 1001), exit 0. A bad key exits 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_binary_prints_ready_line_and_shuts_down_gracefully_on_sigterm() {
    use tokio::io::AsyncBufReadExt;
    let bin = env!("CARGO_BIN_EXE_audio-ingress");
    let out = tokio::process::Command::new(bin)
        .args(["serve", "--set", "max_bytes=0"])
        .output()
        .await
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_bytes"));

    let server = NatsServer::start().expect("nats-server");
    let collector = Collector::start(server.url(), "inference.whisper.stream.*").await;
    let mut child = tokio::process::Command::new(bin)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--nats-url",
            server.url(),
        ])
        .env("WEIR_INGRESS_GRACE_PERIOD_MS", "2000")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(STEP, lines.next_line())
        .await
        .expect("ready in time")
        .expect("read")
        .expect("a line");
    let ready: Value = serde_json::from_str(&line).expect("ready JSON");
    assert_eq!(ready["event"], "ready");
    let ws_addr = ready["ws"].as_str().expect("ws").to_owned();
    assert!(
        ready["admin"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:"))
    );

    // Wait until the service reports NATS connected: before that, streams are refused
    // (503 not_ready).
    let admin: std::net::SocketAddr = ready["admin"]
        .as_str()
        .expect("admin")
        .parse()
        .expect("addr");
    let mut ready_ok = false;
    for _ in 0..100 {
        if http_get(admin, "/readyz").await.0 == 200 {
            ready_ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready_ok, "readyz");
    let url = format!("ws://{ws_addr}/v1/streams/bin-1");
    let (mut ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .expect("in time")
        .expect("upgrade");
    for seq in 1..=5 {
        ws.send(Message::Binary(pcm(seq))).await.expect("send");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = child.id().expect("pid");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let (events, code) = events_until_close(&mut ws).await;
    assert_eq!(code, Some(1001), "{events:?}");
    assert_eq!(
        events.last().map(|e| e["reason"].clone()),
        Some("shutdown".into())
    );
    let exit = tokio::time::timeout(STEP, child.wait())
        .await
        .expect("exit in time")
        .expect("wait");
    assert_eq!(exit.code(), Some(0));
    assert!(collector.wait_ends(1, STEP).await);
    let log = collector.log("bin-1");
    assert_eq!(log.frames, vec![1, 2, 3, 4, 5]);
    let end = log.end.expect("end");
    assert_eq!(
        (end.packet.seq, end.ext.end_reason),
        (6, Some(EndReason::Shutdown))
    );
    assert!(
        lines.next_line().await.expect("read").is_none(),
        "exactly one stdout line"
    );
}

/// A sink that refuses every frame (so that, under `gap`, each frame becomes a gap
/// marker and a `gap` event for the client) and records the `end` reasons it takes.
#[derive(Clone, Default)]
struct RefuseFrames {
    ends: std::sync::Arc<std::sync::Mutex<Vec<Option<EndReason>>>>,
}

impl weir_audio_producer::publisher::Sink for RefuseFrames {
    async fn publish(
        &self,
        _subject: async_nats::Subject,
        headers: async_nats::HeaderMap,
        payload: bytes::Bytes,
    ) -> Result<(), weir_audio_producer::publisher::SinkError> {
        use weir_audio_producer::publisher::{SinkError, SinkErrorKind};
        use weir_protocol::audio::{DecodeOptions, PacketBody, decode};
        let packet = decode(&payload, &DecodeOptions::default())
            .map_err(|e| SinkError::with_source(SinkErrorKind::Publish, "undecodable", e))?;
        match packet.body {
            PacketBody::Frame { .. } => {
                Err(SinkError::new(SinkErrorKind::Publish, "frames refused"))
            }
            PacketBody::Gap(_) => Ok(()),
            PacketBody::End => {
                let ext = weir_protocol::audio::extension::Extensions::read(|k| {
                    headers.get(k).map(|v| v.as_str())
                });
                self.ends.lock().expect("lock").push(ext.end_reason);
                Ok(())
            }
        }
    }
}

/// A client that completes the upgrade and then never reads, while the server has
/// events to send: the server's send blocks once the TCP buffers are full (both are
/// made small, so that a few KB of unread events fill them). Every send is bounded by
/// the send timeout (`ws_send_timeout_ms`): the socket is abandoned, the stream ends
/// with `producer_gone` (its `end` is published) and its slot is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_client_that_stops_reading_is_abandoned_within_the_send_timeout() {
    use weir_audio_ingress::door::Door;
    use weir_audio_ingress::shutdown::TaskTracker;
    use weir_audio_ingress::ws::router;
    use weir_audio_producer::{Ingress, Policy, StreamConfig};

    let prometheus = support::prometheus();
    let sink = RefuseFrames::default();
    let config = StreamConfig::builder()
        .policy(Policy::Gap)
        .extended_consumers(true)
        .build()
        .expect("config");
    let ingress = Ingress::with_max_streams(sink.clone(), config, 4);
    let tracker = TaskTracker::new();
    // Below the kernel's zero-window probe interval (>= 200 ms), so that a pipe that
    // only trickles open as the receiver collapses its queue still counts as stuck.
    let send_timeout = Duration::from_millis(100);
    let app = router(Door {
        ingress: ingress.clone(),
        retry_after: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(30),
        send_timeout,
        tracker,
        auth: None,
        capacity: None,
        resume: weir_audio_ingress::resume::Resume::new(Duration::ZERO).expect("resume"),
    });
    // Accepted sockets inherit the listener's small send buffer (Linux).
    let listener = tokio::net::TcpSocket::new_v4().expect("socket");
    listener.set_send_buffer_size(4096).expect("sndbuf");
    listener
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = listener.listen(16).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(1024).expect("rcvbuf");
    let tcp = tokio::time::timeout(STEP, socket.connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let (mut ws, _) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::client_async(format!("ws://{addr}/v1/streams/ws-deaf"), tcp),
    )
    .await
    .expect("upgrade in time")
    .expect("upgrade");
    assert_eq!(ingress.active_streams(), 1);
    // Frames in, never a read: each refused frame becomes a gap event for this client.
    // The flood goes on until the server stops reading (it is stuck sending) and then
    // drops the socket; the test's own deadline below bounds it.
    // Small batches with pauses, so that the server's loop is not kept busy reading
    // and gets to send the events.
    let flood = tokio::spawn(async move {
        'flood: loop {
            for _ in 0..10 {
                let frame = Message::Binary(vec![0u8; 2].into());
                match tokio::time::timeout(STEP, ws.send(frame)).await {
                    Ok(Ok(())) => {}
                    _ => break 'flood,
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        ws // kept (unread) until the test ends
    });
    let started = std::time::Instant::now();
    assert!(
        wait_until(Duration::from_secs(4), || ingress.active_streams() == 0).await,
        "the stream slot is released within the send timeout + margin: {:?}",
        ingress.streams()
    );
    let released_after = started.elapsed();
    assert_eq!(
        sink.ends.lock().expect("lock").clone(),
        vec![Some(EndReason::ProducerGone)],
        "the end is published with producer_gone"
    );
    let timeouts = prometheus
        .render()
        .lines()
        .find_map(|l| l.strip_prefix("weir_ingress_ws_send_timeouts_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(timeouts >= 1.0, "send timeout counted ({released_after:?})");
    flood.abort();
    server.abort();
}

/// Sends up to 1,000 frames at real time (one per 20 ms) until the socket refuses one.
fn real_time_frames<S>(mut tx: S) -> tokio::task::JoinHandle<()>
where
    S: futures::Sink<Message> + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        for seq in 1..=1000 {
            tick.tick().await;
            if tx.send(Message::Binary(pcm(seq))).await.is_err() {
                break;
            }
        }
    })
}
