//! The example `deploy/nats-server.conf` against hostile users: a real nats-server
//! loading it (the port on the command line), the real `llm-adapter serve` on
//! `deploy/llm-adapter.toml` (its user's credentials from the environment, as the
//! unit's environment file gives them; the sim backend instead of the example's
//! OpenAI server), and clients connected as the example's users with their inbox
//! prefixes.
//!
//! Probes: `guest` reads no caller's replies and may publish nowhere weir listens; a
//! `caller` that names an internal subject as its reply subject makes the adapter
//! publish nothing there (no `allow_responses`); malformed messages from a `caller`
//! lose no request and cost the adapter no connection.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::{Client, ConnectOptions, Event, HeaderMap};
use bytes::Bytes;
use common::STEP;
use common::bin::{BIN, Child, first_line};
use futures::StreamExt;
use weir_testkit::{NatsServer, NatsServerOptions};

const EXAMPLE_CONF: &str = include_str!("../../../../deploy/nats-server.conf");
const ADAPTER_TOML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/llm-adapter.toml");

/// The server with the example configuration and the adapter binary on it.
struct Kit {
    server: NatsServer,
    _adapter: Child,
    admin: String,
}

async fn kit() -> Kit {
    let server = NatsServer::start_with(NatsServerOptions {
        config: Some(EXAMPLE_CONF.to_owned()),
        ..Default::default()
    })
    .expect("nats-server with the example configuration");
    let mut adapter = Child(
        std::process::Command::new(BIN)
            .args(["serve", "--config", ADAPTER_TOML])
            .args(["--admin", "127.0.0.1:0", "--nats-url", server.url()])
            .env("WEIR_LLM_NATS__USER", "llm-adapter")
            .env("WEIR_LLM_NATS__PASSWORD", "adapter-secret")
            .env("WEIR_LLM_BACKEND__KIND", "sim")
            .env("WEIR_LLM_BACKEND__SIM__LATENCY_MS", "1")
            .env("WEIR_LLM_BACKEND__SIM__FIRST_TOKEN_MS", "1")
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn llm-adapter"),
    );
    let line = first_line(&mut adapter).await;
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
    let admin = ready["admin"].as_str().expect("admin").to_owned();
    Kit {
        server,
        _adapter: adapter,
        admin,
    }
}

impl Kit {
    async fn disconnects(&self) -> u64 {
        let url = format!("http://{}/v1/stats", self.admin);
        let r = tokio::time::timeout(STEP, reqwest::get(url))
            .await
            .expect("stats in time")
            .expect("stats");
        let v: serde_json::Value = r.json().await.expect("stats JSON");
        v["nats"]["disconnects"].as_u64().expect("nats.disconnects")
    }
}

/// A client as `user` with its inbox prefix `_INBOX.<user>`; server errors (the
/// permission violations) are counted in `errors`.
async fn user(kit: &Kit, user: &str, password: &str, errors: Arc<AtomicUsize>) -> Client {
    let c = ConnectOptions::with_user_and_password(user.into(), password.into())
        .custom_inbox_prefix(format!("_INBOX.{user}"))
        .connection_timeout(Duration::from_millis(500))
        .ping_interval(Duration::from_secs(1))
        .event_callback(move |e| {
            let errors = errors.clone();
            async move {
                if let Event::ServerError(e) = e
                    && e.to_string().contains("Permissions Violation")
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .connect(kit.server.url());
    tokio::time::timeout(STEP, c)
        .await
        .expect("connect in time")
        .unwrap_or_else(|e| panic!("{user} connects: {e}"))
}

/// `caller`, with no interest in server errors.
async fn caller(kit: &Kit) -> Client {
    user(kit, "caller", "caller-secret", Arc::default()).await
}

/// Requests until the adapter answers (it may still be subscribing).
async fn answered(caller: &Client) {
    let t0 = std::time::Instant::now();
    loop {
        let r = tokio::time::timeout(
            Duration::from_millis(500),
            caller.request("llm.infer", Bytes::from_static(b"{}")),
        )
        .await;
        if matches!(r, Ok(Ok(_))) {
            return;
        }
        assert!(t0.elapsed() < STEP, "the adapter never answered: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Counts every message on `subject` for `user` in the background.
async fn count_on(client: &Client, subject: &str) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    let mut sub = client.subscribe(subject.to_owned()).await.expect("sub");
    let seen = n.clone();
    tokio::spawn(async move {
        while sub.next().await.is_some() {
            seen.fetch_add(1, Ordering::Relaxed);
        }
    });
    n
}

/// A raw NATS connection as `user`: `CONNECT`, `frames` verbatim, `PING`; what the
/// server answered up to the `PONG` (blocking, bounded: `weir_testkit::raw`).
async fn raw_publish(port: u16, user: (&str, &str), frames: &[u8]) -> String {
    weir_testkit::raw::publish(port, Some(user), &[frames.to_vec()]).expect("raw publish")
}

/// Waits until `n` reaches `want` (bounded by `STEP`).
async fn reaches(n: &AtomicUsize, want: usize) {
    let t0 = std::time::Instant::now();
    while n.load(Ordering::Relaxed) < want {
        assert!(
            t0.elapsed() < STEP,
            "{} of {want}",
            n.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_reads_no_replies_meant_for_callers() {
    let kit = kit().await;
    let caller = caller(&kit).await;
    answered(&caller).await;
    let refused = Arc::new(AtomicUsize::new(0));
    let guest = user(&kit, "guest", "guest-secret", refused.clone()).await;
    let all = count_on(&guest, "_INBOX.>").await;
    let callers = count_on(&guest, "_INBOX.caller.>").await;
    // Both subscriptions refused by the server (so it has processed them).
    reaches(&refused, 2).await;

    // The caller gets every answer, unary and streamed.
    for i in 0..50 {
        let r = tokio::time::timeout(
            STEP,
            caller.request("llm.infer", format!(r#"{{"prompt":"secret {i}"}}"#).into()),
        )
        .await
        .expect("in time")
        .expect("answered");
        assert!(r.headers.is_some());
    }
    let llm = weir_llm_client::LlmClient::new(caller.clone(), "llm.infer");
    let mut st = llm
        .request(common::stream_body(40))
        .timeout(Duration::from_secs(5))
        .stream()
        .await
        .expect("stream");
    let mut end = None;
    while let Some(ev) = st.next().await {
        if let weir_llm_client::LlmEvent::End(e) = ev.expect("event") {
            end = Some(e);
        }
    }
    let end = end.expect("end");
    assert!(end.chunks > 16, "acknowledgements pass the window: {end:?}");
    // Anything the guest could read would have arrived with the caller's replies.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(all.load(Ordering::Relaxed), 0, "guest read _INBOX.>");
    assert_eq!(
        callers.load(Ordering::Relaxed),
        0,
        "guest read _INBOX.caller.>"
    );
    assert_eq!(kit.disconnects().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_may_publish_nowhere_weir_listens() {
    let kit = kit().await;
    let caller = caller(&kit).await;
    answered(&caller).await;
    let worker = user(&kit, "asr-worker", "asr-secret", Arc::default()).await;
    let audio = count_on(&worker, "audio.>").await;
    let deployed = count_on(&worker, "inference.whisper.stream.*").await;
    let heartbeat = count_on(&worker, "weir.lease.weir_leases.heartbeat").await;
    worker.flush().await.expect("flush");
    // Make sure the worker's subscriptions are in place: its own probe comes back.
    let probe = count_on(&worker, "_INBOX.asr-worker.probe").await;
    worker
        .publish("_INBOX.asr-worker.probe", Bytes::new())
        .await
        .expect("probe");
    reaches(&probe, 1).await;

    let guest = ("guest", "guest-secret");
    for frame in [
        &b"PUB _INBOX.llm-adapter.x.1 2\r\n17\r\n"[..],
        b"PUB _INBOX.llm-adapter.\xff 2\r\n17\r\n",
        b"PUB audio.x 2\r\n{}\r\n",
        b"PUB audio.\xff 2\r\n{}\r\n",
        b"PUB inference.whisper.stream.x 2\r\n{}\r\n",
        b"PUB llm.infer _INBOX.guest.x 2\r\n{}\r\n",
        b"PUB llm.status _INBOX.guest.x 2\r\n{}\r\n",
        b"PUB llm.\xff _INBOX.guest.x 2\r\n{}\r\n",
        b"PUB $SRV.PING _INBOX.guest.x 0\r\n\r\n",
        b"PUB weir.lease.weir_leases.heartbeat 2\r\n{}\r\n",
        b"PUB $KV.weir_leases.p.0 2\r\n{}\r\n",
    ] {
        let seen = raw_publish(kit.server.port(), guest, frame).await;
        assert!(
            seen.contains("Permissions Violation for Publish"),
            "{:?}: {seen}",
            String::from_utf8_lossy(frame)
        );
    }
    answered(&caller).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        (
            audio.load(Ordering::Relaxed),
            deployed.load(Ordering::Relaxed),
            heartbeat.load(Ordering::Relaxed)
        ),
        (0, 0, 0)
    );
    assert_eq!(kit.disconnects().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_subject_cannot_aim_the_adapter_at_an_internal_subject() {
    let kit = kit().await;
    let caller = caller(&kit).await;
    answered(&caller).await;
    let worker = user(&kit, "asr-worker", "asr-secret", Arc::default()).await;
    let heartbeat = count_on(&worker, "weir.lease.weir_leases.heartbeat").await;
    let audio = count_on(&worker, "audio.>").await;
    let probe = count_on(&worker, "_INBOX.asr-worker.probe").await;
    worker
        .publish("_INBOX.asr-worker.probe", Bytes::new())
        .await
        .expect("probe");
    reaches(&probe, 1).await;

    // Unary and streamed requests whose reply subject names an internal subject.
    let mut ids = Vec::new();
    for (i, reply) in [
        "weir.lease.weir_leases.heartbeat",
        "audio.x",
        "$KV.weir_leases.p.0",
    ]
    .iter()
    .enumerate()
    {
        for stream in [false, true] {
            let id = format!("aim-{i}-{stream}");
            let mut h = HeaderMap::new();
            h.insert("Weir-Request-Id", id.as_str());
            if stream {
                h.insert("Weir-Stream", "1");
            }
            let body = if stream {
                common::stream_body(4)
            } else {
                "{}".to_owned()
            };
            caller
                .publish_with_reply_and_headers("llm.infer", *reply, h, body.into())
                .await
                .expect("queued");
            ids.push(id);
        }
    }
    // The adapter ran each of them (its status says so) and stays connected.
    for id in &ids {
        let t0 = std::time::Instant::now();
        loop {
            let st = tokio::time::timeout(STEP, caller.request("llm.status", id.clone().into()))
                .await
                .expect("in time")
                .expect("status answered");
            let v: serde_json::Value = serde_json::from_slice(&st.payload).expect("json");
            if v["status"] == "done" {
                break;
            }
            assert!(t0.elapsed() < STEP, "{id}: {v}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    answered(&caller).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        heartbeat.load(Ordering::Relaxed),
        0,
        "the adapter heartbeat"
    );
    assert_eq!(
        audio.load(Ordering::Relaxed),
        0,
        "the adapter published audio"
    );
    assert_eq!(kit.disconnects().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_from_a_caller_lose_no_request() {
    const REQUESTS: usize = 200;
    let kit = kit().await;
    let caller = caller(&kit).await;
    answered(&caller).await;
    let answered_ok = Arc::new(AtomicUsize::new(0));
    let load = {
        let caller = caller.clone();
        let ok = answered_ok.clone();
        tokio::spawn(async move {
            let per_task = REQUESTS / 8;
            let tasks: Vec<_> = (0..8)
                .map(|_| {
                    let caller = caller.clone();
                    let ok = ok.clone();
                    tokio::spawn(async move {
                        for _ in 0..per_task {
                            let r = tokio::time::timeout(
                                STEP,
                                caller.request("llm.infer", Bytes::from_static(b"{}")),
                            )
                            .await;
                            if matches!(r, Ok(Ok(_))) {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
        })
    };
    // 10 malformed messages from `caller`, spread over the load: a non-UTF-8 reply
    // subject, a broken header block (12 header bytes that are not `NATS/1.0`), on the
    // request subject and on the status subject.
    let frames: [&[u8]; 3] = [
        b"PUB llm.infer _INBOX.caller.\xff\xfe 2\r\n{}\r\n",
        b"HPUB llm.infer _INBOX.caller.x 12 14\r\nGARBAGE\xff\r\n\r\n{}\r\n",
        b"PUB llm.status _INBOX.caller.\xff 2\r\nid\r\n",
    ];
    for i in 0..10 {
        let seen = raw_publish(
            kit.server.port(),
            ("caller", "caller-secret"),
            frames[i % frames.len()],
        )
        .await;
        assert!(!seen.contains("-ERR"), "accepted from a caller: {seen}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::timeout(Duration::from_secs(60), load)
        .await
        .expect("load in time")
        .expect("load");
    assert_eq!(
        answered_ok.load(Ordering::Relaxed),
        REQUESTS,
        "requests lost"
    );
    assert_eq!(kit.disconnects().await, 0, "adapter disconnects");
}

/// Runs tests/py/deploy_kit_caller.py (the Python client, `weir.llm` of the installed
/// `weir` package, as `caller`) with nats-py's `inbox_prefix`; its JSON summary.
async fn python_caller(kit: &Kit, inbox_prefix: &str) -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = root.join("tests/py/deploy_kit_caller.py");
    let url = kit.server.url().to_owned();
    let prefix = inbox_prefix.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(weir_testkit::python::weir_python())
            .arg(&script)
            .args(["--nats", &url, "--inbox-prefix", &prefix])
            .output()
    });
    // The bound includes building the wheel when it is not current (a no-op after
    // scripts/test built it).
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .expect("the script ends in time")
        .expect("join")
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "deploy_kit_caller.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("summary JSON ({e}): {stdout}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_is_answered_with_its_users_inbox_prefix_only() {
    let kit = kit().await;
    answered(&caller(&kit).await).await;
    let v = python_caller(&kit, "_INBOX.caller").await;
    assert_eq!(
        (&v["unary"], &v["stream"]),
        (&"ok".into(), &"ok".into()),
        "{v}"
    );
    assert!(v["chunks"].as_u64().unwrap_or(0) > 16, "{v}");
    // With the default prefix its reply inbox is refused: no answer reaches it.
    let v = python_caller(&kit, "_INBOX").await;
    assert_eq!(v["unary"], "timed_out", "{v}");
    assert_eq!(kit.disconnects().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_discovers_and_reads_but_may_not_infer_or_cancel() {
    let kit = kit().await;
    answered(&caller(&kit).await).await;
    let operator = user(&kit, "operator", "operator-secret", Arc::default()).await;
    // Discovery and stats answered to the operator's own inbox.
    for subject in [
        "$SRV.PING",
        "$SRV.INFO.weir-llm",
        "$SRV.STATS.weir-llm",
        "llm.limits",
    ] {
        let r = tokio::time::timeout(STEP, operator.request(subject, Bytes::new()))
            .await
            .expect("in time")
            .unwrap_or_else(|e| panic!("{subject}: {e}"));
        assert!(!r.payload.is_empty(), "{subject}");
    }
    for frame in [
        &b"PUB llm.infer _INBOX.operator.x 2\r\n{}\r\n"[..],
        b"PUB llm.cancel _INBOX.operator.x 2\r\nid\r\n",
        b"PUB _INBOX.llm-adapter.x.1 2\r\n17\r\n",
    ] {
        let seen = raw_publish(kit.server.port(), ("operator", "operator-secret"), frame).await;
        assert!(seen.contains("Permissions Violation for Publish"), "{seen}");
    }
    assert_eq!(kit.disconnects().await, 0);
}
