//! The NATS backend's cancel message: when a forwarded call is dropped before its reply
//! (the caller cancelled, a superseding request, the deadline, a failover, the end of
//! the shutdown grace), the service is told, so that it can stop generating for nobody.
//!
//! The message goes to `backend.nats.cancel_subject` (or `backends[].nats.cancel_subject`)
//! with an empty body and the headers:
//! - `Weir-Cancel: <request id>`, when the request had a `Weir-Request-Id`;
//! - `Weir-Cancel-Inbox: <inbox>`, always: the reply subject of the forwarded request
//!   (the per-request inbox), which identifies the call even without a request id;
//! - `Weir-Session-Id: <session>`, when the request had one.
//!
//! Invariants:
//! - [`CancelGuard`] lives inside the call's future: it fires from `Drop`, exactly once,
//!   unless [`CancelGuard::disarm`] was called (a reply came, or nobody received the
//!   request: no responders). A call that was never polled created no guard and sent
//!   nothing.
//! - `Drop` never blocks or awaits. The publish is first tried once without waiting (the
//!   client's command channel usually has room: the message is queued behind the request
//!   itself on the same connection, so the service never sees a cancel before its
//!   request). Only if that would wait (a full channel, or the dropping task's tokio
//!   cooperative budget spent) is it handed to a spawned task, at most
//!   [`MAX_PENDING`] of them at once, each bounded by [`PUBLISH_TIMEOUT`]. A cancel that
//!   finds no room, no runtime or a closed connection is dropped and counted
//!   (`weir_llm_backend_cancels_total{result="dropped"}`), never retried: the service's
//!   own timeout (the forwarded `Weir-Timeout-Ms`) still bounds the call.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Semaphore;
use weir_protocol::llm::headers as h;

use crate::metrics as m;

/// Most cancel publishes waiting in spawned tasks at once (per backend).
pub const MAX_PENDING: usize = 1024;

/// How long a spawned cancel publish may wait for room in the client's channel.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a backend's cancel messages go, shared by its calls.
#[derive(Debug, Clone)]
pub struct CancelTarget {
    subject: String,
    /// The backend's name in the cancel counter (`default` for a single `[backend]`).
    backend: String,
    pending: Arc<Semaphore>,
}

impl CancelTarget {
    /// Cancels go to `subject`; `backend` labels the counter.
    pub fn new(subject: String, backend: String) -> Self {
        Self {
            subject,
            backend,
            pending: Arc::new(Semaphore::new(MAX_PENDING)),
        }
    }

    /// A guard for one call whose forwarded request uses `inbox`.
    pub fn guard(
        &self,
        client: &async_nats::Client,
        inbox: &str,
        request_id: Option<&str>,
        session: Option<&str>,
    ) -> CancelGuard {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(rid) = request_id {
            headers.insert(h::CANCEL, rid);
        }
        headers.insert(h::CANCEL_INBOX, inbox);
        if let Some(s) = session {
            headers.insert(h::SESSION_ID, s);
        }
        CancelGuard {
            armed: Some((client.clone(), headers)),
            target: self.clone(),
        }
    }

    fn count(&self, result: &'static str) {
        metrics::counter!(m::BACKEND_CANCELS_TOTAL, "backend" => self.backend.clone(), "result" => result)
            .increment(1);
    }
}

/// Publishes the call's cancel message when dropped, unless disarmed.
#[derive(Debug)]
pub struct CancelGuard {
    armed: Option<(async_nats::Client, async_nats::HeaderMap)>,
    target: CancelTarget,
}

impl CancelGuard {
    /// The call ended on its own (a reply, or no responders): nothing to cancel.
    pub fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        let Some((client, headers)) = self.armed.take() else {
            return;
        };
        let target = &self.target;
        let subject = target.subject.clone();
        // One poll: queued into the client's channel now, or not at all (the future is
        // dropped unfinished, which sends nothing).
        let now = client
            .publish_with_headers(subject.clone(), headers.clone(), bytes::Bytes::new())
            .now_or_never();
        match now {
            Some(Ok(())) => return target.count("sent"),
            Some(Err(_)) => return target.count("dropped"),
            None => {}
        }
        let (Ok(rt), Ok(permit)) = (
            tokio::runtime::Handle::try_current(),
            target.pending.clone().try_acquire_owned(),
        ) else {
            return target.count("dropped");
        };
        let target = target.clone();
        rt.spawn(async move {
            let publish = client.publish_with_headers(subject, headers, bytes::Bytes::new());
            let sent = matches!(
                tokio::time::timeout(PUBLISH_TIMEOUT, publish).await,
                Ok(Ok(()))
            );
            target.count(if sent { "sent" } else { "dropped" });
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    const STEP: Duration = Duration::from_secs(10);

    /// The cancel goes out from `Drop` on the non-awaiting path (counted `sent` before
    /// `drop` returns), with the documented headers; a disarmed guard sends nothing.
    #[tokio::test]
    async fn a_dropped_guard_publishes_at_once_and_a_disarmed_one_does_not() {
        let server = weir_testkit::NatsServer::start().expect("nats-server");
        let client = async_nats::connect(server.url()).await.expect("connect");
        let mut sub = client.subscribe("svc.cancel").await.expect("subscribe");
        client.flush().await.expect("flush");
        let target = CancelTarget::new("svc.cancel".into(), "b1".into());

        let mut quiet = target.guard(&client, "_INBOX.quiet", Some("q"), None);
        quiet.disarm();
        let (recorder, handle) = crate::metrics::prometheus_recorder();
        metrics::with_local_recorder(&recorder, || {
            drop(quiet);
            drop(target.guard(&client, "_INBOX.abc", Some("req-1"), Some("sess-1")));
            drop(target.guard(&client, "_INBOX.def", None, None));
        });
        let text = handle.render();
        assert!(
            text.contains(r#"weir_llm_backend_cancels_total{backend="b1",result="sent"} 2"#),
            "{text}"
        );
        let first = tokio::time::timeout(STEP, sub.next())
            .await
            .expect("in time")
            .expect("msg");
        let hm = first.headers.expect("headers");
        let get = |n: &str| hm.get(n).map(|v| v.as_str().to_owned());
        assert_eq!(get(h::CANCEL).as_deref(), Some("req-1"));
        assert_eq!(get(h::CANCEL_INBOX).as_deref(), Some("_INBOX.abc"));
        assert_eq!(get(h::SESSION_ID).as_deref(), Some("sess-1"));
        assert!(first.payload.is_empty());
        let second = tokio::time::timeout(STEP, sub.next())
            .await
            .expect("in time")
            .expect("msg");
        let hm = second.headers.expect("headers");
        assert_eq!(hm.get(h::CANCEL), None, "no request id, no Weir-Cancel");
        assert_eq!(
            hm.get(h::CANCEL_INBOX).map(|v| v.as_str()),
            Some("_INBOX.def")
        );
        client.flush().await.expect("flush");
        let none = tokio::time::timeout(Duration::from_millis(200), sub.next()).await;
        assert!(none.is_err(), "the disarmed guard sent nothing: {none:?}");
    }

    /// When the one poll cannot complete (here: this task's cooperative budget is spent,
    /// so the client's channel answers `Pending`), the cancel still goes out, from the
    /// spawned task.
    #[tokio::test]
    async fn a_publish_that_would_wait_goes_out_from_a_spawned_task() {
        let server = weir_testkit::NatsServer::start().expect("nats-server");
        let client = async_nats::connect(server.url()).await.expect("connect");
        let mut sub = client.subscribe("svc.cancel").await.expect("subscribe");
        client.flush().await.expect("flush");
        let target = CancelTarget::new("svc.cancel".into(), "b1".into());
        let guard = target.guard(&client, "_INBOX.late", Some("req-2"), None);
        let (recorder, handle) = crate::metrics::prometheus_recorder();
        let mut spent = 0;
        while tokio::task::coop::has_budget_remaining() && spent < 10_000 {
            let _ = tokio::task::consume_budget().now_or_never();
            spent += 1;
        }
        assert!(!tokio::task::coop::has_budget_remaining(), "budget spent");
        metrics::with_local_recorder(&recorder, || drop(guard));
        assert!(
            !handle.render().contains("result=\"sent\""),
            "not sent on the first poll: {}",
            handle.render()
        );
        assert_eq!(
            target.pending.available_permits(),
            MAX_PENDING - 1,
            "one task"
        );
        let msg = tokio::time::timeout(STEP, sub.next())
            .await
            .expect("in time")
            .expect("msg");
        let hm = msg.headers.expect("headers");
        assert_eq!(hm.get(h::CANCEL).map(|v| v.as_str()), Some("req-2"));
        tokio::time::timeout(STEP, async {
            while target.pending.available_permits() < MAX_PENDING {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the task ended and gave its permit back");
    }
}
