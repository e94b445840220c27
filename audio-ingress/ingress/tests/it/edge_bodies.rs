//! Request bodies and the admin port under hostile clients, against the real binary:
//! a WHIP offer whose body trickles is cut off by the body deadline or the minimum
//! rate; the producer token is checked before the body is read; silent connections
//! filling the admin port do not keep health probes out.
//!
//! Short timings here; the defaults (10 s, 1,024 bytes/s) are measured with the
//! release binary by `audio-ingress/ingress/tests/python/slow_body_probe.py` (figures in
//! docs/audio-ingress.md, "Connection hygiene").

use crate::support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use support::{Binary, STEP, http_get, raise_fd_limit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use weir_testkit::NatsServer;

const WHIP: (&str, &str) = ("whip_udp_listen", "127.0.0.1:0");

/// A TCP connection to `to` from the loopback address 127.0.0.`last`.
async fn connect_from(last: u8, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))
        .expect("bind");
    tokio::time::timeout(STEP, socket.connect(to))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// A WHIP POST announcing 60,000 body bytes, then one byte every 200 ms until the
/// server answers or closes: (closed, time from the head to the close, what the
/// server sent).
async fn slow_body(mut s: TcpStream, i: usize, bound: Duration) -> (bool, Duration, String) {
    let head = format!(
        "POST /v1/whip/slow-{i} HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\n\
         Content-Length: 60000\r\n\r\nv"
    );
    let t0 = Instant::now();
    if s.write_all(head.as_bytes()).await.is_err() {
        return (true, t0.elapsed(), String::new());
    }
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(bound, async {
        loop {
            tokio::select! {
                r = s.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                },
                _ = tick.tick() => {
                    // A write error is the server's close; the read sees it too.
                    let _ = s.write_all(b"=").await;
                }
            }
        }
    })
    .await
    .is_ok();
    (
        closed,
        t0.elapsed(),
        String::from_utf8_lossy(&got).into_owned(),
    )
}

async fn slow_bodies(bin: &Binary, n: usize, bound: Duration) -> Vec<(bool, Duration, String)> {
    let mut set = JoinSet::new();
    for i in 0..n {
        let s = connect_from(2 + (i % 4) as u8, bin.ws).await;
        set.spawn(slow_body(s, i, bound));
    }
    set.join_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_whip_bodies_are_cut_off_by_the_body_deadline() {
    raise_fd_limit();
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[
            WHIP,
            ("http_body_timeout_ms", "1500"),
            ("http_body_min_rate", "0"),
        ],
    )
    .await;
    let ended = slow_bodies(&bin, 40, Duration::from_secs(8)).await;
    let closed = ended.iter().filter(|e| e.0).count();
    let slowest = ended.iter().map(|e| e.1).max().unwrap_or_default();
    eprintln!("deadline: {closed}/40 closed, slowest {slowest:?}");
    assert_eq!(closed, 40, "every slow body is closed");
    // 1.5 s deadline; the bound leaves room for a loaded machine.
    assert!(slowest < Duration::from_secs(5), "{slowest:?}");
    for (_, _, text) in &ended {
        assert!(text.starts_with("HTTP/1.1 408 "), "{text}");
        assert!(text.contains(r#""code":"body_timeout""#), "{text}");
    }
    assert_eq!(
        bin.metric(
            "weir_ingress_http_connections_timed_out_total{listener=\"ws\",reason=\"body\"}"
        )
        .await,
        40.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_whip_bodies_are_cut_off_by_the_minimum_rate() {
    raise_fd_limit();
    let nats = NatsServer::start().expect("nats-server");
    // A long deadline: the rate (5 bytes/s sent, 1,024 needed) decides.
    let bin = Binary::start_ready(nats.url(), &[WHIP, ("http_body_timeout_ms", "60000")]).await;
    let ended = slow_bodies(&bin, 40, Duration::from_secs(10)).await;
    let closed = ended.iter().filter(|e| e.0).count();
    let slowest = ended.iter().map(|e| e.1).max().unwrap_or_default();
    eprintln!("rate: {closed}/40 closed, slowest {slowest:?}");
    assert_eq!(closed, 40);
    assert!(slowest < Duration::from_secs(6), "{slowest:?}");
    for (_, _, text) in &ended {
        assert!(text.contains(r#""code":"body_timeout""#), "{text}");
    }
    assert_eq!(
        bin.metric(
            "weir_ingress_http_connections_timed_out_total{listener=\"ws\",reason=\"body_rate\"}"
        )
        .await,
        40.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_and_the_caps_are_checked_before_the_body_is_read() {
    let nats = NatsServer::start().expect("nats-server");
    let secret = "0123456789abcdef0123456789abcdef";
    let bin = Binary::start_ready(
        nats.url(),
        &[
            WHIP,
            ("auth_required", "true"),
            ("auth_hs256_secret", secret),
        ],
    )
    .await;
    // Heads only: the body is never sent. Each is answered at once.
    let cases = [
        (
            "Content-Type: application/sdp\r\nContent-Length: 60000",
            401,
        ),
        (
            "Content-Type: application/sdp\r\nAuthorization: Bearer x.y.z\r\nContent-Length: 60000",
            401,
        ),
        (
            "Content-Type: application/sdp\r\nContent-Length: 70000",
            401,
        ),
    ];
    for (headers, status) in cases {
        let mut s = connect_from(1, bin.ws).await;
        let head = format!("POST /v1/whip/a HTTP/1.1\r\nHost: x\r\n{headers}\r\n\r\n");
        s.write_all(head.as_bytes()).await.expect("head");
        let mut buf = vec![0u8; 2048];
        let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf))
            .await
            .expect("answered without the body")
            .expect("read");
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(
            text.starts_with(&format!("HTTP/1.1 {status} ")),
            "{headers}: {text}"
        );
        // The unread body is not waited for: the connection is closed.
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest))
            .await
            .expect("closed after the answer");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_filling_the_admin_port_do_not_keep_probes_out() {
    raise_fd_limit();
    let nats = NatsServer::start().expect("nats-server");
    // The default admin cap (64) and header timeout (5 s).
    let bin = Binary::start_ready(nats.url(), &[]).await;
    let mut silent = Vec::new();
    for i in 0..80 {
        silent.push(connect_from(2 + (i % 4) as u8, bin.admin).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut ok = 0;
    for i in 0..20 {
        let path = if i % 2 == 0 { "/healthz" } else { "/readyz" };
        let (status, body) = http_get(bin.admin, path).await;
        if status == 200 {
            ok += 1;
        } else {
            eprintln!("{path}: {status} {body}");
        }
    }
    assert_eq!(
        ok, 20,
        "every probe answered 200 with 80 silent connections"
    );
    // The 16 over the cap took the slots of the oldest silent ones, and the first
    // probe one more (each probe's slot is free again when it closes).
    assert!(
        bin.metric(
            "weir_ingress_http_connections_timed_out_total{listener=\"admin\",reason=\"evicted\"}"
        )
        .await
            >= 17.0
    );
    drop(silent);
}
