//! The durable intake (`intake = "jetstream"`) against a real nats-server with
//! JetStream: direct publishes and core requests forwarded into the stream, dedup by
//! `Nats-Msg-Id`, expired and malformed requests terminated, the cluster-wide session
//! cap over two replicas, and (binary) a replica SIGKILLed mid-run at 2× capacity.
//!
//! The backend is a simulated NATS service in the test process ([`TestBackend`]): it
//! sees every call of every replica, so it counts runs per request id and concurrent
//! calls per session across processes — including a replica that is SIGKILLed.

mod common;

use std::collections::{BTreeMap, HashMap};

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream;
use futures::StreamExt;
use tokio::time::Instant;
use weir_llm_adapter::Config;
use weir_llm_adapter::backend::sim::SimBackend;
use weir_llm_adapter::client::LlmClient;
use weir_protocol::llm::headers as h;
use weir_testkit::{NatsServer, NatsServerOptions};

use common::bin::{BIN, Child, first_line};
use common::{STEP, connect};

fn js_server() -> NatsServer {
    NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("nats-server with JetStream (run scripts/ensure-nats-server)")
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Publishes one request to the intake stream the way a durable caller does; returns
/// whether the stream called it a duplicate.
async fn publish(
    js: &jetstream::Context,
    subject: &str,
    reply: &str,
    rid: &str,
    extra: &[(&str, &str)],
    body: &'static [u8],
) -> bool {
    let mut hm = HeaderMap::new();
    hm.insert(h::REPLY_TO, reply);
    hm.insert(h::NATS_MSG_ID, rid);
    hm.insert(h::REQUEST_ID, rid);
    for (k, v) in extra {
        hm.insert(*k, *v);
    }
    let ack = tokio::time::timeout(STEP, async {
        js.publish_with_headers(subject.to_owned(), hm, body.into())
            .await
            .expect("publish")
            .await
            .expect("stored")
    })
    .await
    .expect("pub ack in time");
    ack.duplicate
}

fn code_of(msg: &async_nats::Message) -> String {
    msg.headers
        .as_ref()
        .and_then(|hm| hm.get(h::ERROR_CODE))
        .map_or_else(|| "ok".to_owned(), |v| v.as_str().to_owned())
}

fn rid_of(msg: &async_nats::Message) -> String {
    msg.headers
        .as_ref()
        .and_then(|hm| hm.get(h::REQUEST_ID))
        .map_or_else(String::new, |v| v.as_str().to_owned())
}

async fn stream_len(js: &jetstream::Context, name: &str) -> u64 {
    let mut s = js.get_stream(name).await.expect("stream");
    s.info().await.expect("info").state.messages
}

/// Waits (bounded) until the intake stream is empty: every message settled.
async fn wait_empty(js: &jetstream::Context, name: &str) -> u64 {
    let until = Instant::now() + STEP;
    loop {
        let n = stream_len(js, name).await;
        if n == 0 || Instant::now() > until {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const INTAKE: &str =
    "intake = \"jetstream\"\n[jetstream]\nack_wait_ms = 2000\nstorage = \"memory\"\n";

/// An in-process replica on its own connection; `latency_ms` = the sim backend's, or
/// `None` for the backend the configuration names.
async fn adapter(
    server: &NatsServer,
    toml: &str,
    latency_ms: Option<u64>,
) -> weir_llm_adapter::AdapterHandle {
    let config = Config::from_toml_str(toml).expect("config");
    let client = connect(server.url()).await;
    let backend: Arc<dyn weir_llm_adapter::backend::Backend> = match latency_ms {
        Some(ms) => Arc::new(SimBackend::fixed(Duration::from_millis(ms))),
        None => {
            weir_llm_adapter::backend::from_config(&config.backend, &client)
                .expect("backend")
                .backend
        }
    };
    tokio::time::timeout(STEP, weir_llm_adapter::start(client, config, backend))
        .await
        .expect("start in time")
        .expect("start")
}

#[tokio::test]
async fn direct_publishes_are_answered_once_and_duplicates_are_dropped_by_the_stream() {
    let server = js_server();
    let a = adapter(&server, &format!("workers = 2\n{INTAKE}"), Some(10)).await;
    let b = adapter(&server, &format!("workers = 2\n{INTAKE}"), Some(10)).await;
    let caller = connect(server.url()).await;
    let js = jetstream::new(caller.clone());
    let inbox = caller.new_inbox();
    let mut replies = caller.subscribe(format!("{inbox}.>")).await.expect("sub");
    caller.flush().await.expect("flush");
    let n = 40;
    for i in 0..n {
        let rid = format!("r-{i}");
        let reply = format!("{inbox}.{i}");
        assert!(
            !publish(
                &js,
                "llm.intake",
                &reply,
                &rid,
                &[(h::TIMEOUT_MS, "5000")],
                b"hi"
            )
            .await
        );
        // A retry of every fourth request: stored once.
        if i % 4 == 0 {
            assert!(
                publish(
                    &js,
                    "llm.intake",
                    &reply,
                    &rid,
                    &[(h::TIMEOUT_MS, "5000")],
                    b"hi"
                )
                .await,
                "the stream drops the second copy"
            );
        }
    }
    let mut got: BTreeMap<String, usize> = BTreeMap::new();
    let until = Instant::now() + STEP;
    while got.values().sum::<usize>() < n && Instant::now() < until {
        if let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(500), replies.next()).await
        {
            assert_eq!(code_of(&m), "ok");
            assert_eq!(&m.payload[..], b"hi");
            *got.entry(rid_of(&m)).or_default() += 1;
        }
    }
    // Nothing more arrives.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), replies.next())
            .await
            .is_err()
    );
    assert_eq!(got.len(), n, "every request answered");
    assert!(got.values().all(|c| *c == 1), "each once: {got:?}");
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        sa.completed + sb.completed,
        n as u64,
        "run once each over the two replicas"
    );
    assert!(
        sa.completed > 0 && sb.completed > 0,
        "both replicas pulled: {} / {}",
        sa.completed,
        sb.completed
    );
    assert_eq!(
        wait_empty(&js, "WEIR_LLM_INTAKE").await,
        0,
        "all acknowledged"
    );

    // A core request is forwarded into the stream (callers unchanged).
    let llm = LlmClient::new(caller.clone(), "llm.infer");
    let r = llm
        .request("core")
        .request_id("c-1")
        .session("s")
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    assert_eq!(&r.expect("forwarded and answered").body[..], b"core");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn expired_and_malformed_requests_are_terminated_with_an_answer_and_never_started() {
    let server = js_server();
    let sim = SimBackend::fixed(Duration::from_millis(10));
    let sim_h = sim.handle();
    let client = connect(server.url()).await;
    let a = weir_llm_adapter::start(
        client,
        Config::from_toml_str(&format!("workers = 2\n{INTAKE}")).expect("config"),
        Arc::new(sim),
    )
    .await
    .expect("start");
    let caller = connect(server.url()).await;
    let js = jetstream::new(caller.clone());
    let inbox = caller.new_inbox();
    let mut replies = caller.subscribe(format!("{inbox}.>")).await.expect("sub");
    caller.flush().await.expect("flush");
    let past = (unix_ms() - 1000).to_string();
    publish(
        &js,
        "llm.intake",
        &format!("{inbox}.1"),
        "old",
        &[(h::DEADLINE_MS, &past)],
        b"x",
    )
    .await;
    publish(
        &js,
        "llm.intake",
        &format!("{inbox}.2"),
        "bad",
        &[(h::TIMEOUT_MS, "soon")],
        b"x",
    )
    .await;
    publish(
        &js,
        "llm.intake",
        &format!("{inbox}.3"),
        "cancel",
        &[(h::CANCEL, "old")],
        b"x",
    )
    .await;
    // No reply subject at all, and a reply subject with a wildcard: terminated, unanswerable.
    let mut hm = HeaderMap::new();
    hm.insert(h::NATS_MSG_ID, "noreply");
    js.publish_with_headers("llm.intake", hm, "x".into())
        .await
        .expect("pub")
        .await
        .expect("ack");
    publish(&js, "llm.intake", "bad.*", "wild", &[], b"x").await;
    let mut codes = BTreeMap::new();
    for _ in 0..3 {
        let m = tokio::time::timeout(STEP, replies.next())
            .await
            .expect("answer")
            .expect("msg");
        let body: serde_json::Value = serde_json::from_slice(&m.payload).expect("json body");
        codes.insert(
            m.subject.to_string(),
            (
                code_of(&m),
                body["message"].as_str().unwrap_or("").to_owned(),
            ),
        );
    }
    let c = |i: u32| codes[&format!("{inbox}.{i}")].clone();
    assert_eq!(c(1).0, "deadline_exceeded", "{codes:?}");
    assert_eq!(c(2).0, "invalid_request");
    assert!(
        c(2).1.contains(h::TIMEOUT_MS),
        "names the header: {}",
        c(2).1
    );
    assert_eq!(c(3).0, "invalid_request");
    assert_eq!(sim_h.stats().started, 0, "none reached the backend");
    assert_eq!(
        wait_empty(&js, "WEIR_LLM_INTAKE").await,
        0,
        "all five settled (terminated)"
    );
    a.shutdown().await;
}

/// Calls seen by the simulated NATS backend.
#[derive(Debug, Clone)]
struct Call {
    rid: String,
    session: String,
    start: Instant,
    end: Option<Instant>,
    /// The reply reached a live replica (the backend asks with a request: no
    /// responders = the replica that made the call is gone).
    delivered: Option<bool>,
}

/// A simulated backend served over NATS from the test process: sleeps `latency`, echoes
/// the body, and records every call.
struct TestBackend {
    calls: Arc<Mutex<Vec<Call>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestBackend {
    async fn start(url: &str, subject: &str, latency: Duration) -> Self {
        let client = connect(url).await;
        let mut sub = client.subscribe(subject.to_owned()).await.expect("sub");
        client.flush().await.expect("flush");
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let rec = calls.clone();
        let task = tokio::spawn(async move {
            while let Some(msg) = sub.next().await {
                let hdr = |n: &str| {
                    msg.headers
                        .as_ref()
                        .and_then(|hm| hm.get(n))
                        .map_or_else(String::new, |v| v.as_str().to_owned())
                };
                let idx = {
                    let mut c = rec.lock().expect("lock");
                    c.push(Call {
                        rid: hdr(h::REQUEST_ID),
                        session: hdr(h::SESSION_ID),
                        start: Instant::now(),
                        end: None,
                        delivered: None,
                    });
                    c.len() - 1
                };
                let (client, rec) = (client.clone(), rec.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(latency).await;
                    rec.lock().expect("lock")[idx].end = Some(Instant::now());
                    let Some(reply) = msg.reply else { return };
                    let req = async_nats::Request::new()
                        .payload(msg.payload)
                        .timeout(Some(Duration::from_millis(100)));
                    let r = client.send_request(reply, req).await;
                    let delivered = !matches!(&r, Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders);
                    rec.lock().expect("lock")[idx].delivered = Some(delivered);
                });
            }
        });
        Self { calls, task }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("lock").clone()
    }

    /// Most calls of one session in progress at once.
    fn max_concurrent_per_session(&self) -> usize {
        let calls = self.calls();
        let mut best = 0;
        for c in &calls {
            let n = calls
                .iter()
                .filter(|o| {
                    o.session == c.session
                        && o.start <= c.start
                        && o.end.is_none_or(|e| e > c.start)
                })
                .count();
            best = best.max(n);
        }
        best
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn the_session_cap_holds_over_two_replicas() {
    let server = js_server();
    let backend = TestBackend::start(server.url(), "sim.backend", Duration::from_millis(300)).await;
    // 4 workers per replica: each alone would run 4 requests of one session at once.
    let toml = format!(
        "workers = 4\n{INTAKE}max_ack_pending = 8\n[session]\npending_cap = 2\nordering = false\n[backend]\nkind = \"nats\"\n[backend.nats]\nsubject = \"sim.backend\"\n"
    );
    let a = adapter(&server, &toml, None).await;
    let b = adapter(&server, &toml, None).await;
    let caller = connect(server.url()).await;
    let js = jetstream::new(caller.clone());
    let inbox = caller.new_inbox();
    let mut replies = caller.subscribe(format!("{inbox}.>")).await.expect("sub");
    caller.flush().await.expect("flush");
    let n = 10;
    for i in 0..n {
        publish(
            &js,
            "llm.intake",
            &format!("{inbox}.{i}"),
            &format!("c-{i}"),
            &[(h::SESSION_ID, "one"), (h::TIMEOUT_MS, "5000")],
            b"x",
        )
        .await;
    }
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..n {
        let m = tokio::time::timeout(STEP, replies.next())
            .await
            .expect("answer")
            .expect("msg");
        *codes.entry(code_of(&m)).or_default() += 1;
    }
    let max = backend.max_concurrent_per_session();
    eprintln!(
        "session cap 2 over 2 replicas x 4 workers, 10 requests at once: {codes:?}, most at once at the backend: {max}"
    );
    assert!(max <= 2, "cap 2 across replicas, saw {max}");
    assert!(
        codes.get("session_queue_full").copied().unwrap_or(0) >= 1,
        "{codes:?}"
    );
    assert_eq!(codes.values().sum::<usize>(), n);
    a.shutdown().await;
    b.shutdown().await;
}
