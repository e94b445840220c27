//! End to end over a real nats-server: the adapter in-process with the sim backend,
//! callers using the Rust client or raw NATS requests.

use crate::common;

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use common::{Rig, STEP, eventually};
use weir_llm_client::{ClientErrorKind, LlmClient};
use weir_protocol::llm::headers as h;
use weir_protocol::llm::{ErrorBody, ErrorCode, ResponseEnvelope};

async fn raw(
    caller: &async_nats::Client,
    subject: &str,
    headers: &[(&str, &str)],
    body: &'static [u8],
) -> async_nats::Message {
    let mut hm = HeaderMap::new();
    for (k, v) in headers {
        hm.insert(*k, *v);
    }
    let req = async_nats::Request::new()
        .payload(Bytes::from_static(body))
        .headers(hm)
        .timeout(Some(STEP))
        .inbox(caller.new_inbox());
    tokio::time::timeout(STEP, caller.send_request(subject.to_owned(), req))
        .await
        .expect("reply in time")
        .expect("reply")
}

fn hdr<'a>(m: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
}

fn server_code(
    r: &Result<weir_llm_client::LlmReply, weir_llm_client::ClientError>,
) -> Option<ErrorCode> {
    match r {
        Ok(_) => None,
        Err(e) => match e.kind() {
            ClientErrorKind::Server(c) => Some(c),
            other => panic!("unexpected client error {other:?}: {e}"),
        },
    }
}

#[tokio::test]
async fn session_cap_refuses_the_sixth_and_frees_a_slot_when_one_settles() {
    let mut rig = Rig::with_sim(
        "workers = 4\nqueue_capacity = 64",
        Duration::from_millis(150),
    )
    .await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let mut tasks = Vec::new();
    for i in 0..5 {
        let llm = llm.clone();
        tasks.push(tokio::spawn(async move {
            llm.request(format!("s1-{i}"))
                .session("s1")
                .timeout(STEP)
                .send()
                .await
        }));
    }
    eventually(STEP, || rig.adapter().stats().admitted == 5).await;
    let limits = rig.adapter().limits(5);
    assert_eq!(
        (limits.sessions[0].pending, limits.sessions[0].waiting),
        (5, 4)
    );

    let sixth = llm.request("s1-6").session("s1").timeout(STEP).send().await;
    assert_eq!(server_code(&sixth), Some(ErrorCode::SessionQueueFull));
    let d = sixth.expect_err("refused").details();
    assert_eq!((d.limit, d.pending), (Some(5), Some(5)));

    let other = llm.request("s2").session("s2").timeout(STEP).send().await;
    let other = other.expect("another session is accepted");
    assert_eq!(&other.body[..], b"s2");

    let first = tokio::time::timeout(STEP, tasks.remove(0))
        .await
        .expect("in time")
        .expect("join");
    assert!(first.is_ok());
    let seventh = llm.request("s1-7").session("s1").timeout(STEP).send().await;
    assert!(seventh.is_ok(), "{seventh:?}");
    for t in tasks {
        assert!(
            tokio::time::timeout(STEP, t)
                .await
                .expect("in time")
                .expect("join")
                .is_ok()
        );
    }
    let s = rig.adapter().stats();
    assert_eq!(s.slots_acquired, s.slots_released);
    assert_eq!(s.refused_of(ErrorCode::SessionQueueFull), 1);
    rig.shutdown().await;
}

#[tokio::test]
async fn refusals_carry_service_headers_and_envelope_shaped_bodies() {
    let mut rig = Rig::with_sim(
        "workers = 1\nqueue_capacity = 1\n[session]\npending_cap = 0\nordering = false",
        Duration::from_millis(10),
    )
    .await;
    rig.sim().pause();
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let a = tokio::spawn({
        let llm = llm.clone();
        async move { llm.request("a").timeout(STEP).send().await }
    });
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    let b = tokio::spawn({
        let llm = llm.clone();
        async move { llm.request("b").timeout(STEP).send().await }
    });
    eventually(STEP, || rig.adapter().stats().queued_now == 1).await;

    // Deployed envelope, no Weir headers: the error is a response envelope.
    let env = br#"{"trace_id":"tr-1","request_id":"rq-1","correlation_id":"co-1","session_id":"se-1","ts_ms":1700000000000,"data":{"prompt":"hi"}}"#;
    let m = raw(&rig.caller, "llm.infer", &[], env).await;
    assert_eq!(hdr(&m, h::NATS_SERVICE_ERROR_CODE), Some("503"));
    assert_eq!(hdr(&m, h::ERROR_CODE), Some("queue_full"));
    assert!(hdr(&m, h::NATS_SERVICE_ERROR).is_some_and(|v| v.starts_with("queue_full: ")));
    let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("json");
    assert_eq!(v["trace_id"], "tr-1");
    assert_eq!(v["request_id"], "rq-1");
    assert_eq!(v["correlation_id"], "co-1");
    assert_eq!(v["session_id"], "se-1");
    assert_eq!(v["ts_ms"], 1_700_000_000_000u64);
    assert_eq!(v["ok"], false);
    assert_eq!(v["data"], serde_json::Value::Null);
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(v["error"]["details"]["limit"], 1);
    assert_eq!(v["error"]["details"]["pending"], 1);
    assert!(v["error"]["details"]["retry_after_ms"].as_u64().is_some());
    let env: ResponseEnvelope = serde_json::from_value(v).expect("valid envelope");
    assert!(!env.ok);

    // Plain body: the error body is {"code","message","details"}.
    let m = raw(&rig.caller, "llm.infer", &[], b"plain").await;
    let e = ErrorBody::from_json(&m.payload).expect("error body");
    assert_eq!(e.code, ErrorCode::QueueFull);

    // Malformed header: invalid_request, naming the header; still envelope-shaped.
    let m = raw(
        &rig.caller,
        "llm.infer",
        &[(h::TIMEOUT_MS, "soon")],
        env_body(),
    )
    .await;
    assert_eq!(hdr(&m, h::ERROR_CODE), Some("invalid_request"));
    assert_eq!(hdr(&m, h::NATS_SERVICE_ERROR_CODE), Some("400"));
    let env: ResponseEnvelope = serde_json::from_slice(&m.payload).expect("envelope");
    let err = env.error.expect("error");
    assert!(err.message.contains(h::TIMEOUT_MS), "{}", err.message);

    rig.sim().resume();
    for t in [a, b] {
        let r = tokio::time::timeout(STEP, t)
            .await
            .expect("in time")
            .expect("join");
        let reply = r.expect("served once resumed");
        assert!(reply.queue_time.is_some() && reply.inference_time.is_some());
    }
    let s = rig.adapter().stats();
    assert_eq!(s.refused_of(ErrorCode::QueueFull), 2);
    assert_eq!(s.refused_of(ErrorCode::InvalidRequest), 1);
    rig.shutdown().await;
}

fn env_body() -> &'static [u8] {
    br#"{"trace_id":"t","request_id":"r","correlation_id":null,"session_id":null,"ts_ms":1}"#
}

#[tokio::test]
async fn micro_service_discovery_capabilities_and_limits() {
    let mut rig = Rig::with_sim(
        r#"
        workers = 2
        [session]
        pending_cap = 0
        [[limits]]
        name = "per-client"
        key = "client"
        limit = 1
        max_wait_ms = 5000
        "#,
        Duration::from_millis(10),
    )
    .await;
    let c = &rig.caller;
    let ping = raw(c, "$SRV.PING.weir-llm", &[], b"").await;
    let v: serde_json::Value = serde_json::from_slice(&ping.payload).expect("json");
    assert_eq!(v["name"], "weir-llm");
    let info = raw(c, "$SRV.INFO.weir-llm", &[], b"").await;
    let v: serde_json::Value = serde_json::from_slice(&info.payload).expect("json");
    let mut subjects: Vec<&str> = v["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .filter_map(|e| e["subject"].as_str())
        .collect();
    subjects.sort_unstable();
    assert_eq!(
        subjects,
        [
            "llm.cancel",
            "llm.capabilities",
            "llm.infer",
            "llm.limits",
            "llm.status"
        ]
    );
    assert!(
        v["endpoints"]
            .as_array()
            .expect("endpoints")
            .iter()
            .all(|e| e["queue_group"] == "q")
    );

    let caps = raw(c, "llm.capabilities", &[], b"").await;
    let v: serde_json::Value = serde_json::from_slice(&caps.payload).expect("json");
    assert_eq!(
        v["session"]["pending_cap"],
        serde_json::Value::Null,
        "disabled cap is null"
    );
    assert_eq!(v["limits"][0]["name"], "per-client");
    assert_eq!(v["limits"][0]["limit"], 1);
    assert_eq!(v["limits"][0]["max_waiters"], 100);
    assert_eq!(v["queue_capacity"], 256);

    rig.sim().pause();
    let llm = LlmClient::new(c.clone(), "llm.infer");
    let mut tasks = Vec::new();
    for i in 0..3 {
        let llm = llm.clone();
        tasks.push(tokio::spawn(async move {
            llm.request(format!("{i}"))
                .client_key("tenant-a")
                .timeout(STEP)
                .send()
                .await
        }));
    }
    eventually(STEP, || rig.adapter().stats().admitted == 3).await;
    let lim = raw(c, "llm.limits", &[], b"5").await;
    let v: serde_json::Value = serde_json::from_slice(&lim.payload).expect("json");
    assert_eq!(v["keys"][0]["key"], "client:tenant-a");
    assert_eq!(v["keys"][0]["in_flight"], 1);
    assert_eq!(v["keys"][0]["waiting"], 2);
    assert!(v["keys"][0]["longest_wait_ms"].as_f64().is_some());
    assert_eq!(v["queue"]["running"], 1);

    let stats = raw(c, "$SRV.STATS.weir-llm", &[], b"").await;
    let v: serde_json::Value = serde_json::from_slice(&stats.payload).expect("json");
    let infer = v["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .find(|e| e["name"] == "infer")
        .expect("infer endpoint")
        .clone();
    assert_eq!(infer["data"]["offered"], 3);

    rig.sim().resume();
    for t in tasks {
        assert!(
            tokio::time::timeout(STEP, t)
                .await
                .expect("in time")
                .expect("join")
                .is_ok()
        );
    }
    rig.shutdown().await;
}

#[tokio::test]
async fn cancel_queued_and_running_over_nats() {
    let mut rig = Rig::with_sim("workers = 1", Duration::from_secs(30)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let run = tokio::spawn({
        let llm = llm.clone();
        async move {
            llm.request("r")
                .request_id("run-1")
                .timeout(STEP)
                .send()
                .await
        }
    });
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    let queued = tokio::spawn({
        let llm = llm.clone();
        async move {
            llm.request("q")
                .request_id("queued-1")
                .timeout(STEP)
                .send()
                .await
        }
    });
    eventually(STEP, || rig.adapter().stats().queued_now == 1).await;

    let r = llm.cancel("queued-1").await.expect("cancel reply");
    assert_eq!(r.result, "queued");
    let q = tokio::time::timeout(STEP, queued)
        .await
        .expect("in time")
        .expect("join");
    assert_eq!(server_code(&q), Some(ErrorCode::Cancelled));

    let r = llm.cancel("run-1").await.expect("cancel reply");
    assert_eq!(r.result, "running");
    let x = tokio::time::timeout(STEP, run)
        .await
        .expect("in time")
        .expect("join");
    assert_eq!(server_code(&x), Some(ErrorCode::Cancelled));
    assert_eq!(
        llm.cancel("run-1").await.expect("reply").result,
        "not_found"
    );

    // A cancel header on the inference subject works too.
    let m = raw(&rig.caller, "llm.infer", &[(h::CANCEL, "nothing")], b"").await;
    let v: serde_json::Value = serde_json::from_slice(&m.payload).expect("json");
    assert_eq!(v["result"], "not_found");

    eventually(STEP, || rig.sim().stats().aborted == 1).await;
    assert_eq!(
        rig.sim().stats().started,
        1,
        "the queued one never reached the backend"
    );
    rig.shutdown().await;
}

#[tokio::test]
async fn idempotent_retries_run_inference_once_and_conflicts_are_refused() {
    let mut rig = Rig::with_sim("workers = 2", Duration::from_millis(200)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let send = |body: &'static str| {
        let llm = llm.clone();
        tokio::spawn(async move {
            llm.request(body)
                .request_id("idem-1")
                .session("s")
                .timeout(STEP)
                .send()
                .await
        })
    };
    let first = send("hello");
    eventually(STEP, || rig.adapter().stats().admitted == 1).await;
    let retry = send("hello");
    eventually(STEP, || rig.adapter().stats().joined == 1).await;
    let conflict = send("different").await.expect("join");
    assert_eq!(server_code(&conflict), Some(ErrorCode::RequestIdConflict));
    let a = tokio::time::timeout(STEP, first)
        .await
        .expect("in time")
        .expect("join")
        .expect("ok");
    let b = tokio::time::timeout(STEP, retry)
        .await
        .expect("in time")
        .expect("join")
        .expect("ok");
    assert_eq!(a.body, b.body);
    let cached = send("hello").await.expect("join").expect("cached reply");
    assert_eq!(&cached.body[..], b"hello");
    assert_eq!(
        rig.sim().stats().started,
        1,
        "one inference for three answers"
    );
    assert_eq!(rig.adapter().stats().cached, 1);
    rig.shutdown().await;
}

#[tokio::test]
async fn deadline_passing_in_the_queue_never_reaches_the_backend() {
    let mut rig = Rig::with_sim("workers = 1", Duration::from_millis(600)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let first = tokio::spawn({
        let llm = llm.clone();
        async move { llm.request("first").timeout(STEP).send().await }
    });
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    let t0 = std::time::Instant::now();
    let late = llm
        .request("late")
        .timeout(Duration::from_millis(150))
        .send()
        .await;
    let took = t0.elapsed();
    assert_eq!(server_code(&late), Some(ErrorCode::DeadlineExceeded));
    assert!(
        took < Duration::from_millis(500),
        "answered at the deadline, not after the backend: {took:?}"
    );
    assert!(
        tokio::time::timeout(STEP, first)
            .await
            .expect("in time")
            .expect("join")
            .is_ok()
    );
    assert_eq!(rig.sim().stats().started, 1);
    assert_eq!(rig.sim().stats().started_after_deadline, 0);
    assert_eq!(rig.adapter().stats().started_after_deadline, 0);

    // An absolute deadline already in the past is refused at admission.
    let past = std::time::SystemTime::now() - Duration::from_secs(1);
    let r = llm.request("past").deadline(past).send().await;
    assert_eq!(server_code(&r), Some(ErrorCode::DeadlineExceeded));
    rig.shutdown().await;
}

#[tokio::test]
async fn paused_backend_gives_queue_full_at_once_and_stays_bounded() {
    let mut rig = Rig::with_sim(
        "workers = 2\nqueue_capacity = 8\n[session]\npending_cap = 0",
        Duration::from_millis(5),
    )
    .await;
    rig.sim().pause();
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let mut tasks = Vec::new();
    for i in 0..200 {
        let llm = llm.clone();
        tasks.push(tokio::spawn(async move {
            llm.request(format!("{i}"))
                .timeout(Duration::from_secs(20))
                .send()
                .await
        }));
    }
    eventually(STEP, || {
        rig.adapter().stats().refused_of(ErrorCode::QueueFull) == 190
    })
    .await;
    let s = rig.adapter().stats();
    assert_eq!((s.queued_now, s.running_now), (8, 2));
    rig.sim().resume();
    let mut ok = 0;
    let mut full = 0;
    for t in tasks {
        match tokio::time::timeout(STEP, t)
            .await
            .expect("in time")
            .expect("join")
        {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::QueueFull));
                assert!(e.retry_after().is_some());
                full += 1;
            }
        }
    }
    assert_eq!((ok, full), (10, 190));
    rig.shutdown().await;
}

#[tokio::test]
async fn service_is_reachable_again_after_a_nats_restart() {
    let mut rig = Rig::with_sim("workers = 2", Duration::from_millis(1)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    assert!(
        llm.request("before")
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok()
    );
    rig.server.restart().expect("restart");
    let t0 = std::time::Instant::now();
    loop {
        match llm
            .request("after")
            .timeout(Duration::from_millis(500))
            .send()
            .await
        {
            Ok(r) => {
                assert_eq!(&r.body[..], b"after");
                break;
            }
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(15),
                    "not reachable again: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let view = rig.adapter().view();
    eventually(STEP, || view.is_ready()).await;
    rig.shutdown().await;
}

#[tokio::test]
async fn shutdown_answers_queued_lets_running_finish_then_stops_listening() {
    let mut rig = Rig::with_sim(
        "workers = 1\nshutdown_grace_ms = 3000",
        Duration::from_millis(300),
    )
    .await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let running = tokio::spawn({
        let llm = llm.clone();
        async move { llm.request("running").timeout(STEP).send().await }
    });
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    let queued = tokio::spawn({
        let llm = llm.clone();
        async move { llm.request("queued").timeout(STEP).send().await }
    });
    eventually(STEP, || rig.adapter().stats().queued_now == 1).await;
    let adapter = rig.adapter.take().expect("adapter");
    let report = tokio::time::timeout(STEP, adapter.shutdown())
        .await
        .expect("in time");
    assert_eq!((report.answered_queued, report.aborted_running), (1, 0));
    let q = tokio::time::timeout(STEP, queued)
        .await
        .expect("in time")
        .expect("join");
    assert_eq!(server_code(&q), Some(ErrorCode::ShuttingDown));
    let r = tokio::time::timeout(STEP, running)
        .await
        .expect("in time")
        .expect("join");
    assert!(r.is_ok(), "running request finished within grace: {r:?}");
    let after = llm
        .request("after")
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert_eq!(
        after.expect_err("nobody listens").kind(),
        ClientErrorKind::NoResponders
    );
}

#[tokio::test]
async fn client_mirrors_the_advertised_session_cap_locally() {
    let mut rig = Rig::with_sim(
        "workers = 1\n[session]\npending_cap = 2",
        Duration::from_millis(200),
    )
    .await;
    let llm = LlmClient::discover(rig.caller.clone(), "llm.capabilities", STEP)
        .await
        .expect("capabilities");
    assert_eq!(llm.session_cap(), Some(2));
    let mut tasks = Vec::new();
    for i in 0..2 {
        let llm = llm.clone();
        tasks.push(tokio::spawn(async move {
            llm.request(format!("{i}"))
                .session("s")
                .timeout(STEP)
                .send()
                .await
        }));
    }
    eventually(STEP, || rig.adapter().stats().admitted == 2).await;
    let local = llm.request("x").session("s").timeout(STEP).send().await;
    let e = local.expect_err("local cap");
    assert_eq!(e.kind(), ClientErrorKind::LocalSessionCap);
    assert_eq!(e.details().limit, Some(2));
    assert_eq!(
        rig.adapter().stats().offered,
        2,
        "refused without a round trip"
    );
    for t in tasks {
        assert!(
            tokio::time::timeout(STEP, t)
                .await
                .expect("in time")
                .expect("join")
                .is_ok()
        );
    }
    // Slots are released when calls return.
    assert!(
        llm.request("y")
            .session("s")
            .timeout(STEP)
            .send()
            .await
            .is_ok()
    );
    rig.shutdown().await;
}

#[tokio::test]
async fn trace_events_are_published_on_the_events_subject() {
    let mut rig = Rig::with_sim(
        "workers = 1\n[trace]\nlog = false\nsubject = \"llm.events\"",
        Duration::from_millis(5),
    )
    .await;
    let mut events = rig.caller.subscribe("llm.events").await.expect("subscribe");
    rig.caller.flush().await.expect("flush");
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    llm.request("x")
        .request_id("traced-1")
        .session("s")
        .timeout(STEP)
        .send()
        .await
        .expect("reply");
    let mut seen = Vec::new();
    while !seen.iter().any(|e: &String| e == "finished") {
        let msg = tokio::time::timeout(STEP, futures::StreamExt::next(&mut events))
            .await
            .expect("event in time")
            .expect("event");
        let v: serde_json::Value = serde_json::from_slice(&msg.payload).expect("json");
        assert_eq!(v["request_id"], "traced-1");
        assert!(v["t_ms"].as_f64().is_some());
        seen.push(v["event"].as_str().expect("event name").to_owned());
    }
    assert_eq!(
        seen,
        ["queued", "slot_acquired", "admitted", "started", "finished"],
        "session cap slot, no key limits"
    );
    rig.shutdown().await;
}

#[tokio::test]
async fn connect_applies_the_configured_credentials() {
    use weir_llm_adapter::StartErrorKind;
    use weir_llm_adapter::config::Config;
    use weir_testkit::{Auth, NatsServer, NatsServerOptions};
    let server = NatsServer::start_with(NatsServerOptions {
        auth: Some(Auth::UserPassword {
            user: "llm".into(),
            password: "s3cret".into(),
        }),
        ..Default::default()
    })
    .expect("nats-server");
    let cfg = |extra: &str| {
        Config::from_toml_str(&format!(
            // The first connection must succeed here, so that wrong credentials fail
            // the connect (with the default retry they leave the adapter not ready and
            // logged, as the ingress does).
            "[nats]\nurl = \"{}\"\nconnection_timeout_ms = 500\nretry_initial_connect = false\n{extra}",
            server.url()
        ))
        .expect("config")
        .nats
    };
    let ok = weir_llm_adapter::connect(&cfg("user = \"llm\"\npassword = \"s3cret\"")).await;
    assert!(ok.is_ok(), "{:?}", ok.err());
    let bad = tokio::time::timeout(
        STEP,
        weir_llm_adapter::connect(&cfg("user = \"llm\"\npassword = \"wrong\"")),
    )
    .await
    .expect("fails in time");
    assert_eq!(bad.expect_err("refused").kind(), StartErrorKind::Connect);
}

/// Overload in counts and codes (the timing targets live in the overload bench and the
/// nats-py check): with the defaults and only `workers = 1`, a burst beyond what fits
/// in the budget is answered — every request, `ok` or `deadline_exceeded` — and the
/// excess is refused at admission on the prediction, with the numbers that explain it.
#[tokio::test]
async fn defaults_refuse_at_once_what_the_prediction_says_cannot_finish() {
    let mut rig = Rig::with_sim(
        "workers = 1\n[trace]\nlog = false",
        Duration::from_millis(20),
    )
    .await;
    // Measure the backend first (no seed: the cold start admits).
    for _ in 0..5 {
        let m = raw(&rig.caller, "llm.infer", &[], b"warm").await;
        assert_eq!(hdr(&m, h::ERROR_CODE), None);
    }
    let est = rig.adapter().stats().service_estimate.expect("estimate");
    assert!(est.service_time_ms.is_some_and(|ms| ms >= 20.0), "{est:?}");

    let mut tasks = Vec::new();
    for _ in 0..60 {
        let caller = rig.caller.clone();
        tasks.push(tokio::spawn(async move {
            raw(&caller, "llm.infer", &[(h::TIMEOUT_MS, "500")], b"x").await
        }));
    }
    let (mut ok, mut predicted, mut later) = (0, 0, 0);
    for t in tasks {
        let m = t.await.expect("task");
        match hdr(&m, h::ERROR_CODE) {
            None => ok += 1,
            Some("deadline_exceeded") => {
                let e = ErrorBody::from_json(&m.payload).expect("error body");
                assert!(hdr(&m, h::INFERENCE_MS).is_none(), "never started");
                if e.details.predicted_start_ms.is_some() {
                    assert!(e.details.budget_ms.is_some_and(|b| b <= 500));
                    assert!(e.details.estimate_ms.is_some());
                    assert!(e.details.retry_after_ms.is_some_and(|r| r >= 1));
                    predicted += 1;
                } else {
                    later += 1;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ok + predicted + later, 60);
    assert!(
        ok >= 1 && predicted >= 1,
        "ok {ok}, refused at admission {predicted}"
    );
    let s = rig.adapter().stats();
    assert_eq!(s.started_after_deadline, 0);
    assert_eq!(
        rig.sim
            .as_ref()
            .expect("sim")
            .stats()
            .started_after_deadline,
        0
    );
    assert_eq!(
        s.refused_of(ErrorCode::QueueFull),
        0,
        "the prediction refuses first"
    );
    rig.shutdown().await;
}
