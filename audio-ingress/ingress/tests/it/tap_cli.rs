//! `audio-ingress tap`, run as the built binary against a real nats-server: JSON and
//! text output, undecodable packets, summaries, and the three ways it stops (`--count`,
//! `--for`, SIGTERM); plus the deployed Python producer read by the tap.

// The consumer core's test helpers live with it (audio-ingress/consumer/tests).

use std::process::Stdio;
use std::time::Duration;

use crate::support::script;
use bytes::Bytes;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use weir_audio_consumer::testing::{client, flush, pcm, publish, publish_raw, python};
use weir_protocol::audio::extension::headers;
use weir_protocol::audio::{Gap, GapReason, Packet};
use weir_testkit::{Auth, NatsServer, NatsServerOptions};

/// Starts `audio-ingress tap <args>` and waits until it has subscribed.
async fn start_tap(url: &str, args: &[&str]) -> Child {
    start_tap_logged(url, args).await.0
}

/// [`start_tap`], keeping every stderr line written after the subscription.
async fn start_tap_logged(
    url: &str,
    args: &[&str],
) -> (Child, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
        .arg("tap")
        .args(args)
        .args(["--nats-url", url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("audio-ingress tap starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let ready = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if line.contains("tap: subscribed to") {
                return true;
            }
        }
        false
    })
    .await
    .expect("tap subscribes within 10 s");
    assert!(ready, "tap exited before subscribing");
    // Keep draining stderr so the child never blocks on a full pipe.
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            keep.lock().expect("log").push(line);
        }
    });
    (child, log)
}

/// Waits (bounded) for the tap to exit and returns (success, stdout lines).
async fn finish(mut child: Child, within: Duration) -> (bool, Vec<String>) {
    let mut stdout = child.stdout.take().expect("stdout");
    let mut out = String::new();
    let status = tokio::time::timeout(within, async {
        stdout.read_to_string(&mut out).await.expect("read stdout");
        child.wait().await.expect("wait")
    })
    .await
    .expect("tap exits in time");
    (status.success(), out.lines().map(str::to_owned).collect())
}

fn json_lines(lines: &[String]) -> Vec<Value> {
    lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_packets_errors_and_summaries_until_count() {
    let server = NatsServer::start().expect("nats-server");
    let tap = start_tap(
        server.url(),
        &["inference.whisper.stream.*", "--json", "--count", "8"],
    )
    .await;
    let nc = client(server.url()).await;
    let a = "inference.whisper.stream.a";
    let b = "inference.whisper.stream.b";
    let captured = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
        - 200;
    for seq in [1, 2, 4] {
        publish(
            &nc,
            a,
            Packet::frame(seq, pcm(seq))
                .with_session(Some("s1".into()))
                .with_captured_at_ms((seq == 1).then_some(captured)),
            &[],
        )
        .await;
    }
    // Seq 3 is missing; the end declares it possibly lost.
    let declared = r#"{"first_seq":3,"last_seq":3,"frames":1,"total_frames":1,"reason":"unconfirmed_at_disconnect"}"#;
    publish(
        &nc,
        a,
        Packet::end(5),
        &[
            (headers::END_REASON, "producer"),
            (headers::POSSIBLY_LOST, declared),
        ],
    )
    .await;
    publish(
        &nc,
        b,
        Packet::gap(Gap {
            first_seq: 1,
            last_seq: 3,
            samples: 960,
            reason: GapReason::QueueFull,
        }),
        &[],
    )
    .await;
    publish_raw(&nc, b, Bytes::from_static(b"\x00\x00"), &[]).await;
    publish_raw(&nc, b, Bytes::from_static(b"\x00\x00\x00\x02{}"), &[]).await;
    publish(&nc, b, Packet::frame(4, pcm(4)), &[]).await;
    // Past --count: must not be printed.
    publish(&nc, b, Packet::frame(5, pcm(5)), &[]).await;
    flush(&nc).await;

    let (ok, lines) = finish(tap, Duration::from_secs(5)).await;
    assert!(ok, "tap exit status");
    let v = json_lines(&lines);
    assert_eq!(
        v.len(),
        8 + 2 + 1,
        "8 packets, 2 summaries, 1 total: {lines:#?}"
    );
    // Every packet line has the documented keys.
    for p in &v[..8] {
        for key in ["subject", "type", "seq", "sample_rate", "samples", "error"] {
            assert!(p.get(key).is_some(), "{key} missing in {p}");
        }
    }
    assert_eq!(v[0]["subject"], a);
    assert_eq!(v[0]["type"], "frame");
    assert_eq!(v[0]["seq"], 1);
    assert_eq!(v[0]["sample_rate"], 16_000);
    assert_eq!(v[0]["samples"], 320);
    assert_eq!(v[0]["session_id"], "s1");
    assert!(v[0]["error"].is_null());
    assert_eq!(v[0]["captured_at_ms"].as_u64(), Some(captured));
    let age = v[0]["age_ms"].as_i64().expect("age");
    assert!((200..10_000).contains(&age), "age {age}");
    assert!(v[1]["captured_at_ms"].is_null() && v[1]["age_ms"].is_null());
    assert_eq!(v[3]["type"], "end");
    assert_eq!(v[3]["headers"][headers::END_REASON], "producer");
    assert_eq!(v[3]["possibly_lost"]["first_seq"], 3);
    assert_eq!(v[3]["possibly_lost"]["total_frames"], 1);
    assert_eq!(v[3]["possibly_lost"]["reason"], "unconfirmed_at_disconnect");
    assert_eq!(v[4]["type"], "gap");
    assert_eq!(v[4]["samples"], 960);
    assert_eq!(v[4]["gap"]["first_seq"], 1);
    assert_eq!(v[5]["error"]["kind"], "truncated");
    assert!(v[5]["type"].is_null());
    assert_eq!(v[6]["error"]["kind"], "missing_field");
    assert_eq!(v[7]["seq"], 4);

    let sa = &v[8];
    assert_eq!(sa["type"], "summary");
    assert_eq!(sa["subject"], a);
    assert_eq!(
        (sa["first_seq"].as_u64(), sa["last_seq"].as_u64()),
        (Some(1), Some(5))
    );
    assert_eq!(sa["frames"], 3);
    assert_eq!(sa["samples"], 960);
    assert_eq!(sa["missing"], 1);
    assert_eq!(sa["gaps"], 1);
    assert_eq!(sa["end_seen"], true);
    assert_eq!(sa["end_reason"], "producer");
    assert!(sa["max_age_ms"].as_i64().is_some_and(|m| m >= 200), "{sa}");
    assert_eq!(sa["possible_loss_declarations"], 1);
    assert_eq!(sa["possibly_lost_frames"], 1);
    let sb = &v[9];
    assert_eq!(sb["subject"], b);
    assert_eq!(sb["declared_gaps"], 1);
    assert_eq!(sb["declared_gap_frames"], 3);
    assert_eq!(sb["missing"], 0);
    assert_eq!(sb["decode_errors"], 2);
    assert_eq!(sb["end_seen"], false);
    let total = &v[10];
    assert_eq!(total["type"], "total");
    assert_eq!(total["messages"], 8);
    assert_eq!(total["errors"], 2);
    assert_eq!(total["stopped_by"], "count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_output_stops_after_duration() {
    let server = NatsServer::start().expect("nats-server");
    let started = tokio::time::Instant::now();
    let tap = start_tap(server.url(), &["audio.*.*", "--for", "0.8"]).await;
    let nc = client(server.url()).await;
    for seq in 1..=3 {
        publish(&nc, "audio.3.call-1", Packet::frame(seq, pcm(seq)), &[]).await;
    }
    flush(&nc).await;
    let (ok, lines) = finish(tap, Duration::from_secs(5)).await;
    assert!(ok);
    assert!(started.elapsed() >= Duration::from_millis(800));
    assert_eq!(lines.len(), 3 + 1 + 1, "{lines:#?}");
    assert_eq!(
        lines[0],
        "audio.3.call-1 frame seq=1 rate=16000 samples=320"
    );
    assert!(
        lines[3]
            .starts_with("summary audio.3.call-1 seq=1..=3 frames=3 samples=960 missing=0 gaps=0"),
        "{}",
        lines[3]
    );
    assert!(lines[3].contains("end=no"), "{}", lines[3]);
    assert!(lines[4].contains("stopped_by=duration"), "{}", lines[4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_prints_the_summary() {
    let server = NatsServer::start().expect("nats-server");
    let tap = start_tap(server.url(), &["s.*", "--json"]).await;
    let nc = client(server.url()).await;
    publish(&nc, "s.x", Packet::frame(1, pcm(1)), &[]).await;
    publish(&nc, "s.x", Packet::end(2), &[]).await;
    flush(&nc).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = tap.id().expect("pid");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let (ok, lines) = finish(tap, Duration::from_secs(5)).await;
    assert!(ok, "tap exits 0 on SIGTERM");
    let v = json_lines(&lines);
    assert_eq!(v.len(), 2 + 1 + 1, "{lines:#?}");
    assert_eq!(v[2]["type"], "summary");
    assert_eq!(v[2]["end_seen"], true);
    assert_eq!(v[3]["stopped_by"], "signal");
}

/// `tap x.* <args>` run to its end (bounded at 15 s).
async fn tap_output(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(
        Duration::from_secs(15),
        Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
            .args(["tap", "x.*"])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("tap gives up in time")
    .expect("runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_clear_error() {
    // A port nobody listens on (the server is started and killed to free one).
    let server = NatsServer::start().expect("nats-server");
    let url = server.url().to_owned();
    drop(server);
    let out = tap_output(&["--nats-url", &url]).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cannot connect to NATS"), "{stderr}");
}

/// The tap's connection flags go through the same validation as `serve`'s NATS keys:
/// a missing credentials file or a bad URL in the list is named before any connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_flags_are_validated_like_serve() {
    for (args, expect) in [
        (
            vec![
                "--nats-url",
                "nats://127.0.0.1:1",
                "--creds-file",
                "/nonexistent/x.creds",
            ],
            "--creds-file: /nonexistent/x.creds is not a readable file",
        ),
        (
            vec!["--nats-url", "nats://127.0.0.1:1,nats://h:notaport"],
            "--nats-url: \"nats://h:notaport\" is not a NATS URL",
        ),
    ] {
        let out = tap_output(&args).await;
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tap_reads_the_deployed_python_producer() {
    let server = NatsServer::start().expect("nats-server");
    let py = python();
    let frames = 20u64;
    let count = 2 * (frames + 1);
    let tap = start_tap(
        server.url(),
        &[
            "inference.whisper.stream.*",
            "--json",
            "--count",
            &count.to_string(),
        ],
    )
    .await;
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        Command::new(py)
            .arg(script("deployed_producer.py"))
            .args(["--url", server.url(), "--streams", "p1,p2"])
            .args(["--frames", &frames.to_string(), "--session-id", "sess-é"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("python producer in time")
    .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, lines) = finish(tap, Duration::from_secs(10)).await;
    assert!(ok);
    let v = json_lines(&lines);
    assert_eq!(v.len() as u64, count + 2 + 1, "{lines:#?}");
    for stream in ["p1", "p2"] {
        let subject = format!("inference.whisper.stream.{stream}");
        let packets: Vec<&Value> = v[..count as usize]
            .iter()
            .filter(|p| p["subject"] == subject.as_str())
            .collect();
        assert_eq!(packets.len() as u64, frames + 1);
        for (i, p) in packets.iter().enumerate() {
            assert!(p["error"].is_null(), "{p}");
            assert_eq!(p["seq"].as_u64(), Some(i as u64 + 1));
            assert_eq!(p["sample_rate"], 16_000);
            if (i as u64) < frames {
                assert_eq!(p["type"], "frame");
                assert_eq!(p["samples"], 320);
                assert_eq!(p["session_id"], "sess-é");
            } else {
                assert_eq!(p["type"], "end");
                assert_eq!(p["samples"], 0);
            }
        }
        let summary = v
            .iter()
            .find(|s| s["type"] == "summary" && s["subject"] == subject.as_str())
            .expect("summary");
        assert_eq!(summary["frames"].as_u64(), Some(frames));
        assert_eq!(summary["samples"].as_u64(), Some(frames * 320));
        assert_eq!(summary["missing"], 0);
        assert_eq!(summary["end_seen"], true);
        assert_eq!(summary["last_seq"].as_u64(), Some(frames + 1));
    }
}

/// Runs `audio-ingress tap <args> --for <secs>` to its exit (bounded): (exit code,
/// stderr).
async fn tap_exit(url: &str, args: &[&str], secs: &str) -> (Option<i32>, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
            .arg("tap")
            .args(args)
            .args(["--nats-url", url, "--for", secs])
            .output(),
    )
    .await
    .expect("tap exits in time")
    .expect("tap runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_the_server_refuses_exits_1() {
    // `>` before the last token: refused before anything is sent.
    let server = NatsServer::start().expect("nats-server");
    let (code, stderr) = tap_exit(server.url(), &[">.a"], "5").await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("invalid subject pattern"), "{stderr}");
    assert!(!stderr.contains("subscribed"), "{stderr}");

    // A pattern the client accepts but the server refuses (permissions): -ERR, exit 1.
    let server = NatsServer::start_with(weir_testkit::NatsServerOptions {
        // Clients without credentials (the tap has none) get user `tap`'s permissions.
        config: Some(
            r#"authorization { users = [ { user: tap, password: pw, permissions: {
                subscribe: { allow: ["allowed.>", "_INBOX.>"] }, publish: { allow: ["_INBOX.>"] } } } ] }
            no_auth_user: tap"#
                .to_owned(),
        ),
        ..Default::default()
    })
    .expect("nats-server with permissions");
    let url = server.url().to_owned();
    let (code, stderr) = tap_exit(&url, &["forbidden.*"], "5").await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(!stderr.contains("tap: subscribed"), "{stderr}");
    // The allowed pattern still works (and stops after --for).
    let t0 = std::time::Instant::now();
    let (code, stderr) = tap_exit(&url, &["allowed.*"], "0.3").await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("tap: subscribed"), "{stderr}");
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_mode_escapes_a_newline_in_a_session_id() {
    let server = NatsServer::start().expect("nats-server");
    let tap = start_tap(
        server.url(),
        &["inference.whisper.stream.*", "--count", "1"],
    )
    .await;
    let nc = client(server.url()).await;
    publish(
        &nc,
        "inference.whisper.stream.a",
        Packet::frame(1, pcm(1)).with_session(Some(
            "s1\ninference.whisper.stream.forged end seq=99".into(),
        )),
        &[],
    )
    .await;
    flush(&nc).await;
    let (ok, lines) = finish(tap, Duration::from_secs(5)).await;
    assert!(ok);
    // One packet line, one summary line, one total line; no forged line.
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].contains(r"session=s1\ninference"), "{lines:?}");
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("inference.whisper.stream.forged")),
        "{lines:?}"
    );
}

/// A secured NATS: `tap` authenticates with the same options as `serve` (it had no auth
/// or TLS options, so it could not reach one); without credentials it exits 1; two
/// methods at once are refused by the command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tap_reaches_a_nats_that_requires_a_password() {
    let server = NatsServer::start_with(NatsServerOptions {
        auth: Some(Auth::UserPassword {
            user: "weir".into(),
            password: "s3cret".into(),
        }),
        ..Default::default()
    })
    .expect("nats-server");
    // The password from the environment (as an operator would pass it).
    let tap = {
        let mut child = Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
            .args([
                "tap",
                "inference.whisper.stream.*",
                "--json",
                "--count",
                "1",
            ])
            .args(["--user", "weir", "--nats-url", server.url()])
            .env("WEIR_TAP_NATS_PASSWORD", "s3cret")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("tap starts");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let subscribed = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("tap: subscribed to") {
                    return true;
                }
            }
            false
        })
        .await
        .expect("in time");
        assert!(subscribed, "tap authenticated and subscribed");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        child
    };
    let publisher = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::ConnectOptions::with_user_and_password("weir".into(), "s3cret".into())
            .connect(server.url()),
    )
    .await
    .expect("in time")
    .expect("publisher connects");
    publish(
        &publisher,
        "inference.whisper.stream.s1",
        Packet::frame(1, pcm(1)),
        &[],
    )
    .await;
    flush(&publisher).await;
    let (ok, lines) = finish(tap, Duration::from_secs(10)).await;
    assert!(ok, "{lines:?}");
    assert_eq!(json_lines(&lines)[0]["seq"], 1, "{lines:?}");

    let (code, stderr) = tap_exit(server.url(), &["inference.whisper.stream.*"], "2").await;
    assert_eq!(code, Some(1), "no credentials: {stderr}");
    let (code, stderr) = tap_exit(
        server.url(),
        &["x.*", "--user", "weir", "--password", "p", "--token", "t"],
        "1",
    )
    .await;
    assert_eq!(code, Some(2), "two auth methods: {stderr}");
}

/// Malformed messages under the tapped wildcard (a non-UTF-8 subject token, a
/// non-UTF-8 reply subject, a broken header block) cost the tap nothing: it keeps its
/// connection (async-nats 0.51 dropped it; vendor/README.md), reports each on stderr,
/// and another stream's frames all arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_do_not_cost_the_tap_its_connection() {
    const FRAMES: u64 = 100;
    let server = NatsServer::start().expect("nats-server");
    let prefix = "inference.whisper.stream";
    let (tap, log) = start_tap_logged(
        server.url(),
        &[&format!("{prefix}.>"), "--json", "--for", "3"],
    )
    .await;
    let nc = client(server.url()).await;
    let mut bad = vec![weir_testkit::raw::non_utf8_subject(prefix)];
    bad.extend(weir_testkit::raw::malformed_messages(&format!(
        "{prefix}.evil"
    )));
    let port = server.port();
    let injector = tokio::task::spawn_blocking(move || {
        let mut raw = weir_testkit::raw::RawConnection::connect(port, None).expect("raw");
        for m in bad.iter().cycle().take(10) {
            std::thread::sleep(Duration::from_millis(100));
            raw.send(m).expect("send");
        }
        raw.ping().expect("pong")
    });
    let good = format!("{prefix}.good");
    let mut tick = tokio::time::interval(Duration::from_millis(12));
    for seq in 1..=FRAMES {
        tick.tick().await;
        publish(&nc, &good, Packet::frame(seq, pcm(seq)), &[]).await;
    }
    publish(&nc, &good, Packet::end(FRAMES + 1), &[]).await;
    flush(&nc).await;
    let seen = injector.await.expect("injector");
    assert!(!seen.contains("-ERR"), "{seen}");
    let (ok, lines) = finish(tap, Duration::from_secs(10)).await;
    assert!(ok, "tap exit status");
    let v = json_lines(&lines);
    let summary = v
        .iter()
        .find(|p| p["type"] == "summary" && p["subject"] == good.as_str())
        .expect("a summary of the good stream");
    assert_eq!(summary["frames"], FRAMES, "{summary}");
    assert_eq!(summary["missing"], 0, "{summary}");
    assert_eq!(summary["end_seen"], true, "{summary}");
    let log = log.lock().expect("log").clone();
    assert!(
        !log.iter().any(|l| l.contains("disconnected")),
        "the tap kept its connection: {log:#?}"
    );
    let reported = log
        .iter()
        .filter(|l| l.starts_with("tap: NATS client error"))
        .count();
    assert_eq!(reported, 10, "each bad message reported once: {log:#?}");
}
