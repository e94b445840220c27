//! Serving an axum router on a TCP listener with connection hygiene, in place of
//! `axum::serve` (which sets no header-read timeout, no idle timeout and no connection
//! cap): the accept loop of every HTTP port weir has (the ingress's WebSocket and admin
//! ports, the adapter's admin port). Each service names its metrics
//! ([`ListenerMetrics`]).
//!
//! For every accepted connection, in order:
//! 1. A [`ConnPermit`] from the listener's [`ConnLimiter`] (e.g. the ingress's
//!    `max_connections`, `max_connections_per_ip`; admin: `admin_max_connections`). Without one the
//!    connection is refused at once: a fixed `503` + `Retry-After` JSON response is
//!    written if the socket takes it without waiting, then it is closed. The loop never
//!    waits for a slot, so a flood cannot park real clients in the kernel's accept
//!    queue behind a full cap.
//! 2. HTTP/1.1 by hyper with a timer: the request head must be complete within
//!    `http_header_timeout_ms` from the moment the server waits for it (at accept, and
//!    after each response on a keep-alive connection), and at most
//!    `http_max_header_bytes` are buffered for it. Silent and slowloris connections are
//!    closed when it expires.
//! 3. Before an upgrade, a connection that moves no byte in either direction for
//!    `http_idle_timeout_ms` is closed (a stalled body, a client that does not read its
//!    response).
//! 4. Every request body is bounded ([`body`]): complete within `http_body_timeout_ms`
//!    of its head, and at least `http_body_min_rate` bytes/s after a 1 s grace; a body
//!    that trickles fails where the handler reads it, and the connection is closed
//!    after the answer. Each request carries its client's address ([`PeerAddr`]).
//! 5. With [`ConnLimiter::evict_silent_when_full`] (the admin ports), a new connection
//!    to a full cap takes the slot of the one that has waited longest for a request
//!    head, which is closed.
//! 6. After a WebSocket upgrade the socket belongs to the WebSocket handler (the
//!    ingress's, with its own idle timeout and send timeout); the permit lives inside
//!    the socket's I/O object and is released when the socket is closed.
//!
//! Invariants: one task per open connection, none per request or frame; every open
//! connection holds exactly one permit, released exactly once by `Drop`; the number of
//! open connections, hence of file descriptors, is bounded by the cap (the ingress keeps
//! it below `RLIMIT_NOFILE` at start); every await before the upgrade is bounded by the
//! header, body or idle timeout.

pub mod body;
pub mod conn_limit;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub use body::{BodyLimits, BodyTimeout};
pub use conn_limit::{Client, ConnLimiter, ConnPermit, ConnRefused, SlotHandle};

/// The client address of a request, in its extensions (`axum::Extension<PeerAddr>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// Label of every listener metric: which listener (`ws`, `admin`).
pub const LABEL_LISTENER: &str = "listener";
/// Label: why a connection was refused or timed out.
pub const LABEL_REASON: &str = "reason";

/// The metric names of one listener (each service keeps its names in its own metrics
/// module); every series carries [`LABEL_LISTENER`]. (The open-connections gauge is the
/// [`ConnLimiter`]'s.)
#[derive(Debug, Clone, Copy)]
pub struct ListenerMetrics {
    /// Counter: connections accepted.
    pub connections_total: &'static str,
    /// Counter: connections refused at accept, by [`LABEL_REASON`].
    pub refused_total: &'static str,
    /// Counter: connections closed by the header or idle timeout, bodies cut off by the
    /// body bounds (`body`, `body_rate`), admin connections evicted (`evicted`), by
    /// [`LABEL_REASON`].
    pub timed_out_total: &'static str,
    /// Counter: accept errors other than a peer's reset (e.g. out of descriptors).
    pub accept_errors_total: &'static str,
}

/// The hygiene settings of one listener.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Metric label: `ws` or `admin`.
    pub name: &'static str,
    /// Bound on receiving a request head.
    pub header_timeout: Duration,
    /// Bound on a connection moving no byte before an upgrade.
    pub idle_timeout: Duration,
    /// Largest buffered request head (at least 8,192).
    pub max_header_bytes: usize,
    /// Bounds on reading a request body.
    pub body: BodyLimits,
    /// `Retry-After` of the refusal when the cap is full.
    pub retry_after: Duration,
    /// The listener's metric names.
    pub metrics: ListenerMetrics,
    /// `SO_SNDBUF` of each accepted socket (`None`: the kernel's autotuning, up to
    /// `net.ipv4.tcp_wmem`'s maximum, 4 MiB by default). A bound here bounds what a
    /// peer that stops reading leaves queued in the kernel, and how long before a
    /// bounded send notices it.
    pub send_buffer: Option<usize>,
}

/// Accepts connections on `listener` and serves `router` on each, until `stop`
/// resolves (a oneshot receiver also resolves when its sender is dropped).
///
/// - Each accepted connection takes a permit from `limiter` (which may evict a silent
///   connection to make room, if the limiter was built to). When the cap (total or per
///   IP) is full, the socket gets a fixed `503` with a JSON error body and `Retry-After`,
///   is closed, and is counted in `refused_total{reason}`; it is never queued.
/// - A served connection runs in its own task with HTTP/1.1 and upgrades, the header
///   timeout, the head-size bound, the body bounds and the idle watchdog of `options`;
///   its permit follows the socket through an upgrade.
/// - A failed accept of one connection is skipped; any other accept error is counted
///   and logged (rate-limited) and the loop pauses 50 ms before accepting again.
/// - On `stop` the accept loop ends and the function returns at once, without waiting
///   for the connections: those that have not upgraded finish the request in progress
///   and close (idle keep-alive ones at once), and any still open 500 ms later is
///   dropped. Upgraded connections are not ended here; their owner stops them.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limiter: ConnLimiter,
    options: HttpOptions,
    stop: impl std::future::Future + Send,
) {
    let (stopping_tx, stopping) = watch::channel(false);
    let refusal_full = refusal_response(
        "max_connections",
        "too many open connections; retry later",
        options.retry_after,
    );
    let refusal_ip = refusal_response(
        "max_connections_per_ip",
        "too many open connections from this address; retry later",
        options.retry_after,
    );
    let options = Arc::new(options);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                accept_error(&options, &e).await;
                continue;
            }
        };
        match limiter.try_acquire(peer.ip()) {
            Ok(permit) => {
                metrics::counter!(options.metrics.connections_total, LABEL_LISTENER => options.name)
                    .increment(1);
                let conn = serve_connection(
                    stream,
                    peer,
                    permit,
                    router.clone(),
                    Arc::clone(&options),
                    stopping.clone(),
                );
                tokio::spawn(conn);
            }
            Err(refused) => {
                metrics::counter!(options.metrics.refused_total,
                    LABEL_LISTENER => options.name, LABEL_REASON => refused.as_label())
                .increment(1);
                let body = match refused {
                    ConnRefused::Full { .. } => &refusal_full,
                    ConnRefused::PerIp { .. } => &refusal_ip,
                };
                // Best effort, never waiting: a fresh socket's send buffer is empty.
                let _ = stream.try_write(body);
                drop(stream);
            }
        }
    }
    let _ = stopping_tx.send(true);
}

/// Accept failed: a per-connection error (the peer reset before accept) is skipped at
/// once; anything else (e.g. `EMFILE`, out of file descriptors) is logged, counted and
/// followed by a short pause, so the loop does not spin while the cause persists.
async fn accept_error(options: &HttpOptions, e: &io::Error) {
    use io::ErrorKind as K;
    if matches!(
        e.kind(),
        K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused | K::Interrupted
    ) {
        return;
    }
    metrics::counter!(options.metrics.accept_errors_total, LABEL_LISTENER => options.name)
        .increment(1);
    static ACCEPT_FAILED: crate::ratelimit::LogLimit =
        crate::ratelimit::LogLimit::new(Duration::from_secs(10));
    if let Some(suppressed) = ACCEPT_FAILED.allow() {
        tracing::warn!(listener = options.name, error = %e, suppressed, "accept failed; pausing 50 ms");
    }
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}

const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// The fixed HTTP response of a refused connection.
fn refusal_response(code: &str, message: &str, retry_after: Duration) -> Vec<u8> {
    let body = serde_json::json!({"error": {"code": code, "message": message}}).to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        retry_after.as_secs().max(1),
        body.len()
    )
    .into_bytes()
}

/// Serves one connection until it closes, upgrades, times out or the listener stops.
async fn serve_connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    permit: ConnPermit,
    router: Router,
    options: Arc<HttpOptions>,
    mut stopping: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    if let Some(bytes) = options.send_buffer {
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(bytes);
    }
    let slot = permit.handle();
    let service = {
        let slot = slot.clone();
        let limits = options.body;
        let report = body::Report {
            listener: options.name,
            counter: options.metrics.timed_out_total,
        };
        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let slot = slot.clone();
            let router = router.clone();
            async move {
                slot.request_started();
                let mut req =
                    req.map(|b| axum::body::Body::new(body::DeadlineBody::new(b, limits, report)));
                req.extensions_mut().insert(PeerAddr(peer));
                let response = tower::ServiceExt::oneshot(router, req).await;
                slot.request_answered();
                response
            }
        })
    };
    let active = Arc::new(AtomicBool::new(true));
    let io = TokioIo::new(TrackedIo {
        stream,
        active: Arc::clone(&active),
        _permit: permit,
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout)
        .max_buf_size(options.max_header_bytes);
    let conn = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    // The idle watchdog looks every quarter of the timeout: a connection is closed
    // after between 1 and 1.25 idle timeouts without a byte moving.
    let tick = (options.idle_timeout / IDLE_TICKS).max(Duration::from_millis(1));
    let mut idle = tokio::time::interval(tick);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    idle.reset();
    let mut quiet_ticks = 0;
    let mut shutting_down = false;
    // After a stop, a connection that has not finished its request (or has not sent
    // one: hyper closes only idle keep-alive connections at once) is dropped after
    // this; it holds no stream, and the service's shutdown waits for the tasks.
    let hard_stop = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(hard_stop);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    if e.is_timeout() {
                        timed_out(&options, "header");
                    } else {
                        tracing::debug!(listener = options.name, error = %e, "connection ended with an error");
                    }
                }
                return;
            }
            _ = idle.tick() => {
                if active.swap(false, Ordering::Relaxed) {
                    quiet_ticks = 0;
                } else {
                    quiet_ticks += 1;
                    if quiet_ticks >= IDLE_TICKS {
                        timed_out(&options, "idle");
                        return;
                    }
                }
            }
            changed = stopping.changed(), if !shutting_down => {
                // Stop requested (or the listener is gone): finish the request in
                // progress, then close.
                let _ = changed;
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
                hard_stop.as_mut().reset(tokio::time::Instant::now() + SHUTDOWN_BOUND);
            }
            () = &mut hard_stop => return,
            () = slot.evicted() => {
                timed_out(&options, "evicted");
                return;
            }
        }
    }
}

const IDLE_TICKS: u32 = 4;

/// How long a connection that has not upgraded may take to finish after a stop.
const SHUTDOWN_BOUND: Duration = Duration::from_millis(500);

fn timed_out(options: &HttpOptions, reason: &'static str) {
    metrics::counter!(options.metrics.timed_out_total,
        LABEL_LISTENER => options.name, LABEL_REASON => reason)
    .increment(1);
}

/// A TCP stream that notes when bytes move (for the idle watchdog) and carries the
/// connection's permit, so that the slot follows the socket through an upgrade.
struct TrackedIo {
    stream: TcpStream,
    active: Arc<AtomicBool>,
    _permit: ConnPermit,
}

impl TrackedIo {
    /// `r`, a write, after noting whether it moved bytes.
    fn wrote(&self, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.active.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncRead for TrackedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.active.store(true, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for TrackedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener whose one route reads the whole body, with these body bounds.
    async fn listener_reading_bodies(body: BodyLimits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = Router::new().route(
            "/",
            axum::routing::post(|b: axum::body::Bytes| async move { b.len().to_string() }),
        );
        let options = HttpOptions {
            name: "test",
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            body,
            retry_after: Duration::from_secs(1),
            metrics: ListenerMetrics {
                connections_total: "t_total",
                refused_total: "t_refused",
                timed_out_total: "t_timed_out",
                accept_errors_total: "t_errors",
            },
            send_buffer: None,
        };
        let limiter = ConnLimiter::new("test", "t_open", 16, 16);
        tokio::spawn(serve(
            listener,
            router,
            limiter,
            options,
            std::future::pending::<()>(),
        ));
        addr
    }

    /// Sends a head announcing 60,000 bytes and then one byte every 50 ms: how long
    /// until the server closed, and what it answered.
    async fn trickle(addr: std::net::SocketAddr) -> (Duration, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let t0 = tokio::time::Instant::now();
        s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\na")
            .await
            .expect("head");
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let r = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                tokio::select! {
                    r = s.read(&mut buf) => match r {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    },
                    _ = tick.tick() => { let _ = s.write_all(b"a").await; }
                }
            }
        })
        .await;
        assert!(r.is_ok(), "closed within 5 s");
        (t0.elapsed(), String::from_utf8_lossy(&got).into_owned())
    }

    #[tokio::test]
    async fn a_trickling_body_is_cut_off_by_the_deadline_and_the_connection_closed() {
        let addr = listener_reading_bodies(BodyLimits {
            timeout: Duration::from_millis(300),
            min_rate: 0,
        })
        .await;
        let (took, answer) = trickle(addr).await;
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    }

    #[tokio::test]
    async fn a_trickling_body_is_cut_off_by_the_minimum_rate() {
        // 20 bytes/s sent, 1,000 needed after the 1 s grace.
        let addr = listener_reading_bodies(BodyLimits {
            timeout: Duration::from_secs(60),
            min_rate: 1000,
        })
        .await;
        let (took, _) = trickle(addr).await;
        assert!(took >= body::BODY_RATE_GRACE, "{took:?}");
        assert!(took < Duration::from_secs(4), "{took:?}");
    }

    #[tokio::test]
    async fn a_body_within_the_bounds_is_read_whole() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = listener_reading_bodies(BodyLimits::default()).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let body = "x".repeat(60_000);
        let req = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 60000\r\n\r\n{body}"
        );
        s.write_all(req.as_bytes()).await.expect("write");
        let mut got = String::new();
        s.read_to_string(&mut got).await.expect("read");
        assert!(got.starts_with("HTTP/1.1 200 "), "{got}");
        assert!(got.ends_with("60000"), "{got}");
    }

    #[test]
    fn refusal_is_complete_http_with_a_json_body() {
        let r = refusal_response("max_connections", "full", Duration::from_millis(300));
        let text = String::from_utf8(r).expect("utf8");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains("retry-after: 1\r\n"), "rounded up to 1 s");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(v["error"]["code"], "max_connections");
    }
}
