//! Connection hygiene of the real binary: silent and slowloris
//! connections on the WebSocket port while a real producer opens a stream and the
//! admin port answers `/readyz`.
//!
//! In CI the attack is small and the header timeout short (1,000 silent, 100 slowloris,
//! `http_header_timeout_ms=1000`); the measured run quoted in docs/audio-ingress.md uses
//! the full numbers and the default configuration:
//!
//! ```text
//! WEIR_EDGE_SILENT=5000 WEIR_EDGE_SLOWLORIS=500 WEIR_EDGE_HEADER_MS=5000 \
//!   cargo test --release -p weir-audio-ingress --test edge_connections -- --nocapture
//! ```
//!
//! The attackers come from other loopback addresses than the producer (127.0.0.2 and
//! up; the producer is 127.0.0.1), `WEIR_EDGE_ATTACKER_IPS` addresses for the silent
//! connections (default 4) and one more for the slowloris ones.

use crate::support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use support::{Binary, STEP, http_get, raise_fd_limit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use weir_testkit::NatsServer;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A TCP connection to `to` from the loopback address 127.0.0.`last`.
async fn connect_from(last: u8, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))?;
    tokio::time::timeout(STEP, socket.connect(to))
        .await
        .map_err(|_| std::io::Error::other("connect timed out"))?
}

/// How an attacker connection ended: (closed by the server, time from connect to the
/// close, bytes the server sent).
type Ended = (bool, Duration, usize);

/// Waits until the server closes `s` (EOF or reset), at most `bound`.
async fn until_closed(mut s: TcpStream, opened: Instant, bound: Duration) -> Ended {
    let mut got = 0;
    let mut buf = [0u8; 512];
    let r = tokio::time::timeout(bound, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    (r.is_ok(), opened.elapsed(), got)
}

/// A slowloris client: an incomplete request head, then one more header byte every
/// 200 ms, until the server closes the connection.
async fn slowloris(mut s: TcpStream, opened: Instant, bound: Duration, i: u64) -> Ended {
    let head = format!("GET /v1/streams/slow-{i} HTTP/1.1\r\nHost: x\r\nX-Slow: ");
    if s.write_all(head.as_bytes()).await.is_err() {
        return (true, opened.elapsed(), 0);
    }
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut buf = [0u8; 512];
    let mut got = 0;
    let r = tokio::time::timeout(bound, async {
        loop {
            tokio::select! {
                r = s.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got += n,
                },
                _ = tick.tick() => {
                    if s.write_all(b"a").await.is_err() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    (r.is_ok(), opened.elapsed(), got)
}

/// A real producer: opens a stream, sends 10 frames and `end`, expects close 1000.
async fn real_producer(ws: SocketAddr, id: &str) -> Duration {
    let t0 = Instant::now();
    let (mut socket, _) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::connect_async(format!("ws://{ws}/v1/streams/{id}")),
    )
    .await
    .expect("upgrade in time")
    .expect("upgrade accepted while under attack");
    let opened = t0.elapsed();
    for _ in 0..10 {
        socket
            .send(Message::Binary(vec![0u8; 640].into()))
            .await
            .expect("send frame");
    }
    socket
        .send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("send end");
    let code = tokio::time::timeout(STEP, async {
        while let Some(m) = socket.next().await {
            if let Ok(Message::Close(f)) = m {
                return f.map(|f| u16::from(f.code));
            }
        }
        None
    })
    .await
    .expect("close in time");
    assert_eq!(code, Some(1000), "{id}: stream ended normally");
    opened
}

fn summarize(ended: &[Ended]) -> (usize, Duration, usize) {
    let closed = ended.iter().filter(|e| e.0).count();
    let slowest = ended.iter().map(|e| e.1).max().unwrap_or_default();
    let answered = ended.iter().filter(|e| e.2 > 0).count();
    (closed, slowest, answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slowloris_connections_are_closed_and_do_not_lock_out_producers_or_readyz() {
    raise_fd_limit();
    let silent = env_or("WEIR_EDGE_SILENT", 1000);
    let slow = env_or("WEIR_EDGE_SLOWLORIS", 100);
    let header_ms = env_or("WEIR_EDGE_HEADER_MS", 1000);
    let ips = env_or("WEIR_EDGE_ATTACKER_IPS", 4).clamp(1, 200) as u8;
    let header = Duration::from_millis(header_ms);
    // The close may come up to one accept lag after the timeout (the client's clock
    // starts at its connect, the server's at its accept).
    let slack = Duration::from_millis(1000);

    let nats = NatsServer::start().expect("nats-server");
    let header_text = header_ms.to_string();
    let mut sets = Vec::new();
    if header_ms != 5000 {
        sets.push(("http_header_timeout_ms", header_text.as_str()));
    }
    let bin = Binary::start_ready(nats.url(), &sets).await;
    let rss_before = bin.rss_kib();

    let t_attack = Instant::now();
    let mut silent_set = JoinSet::new();
    for i in 0..silent {
        let from = 2 + (i % u64::from(ips)) as u8;
        let s = connect_from(from, bin.ws).await.expect("silent connect");
        silent_set.spawn(until_closed(s, Instant::now(), header + slack + STEP));
    }
    let mut slow_set = JoinSet::new();
    for i in 0..slow {
        let s = connect_from(2 + ips, bin.ws)
            .await
            .expect("slowloris connect");
        slow_set.spawn(slowloris(s, Instant::now(), header + slack + STEP, i));
    }
    let attack_open = t_attack.elapsed();

    // Under attack: /readyz and real producers.
    let mut readyz_max = Duration::ZERO;
    for _ in 0..10 {
        let t = Instant::now();
        let (status, _) = http_get(bin.admin, "/readyz").await;
        readyz_max = readyz_max.max(t.elapsed());
        assert_eq!(status, 200, "/readyz under attack");
    }
    let mut producer_max = Duration::ZERO;
    for p in 0..3 {
        producer_max = producer_max.max(real_producer(bin.ws, &format!("real-{p}")).await);
    }
    let rss_peak = bin.rss_kib();
    let open_under_attack = bin
        .metric("weir_ingress_http_connections_open{listener=\"ws\"}")
        .await;

    let silent_ended: Vec<Ended> = silent_set.join_all().await;
    let slow_ended: Vec<Ended> = slow_set.join_all().await;
    let (silent_closed, silent_slowest, silent_refused) = summarize(&silent_ended);
    let (slow_closed, slow_slowest, _) = summarize(&slow_ended);
    let timed_out = bin
        .metric("weir_ingress_http_connections_timed_out_total{listener=\"ws\",reason=\"header\"}")
        .await;
    let refused = bin
        .metric("weir_ingress_http_connections_refused_total{listener=\"ws\"")
        .await;
    let rss_after = bin.rss_kib();
    eprintln!(
        "edge_connections: silent={silent} slowloris={slow} attacker_ips={} header_ms={header_ms} \
         attack_open_ms={} open_under_attack={open_under_attack} refused_at_accept={refused} \
         timed_out_header={timed_out} readyz_max_ms={:.1} producer_open_max_ms={:.1} \
         silent_closed={silent_closed} silent_answered_503={silent_refused} \
         silent_slowest_close_ms={} slowloris_closed={slow_closed} slowloris_slowest_close_ms={} \
         rss_kib before={rss_before} peak={rss_peak} after={rss_after}",
        ips + 1,
        attack_open.as_millis(),
        readyz_max.as_secs_f64() * 1e3,
        producer_max.as_secs_f64() * 1e3,
        silent_slowest.as_millis(),
        slow_slowest.as_millis(),
    );
    assert_eq!(
        silent_closed as u64, silent,
        "every silent connection closed"
    );
    assert_eq!(
        slow_closed as u64, slow,
        "every slowloris connection closed"
    );
    assert!(
        silent_slowest <= header + slack,
        "silent closed within the header timeout: {silent_slowest:?}"
    );
    assert!(
        slow_slowest <= header + slack,
        "slowloris closed within the header timeout: {slow_slowest:?}"
    );
    // Correctness bounds only; the timing figures are the measured run's.
    assert!(readyz_max < Duration::from_secs(1), "{readyz_max:?}");
    assert!(
        rss_peak < rss_before + 128 * 1024,
        "RSS grew by more than 128 MiB: {rss_before} -> {rss_peak} KiB"
    );
    assert!(
        timed_out + refused >= (silent + slow) as f64,
        "every attacker was timed out or refused: {timed_out} + {refused}"
    );
    // The slot goes when the server's connection task ends, a moment after the client
    // saw its close: wait for it (bounded).
    let deadline = Instant::now() + STEP;
    let mut open = f64::NAN;
    while Instant::now() < deadline {
        open = bin
            .metric("weir_ingress_http_connections_open{listener=\"ws\"}")
            .await;
        if open == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(open, 0.0, "every slot released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_is_held_to_its_share_and_refused_with_a_json_503() {
    raise_fd_limit();
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[
            ("max_connections", "40"),
            ("max_connections_per_ip", "10"),
            ("http_header_timeout_ms", "2000"),
        ],
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(connect_from(2, bin.ws).await.expect("connect"));
    }
    // The 11th from the same address is refused at once, with the JSON body.
    let mut s = connect_from(2, bin.ws).await.expect("connect");
    let mut buf = Vec::new();
    tokio::time::timeout(STEP, s.read_to_end(&mut buf))
        .await
        .expect("closed at once")
        .ok();
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 503 "), "{text}");
    assert!(text.contains("retry-after: 1"), "{text}");
    assert!(
        text.contains(r#""code":"max_connections_per_ip""#),
        "{text}"
    );
    // Another address is still served.
    real_producer(bin.ws, "other-address").await;
    assert_eq!(
        bin.metric(
            "weir_ingress_http_connections_refused_total{listener=\"ws\",reason=\"per_ip\"}"
        )
        .await,
        1.0
    );
    drop(held);
}

#[tokio::test]
async fn a_cap_above_the_fd_limit_is_refused_with_exit_2() {
    let out = tokio::time::timeout(
        STEP,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--set",
                "max_connections=1000000",
                "--set",
                "max_connections_per_ip=1000",
            ])
            .env("RUST_LOG", "warn")
            .output(),
    )
    .await
    .expect("exits in time")
    .expect("runs");
    let hard = {
        use nix::sys::resource::{Resource, getrlimit};
        getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit").1
    };
    if hard >= 1_000_000 + 64 + 64 {
        eprintln!("hard open-file limit {hard} fits the cap: nothing to check");
        return;
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("max_connections"), "{stderr}");
    assert!(stderr.contains("RLIMIT_NOFILE"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_that_goes_quiet_is_closed_by_the_idle_timeout() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[
            ("http_header_timeout_ms", "60000"),
            ("http_idle_timeout_ms", "300"),
        ],
    )
    .await;
    for addr in [bin.admin, bin.ws] {
        let mut s = connect_from(1, addr).await.expect("connect");
        let t0 = Instant::now();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("request");
        // One response (200 on admin, 404 on the WebSocket port), then the connection
        // stays open, quiet, waiting for a next request that never comes.
        let (closed, after, got) = until_closed(s, t0, STEP).await;
        assert!(closed && got > 0, "{addr}: answered then closed");
        assert!(
            after >= Duration::from_millis(300) && after < Duration::from_secs(2),
            "{addr}: closed after {after:?}, not within the idle timeout"
        );
    }
    assert_eq!(
        bin.metric(
            "weir_ingress_http_connections_timed_out_total{listener=\"admin\",reason=\"idle\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_answers_while_the_websocket_port_is_full() {
    raise_fd_limit();
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[
            ("max_connections", "20"),
            ("max_connections_per_ip", "20"),
            ("http_header_timeout_ms", "10000"),
        ],
    )
    .await;
    let mut held = Vec::new();
    for i in 0..20u8 {
        held.push(connect_from(2 + i % 4, bin.ws).await.expect("connect"));
    }
    // Let the server accept all of them.
    let deadline = Instant::now() + STEP;
    while bin
        .metric("weir_ingress_http_connections_open{listener=\"ws\"}")
        .await
        < 20.0
    {
        assert!(Instant::now() < deadline, "20 connections accepted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The WebSocket port is full: a producer gets 503 max_connections at once.
    let url = format!("ws://{}/v1/streams/late", bin.ws);
    match tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .expect("answer in time")
    {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 503);
            let body: serde_json::Value =
                serde_json::from_slice(resp.body().as_deref().unwrap_or_default())
                    .expect("json body");
            assert_eq!(body["error"]["code"], "max_connections");
        }
        // The refusal can also arrive as a reset when the request was already sent.
        Err(_) => {}
        Ok(_) => panic!("upgrade accepted on a full port"),
    }
    // The admin port answers all three within 100 ms each.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let t = Instant::now();
        let (status, _) = http_get(bin.admin, path).await;
        let took = t.elapsed();
        assert_eq!(status, 200, "{path}");
        eprintln!("{path}: {took:?} with the WebSocket port full");
        assert!(took < Duration::from_secs(1), "{path}: {took:?}");
    }
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_silent_and_slowloris_connections_open_shuts_down_cleanly() {
    use tokio::io::AsyncBufReadExt;
    let nats = NatsServer::start().expect("nats-server");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--nats-url", nats.url()])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut out = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready: serde_json::Value = serde_json::from_str(
        &tokio::time::timeout(STEP, out.next_line())
            .await
            .expect("ready in time")
            .expect("read")
            .expect("line"),
    )
    .expect("json");
    let ws: SocketAddr = ready["ws"].as_str().expect("ws").parse().expect("addr");
    let mut held = Vec::new();
    for _ in 0..50 {
        held.push(connect_from(2, ws).await.expect("connect"));
    }
    let mut slow = connect_from(3, ws).await.expect("connect");
    slow.write_all(b"GET /v1/streams/x HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("partial head");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pid = child.id().expect("pid");
    let t0 = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let mut stderr = String::new();
    let mut err = child.stderr.take().expect("stderr");
    tokio::time::timeout(STEP, err.read_to_string(&mut stderr))
        .await
        .expect("exits in time")
        .expect("read stderr");
    let code = tokio::time::timeout(STEP, child.wait())
        .await
        .expect("exits")
        .expect("wait");
    eprintln!("exited {code} {:?} after SIGTERM", t0.elapsed());
    assert!(code.success());
    let done = stderr
        .lines()
        .find(|l| l.contains("shutdown complete"))
        .expect("shutdown complete logged");
    // Connections that never upgraded do not hold the shutdown (they hold no stream).
    assert!(
        done.contains("handlers_done") && done.contains("true"),
        "{done}"
    );
    drop((held, slow));
}
