//! `jetstream.forward`: the stream acknowledgements of forwarded requests, awaited off
//! the endpoint task (at most [`FORWARDS_IN_FLIGHT`] at once); a request the stream
//! refused, or did not confirm in time, is answered by the forwarding replica.
//!
//! Invariant: a forwarded request is answered by the forwarding replica only when the
//! stream did not take it (or took it as a duplicate: then with the kept answer).

use std::time::Duration;

use async_nats::jetstream::context::{PublishAckFuture, PublishError};
use async_nats::jetstream::publish::PublishAck;
use futures::StreamExt;
use tokio::time::Instant;
use tokio::time::error::Elapsed;
use weir_protocol::llm::{ErrorBody, ErrorCode};

use crate::admission::Admission;
use crate::metrics as m;

use super::reply::*;

/// Most forwarded requests whose stream acknowledgement is awaited at once.
pub(super) const FORWARDS_IN_FLIGHT: usize = 1024;

/// `queue_full`: the stream refused a forwarded request.
pub(super) fn not_stored(e: &impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::QueueFull,
        format!("the durable intake did not store the request: {e}"),
    )
}

/// `queue_full`: the stream did not acknowledge a forwarded request in time.
pub(super) fn not_confirmed(limit: Duration) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::QueueFull,
        format!(
            "the durable intake did not confirm the request within nats.publish_timeout_ms ({} ms)",
            limit.as_millis()
        ),
    )
}

/// A forwarded request waiting for the stream's acknowledgement.
pub(super) type PendingForward = (PublishAckFuture, PendingMeta);

/// What one forwarded request's future ended with.
pub(super) enum Forwarded {
    /// The stream's acknowledgement (or its timeout).
    Acked(
        Result<Result<PublishAck, PublishError>, Elapsed>,
        PendingMeta,
    ),
    /// A duplicate's wait for the original's kept answer.
    Kept(Option<crate::intake::KeptReply>, PendingMeta),
}

/// A forwarded request: who waits for its answer.
pub(super) struct PendingMeta {
    pub(super) waiter: NatsWaiter,
    pub(super) received_at: Instant,
    pub(super) request_id: Option<String>,
    /// The request's fingerprint: a duplicate gets the kept answer only when it is
    /// this request's.
    pub(super) fingerprint: String,
    /// A duplicate waits for the original's kept answer until then.
    pub(super) until: Instant,
}

/// Shared by [`forward_acks`]' answers.
pub(super) struct ForwardCtx {
    pub(super) admission: Admission<NatsSink>,
    pub(super) client: async_nats::Client,
    pub(super) limit: Duration,
    pub(super) replies: Option<async_nats::jetstream::kv::Store>,
}

/// Awaits the stream's acknowledgements of forwarded requests (at most `limit` each)
/// and answers the ones not stored (`queue_full`). A duplicate (the stream already has
/// this request id) is answered with the original's answer from the reply bucket when
/// it comes before the duplicate's own deadline (`deadline_exceeded` otherwise), or
/// `request_id_conflict` without a reply bucket. Ends when the edge is gone and every
/// pending future was handled.
pub(super) async fn forward_acks(
    mut rx: tokio::sync::mpsc::Receiver<PendingForward>,
    ctx: ForwardCtx,
) {
    let mut pending: futures::stream::FuturesUnordered<
        futures::future::BoxFuture<'static, Forwarded>,
    > = futures::stream::FuturesUnordered::new();
    let limit = ctx.limit;
    let count = |result: &'static str| {
        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => result).increment(1);
    };
    let mut open = true;
    loop {
        tokio::select! {
            p = rx.recv(), if open => match p {
                Some((ack, meta)) => {
                    pending.push(Box::pin(async move {
                        Forwarded::Acked(tokio::time::timeout(limit, ack.into_future()).await, meta)
                    }));
                }
                None => open = false,
            },
            Some(done) = pending.next(), if !pending.is_empty() => {
                let (failure, meta) = match done {
                    Forwarded::Acked(Ok(Ok(ack)), meta) if ack.duplicate => {
                        count("duplicate");
                        if let (Some(kv), Some(rid)) = (&ctx.replies, meta.request_id.clone()) {
                            let (kv, until) = (kv.clone(), meta.until);
                            pending.push(Box::pin(async move {
                                let kept = crate::intake::wait_kept_reply(kv, rid, until).await;
                                Forwarded::Kept(kept, meta)
                            }));
                            continue;
                        }
                        (
                            ErrorBody::new(
                                ErrorCode::RequestIdConflict,
                                "this request id is already in the durable intake (within \
                                 jetstream.duplicate_window_ms); its answer goes to the first \
                                 copy's reply subject",
                            ),
                            meta,
                        )
                    }
                    Forwarded::Acked(Ok(Ok(_)), _) => {
                        count("stored");
                        continue;
                    }
                    Forwarded::Acked(failed, meta) => {
                        count("failed");
                        let failure = match failed {
                            Ok(Err(e)) => not_stored(&e),
                            _ => not_confirmed(limit),
                        };
                        (failure, meta)
                    }
                    Forwarded::Kept(Some(kept), meta) if kept.answers(&meta.fingerprint) => {
                        count("joined");
                        let reply = meta.waiter.reply;
                        let publish = ctx.client.publish_with_headers(reply, kept.headers, kept.body);
                        publish_reply(limit, publish).await;
                        continue;
                    }
                    // Another request's answer (another body or session), or one that
                    // cannot be told apart (kept by an earlier version): never sent.
                    Forwarded::Kept(Some(_), meta) => {
                        count("conflict");
                        let rid = meta.request_id.clone().unwrap_or_default();
                        (crate::intake::conflict(&rid), meta)
                    }
                    Forwarded::Kept(None, meta) => (
                        ErrorBody::new(
                            ErrorCode::DeadlineExceeded,
                            "a copy of this request id is in the durable intake and was not \
                             answered within this request's budget",
                        ),
                        meta,
                    ),
                };
                ctx.admission.answer_now(meta.waiter, failure, meta.received_at).await;
            }
            else => return,
        }
    }
}
