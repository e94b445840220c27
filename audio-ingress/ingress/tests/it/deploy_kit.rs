//! The deploy kit against the real binary: `deploy/audio-ingress.toml` starts
//! `audio-ingress serve` as the systemd unit would (secret from the environment), and
//! every `weir_ingress_*` and `process_*` metric named by the alerting rules or the
//! dashboard is in its first `/metrics` scrape; every `weir_consumer_*` one is exported
//! by the consumer core (what a recognition worker embeds) from its start. And
//! `deploy/nats-server.conf`: the ingress binary starts as `ingress` with the example
//! configuration's inbox prefix, a producer core publishes as `producer`, `tap` reads
//! as `operator`, and `guest` may publish no audio; `asr-worker` announces its
//! capacity and the ingress hears it, `guest` may not announce; a phone call's bot
//! audio, mark and `clear` go both ways for `voice-agent`, and `guest` may neither
//! speak into a call nor read its events.

// The consumer core's test helpers live with it (audio-ingress/consumer/tests).
use crate::support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use support::{Binary, STEP, http_get};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use weir_audio_consumer::testing::{Book, Recorder, connect_options};
use weir_audio_consumer::{Consumer, ConsumerConfig};
use weir_audio_ingress::config::{NATS_CLIENT_NAME, NatsConfig};
use weir_audio_producer::{Ingress, StreamConfig};
use weir_service::nats::NatsAuth;
use weir_testkit::deploy;
use weir_testkit::{NatsServer, NatsServerOptions};

fn missing(
    refs: &BTreeSet<(String, &'static str)>,
    prefixes: &[&str],
    have: &BTreeSet<String>,
) -> Vec<String> {
    refs.iter()
        .filter(|(n, _)| prefixes.iter().any(|p| n.starts_with(p)))
        .filter(|(n, _)| !have.contains(n))
        .map(|(n, f)| format!("{n} (in deploy/{f})"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_name_only_metrics_the_binary_and_the_consumer_export() {
    let refs = deploy::referenced().expect("deploy files");
    let server = NatsServer::start().expect("nats-server");

    // As the systemd unit runs it (its ExecStart arguments, the example configuration
    // as shipped, the token secret from the environment); only the addresses are made
    // local.
    let args = deploy::unit_exec_args("audio-ingress.service", "ExecStart").expect("unit");
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let secret = "deploy-kit-test-secret-of-at-least-32-bytes";
    let ingress = Binary::start_with(
        &args,
        &[("WEIR_INGRESS_AUTH_HS256_SECRET", secret)],
        server.url(),
        &[],
    )
    .await;
    assert!(ingress.wait_ready(200).await, "ready on the example config");
    let (status, text) = http_get(ingress.admin, "/metrics").await;
    assert_eq!(status, 200);
    let scraped = deploy::scraped(&text);
    let gone = missing(
        &refs,
        &["weir_ingress_", "weir_build_", "process_"],
        &scraped,
    );
    assert!(
        gone.is_empty(),
        "not exported by audio-ingress serve: {gone:?}"
    );
    // The bound it reports is the configuration's, and RSS is below it.
    let bound = ingress.metric("weir_ingress_memory_bound_bytes").await;
    let rss = ingress.metric("process_resident_memory_bytes").await;
    assert!(rss > 1e6 && rss < bound, "rss {rss}, bound {bound}");

    // The consumer core registers its metrics when it starts, with whatever recorder
    // the worker installed (here: the same Prometheus recorder the ingress uses).
    let handle = support::prometheus();
    let settings = ConsumerConfig::default().validate().expect("valid");
    let consumer = tokio::time::timeout(
        STEP,
        Consumer::connect_with(
            connect_options(),
            server.url(),
            settings,
            Recorder::factory("deploy-kit", Book::default()),
        ),
    )
    .await
    .expect("consumer starts in time")
    .expect("consumer starts");
    let scraped = deploy::scraped(&handle.render());
    let gone = missing(&refs, &["weir_consumer_"], &scraped);
    assert!(
        gone.is_empty(),
        "not exported by the consumer core: {gone:?}"
    );
    consumer.shutdown(std::time::Duration::from_secs(1)).await;
}

/// A raw NATS connection as `user`: `CONNECT`, `frames` verbatim, `PING`; what the
/// server answered up to the `PONG` (blocking, bounded: `weir_testkit::raw`).
async fn raw_publish(port: u16, user: (&str, &str), frames: &[u8]) -> String {
    weir_testkit::raw::publish(port, Some(user), &[frames.to_vec()]).expect("raw publish")
}

/// 640 bytes of PCM.
fn pcm(seq: u64) -> bytes::Bytes {
    bytes::Bytes::from(
        (0..640u64)
            .map(|i| ((seq * 7 + i) % 251) as u8)
            .collect::<Vec<u8>>(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_permissions_carry_audio_for_its_users_and_refuse_a_guest() {
    const FRAMES: u64 = 50;
    let server = NatsServer::start_with(NatsServerOptions {
        config: Some(include_str!("../../../../deploy/nats-server.conf").to_owned()),
        ..Default::default()
    })
    .expect("nats-server with the example configuration");

    // The ingress as the unit runs it, as `ingress` with deploy/audio-ingress.toml's
    // inbox prefix: ready (connected, its subscriptions allowed).
    let args = deploy::unit_exec_args("audio-ingress.service", "ExecStart").expect("unit");
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let ingress = Binary::start_with(
        &args,
        &[
            (
                "WEIR_INGRESS_AUTH_HS256_SECRET",
                "deploy-kit-test-secret-of-at-least-32-bytes",
            ),
            ("WEIR_INGRESS_NATS_USER", "ingress"),
            ("WEIR_INGRESS_NATS_PASSWORD", "ingress-secret"),
        ],
        server.url(),
        &[],
    )
    .await;
    assert!(ingress.wait_ready(200).await, "ready as `ingress`");

    // `tap` as `operator`, with its inbox prefix (its subscription is confirmed by a
    // probe to its own inbox).
    let mut tap = tokio::process::Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
        .args(["tap", "inference.whisper.stream.*", "--json", "--for", "4"])
        .args([
            "--nats-url",
            server.url(),
            "--inbox-prefix",
            "_INBOX.operator",
        ])
        .env("WEIR_TAP_NATS_USER", "operator")
        .env("WEIR_TAP_NATS_PASSWORD", "operator-secret")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("tap starts");
    let mut err = BufReader::new(tap.stderr.take().expect("stderr")).lines();
    let subscribed = tokio::time::timeout(STEP, async {
        while let Ok(Some(l)) = err.next_line().await {
            if l.contains("tap: subscribed to") {
                return true;
            }
        }
        false
    })
    .await
    .expect("tap subscribes in time");
    assert!(subscribed, "tap exited before subscribing");
    tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });

    // A producer core as `producer` with its inbox prefix: confirmed delivery needs
    // its marker to come back through `_INBOX.producer.>`.
    let mut nats = NatsConfig::for_url(NATS_CLIENT_NAME, server.url());
    nats.auth = NatsAuth::UserPassword {
        user: "producer".into(),
        password: "producer-secret".into(),
    };
    nats.inbox_prefix = "_INBOX.producer".into();
    let client = tokio::time::timeout(STEP, weir_audio_producer::nats::connect(&nats))
        .await
        .expect("connect in time")
        .expect("producer connects");
    let cfg = StreamConfig::builder()
        .max_wait(Duration::from_millis(500))
        .publish_timeout(Duration::from_millis(500))
        .max_rate_permille(0)
        .build()
        .expect("cfg");
    let producer = Ingress::new(client, cfg);
    let h = producer.open("dk", None).expect("open");
    for seq in 1..=FRAMES {
        h.push(pcm(seq)).await.expect("admitted");
        if seq == FRAMES / 2 {
            // `guest` may publish no audio (a frame, non-UTF-8 bytes), and malformed
            // messages from `producer`, who may, cost the tap nothing.
            let guest = ("guest", "guest-secret");
            for frame in [
                &b"PUB inference.whisper.stream.dk 2\r\n{}\r\n"[..],
                b"PUB inference.whisper.stream.\xff 2\r\n{}\r\n",
                b"PUB audio.0.dk 2\r\n{}\r\n",
            ] {
                let seen = raw_publish(server.port(), guest, frame).await;
                assert!(seen.contains("Permissions Violation for Publish"), "{seen}");
            }
            let seen = raw_publish(
                server.port(),
                ("producer", "producer-secret"),
                b"PUB inference.whisper.stream.\xff 2\r\n{}\r\nPUB inference.whisper.stream.x _INBOX.\xfe 2\r\n{}\r\n",
            )
            .await;
            assert!(!seen.contains("-ERR"), "{seen}");
        }
    }
    let summary = tokio::time::timeout(STEP, h.finish())
        .await
        .expect("finish");
    assert!(summary.snapshot.end_delivered, "{summary:?}");
    assert_eq!(summary.snapshot.frames.published, FRAMES);

    let mut out = String::new();
    let mut stdout = tap.stdout.take().expect("stdout");
    let status = tokio::time::timeout(STEP, async {
        stdout.read_to_string(&mut out).await.expect("read");
        tap.wait().await.expect("wait")
    })
    .await
    .expect("tap exits in time");
    assert!(status.success(), "{out}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    let seqs: Vec<u64> = lines
        .iter()
        .filter(|v| v["subject"] == "inference.whisper.stream.dk" && v["type"] == "frame")
        .filter_map(|v| v["seq"].as_u64())
        .collect();
    assert_eq!(
        seqs,
        (1..=FRAMES).collect::<Vec<_>>(),
        "every frame, once, in order"
    );
    assert!(
        lines
            .iter()
            .any(|v| v["subject"] == "inference.whisper.stream.dk" && v["type"] == "end"),
        "{out}"
    );
}

/// A capacity announcement of a static worker `worker` for the default template.
fn announcement(worker: &str, seq: u64) -> weir_protocol::capacity::Announcement {
    use weir_protocol::capacity::{Announcement, OwnershipKind, VERSION};
    Announcement {
        v: VERSION,
        worker: worker.into(),
        instance: "dk-1".into(),
        seq,
        sent_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64,
        interval_ms: 200,
        subject: weir_protocol::partition::DEFAULT_STREAM_TEMPLATE.into(),
        partitions_total: 1,
        ownership: OwnershipKind::Static,
        lease_bucket: None,
        partitions: vec![0],
        max_streams: 4,
        live_streams: 0,
        lag_ms: 0,
        rtf_p95: 0.3,
        streams: Vec::new(),
        streams_truncated: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_permissions_let_a_worker_announce_to_the_ingress_and_refuse_a_guest() {
    let server = NatsServer::start_with(NatsServerOptions {
        config: Some(include_str!("../../../../deploy/nats-server.conf").to_owned()),
        ..Default::default()
    })
    .expect("nats-server with the example configuration");
    let args = deploy::unit_exec_args("audio-ingress.service", "ExecStart").expect("unit");
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let ingress = Binary::start_with(
        &args,
        &[
            (
                "WEIR_INGRESS_AUTH_HS256_SECRET",
                "deploy-kit-test-secret-of-at-least-32-bytes",
            ),
            ("WEIR_INGRESS_NATS_USER", "ingress"),
            ("WEIR_INGRESS_NATS_PASSWORD", "ingress-secret"),
        ],
        server.url(),
        &[],
    )
    .await;
    assert!(ingress.wait_ready(200).await, "ready as `ingress`");

    // A guest may neither announce capacity nor refuse a stream (spoofing).
    let guest = ("guest", "guest-secret");
    let body = announcement("w-guest", 1).encode();
    let mut frame = format!("PUB weir.capacity.announce.w-guest {}\r\n", body.len()).into_bytes();
    frame.extend_from_slice(&body);
    frame.extend_from_slice(b"\r\n");
    let seen = raw_publish(server.port(), guest, &frame).await;
    assert!(seen.contains("Permissions Violation for Publish"), "{seen}");
    let seen = raw_publish(
        server.port(),
        guest,
        b"PUB weir.capacity.refused.x 2\r\n{}\r\n",
    )
    .await;
    assert!(seen.contains("Permissions Violation for Publish"), "{seen}");
    assert_eq!(ingress.metric("weir_ingress_capacity_workers").await, 0.0);

    // `asr-worker` announces; the ingress (allowed to subscribe) sees one live worker.
    let worker = async_nats::ConnectOptions::with_user_and_password(
        "asr-worker".into(),
        "asr-secret".into(),
    )
    .custom_inbox_prefix("_INBOX.asr-worker")
    .connect(server.url())
    .await
    .expect("asr-worker connects");
    let deadline = tokio::time::Instant::now() + STEP;
    let mut seq = 0;
    loop {
        seq += 1;
        worker
            .publish(
                "weir.capacity.announce.w-dk",
                announcement("w-dk", seq).encode().into(),
            )
            .await
            .expect("publish");
        worker.flush().await.expect("flush");
        if ingress.metric("weir_ingress_capacity_workers").await == 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ingress never heard the worker"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = raw_publish(
        server.port(),
        ("asr-worker", "asr-secret"),
        b"PUB weir.capacity.refused.x 2\r\n{}\r\n",
    )
    .await;
    assert!(!seen.contains("-ERR"), "{seen}");
}

/// A phone call with the example permissions: the ingress (as `ingress`) takes a
/// carrier's stream, `voice-agent` sends bot audio with a mark and a `clear` and reads
/// the call's events (the `clear` answer reaches its inbox); `guest` can neither
/// publish bot audio or `clear` nor subscribe to the events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_permissions_carry_a_call_both_ways_and_refuse_a_guest() {
    use crate::telephony_door::{connect, connected, send, start, stop, until_close};
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;

    let server = NatsServer::start_with(NatsServerOptions {
        config: Some(include_str!("../../../../deploy/nats-server.conf").to_owned()),
        ..Default::default()
    })
    .expect("nats-server with the example configuration");
    let args = deploy::unit_exec_args("audio-ingress.service", "ExecStart").expect("unit");
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let ingress = Binary::start_with(
        &args,
        &[
            (
                "WEIR_INGRESS_AUTH_HS256_SECRET",
                "deploy-kit-test-secret-of-at-least-32-bytes",
            ),
            ("WEIR_INGRESS_NATS_USER", "ingress"),
            ("WEIR_INGRESS_NATS_PASSWORD", "ingress-secret"),
        ],
        server.url(),
        &[],
    )
    .await;
    assert!(ingress.wait_ready(200).await, "ready as `ingress`");
    // The kit requires producer tokens: the carrier brings one as a custom parameter.
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 600;
    let token = weir_audio_ingress::auth::mint(
        weir_audio_ingress::auth::SigningKey::Hs256(b"deploy-kit-test-secret-of-at-least-32-bytes"),
        &serde_json::json!({"stream": "dk-call", "exp": exp}),
    )
    .expect("mint");

    let agent = tokio::time::timeout(
        STEP,
        async_nats::ConnectOptions::with_user_and_password(
            "voice-agent".into(),
            "voice-secret".into(),
        )
        .custom_inbox_prefix("_INBOX.voice-agent")
        .connect(server.url()),
    )
    .await
    .expect("in time")
    .expect("voice-agent connects");
    let mut events = agent
        .subscribe("weir.voice.events.dk-call")
        .await
        .expect("subscribe");
    agent.flush().await.expect("flush");

    let mut ws = connect(&ingress, "/v1/telephony/twilio").await;
    send(&mut ws, &connected()).await;
    let mut start = start("dk-call", "audio/x-mulaw", 8000);
    start["start"]["customParameters"]["access_token"] = token.into();
    send(&mut ws, &start).await;
    let first = tokio::time::timeout(STEP, events.next())
        .await
        .expect("started in time")
        .expect("open");
    let started: serde_json::Value = serde_json::from_slice(&first.payload).expect("JSON");
    assert_eq!(started["type"], "started", "{started}");

    // 100 ms of bot audio and a mark reach the carrier.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Weir-Mark", "hello");
    agent
        .publish_with_headers("weir.voice.out.dk-call", headers, vec![0u8; 3200].into())
        .await
        .expect("publish");
    let (mut media, mut mark) = (0, None);
    while mark.is_none() {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("message");
        if let Message::Text(t) = msg {
            let v: serde_json::Value = serde_json::from_str(t.as_str()).expect("JSON");
            match v["event"].as_str() {
                Some("media") => media += 1,
                Some("mark") => mark = Some(v),
                _ => {}
            }
        }
    }
    assert_eq!(media, 5, "100 ms = five 20 ms media messages");
    // `clear` is a request; its answer reaches the agent's inbox.
    let reply = tokio::time::timeout(
        STEP,
        agent.request("weir.voice.ctl.dk-call", r#"{"type":"clear"}"#.into()),
    )
    .await
    .expect("in time")
    .expect("answered");
    let cleared: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(cleared["type"], "cleared", "{cleared}");
    assert_eq!(
        cleared["unplayed_marks"],
        serde_json::json!(["hello"]),
        "{cleared}"
    );

    // A guest may not speak into the call, clear it, or listen to its events.
    let guest = ("guest", "guest-secret");
    for frame in [
        &b"PUB weir.voice.out.dk-call 4\r\n\0\0\0\0\r\n"[..],
        b"PUB weir.voice.ctl.dk-call 16\r\n{\"type\":\"clear\"}\r\n",
        b"SUB weir.voice.events.* 1\r\n",
        b"SUB weir.voice.out.* 2\r\n",
    ] {
        let seen = raw_publish(server.port(), guest, frame).await;
        assert!(seen.contains("Permissions Violation"), "{seen}");
    }

    send(&mut ws, &stop()).await;
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1000, "stop".to_owned())));
}
