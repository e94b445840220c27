//! The endpoint handlers ([`Edge`]): inference (decode, cluster slots for the durable
//! intake, submit), cancel, status, capabilities and limits; the durable intake's
//! admission of pulled requests; and `jetstream.forward`, which puts a core
//! request into the stream.
//!
//! Invariant: an endpoint task never spawns per message, except for a request that must
//! wait for a cluster-wide slot (the task moves on, the wait holds its intake permit).

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::service::Request;
use serde::Serialize;
use tokio::time::Instant;
use weir_protocol::WireName;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::stream as s;
use weir_protocol::llm::{EnvelopeMeta, ErrorBody, ErrorCode, HeaderError};
use weir_service::clock::unix_ms_now;
use weir_service::config::whole_ms;

use super::decode::{Known, decode, header, invalid, open_span, request_id_of};
use super::forward::{PendingForward, PendingMeta, not_confirmed, not_stored};
use super::reply::{NatsSink, NatsWaiter, publish_reply, put, put_static, render};
use super::{CancelReply, Route, StatusReply, capabilities};
use crate::admission::{Admission, Outcome, Submission};
use crate::config::Config;
use crate::intake::{Pulled, Settle, SlotRefusal, TermReason, Ticket};
use crate::metrics as m;
use crate::nats_events::AdapterEvents;
use crate::stream::{AckHub, NatsStream, StreamLimits};

/// Shared by the endpoint tasks.
pub(crate) struct Edge {
    pub(super) admission: Admission<NatsSink>,
    pub(super) events: AdapterEvents,
    pub(super) config: Arc<Config>,
    pub(super) publish_timeout: Duration,
    pub(super) client: async_nats::Client,
    pub(super) acks: AckHub,
    /// `intake = "jetstream"` with `jetstream.forward`: core requests go to the stream.
    pub(super) forward: Option<async_nats::jetstream::Context>,
    /// Where forwarded requests wait for the stream's acknowledgement.
    pub(super) forward_acks: Option<tokio::sync::mpsc::Sender<PendingForward>>,
}

impl Edge {
    pub(super) async fn reply_json(&self, req: &Request, value: &impl Serialize) {
        let body = serde_json::to_vec(value).unwrap_or_default();
        let mut headers = HeaderMap::new();
        put(&mut headers, "Content-Type", "application/json");
        let respond = req.respond_with_headers(Ok(body.into()), headers);
        publish_reply(self.publish_timeout, respond).await;
    }

    pub(super) async fn handle_infer(&self, req: Request) {
        let received_at = Instant::now();
        let Some(reply) = req.message.reply.clone() else {
            metrics::counter!(m::NO_REPLY_SUBJECT_TOTAL).increment(1);
            return;
        };
        let known = Known::read(req.message.headers.as_ref());
        if let Some(session) = known.cancel_session {
            return self.handle_cancel_session(&req, session).await;
        }
        if let Some(target) = known.cancel {
            let target = target.trim().to_owned();
            return self.handle_cancel_of(&req, target).await;
        }
        if let Some(js) = &self.forward {
            return self
                .forward(js, &req.message, reply, &known, received_at)
                .await;
        }
        self.admit_message(&req.message, reply, &known, received_at, None)
            .await;
    }

    /// Decodes one request and submits it (or answers it at once). `intake`: the
    /// request came from the durable intake (`edge` = this edge, shared); a refusal
    /// before admission terminates it, and a request that must wait for a cluster-wide
    /// wait-limit slot waits in a task of its own (at most one per intake permit), so
    /// that the pull loop keeps reading — a pulled message nobody reads gets no
    /// progress acknowledgement and is redelivered after `ack_wait`.
    pub(super) async fn admit_message(
        &self,
        message: &async_nats::Message,
        reply: async_nats::Subject,
        known: &Known<'_>,
        received_at: Instant,
        intake: Option<(Ticket, Arc<Self>)>,
    ) {
        let (mut intake, edge) = intake.unzip();
        let (envelope, mut sub) = decode(message, known, received_at);
        if let Ok(sub) = &mut sub {
            open_span(sub, envelope.as_ref().and_then(Option::as_ref));
        }
        let stream = known.stream.map(s::wants_stream).transpose();
        if (sub.is_err() || stream.is_err())
            && let Some(t) = &mut intake
        {
            t.terminate(TermReason::Invalid);
        }
        let mut waiter = NatsWaiter {
            envelope: envelope.map(|e| e.map(Box::new)),
            stream: matches!(stream, Ok(Some(true))).then(Arc::default),
            ..NatsWaiter::new(reply, message.payload.clone(), intake)
        };
        match (sub, stream) {
            (Ok(sub), Ok(wants)) => {
                // `Weir-Supersede: session`: the session's earlier requests are
                // cancelled (and answered) before this one is admitted.
                let Some(w) = self.supersede(known, &sub, waiter, received_at).await else {
                    return;
                };
                waiter = w;
                // Durable intake: the cluster-wide session cap and limits, taken as KV
                // slot leases before the local admission.
                if let Some(t) = &mut waiter.intake {
                    let keys = crate::admission::resolve_keys(self.admission.config(), &sub)
                        .unwrap_or_default();
                    match t.take_cluster_slots(sub.session.as_deref(), &keys).await {
                        Ok(()) => {}
                        Err(SlotRefusal::MustWait(from)) => {
                            // Some with every intake ticket (they come as a pair).
                            let Some(edge) = edge else {
                                return;
                            };
                            let dl = &self.config.admission.deadline;
                            let deadline = dl.budget(sub.budget).map(|b| sub.received_at + b);
                            tokio::spawn(async move {
                                let r = match &mut waiter.intake {
                                    Some(t) => t.wait_cluster_slots(from, &keys, deadline).await,
                                    None => Ok(()),
                                };
                                if let Some(waiter) = edge.after_slots(r, waiter, received_at).await
                                {
                                    edge.submit(sub, waiter, wants).await;
                                }
                            });
                            return;
                        }
                        r => {
                            let Some(w) = self.after_slots(r, waiter, received_at).await else {
                                return;
                            };
                            waiter = w;
                        }
                    }
                }
                self.submit(sub, waiter, wants).await;
            }
            (Err(err), _) => self.admission.answer_now(waiter, err, received_at).await,
            (Ok(_), Err(e)) => {
                waiter.stream = None;
                self.admission
                    .answer_now(waiter, invalid(&e), received_at)
                    .await
            }
        }
    }

    /// Settles a cluster-slot outcome: `Some` = go on to the local admission; `None`
    /// = answered (`Full`) or handed back (`Store`) here.
    pub(super) async fn after_slots(
        &self,
        r: Result<(), SlotRefusal>,
        mut waiter: NatsWaiter,
        received_at: Instant,
    ) -> Option<NatsWaiter> {
        match r {
            Ok(()) => Some(waiter),
            Err(SlotRefusal::Full(reason, err)) => {
                if let Some(t) = &mut waiter.intake {
                    t.terminate(reason);
                }
                self.admission.answer_now(waiter, *err, received_at).await;
                None
            }
            Err(SlotRefusal::Store(e)) => {
                metrics::counter!(m::INTAKE_CLUSTER_SLOTS_TOTAL, "result" => "error").increment(1);
                // On its last delivery the server would not deliver it again: answer it.
                if let Some(t) = waiter.intake.as_mut().filter(|t| t.last_delivery()) {
                    tracing::warn!(error = %e, "cluster slot store failed on a request's last delivery; refused");
                    t.terminate(TermReason::SlotStore);
                    let err = ErrorBody::new(
                        ErrorCode::QueueFull,
                        format!(
                            "the cluster slot store failed on this request's last delivery; not started: {e}"
                        ),
                    );
                    self.admission.answer_now(waiter, err, received_at).await;
                    return None;
                }
                tracing::warn!(error = %e, "cluster slot store failed; request handed back");
                if let Some(t) = waiter.intake.take() {
                    t.settle(Settle::Retry).await;
                }
                None
            }
            // Only `take_cluster_slots` asks not to wait; its caller handles this.
            Err(SlotRefusal::MustWait(_)) => Some(waiter),
        }
    }

    /// Hands a decoded request to the local admission (with its reply stream when it
    /// asked for one).
    pub(super) async fn submit(
        &self,
        mut sub: Submission,
        waiter: NatsWaiter,
        wants: Option<bool>,
    ) {
        if let (Some(true), Some(sent)) = (wants, &waiter.stream) {
            let sc = &self.config.stream;
            sub.stream = Some(Arc::new(NatsStream::new(
                self.client.clone(),
                waiter.reply.clone(),
                sub.request_id.clone(),
                &self.acks,
                StreamLimits {
                    window: sc.window,
                    ack_timeout: sc.ack_timeout,
                    publish_timeout: self.publish_timeout,
                },
                sent.clone(),
            )));
        }
        self.admission.submit(sub, waiter).await;
    }

    pub(super) async fn handle_status(&self, req: Request) {
        let target = request_id_of(&req);
        if let Err(e) = h::parse_id(h::REQUEST_ID, &target) {
            return self.reply_invalid(&req, &e).await;
        }
        let status = self.admission.status(&target);
        metrics::counter!(m::STATUS_TOTAL, "result" => status.as_str()).increment(1);
        let reply = StatusReply::new(target, status);
        self.reply_json(&req, &reply).await;
    }

    /// Answers one request taken from `route`'s endpoint.
    pub(super) async fn serve(&self, route: Route, req: Request) {
        match route {
            Route::Infer => self.handle_infer(req).await,
            Route::Cancel => match header(req.message.headers.as_ref(), h::CANCEL_SESSION) {
                Some(session) => self.handle_cancel_session(&req, session).await,
                None => self.handle_cancel_of(&req, request_id_of(&req)).await,
            },
            Route::Capabilities => {
                let value = capabilities(&self.config, &self.admission);
                self.reply_json(&req, &value).await;
            }
            Route::Limits => {
                let top = std::str::from_utf8(&req.message.payload)
                    .ok()
                    .and_then(|s| s.trim().parse::<usize>().ok())
                    .unwrap_or(20)
                    .clamp(1, 1000);
                self.reply_json(&req, &self.admission.limits_view(top))
                    .await;
            }
            Route::Status => self.handle_status(req).await,
        }
    }

    /// Answers `invalid_request` for a bad request id on the cancel or status subject.
    pub(super) async fn reply_invalid(&self, req: &Request, e: &HeaderError) {
        let outcome = Outcome::refused(invalid(e), Duration::ZERO, None);
        let (headers, body) = render(&outcome, None, usize::MAX);
        let respond = req.respond_with_headers(Ok(body), headers);
        publish_reply(self.publish_timeout, respond).await;
    }

    pub(super) async fn handle_cancel_of(&self, req: &Request, target: String) {
        if let Err(e) = h::parse_id(h::CANCEL, &target) {
            return self.reply_invalid(req, &e).await;
        }
        let result = self.admission.cancel(&target).await;
        let reply = CancelReply {
            request_id: target,
            result: result.as_str().to_owned(),
        };
        self.reply_json(req, &reply).await;
    }

    /// `jetstream.forward`: puts a core request into the durable intake, with its reply
    /// subject in `Weir-Reply-To`, its request id as `Nats-Msg-Id` and its deadline
    /// made absolute (a relative budget counts from this receipt). A malformed request
    /// is answered here; one the stream does not store is answered `queue_full`; a
    /// duplicate (same request id within the duplicate window) is answered
    /// `request_id_conflict`: the answer goes to the first copy's reply subject.
    pub(super) async fn forward(
        &self,
        js: &async_nats::jetstream::Context,
        message: &async_nats::Message,
        reply: async_nats::Subject,
        known: &Known<'_>,
        received_at: Instant,
    ) {
        let (envelope, sub) = decode(message, known, received_at);
        let waiter = |envelope: Option<Option<EnvelopeMeta>>| NatsWaiter {
            envelope: envelope.map(|e| e.map(Box::new)),
            ..NatsWaiter::new(reply.clone(), message.payload.clone(), None)
        };
        let stream = known.stream.map(s::wants_stream).transpose();
        let sub = match (sub, stream.map_err(|e| invalid(&e))) {
            // A malformed `Weir-Supersede` is refused here, not in the stream.
            (Ok(sub), Ok(_)) => match super::barge_in::wants_supersede(known, &sub) {
                Ok(_) => sub,
                Err(e) => {
                    return self
                        .admission
                        .answer_now(waiter(envelope), *e, received_at)
                        .await;
                }
            },
            (Err(e), _) | (Ok(_), Err(e)) => {
                return self
                    .admission
                    .answer_now(waiter(envelope), e, received_at)
                    .await;
            }
        };
        let deadline_ms = sub
            .budget
            .map(|b| unix_ms_now().saturating_add(whole_ms(b)));
        let mut headers = crate::intake::set_deadline(
            message.headers.as_ref().unwrap_or(&HeaderMap::new()),
            deadline_ms,
        );
        put_static(&mut headers, h::REPLY_TO, reply.as_str());
        if let Some(rid) = &sub.request_id {
            put_static(&mut headers, h::NATS_MSG_ID, rid);
            put_static(&mut headers, h::REQUEST_ID, rid);
        }
        if let Some(session) = &sub.session {
            put_static(&mut headers, h::SESSION_ID, session);
        }
        let subject = self
            .config
            .intake
            .jetstream()
            .map(|j| j.subject.clone())
            .unwrap_or_default();
        let limit = self.publish_timeout;
        let queued = tokio::time::timeout(
            limit,
            js.publish_with_headers(subject, headers, message.payload.clone()),
        )
        .await;
        let failure = match queued {
            Ok(Ok(ack)) => {
                let dl = &self.config.admission.deadline;
                let meta = PendingMeta {
                    waiter: waiter(envelope),
                    received_at,
                    request_id: sub.request_id.clone(),
                    fingerprint: crate::intake::fingerprint(sub.session.as_deref(), &sub.body),
                    until: received_at
                        + (dl.budget(sub.budget).unwrap_or(dl.max)).saturating_sub(dl.reply_margin),
                };
                // The stream's acknowledgement is awaited by the forwarding task, so
                // that this intake loop takes the next request meanwhile; the bounded
                // channel makes the loop wait when FORWARDS_IN_FLIGHT are unconfirmed (a
                // slow stream slows intake instead of growing a list).
                if let Some(tx) = &self.forward_acks
                    && let Err(e) = tx.send((ack, meta)).await
                {
                    let (_, p) = e.0;
                    self.admission
                        .answer_now(p.waiter, not_confirmed(limit), p.received_at)
                        .await;
                }
                return;
            }
            Ok(Err(e)) => not_stored(&e),
            Err(_) => not_confirmed(limit),
        };
        metrics::counter!(m::INTAKE_FORWARDED_TOTAL, "result" => "failed").increment(1);
        self.admission
            .answer_now(waiter(envelope), failure, received_at)
            .await;
    }

    /// Admits one pulled request (or answers it at once); the ticket rides in the waiter.
    pub(crate) async fn admit(self: &Arc<Self>, pulled: Pulled) {
        let received_at = Instant::now();
        let Pulled {
            message,
            reply,
            mut ticket,
        } = pulled;
        let known = Known::read(message.headers.as_ref());
        if known.cancel.is_some() || known.cancel_session.is_some() {
            ticket.terminate(TermReason::Invalid);
            let waiter = NatsWaiter::new(reply, message.payload.clone(), Some(ticket));
            let e = ErrorBody::new(
                ErrorCode::InvalidRequest,
                format!(
                    "{} on the durable intake: send cancellations to {}",
                    h::CANCEL,
                    self.config.service.cancel_subject
                ),
            );
            return self.admission.answer_now(waiter, e, received_at).await;
        }
        self.admit_message(
            &message,
            reply,
            &known,
            received_at,
            Some((ticket, Arc::clone(self))),
        )
        .await;
    }

    /// Answers a pulled request at once with `error` (the ticket settles it).
    pub(crate) async fn refuse(&self, pulled: Pulled, error: ErrorBody, received_at: Instant) {
        let waiter = NatsWaiter::new(pulled.reply, pulled.message.payload, Some(pulled.ticket));
        self.admission.answer_now(waiter, error, received_at).await;
    }
}
