//! The pull loop: pulls exactly as many requests as this replica has free intake
//! permits, and hands each to the edge with a [`Ticket`]; on stop, what the server
//! already sent for the last pull is handed back (`-NAK`).
//!
//! Invariants: a message is pulled only with a permit, which moves into its ticket;
//! nothing from the network panics (a message without a reply subject is terminated);
//! a redelivered request's kept answer is looked up off the loop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use async_nats::{HeaderMap, Subject};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, ErrorCode, ErrorDetails};
use weir_service::clock::unix_ms_now;
use weir_service::ratelimit::LogLimit;

use super::kept::{Replay, replay_kept};
use super::ticket::Hub;
use super::{
    PULL_EXPIRES, PULL_RETRY, Pulled, Settle, TermReason, Ticket, absolute_deadline, conflict,
    fingerprint, send_ack, set_deadline, valid_reply_subject,
};
use crate::config::Config;
use crate::metrics as m;
use crate::service::{Edge, header};

pub(super) struct PullCtx {
    pub(super) consumer: consumer::PullConsumer,
    pub(super) hub: Arc<Hub>,
    pub(super) edge: Arc<Edge>,
    pub(super) permits: Arc<Semaphore>,
    pub(super) config: Arc<Config>,
    pub(super) stop: CancellationToken,
}

pub(super) async fn pull_loop(ctx: PullCtx) {
    loop {
        if ctx.stop.is_cancelled() {
            return;
        }
        // Wait for one free permit, then take every other free one: pull exactly as
        // many requests as this replica can start.
        let first = tokio::select! {
            p = ctx.permits.clone().acquire_owned() => p,
            _ = ctx.stop.cancelled() => return,
        };
        let Ok(first) = first else { return };
        let mut permits = vec![first];
        while let Ok(p) = ctx.permits.clone().try_acquire_owned() {
            permits.push(p);
        }
        let batch = ctx
            .consumer
            .batch()
            .max_messages(permits.len())
            .expires(PULL_EXPIRES)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                metrics::counter!(m::INTAKE_PULL_ERRORS_TOTAL).increment(1);
                static PULL_FAILED: LogLimit = LogLimit::new(Duration::from_secs(10));
                if let Some(suppressed) = PULL_FAILED.allow() {
                    tracing::warn!(error = %e, suppressed, "intake pull request failed; retrying");
                }
                drop(permits);
                tokio::time::sleep(PULL_RETRY).await;
                continue;
            }
        };
        let mut stopping = false;
        loop {
            let item = if stopping {
                // Drain what the server already sent for this pull and hand it over.
                tokio::time::timeout(PULL_EXPIRES * 2, batch.next())
                    .await
                    .ok()
                    .flatten()
            } else {
                tokio::select! {
                    item = batch.next() => item,
                    _ = ctx.stop.cancelled() => { stopping = true; continue; }
                }
            };
            let Some(item) = item else { break };
            match item {
                Ok(msg) => match permits.pop() {
                    Some(permit) if !stopping && !ctx.stop.is_cancelled() => {
                        handle(&ctx, msg, permit).await;
                    }
                    // Stopping, or more than asked for (cannot happen): hand it back.
                    permit => {
                        stopping |= permit.is_some();
                        if let Some(ack) = msg.message.reply.clone() {
                            send_ack(&ctx.hub.client, &ack, AckKind::Nak(None), PULL_EXPIRES).await;
                        }
                    }
                },
                Err(e) => {
                    // A missed heartbeat or a status from the server: count it, pull again.
                    metrics::counter!(m::INTAKE_PULL_ERRORS_TOTAL).increment(1);
                    tracing::debug!(error = %e, "intake pull item error");
                    break;
                }
            }
        }
        if stopping {
            return;
        }
    }
}

async fn handle(ctx: &PullCtx, msg: jetstream::Message, permit: OwnedSemaphorePermit) {
    let received_at = Instant::now();
    metrics::counter!(m::INTAKE_PULLED_TOTAL).increment(1);
    // The stream's timestamp (the server's clock) and the delivery count, from the ack
    // subject; a subject that does not parse is treated as a first delivery now.
    let (delivered, published_ms) = msg.info().map_or_else(
        |_| (1, unix_ms_now()),
        |i| {
            let ms = i.published.unix_timestamp_nanos() / 1_000_000;
            (i.delivered, u64::try_from(ms).unwrap_or(0))
        },
    );
    let message = msg.message;
    let Some(ack) = message.reply.clone() else {
        return;
    };
    if delivered > 1 {
        metrics::counter!(m::INTAKE_REDELIVERED_TOTAL).increment(1);
    }
    let id = ctx.hub.next_id.fetch_add(1, Ordering::Relaxed);
    ctx.hub.held().insert(id, ack.clone());
    metrics::gauge!(m::INTAKE_HELD).increment(1.0);
    // The request id: `Weir-Request-Id`, else `Nats-Msg-Id` (the wire contract makes
    // them the same; a direct publisher may set only the one the stream dedups on).
    let request_id = [h::REQUEST_ID, h::NATS_MSG_ID]
        .into_iter()
        .filter_map(|name| header(message.headers.as_ref(), name))
        .map(str::trim)
        .find(|r| h::parse_id(h::REQUEST_ID, r).is_ok())
        .map(str::to_owned);
    let last_delivery = ctx
        .config
        .intake
        .jetstream()
        .is_none_or(|j| delivered >= i64::try_from(j.max_deliver.get()).unwrap_or(i64::MAX));
    // The stream dedups on `Nats-Msg-Id`: only when it is the request id can no other
    // stored message carry this request id within the duplicate window.
    let deduped =
        header(message.headers.as_ref(), h::NATS_MSG_ID).map(str::trim) == request_id.as_deref();
    let mut ticket = Ticket {
        hub: ctx.hub.clone(),
        id,
        ack,
        term: false,
        request_id,
        fingerprint: fingerprint(
            crate::service::session_of(&message).as_deref(),
            &message.payload,
        ),
        kept: None,
        last_delivery,
        _permit: permit,
    };
    let hm = message.headers.as_ref();
    let reply = header(hm, h::REPLY_TO)
        .map(str::trim)
        .filter(|s| valid_reply_subject(s));
    let Some(reply) = reply.map(Subject::from) else {
        // Without a readable header block (the NATS client delivers a block it cannot
        // decode as none) there is no reply subject either: terminated on this first
        // delivery, never redelivered.
        let reason = match hm {
            None => TermReason::NoHeaders,
            Some(_) => TermReason::NoReply,
        };
        ticket.terminate(reason);
        tracing::debug!(
            reason = reason.as_str(),
            "intake message without a valid Weir-Reply-To: terminated"
        );
        ticket.settle(Settle::Answered).await;
        return;
    };
    // A redelivered request may have been answered by a replica that died (or whose
    // `+ACK` was lost) after its answer was kept: the kept answer is sent again instead
    // of running it twice (the caller may receive the same answer twice). So is a
    // request whose id the stream does not dedup on (`Nats-Msg-Id` absent or another
    // value), on any delivery. A kept answer of another body or session refuses it
    // `request_id_conflict`. The check runs off the pull loop: a bucket in a leader
    // election answers no read for seconds, and the batch's other requests must not
    // wait behind it (nor go without progress).
    if (delivered > 1 || !deduped) && ctx.hub.replies.is_some() && ticket.request_id.is_some() {
        let (hub, edge, config) = (ctx.hub.clone(), ctx.edge.clone(), ctx.config.clone());
        tokio::spawn(async move {
            match replay_kept(&hub, ticket, &reply, delivered).await {
                Replay::Done => {}
                Replay::Run(ticket) => {
                    let pulled = (message, reply, ticket);
                    admit_pulled(&edge, &config, pulled, published_ms, received_at).await;
                }
                Replay::Conflict(mut ticket) => {
                    ticket.terminate(TermReason::RequestIdConflict);
                    let rid = ticket.request_id.clone().unwrap_or_default();
                    let pulled = Pulled {
                        message,
                        reply,
                        ticket,
                    };
                    edge.refuse(pulled, conflict(&rid), received_at).await;
                }
            }
        });
        return;
    }
    let pulled = (message, reply, ticket);
    admit_pulled(&ctx.edge, &ctx.config, pulled, published_ms, received_at).await;
}

/// The rest of a pulled request's way in: its deadline made absolute (refused and
/// terminated when it passed in the stream), then the edge's admission.
async fn admit_pulled(
    edge: &Arc<Edge>,
    config: &Config,
    (message, reply, ticket): (async_nats::Message, Subject, Ticket),
    published_ms: u64,
    received_at: Instant,
) {
    let hm = message.headers.as_ref();
    let deadline = absolute_deadline(
        header(hm, h::DEADLINE_MS),
        header(hm, h::TIMEOUT_MS),
        published_ms,
        config.admission.deadline.default,
    );
    let now_ms = unix_ms_now();
    let (message, expired) = match deadline {
        // A malformed deadline header: the decoder refuses it, naming the header.
        Err(()) => (message, false),
        Ok(d) => {
            let mut message = message;
            let headers = set_deadline(message.headers.as_ref().unwrap_or(&HeaderMap::new()), d);
            message.headers = Some(headers);
            (message, d.is_some_and(|d| d <= now_ms))
        }
    };
    let mut pulled = Pulled {
        message,
        reply,
        ticket,
    };
    if expired {
        pulled.ticket.terminate(TermReason::Expired);
        let err = ErrorBody::new(
            ErrorCode::DeadlineExceeded,
            "deadline passed while the request waited in the durable intake; not started",
        )
        .with_details(ErrorDetails {
            budget_ms: Some(0),
            ..Default::default()
        });
        edge.refuse(pulled, err, received_at).await;
        return;
    }
    edge.admit(pulled).await;
}
