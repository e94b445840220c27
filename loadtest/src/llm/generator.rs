//! The LLM request generator: requests at a fixed rate over many sessions, each with a
//! deadline, through plain async-nats requests with the documented headers
//! (`Weir-Request-Id`, `Weir-Session-Id`, `Weir-Deadline-Ms`).
//!
//! Every request uses its own inbox (a request that never gets a reply otherwise leaves
//! an entry in the client) and a timeout of deadline + [`REPLY_MARGIN`]: the caller gives
//! up then, which is *not* a cancellation of the responder's work — the naive front
//! keeps working on it, weir's adapter drops it at the deadline.
//!
//! Invariants: the generator never has more than [`MAX_OUTSTANDING`] requests waiting
//! (beyond that it counts `skipped` instead of sending); it stops at its stop signal
//! and every outstanding request ends within its timeout. A reply is classified by its
//! headers: `Weir-Error-Code` (or `Nats-Service-Error-Code`) → refused by that code,
//! else completed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use weir_llm_client::LlmClient;
use weir_protocol::WireName;
use weir_protocol::llm::headers;

use crate::counters::{Count, bump, counters};
use crate::stats::LatencyHistogram;
use crate::timeliness::unix_ms;

/// Extra time a caller waits after the deadline before giving up.
pub const REPLY_MARGIN: Duration = Duration::from_millis(500);
/// Most requests waiting for a reply at once.
pub const MAX_OUTSTANDING: u64 = 20_000;
/// Generator tick.
const TICK: Duration = Duration::from_millis(10);

counters! {
    /// What the generator counted.
    pub struct GeneratorCounters;
    /// A copy of [`GeneratorCounters`].
    pub struct GeneratorSnapshot {
        /// Requests sent.
        offered,
        /// Replies with a result.
        completed,
        /// Of those, received within the deadline.
        completed_in_deadline,
        /// No reply within deadline + margin.
        caller_timeouts,
        /// Not sent because too many were outstanding.
        skipped,
        /// Waiting for a reply now.
        outstanding,
        /// Replies (any outcome) received after the deadline: a caller whose own timeout
        /// is the deadline would have given up on them.
        answered_after_deadline,
        /// Refusals that arrived [`WAITED`] or more after the request was sent: admitted,
        /// then answered without a result (while queued, or a failed call), as opposed to
        /// refused at once.
        refused_after_waiting,
        ;
        /// Refusals by code.
        refused: Mutex<BTreeMap<String, u64>>,
        /// Caller-side latency of refusals (send → reply).
        refusal_ms: LatencyHistogram,
        /// Caller-side time to the first token (streamed: send → first chunk; unary:
        /// send → the reply), completed requests.
        ttft: LatencyHistogram,
        ;
        /// Per session, the replies each backend served (the reply's `Weir-Backend`).
        served_by: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
    }
}

/// The reply header naming the backend that served a request.
const BACKEND_HEADER: &str = "Weir-Backend";

/// A refusal this long after the request was sent was not an at-once refusal (those take
/// about a millisecond; their p99 stays under 5 ms in the load runs).
pub const WAITED: Duration = Duration::from_millis(100);

impl GeneratorCounters {
    /// How sessions stayed on one backend (`None` when no reply named its backend).
    pub fn affinity(&self) -> Option<Affinity> {
        let map = self.served_by.lock().ok()?;
        let mut a = Affinity::default();
        for backends in map.values() {
            let turns: u64 = backends.values().sum();
            let most = backends.values().copied().max().unwrap_or(0);
            a.sessions += 1;
            a.turns += turns;
            a.turns_on_main_backend += most;
            if most as f64 >= 0.95 * turns as f64 {
                a.sessions_95pct_on_one += 1;
            }
        }
        (a.sessions > 0).then_some(a)
    }

    fn served(&self, session: &str, backend: &str) {
        if let Ok(mut m) = self.served_by.lock() {
            *m.entry(session.to_owned())
                .or_default()
                .entry(backend.to_owned())
                .or_default() += 1;
        }
    }

    /// A reply with a result arrived `elapsed` after it was sent.
    fn completed(&self, elapsed: Duration, deadline: Duration) {
        self.completed.inc();
        if elapsed <= deadline {
            self.completed_in_deadline.inc();
        }
    }

    fn refuse(&self, code: &str) {
        bump(&self.refused, code.to_owned());
    }

    /// A refusal with `code` arrived `elapsed` after the request was sent.
    fn refused_after(&self, code: &str, elapsed: Duration) {
        self.refuse(code);
        if elapsed >= WAITED {
            self.refused_after_waiting.inc();
        }
        self.refusal_ms.record(elapsed);
    }

    /// A reply (any outcome) arrived `elapsed` after the request was sent.
    fn answered(&self, elapsed: Duration, deadline: Duration) {
        if elapsed > deadline {
            self.answered_after_deadline.inc();
        }
    }
}

/// How each session's replies spread over the backends (from `Weir-Backend`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Affinity {
    /// Sessions with a reply that named its backend.
    pub sessions: u64,
    /// Their replies.
    pub turns: u64,
    /// Sessions with at least 95 % of their replies from one backend.
    pub sessions_95pct_on_one: u64,
    /// Replies from each session's most frequent backend.
    pub turns_on_main_backend: u64,
}

/// Generator settings.
#[derive(Debug, Clone)]
pub struct GeneratorConfig {
    /// Request subject.
    pub subject: String,
    /// Requests per second.
    pub rate: f64,
    /// Distinct sessions (round-robin); 0 = requests carry no session.
    pub sessions: usize,
    /// Deadline of each request, from when it is sent.
    pub deadline: Duration,
    /// Ask for streamed replies (`Weir-Stream: 1`) through the Rust client's
    /// streaming call.
    pub stream: bool,
    /// `max_tokens` in each body.
    pub max_tokens: u32,
}

/// Runs until `stop` is set; returns when every outstanding request has ended.
pub async fn run(
    client: async_nats::Client,
    config: GeneratorConfig,
    counters: Arc<GeneratorCounters>,
    stop: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_tick = config.rate * TICK.as_secs_f64();
    let mut credit = 0.0;
    let mut n: u64 = 0;
    let mut tasks = tokio::task::JoinSet::new();
    let sessions = config.sessions as u64;
    let llm = LlmClient::new(client.clone(), config.subject.clone());
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        credit += per_tick;
        while credit >= 1.0 {
            credit -= 1.0;
            n += 1;
            if counters.outstanding.load(Ordering::Relaxed) >= MAX_OUTSTANDING {
                counters.skipped.inc();
                continue;
            }
            counters.offered.inc();
            counters.outstanding.inc();
            let (client, counters) = (client.clone(), counters.clone());
            let subject = config.subject.clone();
            let session = (sessions > 0).then(|| format!("conv{}", n % sessions));
            let body = Bytes::from(format!(
                r#"{{"prompt":"transcript {n} of {}","max_tokens":{}{}}}"#,
                session.as_deref().unwrap_or("no session"),
                config.max_tokens,
                if config.stream {
                    r#","stream":true"#
                } else {
                    ""
                }
            ));
            let call = Call {
                request_id: format!("lt-{n}"),
                session,
                body,
                deadline: config.deadline,
            };
            let (llm, stream) = (llm.clone(), config.stream);
            tasks.spawn(async move {
                if stream {
                    one_stream(&llm, call, &counters).await;
                } else {
                    one_request(&client, subject, call, &counters).await;
                }
                counters.outstanding.fetch_sub(1, Ordering::Relaxed);
            });
        }
        // Reap finished tasks so the set does not grow with the run.
        while tasks.try_join_next().is_some() {}
    }
    // Every request ends within deadline + margin.
    let _ = tokio::time::timeout(
        config.deadline + REPLY_MARGIN + Duration::from_secs(1),
        async { while tasks.join_next().await.is_some() {} },
    )
    .await;
    tasks.abort_all();
}

/// One request the generator offers, streamed or not.
struct Call {
    /// `lt-{n}`, n counting the requests offered.
    request_id: String,
    session: Option<String>,
    body: Bytes,
    /// From when it is sent.
    deadline: Duration,
}

/// One streamed request through the Rust client: TTFT = send → first chunk; completed
/// = `end` received (in the deadline or not).
async fn one_stream(llm: &LlmClient, call: Call, counters: &GeneratorCounters) {
    use futures::StreamExt;
    use weir_llm_client::{ClientErrorKind, LlmEvent};
    let sent = Instant::now();
    let refused = |code: &str| counters.refused_after(code, sent.elapsed());
    let failed = |kind: ClientErrorKind| match kind {
        ClientErrorKind::Server(code) => refused(code.as_str()),
        ClientErrorKind::TimedOut => {
            counters.caller_timeouts.inc();
        }
        ClientErrorKind::NoResponders => refused("no_responders"),
        _ => refused("request_error"),
    };
    let at = std::time::SystemTime::now() + call.deadline;
    let mut builder = llm
        .request(call.body)
        .request_id(call.request_id)
        .deadline(at);
    if let Some(session) = call.session {
        builder = builder.session(session);
    }
    let stream = builder.stream().await;
    let mut st = match stream {
        Ok(st) => st,
        Err(e) => return failed(e.kind()),
    };
    let mut first = None;
    while let Some(ev) = st.next().await {
        match ev {
            Ok(LlmEvent::Chunk { .. }) if first.is_none() => first = Some(sent.elapsed()),
            Ok(LlmEvent::End(_)) => {
                let elapsed = sent.elapsed();
                counters.answered(elapsed, call.deadline);
                counters.completed(elapsed, call.deadline);
                if let Some(first) = first {
                    counters.ttft.record(first);
                }
                return;
            }
            Ok(_) => {}
            Err(e) => return failed(e.kind()),
        }
    }
}

async fn one_request(
    client: &async_nats::Client,
    subject: String,
    call: Call,
    counters: &GeneratorCounters,
) {
    let sent = Instant::now();
    let mut h = async_nats::HeaderMap::new();
    h.insert(headers::REQUEST_ID, call.request_id.as_str());
    if let Some(session) = &call.session {
        h.insert(headers::SESSION_ID, session.as_str());
    }
    h.insert(
        headers::DEADLINE_MS,
        (unix_ms() + call.deadline.as_millis() as u64)
            .to_string()
            .as_str(),
    );
    let request = async_nats::Request::new()
        .headers(h)
        .payload(call.body)
        .timeout(Some(call.deadline + REPLY_MARGIN))
        .inbox(client.new_inbox());
    // Bound the whole call, not only the wait after it was queued.
    let result = tokio::time::timeout(
        call.deadline + REPLY_MARGIN + Duration::from_millis(200),
        client.send_request(subject, request),
    )
    .await;
    match result {
        Ok(Ok(msg)) => {
            let get = |name: &str| {
                msg.headers
                    .as_ref()
                    .and_then(|h| h.get(name))
                    .map(|v| v.as_str().to_owned())
            };
            let elapsed = sent.elapsed();
            counters.answered(elapsed, call.deadline);
            if let Some(code) =
                get(headers::ERROR_CODE).or_else(|| get(headers::NATS_SERVICE_ERROR_CODE))
            {
                return counters.refused_after(&code, elapsed);
            }
            counters.completed(elapsed, call.deadline);
            counters.ttft.record(elapsed);
            if let (Some(session), Some(backend)) = (&call.session, get(BACKEND_HEADER)) {
                counters.served(session, &backend);
            }
        }
        Ok(Err(e)) => match e.kind() {
            async_nats::client::RequestErrorKind::TimedOut => {
                counters.caller_timeouts.inc();
            }
            async_nats::client::RequestErrorKind::NoResponders => counters.refuse("no_responders"),
            _ => counters.refuse("request_error"),
        },
        Err(_) => {
            counters.caller_timeouts.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_counts_the_sessions_that_stayed_on_one_backend() {
        let c = GeneratorCounters::default();
        assert_eq!(c.affinity(), None);
        for _ in 0..19 {
            c.served("a", "sim-0");
        }
        c.served("a", "sim-1"); // 19 of 20 = 95 %: stayed
        for b in ["sim-0", "sim-1", "sim-0", "sim-2"] {
            c.served("b", b); // 2 of 4: moved
        }
        assert_eq!(
            c.affinity(),
            Some(Affinity {
                sessions: 2,
                turns: 24,
                sessions_95pct_on_one: 1,
                turns_on_main_backend: 21,
            })
        );
    }
}
