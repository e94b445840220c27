//! The NATS edge: a NATS micro service (`$SRV.PING|INFO|STATS`) with four endpoints in
//! one queue group — inference, cancel, capabilities, limits.
//!
//! Inference requests: headers (`Weir-*`, see [`weir_protocol::llm::headers`]) become a
//! [`Submission`]; the body is passed to the backend unchanged and never logged. When a
//! deployed caller sends the JSON envelope without the headers, the envelope's
//! `request_id` / `session_id` stand in for them, validated like the headers (an invalid
//! one is `invalid_request` naming the envelope field, never silently ignored).
//!
//! Replies (headers, the [`ErrorBody`] or a response envelope): docs/llm-adapter.md,
//! "Reply".
//!
//! Invariants:
//! - intake never spawns per message: each endpoint has one task that decodes, submits
//!   and moves on; answers are published by whoever settles the request;
//! - every message an endpoint loop takes is counted ([`AdapterEvents::took`]), so that
//!   messages the NATS client received but dropped (slow consumer) are counted too:
//!   `in_messages − taken` (see [`crate::nats_events`]);
//! - every reply publish is bounded by `nats.publish_timeout_ms` (a publish waits
//!   without limit when the client's channel is full); a reply that cannot be published
//!   is counted (`weir_llm_reply_failed_total`), never retried or waited for;
//! - nothing from the network can panic the edge: header names/values are built with the
//!   fallible parsers, ids are validated, oversize replies become `backend_error`.
//!
//! The `$SRV.STATS` `data` of the inference endpoint is the
//! [`crate::admission::StatsSnapshot`]; the service API's own `num_requests` /
//! `num_errors` stay 0 (docs/llm-adapter.md, "Reply": the service `Request` is not kept
//! while a request waits — a waiter is just the reply subject and the body).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::service::{Service, ServiceExt};
use futures::StreamExt;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::admission::{Admission, RequestStatus, Sink};
use crate::config::Config;
use crate::intake::IntakeEdge;
use crate::nats_events::AdapterEvents;
use crate::stream::AckHub;
use weir_service::config::whole_ms;

mod barge_in;
mod decode;
mod edge;
mod forward;
mod reply;

pub(crate) use self::decode::{header, session_of};
pub(crate) use self::edge::Edge;
use self::forward::{FORWARDS_IN_FLIGHT, ForwardCtx, forward_acks};
pub use self::reply::{NatsSink, NatsWaiter};
pub(crate) use self::reply::{publish_reply, put_static};

/// The capabilities document of a running adapter: [`Config::capabilities`] plus the
/// backend's live service-time estimate under `estimator.current`, and each pool
/// member's live `health` and `estimate` under `backends[i]`.
pub fn capabilities<S: Sink>(config: &Config, admission: &Admission<S>) -> serde_json::Value {
    let mut v = config.capabilities();
    if let Some(list) = v.get_mut("backends").and_then(|b| b.as_array_mut()) {
        for (doc, live) in list.iter_mut().zip(admission.backends()) {
            if let Some(doc) = doc.as_object_mut() {
                doc.insert("health".into(), live.health.into());
                let est = serde_json::to_value(live.estimate).unwrap_or_default();
                doc.insert("estimate".into(), est);
            }
        }
    }
    if let Some(est) = v.get_mut("estimator").and_then(|e| e.as_object_mut()) {
        est.insert("backend".into(), config.backend.kind.name().into());
        est.insert(
            "current".into(),
            serde_json::to_value(admission.estimate()).unwrap_or_default(),
        );
    }
    v
}

/// Reply of the cancel endpoint (a wire schema: `weir_protocol::llm::CancelReply`).
pub use weir_protocol::llm::CancelReply;

/// Reply of the status endpoint (`llm.status`): where a request is.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct StatusReply {
    /// The request id asked about.
    pub request_id: String,
    /// `queued`, `running`, `done` or `not_found`.
    pub status: String,
    /// `queued`: 1-based position (1 = next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    /// `queued`: predicted wait before inference starts, ms (absent without an
    /// estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_start_ms: Option<u64>,
    /// `queued`: time since receipt, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_ms: Option<u64>,
    /// `running`: time since inference started, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
}

impl StatusReply {
    fn new(request_id: String, status: RequestStatus) -> Self {
        let mut r = Self {
            request_id,
            status: status.as_str().to_owned(),
            ..Self::default()
        };
        match status {
            RequestStatus::Queued {
                position,
                predicted_start,
                waited,
            } => {
                r.position = Some(position);
                r.predicted_start_ms = predicted_start.map(whole_ms);
                r.waited_ms = Some(whole_ms(waited));
            }
            RequestStatus::Running { elapsed } => r.elapsed_ms = Some(whole_ms(elapsed)),
            RequestStatus::Done | RequestStatus::NotFound => {}
        }
        r
    }
}

/// The service's endpoints, each served by one task ([`Edge::serve`]).
#[derive(Debug, Clone, Copy)]
enum Route {
    Infer,
    Cancel,
    Capabilities,
    Limits,
    Status,
}

/// The inference endpoint's name (its `$SRV.STATS` data is the admission's stats).
const INFER_ENDPOINT: &str = "infer";

/// The running NATS edge.
pub(crate) struct ServiceEdge {
    service: Option<Service>,
    tasks: Vec<JoinHandle<()>>,
    /// The acknowledgement router: it outlives the endpoints, since running streams
    /// still need their acknowledgements while shutdown drains them.
    acks: Option<JoinHandle<()>>,
    /// The durable intake's pull loop and keeper (`intake = "jetstream"`).
    intake: Option<IntakeEdge>,
}

impl ServiceEdge {
    /// Registers the service and its endpoints and starts one intake task per endpoint.
    pub(crate) async fn start(
        client: &async_nats::Client,
        config: Arc<Config>,
        admission: Admission<NatsSink>,
        events: AdapterEvents,
    ) -> Result<Self, async_nats::Error> {
        let sc = &config.service;
        let stats_admission = admission.clone();
        let service = client
            .service_builder()
            .description(&sc.description)
            .queue_group(&sc.queue_group)
            .metadata(HashMap::from([
                (
                    "weir.capabilities_subject".to_owned(),
                    sc.capabilities_subject.clone(),
                ),
                (
                    "weir.backend".to_owned(),
                    config.backend.kind.name().to_owned(),
                ),
            ]))
            .stats_handler(move |endpoint, _| {
                if endpoint == INFER_ENDPOINT {
                    serde_json::to_value(stats_admission.stats()).unwrap_or_default()
                } else {
                    serde_json::Value::Null
                }
            })
            .start(&sc.name, &sc.version)
            .await?;
        let mut endpoints = Vec::new();
        for (route, name, subject) in [
            (Route::Infer, INFER_ENDPOINT, &sc.subject),
            (Route::Cancel, "cancel", &sc.cancel_subject),
            (
                Route::Capabilities,
                "capabilities",
                &sc.capabilities_subject,
            ),
            (Route::Limits, "limits", &sc.limits_subject),
            (Route::Status, "status", &sc.status_subject),
        ] {
            let endpoint = service.endpoint_builder().name(name).add(subject).await?;
            endpoints.push((route, endpoint));
        }
        let (acks, ack_task) = AckHub::start(client, events.clone()).await?;

        let forward = config.intake.jetstream().filter(|j| j.forward).map(|_| {
            let mut js = async_nats::jetstream::new(client.clone());
            js.set_timeout(config.nats.publish_timeout);
            js
        });
        let replies = match config.intake.jetstream() {
            Some(j) => crate::intake::open_reply_bucket(client, j).await?,
            None => None,
        };
        let mut tasks = Vec::new();
        let forward_acks = forward.as_ref().map(|_| {
            let (tx, rx) = tokio::sync::mpsc::channel(FORWARDS_IN_FLIGHT);
            tasks.push(tokio::spawn(forward_acks(
                rx,
                ForwardCtx {
                    admission: admission.clone(),
                    client: client.clone(),
                    limit: config.nats.publish_timeout,
                    replies: replies.clone(),
                },
            )));
            tx
        });
        let edge = Arc::new(Edge {
            admission,
            events,
            publish_timeout: config.nats.publish_timeout,
            config: config.clone(),
            client: client.clone(),
            acks,
            forward,
            forward_acks,
        });
        let intake = match config.intake.jetstream() {
            None => None,
            Some(_) => Some(
                IntakeEdge::start(client, config.clone(), edge.clone(), replies)
                    .await
                    .map_err(|e| -> async_nats::Error { e.into() })?,
            ),
        };
        for (route, mut endpoint) in endpoints {
            let edge = edge.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(req) = endpoint.next().await {
                    edge.events.took();
                    edge.serve(route, req).await;
                }
            }));
        }
        // A round trip on this connection: once the server answered, it holds every
        // subscription above, so a request sent after `start` returned is served, not
        // refused with no-responders. Bounded: with the server unreachable the
        // subscriptions are sent on (re)connect, and the start goes on.
        let confirmed = tokio::time::timeout(config.nats.publish_timeout, client.flush()).await;
        if !matches!(confirmed, Ok(Ok(()))) {
            tracing::warn!("the server did not confirm the subscriptions yet (NATS unreachable)");
        }
        Ok(Self {
            service: Some(service),
            tasks,
            acks: Some(ack_task),
            intake,
        })
    }

    /// Stops routing stream acknowledgements (after the running requests ended) and,
    /// once the intake's requests are settled (bounded: see
    /// [`IntakeEdge::stop_keeper`]), their progress.
    pub(crate) async fn stop_acks(&mut self) {
        if let Some(t) = self.acks.take() {
            t.abort();
        }
        if let Some(i) = &mut self.intake {
            i.stop_keeper().await;
        }
    }

    /// Stops pulling from the durable intake (requests of the last pull are handed back
    /// with `-NAK`), so that other replicas take what waits in the stream. Bounded by
    /// `wait`; nothing to do for the core intake.
    pub(crate) async fn stop_intake(&mut self, wait: Duration) {
        if let Some(i) = &mut self.intake {
            i.stop_pulling(wait).await;
        }
    }

    /// Unsubscribes every endpoint; the intake tasks answer what is already buffered and
    /// end. Bounded by `wait`.
    pub(crate) async fn stop(&mut self, wait: Duration) {
        self.stop_intake(wait).await;
        if let Some(service) = self.service.take() {
            let _ = tokio::time::timeout(wait, service.stop()).await;
        }
        let tasks = std::mem::take(&mut self.tasks);
        let all = futures::future::join_all(tasks);
        if tokio::time::timeout(wait, all).await.is_err() {
            tracing::warn!("endpoint intake tasks did not end in time");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_nats::HeaderMap;
    use bytes::Bytes;
    use tokio::time::Instant;
    use weir_protocol::llm::headers as h;
    use weir_protocol::llm::{
        AdmissionPolicy, EnvelopeMeta, ErrorBody, ErrorCode, ErrorDetails, ResponseEnvelope,
    };

    use super::decode::{Known, decode};
    use super::reply::{put, render};
    use super::*;
    use crate::admission::Outcome;
    use crate::backend::BackendReply;

    fn outcome(result: Result<BackendReply, ErrorBody>) -> Outcome {
        Outcome {
            result,
            queue_time: Duration::from_micros(1500),
            inference_time: Some(Duration::from_millis(20)),
            request_id: Some("r1".into()),
        }
    }

    #[test]
    fn success_reply_carries_timings_and_passthrough_headers() {
        let reply = BackendReply {
            body: Bytes::from_static(b"{\"text\":\"hi\"}"),
            headers: vec![
                ("X-Backend".into(), "v1".into()),
                ("Bad\nName".into(), "x".into()),
            ],
        };
        let (hm, body) = render(&outcome(Ok(reply)), None, 1 << 20);
        assert_eq!(&body[..], b"{\"text\":\"hi\"}");
        assert_eq!(header(Some(&hm), h::QUEUE_MS), Some("1.500"));
        assert_eq!(header(Some(&hm), h::INFERENCE_MS), Some("20.000"));
        assert_eq!(header(Some(&hm), h::REQUEST_ID), Some("r1"));
        assert_eq!(header(Some(&hm), "x-backend"), Some("v1"));
        assert_eq!(header(Some(&hm), h::NATS_SERVICE_ERROR), None);
    }

    #[test]
    fn error_reply_has_service_headers_and_json_or_envelope_body() {
        let err = ErrorBody::new(ErrorCode::QueueFull, "queue holds 4 requests (capacity)")
            .with_details(ErrorDetails {
                limit: Some(4),
                pending: Some(4),
                retry_after_ms: Some(12),
                ..Default::default()
            });
        let (hm, body) = render(&outcome(Err(err.clone())), None, 1 << 20);
        assert_eq!(header(Some(&hm), h::NATS_SERVICE_ERROR_CODE), Some("503"));
        assert_eq!(header(Some(&hm), h::ERROR_CODE), Some("queue_full"));
        assert_eq!(
            header(Some(&hm), h::NATS_SERVICE_ERROR),
            Some("queue_full: queue holds 4 requests (capacity)")
        );
        assert_eq!(ErrorBody::from_json(&body), Some(err.clone()));

        let meta = EnvelopeMeta::detect(br#"{"trace_id":"t","request_id":"r","correlation_id":"c","session_id":"s","ts_ms":5,"data":{}}"#)
            .expect("envelope");
        let (_, body) = render(&outcome(Err(err.clone())), Some(&meta), 1 << 20);
        let env: ResponseEnvelope = serde_json::from_slice(&body).expect("envelope json");
        assert_eq!(env.meta, meta);
        assert!(!env.ok);
        assert_eq!(env.data, serde_json::Value::Null);
        assert_eq!(env.error, Some(err));
    }

    #[test]
    fn oversize_replies_become_backend_errors() {
        let reply = BackendReply::body(vec![b'x'; 5000]);
        let (hm, body) = render(&outcome(Ok(reply)), None, 4096);
        assert_eq!(header(Some(&hm), h::ERROR_CODE), Some("backend_error"));
        assert!(ErrorBody::from_json(&body).is_some());
    }

    #[test]
    fn decode_reads_headers_and_falls_back_to_the_envelope() {
        let mut hm = HeaderMap::new();
        put(&mut hm, "weir-session-id", "s-hdr");
        put(&mut hm, h::TIMEOUT_MS, "1500");
        put(&mut hm, h::ADMISSION, "reject");
        put(&mut hm, h::CLIENT_KEY, "tenant-a");
        let msg = async_nats::Message {
            subject: "llm.infer".into(),
            reply: Some("_INBOX.x".into()),
            payload: Bytes::from_static(
                br#"{"trace_id":"t","request_id":"r-env","session_id":"s-env","ts_ms":1}"#,
            ),
            headers: Some(hm),
            status: None,
            description: None,
            length: 0,
        };
        let (env, sub) = decode(&msg, &Known::read(msg.headers.as_ref()), Instant::now());
        let sub = sub.expect("valid");
        assert!(env.is_some_and(|e| e.is_some()));
        assert_eq!(sub.request_id.as_deref(), Some("r-env"));
        assert_eq!(
            sub.session.as_deref(),
            Some("s-hdr"),
            "header wins, case-insensitively"
        );
        assert_eq!(sub.client_key.as_deref(), Some("tenant-a"));
        assert_eq!(sub.policy, AdmissionPolicy::Reject);
        assert_eq!(sub.budget, Some(Duration::from_millis(1500)));

        let mut bad = msg.clone();
        let mut hm = HeaderMap::new();
        put(&mut hm, h::TIMEOUT_MS, "-5");
        bad.headers = Some(hm);
        let (env, sub) = decode(&bad, &Known::read(bad.headers.as_ref()), Instant::now());
        assert!(env.is_some_and(|e| e.is_some()));
        let err = sub.expect_err("refused");
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert!(err.message.contains(h::TIMEOUT_MS), "{}", err.message);
    }

    #[test]
    fn trace_context_is_read_and_a_malformed_one_ignored() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let msg = |traceparent: &str| {
            let mut hm = HeaderMap::new();
            put(&mut hm, "TraceParent", traceparent);
            put(&mut hm, h::TRACESTATE, "v=1");
            async_nats::Message {
                subject: "llm.infer".into(),
                reply: Some("_INBOX.x".into()),
                payload: Bytes::from_static(b"{}"),
                headers: Some(hm),
                status: None,
                description: None,
                length: 0,
            }
        };
        let m = msg(tp);
        let (_, sub) = decode(&m, &Known::read(m.headers.as_ref()), Instant::now());
        let trace = sub.expect("valid").trace.expect("read, case-insensitively");
        assert_eq!(trace.parent.to_string(), tp);
        assert_eq!(trace.state.as_deref(), Some("v=1"));
        for bad in ["00-xyz-01", "", &tp.to_uppercase()] {
            let m = msg(bad);
            let (_, sub) = decode(&m, &Known::read(m.headers.as_ref()), Instant::now());
            assert_eq!(sub.expect("never refused").trace, None, "{bad:?}");
        }
    }

    #[test]
    fn envelope_ids_are_validated_like_header_ids() {
        let msg = |body: &'static [u8]| async_nats::Message {
            subject: "llm.infer".into(),
            reply: Some("_INBOX.x".into()),
            payload: Bytes::from_static(body),
            headers: None,
            status: None,
            description: None,
            length: 0,
        };
        for (body, field) in [
            (
                &br#"{"trace_id":"t","request_id":"r x","session_id":"s","ts_ms":1}"#[..],
                "request_id",
            ),
            (
                br#"{"trace_id":"t","request_id":"r","session_id":"s\u00e9","ts_ms":1}"#,
                "session_id",
            ),
            (
                br#"{"trace_id":"t","request_id":"r","session_id":"s x","ts_ms":1}"#,
                "session_id",
            ),
        ] {
            let m = msg(body);
            let (env, sub) = decode(&m, &Known::read(None), Instant::now());
            assert!(env.is_some_and(|e| e.is_some()));
            let err = sub.expect_err("refused");
            assert_eq!(err.code, ErrorCode::InvalidRequest);
            assert!(
                err.message.starts_with(&format!("envelope field {field}:")),
                "{}",
                err.message
            );
        }
        // Valid envelope ids still stand in for missing headers.
        let m = msg(br#"{"trace_id":"t","request_id":"r-1","session_id":"s-1","ts_ms":1}"#);
        let (_, sub) = decode(&m, &Known::read(None), Instant::now());
        let sub = sub.expect("valid");
        assert_eq!(
            (sub.request_id.as_deref(), sub.session.as_deref()),
            (Some("r-1"), Some("s-1"))
        );
    }
}
