//! The naive audio ingress: the deployed task-per-frame shape, for comparison.
//!
//! Same process interface as `audio-ingress serve` (ready line, WebSocket at
//! `/v1/streams/{id}`, `GET /v1/stats`), same HTTP/WebSocket stack (axum), same subject
//! layout and packet bytes — only the design differs, as deployed:
//! - every incoming frame spawns a tokio task;
//! - the task waits on a per-stream semaphore of 3 publishes in flight, then calls
//!   `publish().await` with no timeout;
//! - nothing bounds the bytes or the age of what the tasks hold; nothing is ever
//!   refused or dropped on purpose;
//! - `end` is one more task behind the same semaphore (it can overtake frames);
//! - a socket that drops without `end` publishes nothing (the consumer must reap it);
//! - the NATS client uses the library defaults (no ping or connection timeout tuning).
//!
//! Two additions exist only to measure it and change no behaviour a consumer relies on:
//! the `Weir-Audio-Version`/`Weir-Captured-At-Ms` headers and the frame meta key
//! `captured_at_ms` (both invisible to deployed consumers, used for end-to-end latency
//! whichever of the two the consumer core reads) and the counters behind `/v1/stats`
//! (`pending_bytes` = PCM bytes held by tasks that have not published yet,
//! `pending_frames` = such tasks, `oldest_frame_age_ms` = age of the oldest of them,
//! `queue_wait_ms` = frame received → `publish()` returned).
//!
//! Invariant: a frame's pending bytes are released exactly once, by the drop of its
//! `Pending` guard, whatever way its task ends.
//!
//! **Floor mode** (`--naive-floor`, measurement only, not a design): the same process,
//! HTTP/WebSocket stack and NATS client, with the WebSocket sized like weir's door, does
//! the least any ingress must do with a frame: read it and drop it (`discard`), or read
//! it, encode the deployed `frame` packet and `publish` it inline with no header, queue
//! or task (`publish`). Its CPU
//! per frame is the floor under which no ingress on this stack and protocol can go: one
//! socket read per 20 ms message, plus one hand-over to the NATS client. Frames are
//! counted as offered (and as published), nothing else is accounted.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use weir_protocol::audio::extension::{PROTOCOL_VERSION, headers};
use weir_protocol::audio::{Packet, PacketBody};
use weir_protocol::{StreamId, SubjectTemplate, partition_of};

use crate::cli::NaiveArgs;
use crate::counters::Count;
use crate::error::{Error, ErrorKind, nats, usage};
use crate::stats::LatencyHistogram;
use crate::timeliness::unix_ms;

/// What the naive ingress does with a frame in floor mode (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Floor {
    /// Read each WebSocket message and drop it.
    Discard,
    /// Read each message, encode the deployed `frame` packet and `publish` it inline: no
    /// header, queue or task.
    Publish,
}

/// weir's door sizes (`audio-ingress/ingress/src/ws.rs`), so that the floor reads as weir does
/// (tungstenite zero-fills its read buffer before every read: 128 KiB by default).
const FLOOR_READ_BUFFER_BYTES: usize = 2 * 1024;
const FLOOR_WRITE_BUFFER_BYTES: usize = 8 * 1024;

/// Settings of the naive ingress.
#[derive(Debug, Clone)]
pub struct NaiveConfig {
    /// Audio subject template.
    pub template: SubjectTemplate,
    /// Partitions of the template.
    pub partitions: NonZeroU32,
    /// Publishes in flight per stream (3 as deployed).
    pub in_flight: usize,
    /// Floor mode: measurement only (see the module docs); `None` = the naive design.
    pub floor: Option<Floor>,
}

struct NaiveState {
    client: async_nats::Client,
    config: NaiveConfig,
    counts: Counts,
}

/// What `/v1/stats` reports (see the module docs).
#[derive(Default)]
struct Counts {
    active: Mutex<HashSet<String>>,
    streams_total: AtomicU64,
    offered: AtomicU64,
    published: AtomicU64,
    publish_errors: AtomicU64,
    pending_bytes: AtomicU64,
    pending_frames: AtomicU64,
    next_id: AtomicU64,
    pending_since: Mutex<BTreeMap<u64, Instant>>,
    queue_wait: LatencyHistogram,
}

/// One frame held by a task: counted in the pending figures until dropped.
struct Pending {
    state: Arc<NaiveState>,
    id: u64,
    bytes: u64,
    since: Instant,
}

impl Pending {
    fn new(state: &Arc<NaiveState>, bytes: u64) -> Self {
        let id = state.counts.next_id.fetch_add(1, Ordering::Relaxed);
        let since = Instant::now();
        state.counts.pending_bytes.add(bytes);
        state.counts.pending_frames.inc();
        if let Ok(mut m) = state.counts.pending_since.lock() {
            m.insert(id, since);
        }
        Self {
            state: state.clone(),
            id,
            bytes,
            since,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let counts = &self.state.counts;
        counts
            .pending_bytes
            .fetch_sub(self.bytes, Ordering::Relaxed);
        counts.pending_frames.fetch_sub(1, Ordering::Relaxed);
        if let Ok(mut m) = counts.pending_since.lock() {
            m.remove(&self.id);
        }
    }
}

/// Builds the two routers (WebSocket, admin) of the naive ingress.
pub fn routers(client: async_nats::Client, config: NaiveConfig) -> (Router, Router) {
    let state = Arc::new(NaiveState {
        client,
        config,
        counts: Counts::default(),
    });
    let ws = Router::new()
        .route("/v1/streams/{id}", get(upgrade))
        .with_state(state.clone());
    let admin = Router::new()
        .route("/v1/stats", get(stats))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    (ws, admin)
}

async fn upgrade(
    State(state): State<Arc<NaiveState>>,
    Path(id): Path<String>,
    ws: WebSocketUpgrade,
) -> Response {
    let Ok(stream) = StreamId::parse(&id) else {
        return (StatusCode::BAD_REQUEST, "unsafe stream id").into_response();
    };
    {
        let Ok(mut active) = state.counts.active.lock() else {
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        if !active.insert(id.clone()) {
            return (StatusCode::CONFLICT, "stream already active").into_response();
        }
    }
    state.counts.streams_total.inc();
    let ws = match state.config.floor {
        Some(_) => ws
            .read_buffer_size(FLOOR_READ_BUFFER_BYTES)
            .write_buffer_size(FLOOR_WRITE_BUFFER_BYTES),
        None => ws,
    };
    ws.on_upgrade(move |socket| async move {
        handle(state.clone(), stream, socket).await;
        if let Ok(mut active) = state.counts.active.lock() {
            active.remove(&id);
        }
    })
}

async fn handle(state: Arc<NaiveState>, stream: StreamId, mut socket: WebSocket) {
    let partition = partition_of(&stream, state.config.partitions);
    let subject = state.config.template.render(&stream, partition);
    let semaphore = Arc::new(Semaphore::new(state.config.in_flight.max(1)));
    let mut seq: u64 = 0;
    let published_here = Arc::new(AtomicU64::new(0));
    let floor = state.config.floor;
    while let Some(msg) = socket.recv().await {
        match msg {
            Ok(Message::Binary(pcm)) if floor.is_some() => {
                seq += 1;
                state.counts.offered.inc();
                if floor == Some(Floor::Publish) {
                    let Ok(payload) = Packet::frame(seq, pcm).encode() else {
                        continue;
                    };
                    if state.client.publish(subject.clone(), payload).await.is_ok() {
                        state.counts.published.inc();
                    }
                }
            }
            Ok(Message::Binary(pcm)) => {
                seq += 1;
                state.counts.offered.inc();
                spawn_publish(
                    &state,
                    &semaphore,
                    &subject,
                    Packet::frame(seq, pcm),
                    &published_here,
                );
            }
            Ok(Message::Text(text)) => {
                let is_end = serde_json::from_str::<serde_json::Value>(text.as_str())
                    .is_ok_and(|v| v["type"] == "end");
                if !is_end {
                    continue;
                }
                seq += 1;
                let end = spawn_publish(
                    &state,
                    &semaphore,
                    &subject,
                    Packet::end(seq),
                    &published_here,
                );
                // As deployed: wait for the end to be published, however long it takes.
                let _ = end.await;
                let frames_published = published_here.load(Ordering::Relaxed);
                let closed = serde_json::json!({
                    "type": "closed",
                    "reason": "producer",
                    "frames_published": frames_published,
                    "frames_dropped": 0,
                });
                let _ = socket.send(Message::Text(closed.to_string().into())).await;
                let _ = socket
                    .send(Message::Close(Some(CloseFrame {
                        code: 1000,
                        reason: "end".into(),
                    })))
                    .await;
                return;
            }
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    // The producer vanished: the deployed shape publishes nothing more.
}

fn spawn_publish(
    state: &Arc<NaiveState>,
    semaphore: &Arc<Semaphore>,
    subject: &str,
    packet: Packet,
    published_here: &Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let is_frame = matches!(packet.body, PacketBody::Frame { .. });
    let pending = Pending::new(state, packet.pcm().len() as u64);
    let state = state.clone();
    let semaphore = semaphore.clone();
    let subject = subject.to_owned();
    let published_here = published_here.clone();
    let captured = unix_ms();
    let packet = packet.with_captured_at_ms(is_frame.then_some(captured));
    tokio::spawn(async move {
        // The semaphore is never closed, so acquire cannot fail; if it did, the frame
        // would be counted as a publish error below.
        let permit = semaphore.acquire_owned().await;
        let result = match (permit, packet.encode()) {
            (Ok(_permit), Ok(payload)) => {
                let mut h = async_nats::HeaderMap::new();
                h.insert(headers::VERSION, PROTOCOL_VERSION.to_string().as_str());
                h.insert(headers::CAPTURED_AT_MS, captured.to_string().as_str());
                state
                    .client
                    .publish_with_headers(subject, h, payload)
                    .await
                    .map_err(|_| ())
            }
            _ => Err(()),
        };
        state.counts.queue_wait.record(pending.since.elapsed());
        match result {
            Ok(()) => {
                if is_frame {
                    state.counts.published.inc();
                    published_here.inc();
                }
            }
            Err(()) if is_frame => {
                state.counts.publish_errors.inc();
            }
            Err(()) => {}
        }
        drop(pending);
    })
}

async fn stats(State(state): State<Arc<NaiveState>>) -> Response {
    let c = &state.counts;
    let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let oldest = c
        .pending_since
        .lock()
        .ok()
        .and_then(|m| m.values().next().copied());
    let oldest_ms = oldest.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1000.0);
    let active = c.active.lock().map(|a| a.len()).unwrap_or(0);
    let body = serde_json::json!({
        "design": match state.config.floor {
            None => "naive",
            Some(Floor::Discard) => "floor_discard",
            Some(Floor::Publish) => "floor_publish",
        },
        "active_streams": active,
        "streams_total": l(&c.streams_total),
        "pending_bytes": l(&c.pending_bytes),
        "pending_frames": l(&c.pending_frames),
        "pending_bytes_limit_per_stream": null,
        "oldest_frame_age_ms": oldest_ms,
        "queue_wait_ms": c.queue_wait.percentiles(),
        "frames": {
            "offered": l(&c.offered),
            "admitted": l(&c.offered),
            "published": l(&c.published),
            "dropped": { "publish_error": l(&c.publish_errors) },
            "would_reject": 0,
        },
        "admission_rejects": 0,
        "overloads": 0,
        "gaps": 0,
        "tasks_alive": tokio::runtime::Handle::current().metrics().num_alive_tasks(),
        "nats_connected": state.client.connection_state() == async_nats::connection::State::Connected,
    });
    axum::Json(body).into_response()
}

/// Binds `addr` (the value of `flag`); the listener and its local address.
async fn bind(flag: &str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), Error> {
    let failed = |e| Error::with_source(ErrorKind::Io, format!("{flag} {addr}"), e);
    let listener = TcpListener::bind(addr).await.map_err(failed)?;
    let local = listener.local_addr().map_err(failed)?;
    Ok((listener, local))
}

/// Runs the naive ingress until stdin closes (the parent went away) or SIGTERM/Ctrl-C.
/// Prints the ready line on stdout once both listeners are bound and NATS is connected.
pub async fn serve(args: NaiveArgs) -> Result<(), Error> {
    let template = SubjectTemplate::parse(&args.subject)
        .map_err(|e| Error::with_source(ErrorKind::Usage, "--subject", e))?;
    let config = NaiveConfig {
        template,
        partitions: NonZeroU32::new(args.partitions).unwrap_or(NonZeroU32::MIN),
        in_flight: args.in_flight as usize,
        floor: args.floor,
    };
    let (nats_url, listen, admin) = (&args.nats_url, args.listen, args.admin);
    for (what, a) in [("--listen", listen), ("--admin", admin)] {
        if !a.ip().is_loopback() {
            return Err(usage(format!("{what} {a} is not a loopback address")));
        }
    }
    // As deployed: library defaults.
    let client = async_nats::connect(nats_url)
        .await
        .map_err(|e| nats(format!("cannot connect to NATS at {nats_url}"), e))?;
    let (ws_router, admin_router) = routers(client, config);
    let (ws_listener, ws_addr) = bind("--listen", listen).await?;
    let (admin_listener, admin_addr) = bind("--admin", admin).await?;
    println!(
        "{}",
        weir_protocol::admin::ReadyLine::new(
            Some(ws_addr.to_string()),
            Some(admin_addr.to_string()),
            None,
        )
        .to_line()
    );
    let ws = tokio::spawn(async move { axum::serve(ws_listener, ws_router).await });
    let adm = tokio::spawn(async move { axum::serve(admin_listener, admin_router).await });
    // The parent keeps our stdin open and never writes to it: EOF means it is gone.
    let (stdin_tx, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        let _ = stdin_tx.send(());
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::with_source(ErrorKind::Io, "cannot watch SIGTERM", e))?;
    tokio::select! {
        _ = stdin_closed => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        r = ws => return Err(Error::new(ErrorKind::Run, format!("WebSocket server stopped: {r:?}"))),
        r = adm => return Err(Error::new(ErrorKind::Run, format!("admin server stopped: {r:?}"))),
    }
    Ok(())
}
