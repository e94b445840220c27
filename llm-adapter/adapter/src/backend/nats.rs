//! Forwards requests to an existing NATS service, unchanged.
//!
//! The body goes to the configured subject as a request with a per-request inbox (the
//! client otherwise keeps an entry for every request that is never answered) and a
//! timeout equal to the remaining deadline (capped by `backend.timeout_ms`), so an
//! unchanged service gets a bounded front. The adapter's headers `Weir-Request-Id`,
//! `Weir-Session-Id` and `Weir-Timeout-Ms` (the remaining budget) are forwarded; services
//! that do not know them ignore headers, and so are the W3C `traceparent` / `tracestate`
//! of [`BackendRequest::trace`] (the `backend_call` span with the feature `otel`, else
//! the caller's own). The service's reply — body and headers,
//! including its own `Nats-Service-Error` headers if any — is passed back unchanged.
//!
//! With a `cancel_subject`, a call dropped before its reply also publishes a cancel
//! message there ([`super::nats_cancel`]); without one, dropping only stops the wait.

use std::time::Duration;

use tokio::time::Instant;
use weir_protocol::llm::headers as h;

use super::nats_cancel::CancelTarget;
use super::{Backend, BackendError, BackendErrorKind, BackendReply, BackendRequest, Call};
use crate::config::NatsBackendConfig;

/// The NATS forwarding backend.
#[derive(Debug, Clone)]
pub struct NatsBackend {
    client: async_nats::Client,
    subject: String,
    timeout: Duration,
    cancel: Option<CancelTarget>,
}

impl NatsBackend {
    /// Forwards to `cfg.subject` over `client`, each call bounded by `timeout` (and by
    /// the request's deadline when it is sooner). With `cfg.cancel_subject`, every call
    /// dropped before its reply also publishes a cancel message there
    /// ([`super::nats_cancel`]); `backend` names this backend in the cancel counter.
    pub fn new(
        client: &async_nats::Client,
        cfg: &NatsBackendConfig,
        timeout: Duration,
        backend: &str,
    ) -> Self {
        let cancel = (cfg.cancel_subject.clone()).map(|s| CancelTarget::new(s, backend.into()));
        Self {
            client: client.clone(),
            subject: cfg.subject.clone(),
            timeout,
            cancel,
        }
    }
}

impl Backend for NatsBackend {
    fn name(&self) -> &'static str {
        "nats"
    }

    fn call(&self, request: BackendRequest) -> Call {
        let client = self.client.clone();
        let subject = self.subject.clone();
        let cancel = self.cancel.clone();
        let left = |d: Instant| d.saturating_duration_since(Instant::now());
        let budget = (request.deadline).map_or(self.timeout, |d| left(d).min(self.timeout));
        Box::pin(async move {
            let mut headers = async_nats::HeaderMap::new();
            if let Some(rid) = &request.request_id {
                headers.insert(h::REQUEST_ID, rid.as_str());
            }
            if let Some(s) = &request.session {
                headers.insert(h::SESSION_ID, s.as_str());
            }
            headers.insert(h::TIMEOUT_MS, budget.as_millis().to_string().as_str());
            if let Some(t) = &request.trace {
                headers.insert(h::TRACEPARENT, t.parent.to_string().as_str());
                if let Some(state) = &t.state {
                    headers.insert(h::TRACESTATE, state.as_str());
                }
            }
            let inbox = client.new_inbox();
            // Lives as long as this future: dropped before the reply, it publishes the
            // cancel message.
            let mut guard = cancel.map(|c| {
                let (rid, session) = (request.request_id.as_deref(), request.session.as_deref());
                c.guard(&client, &inbox, rid, session)
            });
            let req = async_nats::Request::new()
                .payload(request.body)
                .headers(headers)
                .timeout(Some(budget))
                .inbox(inbox);
            // The request's own timeout covers waiting for the reply; this one also
            // covers queuing the publish (which waits without limit when the client's
            // channel is full).
            let sent = tokio::time::timeout(budget, client.send_request(subject, req)).await;
            let msg = match sent {
                Err(_) => {
                    return Err(BackendError::new(
                        BackendErrorKind::Timeout,
                        format!(
                            "no reply from the NATS service within {} ms",
                            budget.as_millis()
                        ),
                    ));
                }
                Ok(Err(e)) => {
                    use async_nats::RequestErrorKind as K;
                    let kind = match e.kind() {
                        K::TimedOut => BackendErrorKind::Timeout,
                        K::NoResponders => BackendErrorKind::Unavailable,
                        _ => BackendErrorKind::Failed,
                    };
                    // Nobody received the request: nothing runs to cancel.
                    if let Some(g) = guard.as_mut()
                        && kind == BackendErrorKind::Unavailable
                    {
                        g.disarm();
                    }
                    return Err(BackendError::with_source(kind, "NATS request failed", e));
                }
                Ok(Ok(msg)) => msg,
            };
            if let Some(g) = guard.as_mut() {
                g.disarm();
            }
            let headers = (msg.headers.iter().flat_map(|hm| hm.iter()))
                .flat_map(|(n, vs)| {
                    vs.iter()
                        .map(move |v| (n.to_string(), v.as_str().to_owned()))
                })
                .collect();
            Ok(BackendReply {
                body: msg.payload,
                headers,
            })
        })
    }
}
