//! The admin HTTP listener with connection hygiene, in place of `axum::serve` (which
//! sets no header-read timeout, no idle timeout and no connection cap). The approach is
//! the ingress's (`audio-ingress/src/listener.rs`), reduced to what a localhost admin
//! port needs (no per-address fairness, no upgrades); the code is copied, not shared:
//! a shared HTTP crate is issue 9's.
//!
//! For every accepted connection, in order:
//! 1. A permit of the listener's semaphore (`admin.max_connections`). Without one the
//!    connection is refused at once: a fixed `503` + `Retry-After` JSON response is
//!    written if the socket takes it without waiting, then it is closed. The loop never
//!    waits for a slot.
//! 2. HTTP/1.1 by hyper with a timer: the request head must be complete within
//!    `admin.header_timeout_ms` from the moment the server waits for it (at accept and
//!    after each response on a keep-alive connection); at most [`MAX_HEADER_BYTES`]
//!    are buffered for it.
//! 3. A connection that moves no byte in either direction for `admin.idle_timeout_ms`
//!    is closed (a slow body, a client that does not read its response).
//!
//! Invariants: one task per open connection; every open connection holds exactly one
//! permit, released exactly once by `Drop` (it lives in the connection's I/O object);
//! every await of a connection is bounded by the header or the idle timeout.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::config::AdminConfig;
use crate::metrics as m;

/// Largest buffered request head.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

const IDLE_TICKS: u32 = 4;
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// How long a connection may take to finish its request after a stop.
const SHUTDOWN_BOUND: Duration = Duration::from_millis(500);

/// Serves `router` on `listener` with the hygiene of `cfg` until `stop` resolves.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    cfg: AdminConfig,
    stop: impl std::future::Future<Output = ()> + Send,
) {
    let (stopping_tx, stopping) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(cfg.max_connections.get()));
    let refusal = refusal_response();
    let service = TowerToHyperService::new(router);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                accept_error(&e).await;
                continue;
            }
        };
        match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(serve_connection(
                    stream,
                    permit,
                    service.clone(),
                    cfg,
                    stopping.clone(),
                ));
            }
            Err(_) => {
                metrics::counter!(m::ADMIN_CONNECTIONS_REFUSED_TOTAL).increment(1);
                // Best effort, never waiting: a fresh socket's send buffer is empty.
                let _ = stream.try_write(&refusal);
            }
        }
    }
    let _ = stopping_tx.send(true);
}

/// A per-connection accept error is skipped; anything else (e.g. out of file
/// descriptors) is logged and followed by a short pause so the loop does not spin.
async fn accept_error(e: &io::Error) {
    use io::ErrorKind as K;
    if matches!(
        e.kind(),
        K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused | K::Interrupted
    ) {
        return;
    }
    tracing::warn!(error = %e, "admin accept failed; pausing 50 ms");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}

fn refusal_response() -> Vec<u8> {
    let body = serde_json::json!({"error": {
        "code": "max_connections",
        "message": "too many open admin connections; retry later",
    }})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn serve_connection(
    stream: TcpStream,
    permit: OwnedSemaphorePermit,
    service: TowerToHyperService<Router>,
    cfg: AdminConfig,
    mut stopping: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let active = Arc::new(AtomicBool::new(true));
    let io = TokioIo::new(TrackedIo {
        stream,
        active: Arc::clone(&active),
        _permit: permit,
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    // Looks every quarter of the timeout: closed after 1 to 1.25 idle timeouts.
    let tick = (cfg.idle_timeout / IDLE_TICKS).max(Duration::from_millis(1));
    let mut idle = tokio::time::interval(tick);
    idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    idle.reset();
    let mut quiet_ticks = 0;
    let mut shutting_down = false;
    let hard_stop = tokio::time::sleep(Duration::from_secs(86_400));
    tokio::pin!(hard_stop);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result
                    && e.is_timeout()
                {
                    timed_out("header");
                }
                return;
            }
            _ = idle.tick() => {
                if active.swap(false, Ordering::Relaxed) {
                    quiet_ticks = 0;
                } else {
                    quiet_ticks += 1;
                    if quiet_ticks >= IDLE_TICKS {
                        timed_out("idle");
                        return;
                    }
                }
            }
            _ = stopping.changed(), if !shutting_down => {
                shutting_down = true;
                conn.as_mut().graceful_shutdown();
                hard_stop.as_mut().reset(tokio::time::Instant::now() + SHUTDOWN_BOUND);
            }
            () = &mut hard_stop => return,
        }
    }
}

fn timed_out(reason: &'static str) {
    metrics::counter!(m::ADMIN_CONNECTIONS_TIMED_OUT_TOTAL, "reason" => reason).increment(1);
}

/// A TCP stream that notes when bytes move (for the idle watchdog) and carries the
/// connection's permit.
struct TrackedIo {
    stream: TcpStream,
    active: Arc<AtomicBool>,
    _permit: OwnedSemaphorePermit,
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
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.active.store(true, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
