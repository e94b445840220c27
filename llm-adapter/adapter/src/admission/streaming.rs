//! Streamed replies inside the worker: the backend's body goes to the caller as it is
//! generated, coalesced into `chunk` messages ([`super::coalesce`]), through a
//! [`StreamOut`] that the edge implements (NATS, `crate::stream`).
//!
//! Invariants a reader must not break:
//! - memory per stream is bounded: the backend hands pieces through a channel of
//!   [`PIECES_IN_FLIGHT`] pieces, and the coalescer holds at most `max_bytes` plus one
//!   piece before it must publish; a publish that cannot proceed (caller not
//!   acknowledging, NATS not taking it) stops the backend read, it never buffers;
//! - every wait (a piece, a publish, the backend) races the request's stop condition
//!   (deadline, backend timeout, cancel, shutdown), so a stream ends no later than a
//!   unary call would;
//! - a stream the caller stopped reading is aborted (the backend call is dropped) and
//!   counted by reason ([`StopReason`]); it is answered `cancelled` like a cancel, the
//!   answer is published anyway (a slow caller may still read it);
//! - chunks are numbered 1, 2, 3, ... in publish order, and the `end` the sink sends
//!   carries the count, so a caller detects a lost chunk.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::stream as s;
use weir_protocol::llm::{ErrorBody, ErrorCode, headers as h};

use super::coalesce::Coalescer;
use super::pool::Progress;
use super::stats::Stats;
use super::usage::StreamTail;
use crate::backend::{Backend, BackendReply, BackendRequest};

/// Pieces of a backend body in flight between the backend read and the publisher.
pub const PIECES_IN_FLIGHT: usize = 8;

/// How chunks are coalesced (`[stream]` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSettings {
    /// At most one `chunk` message per this interval per stream (the first piece after
    /// a quiet period goes at once).
    pub interval: Duration,
    /// Pending bytes that are published at once, whatever the interval.
    pub max_bytes: usize,
}

/// Why a stream was aborted because of its caller (`as_str`: the label value of
/// `weir_llm_stream_aborted_total`).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// Nobody is subscribed to the reply subject any more (NATS no-responders).
    CallerGone,
    /// The caller did not acknowledge chunks in time with its window full.
    CallerStalled,
    /// The NATS client did not take the chunk within the publish timeout.
    PublishTimeout,
}

/// A stream that cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStop {
    /// Why.
    pub reason: StopReason,
    /// The explanation (no body bytes).
    pub message: String,
}

/// The streaming side of one request, implemented by the edge. Every method is bounded
/// in time by the implementation (a publish timeout, an acknowledgement timeout).
pub trait StreamOut: Send + Sync + 'static {
    /// Publishes `queued` with the 1-based position and the predicted start. Best
    /// effort: a failure is not reported (the caller can ask `llm.status`).
    fn queued(&self, position: usize, predicted_start: Option<Duration>) -> BoxFuture<'_, ()>;

    /// Publishes `started` with the queue wait. Best effort.
    fn started(&self, queue_wait: Duration) -> BoxFuture<'_, ()>;

    /// Publishes chunk `seq` (1, 2, ...). Returns once the chunk is handed to NATS and
    /// the caller's window has room again; an error ends the stream.
    fn chunk(&self, seq: u64, data: Bytes) -> BoxFuture<'_, Result<(), StreamStop>>;
}

impl fmt::Debug for dyn StreamOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StreamOut")
    }
}

/// Runs one streamed call: pieces from [`Backend::call_stream`] are coalesced and
/// published through `out` until the backend ends the body, or `stop` (deadline,
/// timeout, cancel, shutdown) resolves first. On success the reply has an empty body
/// and the stream's figures as headers ([`s::TTFT_MS`], [`s::STREAM_CHUNKS`],
/// [`s::STREAM_BYTES`]), which the sink puts on `end`. Its body is the stream's last
/// bytes ([`StreamTail`]), read for the token budgets' `usage` and emptied when the
/// request is settled (`State::retire`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_stream(
    backend: &dyn Backend,
    request: BackendRequest,
    out: &dyn StreamOut,
    stats: &Stats,
    settings: StreamSettings,
    started_at: Instant,
    progress: Option<&Progress>,
    stop: impl Future<Output = ErrorBody>,
) -> Result<BackendReply, ErrorBody> {
    let deadline = request.deadline;
    let max_message = request.max_reply_bytes;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(PIECES_IN_FLIGHT);
    let call = backend.call_stream(request, tx);
    tokio::pin!(call);
    tokio::pin!(stop);
    let mut co = Coalescer::new(settings.interval, settings.max_bytes, max_message);
    let mut seq = 0u64;
    let mut sent_bytes = 0usize;
    let mut ttft = None;
    let mut result = None;
    let mut pieces_open = true;
    let mut tail = StreamTail::default();
    loop {
        let end = result.is_some() && !pieces_open;
        let now = Instant::now();
        while let Some(msg) = co.take(now, end) {
            seq += 1;
            let len = msg.len();
            // Published once `out.chunk` is called: the call can no longer be retried
            // elsewhere (the caller would get this chunk twice). While it waits for the
            // caller's window, the backend's silence is not a stall.
            if let Some(p) = progress {
                p.chunk_sent();
                p.waiting_on_caller(true);
            }
            tokio::select! {
                biased;
                e = &mut stop => return Err(e),
                r = out.chunk(seq, msg) => {
                    if let Err(st) = r {
                        stats.stream_aborted(st.reason.as_str());
                        return Err(ErrorBody::new(
                            ErrorCode::Cancelled,
                            format!("stream aborted ({}): {}; backend call aborted", st.reason.as_str(), st.message),
                        ));
                    }
                }
            }
            if let Some(p) = progress {
                p.waiting_on_caller(false);
            }
            if ttft.is_none() {
                let t = started_at.elapsed();
                stats.stream_ttft(t);
                ttft = Some(t);
            }
            stats.stream_chunk(len);
            sent_bytes += len;
        }
        if end {
            break;
        }
        let due = co.due_at();
        tokio::select! {
            biased;
            e = &mut stop => return Err(e),
            r = &mut call, if result.is_none() => result = Some(r),
            p = rx.recv(), if pieces_open => match p {
                Some(p) => {
                    tail.push(&p);
                    if let Some(pr) = progress {
                        pr.bytes();
                    }
                    co.push(&p, Instant::now());
                }
                None => pieces_open = false,
            },
            _ = tokio::time::sleep_until(due.unwrap_or(started_at)), if due.is_some() => {}
        }
    }
    match result {
        Some(Ok(mut reply)) => {
            reply.body = tail.into_bytes();
            let ttft = ttft.map(|t| (s::TTFT_MS, h::format_ms(t)));
            let figures = [
                (s::STREAM_CHUNKS, seq.to_string()),
                (s::STREAM_BYTES, sent_bytes.to_string()),
            ];
            let figures = ttft.into_iter().chain(figures);
            (reply.headers).extend(figures.map(|(n, v)| (n.to_owned(), v)));
            Ok(reply)
        }
        Some(Err(e)) => Err(super::backend_failure(&e, deadline)),
        // `end` needs a result; the loop leaves only with one.
        None => Err(ErrorBody::new(
            ErrorCode::BackendError,
            "backend stream ended without a result",
        )),
    }
}
