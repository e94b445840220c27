//! Session interrupt (barge-in) against a real nats-server: a session cancel
//! (`Weir-Cancel-Session`) and a superseding request (`Weir-Supersede: session`) with the
//! sim backend, malformed headers refused without effect, no chunk of a cancelled
//! stream after the cancel's acknowledgement, and cancel → connection close at a real
//! HTTP server in front of the OpenAI backend.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use common::{Rig, STEP, eventually, stream_body};
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use weir_llm_adapter::Config;
use weir_llm_adapter::backend::openai::OpenAiBackend;
use weir_llm_adapter::config::BackendKind;
use weir_llm_client::{ClientErrorKind, LlmClient, LlmReply};
use weir_protocol::llm::headers as h;
use weir_protocol::llm::stream as s;
use weir_protocol::llm::{ErrorBody, ErrorCode, SessionCancelReply};

type Answer = Result<LlmReply, weir_llm_client::ClientError>;

/// Sends one request of `session` with `id` in a task.
fn send(llm: &LlmClient, session: &str, id: &str) -> tokio::task::JoinHandle<Answer> {
    let llm = llm.clone();
    let (session, id) = (session.to_owned(), id.to_owned());
    tokio::spawn(async move {
        llm.request("x")
            .session(session)
            .request_id(id)
            .timeout(STEP)
            .send()
            .await
    })
}

async fn joined(t: tokio::task::JoinHandle<Answer>) -> Answer {
    tokio::time::timeout(STEP, t)
        .await
        .expect("in time")
        .expect("join")
}

/// The error body of a refused answer.
fn refusal(a: &Answer) -> ErrorBody {
    match a {
        Ok(_) => panic!("expected a refusal"),
        Err(e) => e.body().cloned().expect("an error body"),
    }
}

/// A raw request with `headers` (and an empty body) to `subject`.
async fn raw(
    client: &async_nats::Client,
    subject: &str,
    headers: &[(&str, &str)],
) -> async_nats::Message {
    let mut hm = HeaderMap::new();
    for (k, v) in headers {
        hm.insert(*k, *v);
    }
    let req = async_nats::Request::new()
        .headers(hm)
        .timeout(Some(STEP))
        .inbox(client.new_inbox());
    tokio::time::timeout(STEP, client.send_request(subject.to_owned(), req))
        .await
        .expect("in time")
        .expect("reply")
}

fn header<'a>(m: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
}

#[tokio::test]
async fn cancel_session_over_nats_answers_queued_and_aborts_running() {
    let mut rig = Rig::with_sim(
        "workers = 2\n[session]\nordering = false\npending_cap = 10",
        Duration::from_secs(30),
    )
    .await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let mut s1 = Vec::new();
    for id in ["a", "b"] {
        s1.push(send(&llm, "s1", id));
        eventually(STEP, || rig.adapter().stats().admitted == s1.len() as u64).await;
    }
    eventually(STEP, || rig.sim().stats().in_progress == 2).await;
    for id in ["c", "d"] {
        s1.push(send(&llm, "s1", id));
    }
    let other = send(&llm, "s2", "e");
    eventually(STEP, || rig.adapter().stats().queued_now == 3).await;

    let m = raw(&rig.caller, "llm.cancel", &[(h::CANCEL_SESSION, "s1")]).await;
    // At the acknowledgement both backend calls have been dropped.
    assert_eq!(rig.sim().stats().aborted, 2);
    let r: SessionCancelReply = serde_json::from_slice(&m.payload).expect("json");
    assert_eq!(
        r,
        SessionCancelReply {
            session: "s1".into(),
            result: "cancelled".into(),
            cancelled: 4,
            queued: 2,
            running: 2,
            queued_ids: vec!["c".into(), "d".into()],
            running_ids: vec!["a".into(), "b".into()],
        }
    );
    for t in s1 {
        let e = refusal(&joined(t).await);
        assert_eq!(e.code, ErrorCode::Cancelled);
        assert!(e.message.contains("cancelled while"), "{}", e.message);
    }
    // The other session was not touched: it runs now.
    eventually(STEP, || rig.sim().stats().in_progress == 1).await;
    assert_eq!(
        rig.sim().stats().started,
        3,
        "c and d never reached the backend"
    );
    // The typed client, and a session with nothing left.
    let again = llm.cancel_session("s1").await.expect("reply");
    assert_eq!((again.result.as_str(), again.cancelled), ("not_found", 0));
    // A session cancel on the inference subject works too.
    let m = raw(&rig.caller, "llm.infer", &[(h::CANCEL_SESSION, "s2")]).await;
    let r: SessionCancelReply = serde_json::from_slice(&m.payload).expect("json");
    assert_eq!((r.running, r.running_ids), (1, vec!["e".to_owned()]));
    assert_eq!(
        server_code(&joined(other).await),
        Some(ErrorCode::Cancelled)
    );
    rig.shutdown().await;
}

fn server_code(a: &Answer) -> Option<ErrorCode> {
    match a {
        Ok(_) => None,
        Err(e) => match e.kind() {
            ClientErrorKind::Server(c) => Some(c),
            other => panic!("unexpected client error {other:?}: {e}"),
        },
    }
}

#[tokio::test]
async fn a_superseding_request_cancels_the_sessions_earlier_ones_and_says_so() {
    // Session ordering on (the default) with a cap of 2: without the supersede the new
    // request would be refused (cap) or wait 30 s behind the running one (ordering).
    let mut rig = Rig::with_sim(
        "workers = 1\n[session]\npending_cap = 2",
        Duration::from_millis(300),
    )
    .await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let first = send(&llm, "s1", "r1");
    eventually(STEP, || rig.sim().stats().in_progress == 1).await;
    let second = send(&llm, "s1", "r2");
    eventually(STEP, || rig.adapter().stats().queued_now == 1).await;

    let t0 = Instant::now();
    let reply = llm
        .request("new")
        .session("s1")
        .request_id("r3")
        .supersede()
        .timeout(STEP)
        .send()
        .await
        .expect("the superseding request is served");
    let took = t0.elapsed();
    assert_eq!(&reply.body[..], b"new");
    let hv = |n: &str| reply.headers.get(n).map(|v| v.as_str().to_owned());
    assert_eq!(hv(h::SUPERSEDED).as_deref(), Some("2"));
    assert_eq!(hv(h::SUPERSEDED_IDS).as_deref(), Some("r1 r2"));
    // It started at once, not behind r1 (~300 ms left when it came).
    let queued = reply.queue_time.expect("Weir-Queue-Ms");
    assert!(queued < Duration::from_millis(150), "queued {queued:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    for (t, stage) in [(first, "running"), (second, "queued")] {
        let e = refusal(&joined(t).await);
        assert_eq!(e.code, ErrorCode::Cancelled);
        assert!(
            e.message.contains("superseded by request r3") && e.message.contains(stage),
            "{}",
            e.message
        );
    }
    let st = rig.sim().stats();
    assert_eq!((st.started, st.aborted, st.completed), (2, 1, 1));
    // Superseding an idle session: nothing to cancel, `Weir-Superseded: 0`.
    let m = raw(
        &rig.caller,
        "llm.infer",
        &[(h::SESSION_ID, "s1"), (h::SUPERSEDE, "Session")],
    )
    .await;
    assert_eq!(header(&m, h::SUPERSEDED), Some("0"));
    assert_eq!(header(&m, h::ERROR_CODE), None);
    rig.shutdown().await;
}

#[tokio::test]
async fn malformed_supersede_and_session_cancel_headers_are_refused_and_change_nothing() {
    let mut rig = Rig::with_sim("workers = 1", Duration::from_millis(500)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let running = send(&llm, "s1", "r1");
    eventually(STEP, || rig.sim().stats().in_progress == 1).await;
    let long = "x".repeat(300);
    let cases: [(&str, &[(&str, &str)]); 5] = [
        (
            "llm.infer",
            &[(h::SESSION_ID, "s1"), (h::SUPERSEDE, "request")],
        ),
        ("llm.infer", &[(h::SESSION_ID, "s1"), (h::SUPERSEDE, "")]),
        ("llm.infer", &[(h::SUPERSEDE, "session")]),
        ("llm.cancel", &[(h::CANCEL_SESSION, &long)]),
        ("llm.infer", &[(h::CANCEL_SESSION, &long)]),
    ];
    for (subject, headers) in cases {
        let m = raw(&rig.caller, subject, headers).await;
        assert_eq!(
            header(&m, h::ERROR_CODE),
            Some("invalid_request"),
            "{headers:?}"
        );
        let body: ErrorBody = serde_json::from_slice(&m.payload).expect("error body");
        assert!(
            body.message.contains(h::SUPERSEDE) || body.message.contains(h::CANCEL_SESSION),
            "names the header: {}",
            body.message
        );
    }
    // Nothing was cancelled: the running request finishes normally.
    assert_eq!(server_code(&joined(running).await), None);
    let st = rig.sim().stats();
    assert_eq!((st.started, st.aborted, st.completed), (1, 0, 1));
    rig.shutdown().await;
}

#[tokio::test]
async fn no_chunk_of_a_cancelled_stream_reaches_the_caller_after_the_acknowledgement() {
    // No acknowledgement window: the raw caller below only reads.
    let mut rig = Rig::with_sim_stream("workers = 1\n[stream]\nwindow = 0", 5, 200).await;
    let caller = &rig.caller;
    // One subscription for the stream and the cancel's answer: what it delivers is in
    // the order the server sent it.
    let base = caller.new_inbox();
    let mut sub = caller
        .subscribe(format!("{base}.>"))
        .await
        .expect("subscribe");
    let mut hm = HeaderMap::new();
    hm.insert(s::STREAM, "1");
    hm.insert(h::SESSION_ID, "talk");
    hm.insert(h::REQUEST_ID, "turn-1");
    caller
        .publish_with_reply_and_headers(
            "llm.infer",
            format!("{base}.stream"),
            hm,
            stream_body(5000).into(),
        )
        .await
        .expect("publish");
    let event = |m: &async_nats::Message| header(m, s::STREAM_EVENT).unwrap_or("").to_owned();
    let mut chunks = 0;
    while chunks < 3 {
        if event(&next_message(&mut sub).await) == "chunk" {
            chunks += 1;
        }
    }
    let mut hm = HeaderMap::new();
    hm.insert(h::CANCEL_SESSION, "talk");
    caller
        .publish_with_reply_and_headers("llm.cancel", format!("{base}.ack"), hm, "".into())
        .await
        .expect("publish");
    // Until the acknowledgement: more chunks may come, then the stream's error; after
    // it: nothing.
    let mut error_before_ack = false;
    loop {
        let m = next_message(&mut sub).await;
        if m.subject.as_str().ends_with(".ack") {
            let r: SessionCancelReply = serde_json::from_slice(&m.payload).expect("json");
            assert_eq!(r.running_ids, vec!["turn-1".to_owned()]);
            break;
        }
        match event(&m).as_str() {
            "chunk" => assert!(!error_before_ack, "chunk after the stream's error"),
            "error" => {
                assert_eq!(header(&m, h::ERROR_CODE), Some("cancelled"));
                error_before_ack = true;
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert!(
        error_before_ack,
        "the stream was answered before the acknowledgement"
    );
    let after = tokio::time::timeout(Duration::from_millis(500), sub.next()).await;
    assert!(
        after.is_err(),
        "a message after the acknowledgement: {after:?}"
    );
    assert_eq!(rig.sim().stats().aborted, 1);
    rig.shutdown().await;
}

async fn next_message(sub: &mut async_nats::Subscriber) -> async_nats::Message {
    tokio::time::timeout(STEP, sub.next())
        .await
        .expect("a message in time")
        .expect("subscribed")
}

/// A plain HTTP server that accepts, reads one request (headers and its
/// `Content-Length` body), reports it, never answers, and reports when the connection
/// reads EOF.
async fn silent_http_server() -> (
    String,
    mpsc::UnboundedReceiver<()>,
    mpsc::UnboundedReceiver<Instant>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (got_tx, got_rx) = mpsc::unbounded_channel();
    let (eof_tx, eof_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (got_tx, eof_tx) = (got_tx.clone(), eof_tx.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let mut reported = false;
                loop {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => {
                            let _ = eof_tx.send(Instant::now());
                            return;
                        }
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    if !reported && request_complete(&buf) {
                        reported = true;
                        let _ = got_tx.send(());
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), got_rx, eof_rx)
}

/// Whether `buf` holds a whole HTTP/1.1 request with a `Content-Length` body.
fn request_complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    buf.len() >= end + 4 + len
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::test]
async fn a_session_cancel_or_supersede_closes_the_backend_http_connection_at_once() {
    let (base, mut got, mut eof) = silent_http_server().await;
    let toml = format!(
        "workers = 2\n[backend]\nkind = \"openai\"\ntimeout_ms = 60000\n[backend.openai]\nbase_url = \"{base}\""
    );
    let config = Config::from_toml_str(&toml).expect("config");
    let BackendKind::OpenAi(oc) = &config.backend.kind else {
        panic!("openai")
    };
    let backend = OpenAiBackend::new(oc, config.backend.timeout).expect("backend");
    let mut rig = Rig::with_backend(&toml, Arc::new(backend)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    const TRIALS: usize = 100;
    let mut closes = Vec::with_capacity(TRIALS);
    for i in 0..TRIALS {
        let session = format!("call-{i}");
        let t = send(&llm, &session, &format!("turn-{i}"));
        tokio::time::timeout(STEP, got.recv())
            .await
            .expect("the server got the request in time")
            .expect("server running");
        let t_cancel = Instant::now();
        let r = llm.cancel_session(&session).await.expect("cancel reply");
        assert_eq!(r.running, 1, "{r:?}");
        let closed = tokio::time::timeout(STEP, eof.recv())
            .await
            .expect("the connection closed in time")
            .expect("server running");
        closes.push(closed.saturating_duration_since(t_cancel));
        assert_eq!(server_code(&joined(t).await), Some(ErrorCode::Cancelled));
    }
    report("session cancel", closes);
    // Supersede: a new turn of the session closes the running turn's connection.
    let mut closes = Vec::with_capacity(TRIALS);
    for i in 0..TRIALS {
        let session = format!("talk-{i}");
        let old = send(&llm, &session, &format!("old-{i}"));
        tokio::time::timeout(STEP, got.recv())
            .await
            .expect("the server got the request in time")
            .expect("server running");
        let t_supersede = Instant::now();
        let new = tokio::spawn({
            let (llm, session) = (llm.clone(), session.clone());
            async move {
                llm.request("x")
                    .session(session)
                    .supersede()
                    .timeout(STEP)
                    .send()
                    .await
            }
        });
        let closed = tokio::time::timeout(STEP, eof.recv())
            .await
            .expect("the connection closed in time")
            .expect("server running");
        closes.push(closed.saturating_duration_since(t_supersede));
        assert_eq!(server_code(&joined(old).await), Some(ErrorCode::Cancelled));
        // The new turn reached the backend; end it for the next trial.
        tokio::time::timeout(STEP, got.recv())
            .await
            .expect("the new turn reached the server")
            .expect("server running");
        assert_eq!(
            llm.cancel_session(&session).await.expect("reply").running,
            1
        );
        tokio::time::timeout(STEP, eof.recv())
            .await
            .expect("closed in time")
            .expect("server running");
        assert_eq!(server_code(&joined(new).await), Some(ErrorCode::Cancelled));
    }
    report("supersede", closes);
    rig.shutdown().await;
}

/// Prints the p50 / p99 / max of `closes` and checks the p99.
fn report(what: &str, mut closes: Vec<Duration>) {
    closes.sort_unstable();
    let n = closes.len();
    let (p50, p99, max) = (
        percentile(&closes, 0.5),
        percentile(&closes, 0.99),
        closes[n - 1],
    );
    println!(
        "{what} -> backend connection closed, {n} trials: p50 {p50:?}, p99 {p99:?}, max {max:?}"
    );
    // The aim is p99 <= 10 ms; a shared 2-core machine gets a generous bound.
    assert!(p99 <= Duration::from_millis(200), "{what}: p99 {p99:?}");
}

/// Publishes one request to the durable intake stream with `headers` (the answer goes
/// to `reply`).
async fn publish_durable(
    js: &async_nats::jetstream::Context,
    reply: &str,
    rid: &str,
    headers: &[(&str, &str)],
) {
    let mut hm = HeaderMap::new();
    for (k, v) in [
        (h::REPLY_TO, reply),
        (h::NATS_MSG_ID, rid),
        (h::REQUEST_ID, rid),
    ]
    .iter()
    .chain(headers)
    {
        hm.insert(*k, *v);
    }
    tokio::time::timeout(STEP, async {
        js.publish_with_headers("llm.intake", hm, "x".into())
            .await
            .expect("publish")
            .await
            .expect("stored")
    })
    .await
    .expect("stored in time");
}

#[tokio::test]
async fn a_superseding_request_from_the_durable_intake_cancels_the_sessions_running_one() {
    let server = weir_testkit::NatsServer::start_with(weir_testkit::NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("nats-server with JetStream");
    // A replica holds at most `workers` intake requests: two, so that the superseding
    // request is pulled while the first one runs.
    let sim = weir_llm_adapter::backend::sim::SimBackend::fixed(Duration::from_millis(1500));
    let handle = sim.handle();
    let config = Config::from_toml_str(
        "workers = 2\nintake = \"jetstream\"\n[jetstream]\nack_wait_ms = 2000\nstorage = \"memory\"\n",
    )
    .expect("config");
    let adapter = tokio::time::timeout(
        STEP,
        weir_llm_adapter::start(common::connect(server.url()).await, config, Arc::new(sim)),
    )
    .await
    .expect("start in time")
    .expect("start");
    let caller = common::connect(server.url()).await;
    let inbox = caller.new_inbox();
    let mut replies = caller.subscribe(format!("{inbox}.>")).await.expect("sub");
    caller.flush().await.expect("flush");
    let js = async_nats::jetstream::new(caller.clone());

    publish_durable(&js, &format!("{inbox}.1"), "d-1", &[(h::SESSION_ID, "s1")]).await;
    eventually(STEP, || handle.stats().in_progress == 1).await;
    // A malformed supersede is refused (terminated) and cancels nothing.
    publish_durable(
        &js,
        &format!("{inbox}.bad"),
        "d-bad",
        &[(h::SESSION_ID, "s1"), (h::SUPERSEDE, "all")],
    )
    .await;
    let bad = next_message(&mut replies).await;
    assert!(
        bad.subject.as_str().ends_with(".bad"),
        "{} {:?}",
        bad.subject,
        bad.headers
    );
    assert_eq!(header(&bad, h::ERROR_CODE), Some("invalid_request"));
    assert_eq!(handle.stats().aborted, 0);
    publish_durable(
        &js,
        &format!("{inbox}.2"),
        "d-2",
        &[(h::SESSION_ID, "s1"), (h::SUPERSEDE, "session")],
    )
    .await;
    let first = next_message(&mut replies).await;
    assert!(first.subject.as_str().ends_with(".1"), "{}", first.subject);
    assert_eq!(header(&first, h::ERROR_CODE), Some("cancelled"));
    let body: ErrorBody = serde_json::from_slice(&first.payload).expect("error body");
    assert!(
        body.message.contains("superseded by request d-2"),
        "{}",
        body.message
    );
    let second = next_message(&mut replies).await;
    assert!(
        second.subject.as_str().ends_with(".2"),
        "{}",
        second.subject
    );
    assert_eq!(header(&second, h::ERROR_CODE), None);
    assert_eq!(header(&second, h::SUPERSEDED), Some("1"));
    assert_eq!(header(&second, h::SUPERSEDED_IDS), Some("d-1"));
    let st = handle.stats();
    assert_eq!((st.started, st.aborted, st.completed), (2, 1, 1));
    tokio::time::timeout(STEP, adapter.shutdown())
        .await
        .expect("shutdown in time");
}
