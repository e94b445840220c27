//! Interop with the deployed Python side (nats-py from PyPI), both directions:
//! - a producer written exactly like the deployed one (`tests/python/deployed_producer.py`)
//!   is read correctly by the consumer core: frames in order with the right PCM,
//!   session id, end, a skipped seq counted as lost, a vanished stream reaped;
//! - packets published by weir's producer core (`Ingress`) decode with the deployed
//!   Python reading code (`tests/python/decode_subscriber.py`), headers included, and the
//!   consumer core reads the same packets.
//!
//! Python comes from `WEIR_PYTHON` or `scripts/ensure-python-env`; without Python and
//! nats-py these tests fail with a message saying so.

// The consumer core's test helpers live with it (audio-ingress/consumer/tests).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::script;
use bytes::Bytes;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use weir_audio_consumer::testing::{Book, Recorder, connect_options, python, wait_until};
use weir_audio_consumer::{Consumer, ConsumerConfig, StreamEvent, StreamHandler, StreamInfo};
use weir_audio_producer::StreamConfig;
use weir_audio_producer::stream::Ingress;
use weir_testkit::NatsServer;

const GRACE: Duration = Duration::from_secs(2);

/// The PCM `deployed_producer.py` sends for `seq`: 320 samples
/// `((seq * 7 + i) % 2000) - 1000`, s16le.
fn python_pcm(seq: u64) -> Vec<u8> {
    (0..320u64)
        .flat_map(|i| ((((seq * 7 + i) % 2000) as i32 - 1000) as i16).to_le_bytes())
        .collect()
}

/// Checks every frame's bytes against what the Python producer sent.
#[derive(Clone, Default)]
struct PcmCheck {
    bad: Arc<Mutex<Vec<(String, u64)>>>,
    session_ids: Arc<Mutex<HashMap<String, Option<String>>>>,
}

struct PcmCheckHandler {
    stream: String,
    check: PcmCheck,
}

impl StreamHandler for PcmCheckHandler {
    async fn on_event(&mut self, event: StreamEvent) {
        if let StreamEvent::Frame(f) = event
            && f.pcm != python_pcm(f.seq)
        {
            self.check
                .bad
                .lock()
                .expect("lock")
                .push((self.stream.clone(), f.seq));
        }
    }
}

async fn run_python_producer(url: &str, args: &[&str]) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(script("deployed_producer.py"))
        .args(["--url", url])
        .args(args)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect("python producer finishes within 20 s")
        .expect("python producer runs");
    assert!(
        out.status.success(),
        "deployed_producer.py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(line.trim()).expect("producer prints one JSON line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployed_python_producer_is_read_by_the_consumer_core() {
    let server = NatsServer::start().expect("nats-server");
    let py = python(); // fail early and clearly if Python/nats-py is missing
    drop(py);
    let check = PcmCheck::default();
    let factory_check = check.clone();
    // The script publishes each stream's 50 frames (1 s of audio) in a burst, faster
    // than real time: give the handlers a 2 s byte budget so the burst fits.
    let settings = ConsumerConfig {
        idle_timeout_ms: 600,
        max_pending_age_ms: 200,
        max_pending_bytes: 64_000,
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("valid");
    let book = Book::default();
    let recorder = Recorder::factory("c", book.clone());
    let consumer = Consumer::connect_with(
        connect_options(),
        server.url(),
        settings,
        move |info: &StreamInfo| {
            factory_check
                .session_ids
                .lock()
                .expect("lock")
                .insert(info.stream.clone(), info.session_id.clone());
            // Record and check at once: the recorder keeps order and ends.
            Both(
                recorder(info),
                PcmCheckHandler {
                    stream: info.stream.clone(),
                    check: factory_check.clone(),
                },
            )
        },
    )
    .await
    .expect("consumer");

    let published = run_python_producer(
        server.url(),
        &[
            "--streams",
            "py-a,py-b,py-gone",
            "--frames",
            "50",
            "--session-id",
            "s-é1",
            "--no-end",
            "py-gone",
            "--skip-seq",
            "10",
        ],
    )
    .await;
    assert_eq!(published["published"]["py-a"]["frames"], 49);
    assert_eq!(published["published"]["py-a"]["end_seq"], 51);

    assert!(
        wait_until(Duration::from_secs(5), || {
            let t = consumer.stats().totals;
            t.streams_end_seen == 2 && t.streams_reaped == 1
        })
        .await,
        "{:?}",
        consumer.stats().totals
    );
    let stats = consumer.stats();
    for name in ["py-a", "py-b", "py-gone"] {
        let s = stats.stream(name).next().expect(name);
        assert_eq!(s.counters.frames, 49, "{name}");
        assert_eq!(s.counters.samples, 49 * 320, "{name}");
        assert_eq!(s.counters.lost_frames, 1, "{name}: the skipped seq 10");
        assert_eq!(s.counters.decode_errors, 0, "{name}");
        assert_eq!(s.counters.overloads, 0, "{name}");
        assert_eq!(s.first_seq, Some(1));
        assert_eq!(s.session_id.as_deref(), Some("s-é1"));
    }
    let a = stats.stream("py-a").next().expect("py-a");
    assert!(a.end_seen && !a.reaped);
    assert_eq!(a.end_seq, Some(51));
    assert_eq!(a.end_reason, None, "the deployed producer sends no headers");
    let gone = stats.stream("py-gone").next().expect("py-gone");
    assert!(gone.reaped && !gone.end_seen);
    assert_eq!(gone.last_seq, Some(50));

    weir_audio_consumer::testing::wait_handlers_done(&consumer).await;
    let seen = book.lock().expect("book").clone();
    let expected: Vec<u64> = (1..=50).filter(|&s| s != 10).collect();
    for s in seen.values() {
        let name = &s.info.as_ref().expect("info").stream;
        assert_eq!(s.frames, expected, "{name}");
        assert_eq!(s.gaps, vec![(10, 10, "Lost".to_owned())], "{name}");
        let want_end = if name == "py-gone" {
            "idle"
        } else {
            "producer"
        };
        assert_eq!(s.end.as_deref(), Some(want_end), "{name}");
    }
    assert_eq!(seen.len(), 3);
    assert!(
        check.bad.lock().expect("lock").is_empty(),
        "PCM differs from what Python sent"
    );
    consumer.shutdown(GRACE).await;
}

/// Two handlers in sequence.
struct Both<A, B>(A, B);

impl<A: StreamHandler, B: StreamHandler> StreamHandler for Both<A, B> {
    async fn on_event(&mut self, event: StreamEvent) {
        self.0.on_event(event.clone()).await;
        self.1.on_event(event).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packets_published_by_weir_decode_in_python() {
    const FRAMES: u64 = 10;
    let server = NatsServer::start().expect("nats-server");
    let mut child = Command::new(python())
        .arg(script("decode_subscriber.py"))
        .args(["--url", server.url(), "--subject", "audio.*.*"])
        .args([
            "--count",
            &(2 * (FRAMES + 1)).to_string(),
            "--timeout",
            "15",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("python subscriber starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("python subscriber ready within 10 s")
        .expect("read");
    assert_eq!(ready.as_deref(), Some("READY"));

    // The consumer core reads the same packets.
    let book = Book::default();
    let settings = ConsumerConfig::partitioned("audio.{partition}.{stream}", 4, 0..4)
        .validate()
        .expect("valid");
    let consumer = Consumer::connect_with(
        connect_options(),
        server.url(),
        settings,
        Recorder::factory("c", book.clone()),
    )
    .await
    .expect("consumer");

    let nc = tokio::time::timeout(
        Duration::from_secs(3),
        connect_options().connect(server.url()),
    )
    .await
    .expect("connect in time")
    .expect("connect");
    let config = StreamConfig::builder()
        .subject("audio.{partition}.{stream}")
        .partitions(4)
        .build()
        .expect("valid producer config");
    let ingress = Ingress::new(nc, config);
    let mut subjects = HashMap::new();
    for id in ["weir-1", "weir-2"] {
        let stream = ingress
            .open(id, Some("sess-é".into()))
            .expect("stream opens");
        subjects.insert(id, stream.subject().to_owned());
        for seq in 1..=FRAMES {
            let pcm = Bytes::from(python_pcm(seq));
            stream.push(pcm).await.expect("admitted");
        }
        let summary = stream.finish().await;
        assert!(summary.finished, "{summary:?}");
    }

    let mut got: Vec<Value> = Vec::new();
    while got.len() < (2 * (FRAMES + 1)) as usize {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .expect("python prints every packet within 10 s")
            .expect("read")
            .expect("python exited early");
        got.push(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}")));
    }
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("python exits")
        .expect("status");
    assert!(status.success(), "decode_subscriber.py: {status}");

    for id in ["weir-1", "weir-2"] {
        let subject = &subjects[id];
        let packets: Vec<&Value> = got
            .iter()
            .filter(|v| v["subject"] == subject.as_str())
            .collect();
        assert_eq!(
            packets.len() as u64,
            FRAMES + 1,
            "{id} on {subject}: {got:?}"
        );
        for (i, p) in packets.iter().enumerate() {
            assert!(p["error"].is_null(), "Python could not read: {p}");
            let meta = &p["meta"];
            let seq = i as u64 + 1;
            assert_eq!(meta["seq"].as_u64(), Some(seq), "{p}");
            assert_eq!(meta["sample_rate"], 16_000);
            assert_eq!(meta["sample_width"], 2);
            assert_eq!(meta["channels"], 1);
            assert_eq!(meta["session_id"], "sess-é");
            assert_eq!(p["pcm_ok"], true);
            if seq <= FRAMES {
                assert_eq!(meta["type"], "frame");
                assert_eq!(p["samples"], 320);
                // The capture time rides in the meta; frames carry no headers.
                assert!(meta["captured_at_ms"].as_u64().is_some(), "{p}");
            } else {
                assert_eq!(p["headers"]["Weir-Audio-Version"], "1", "{p}");
                assert_eq!(meta["type"], "end");
                assert_eq!(p["pcm_len"], 0);
                assert_eq!(p["headers"]["Weir-End-Reason"], "producer", "{p}");
            }
        }
    }

    assert!(
        wait_until(Duration::from_secs(3), || consumer
            .stats()
            .totals
            .streams_end_seen
            == 2)
        .await,
        "{:?}",
        consumer.stats().totals
    );
    weir_audio_consumer::testing::wait_handlers_done(&consumer).await;
    let stats = consumer.stats();
    for id in ["weir-1", "weir-2"] {
        let s = stats.stream(id).next().expect(id);
        assert_eq!(s.counters.frames, FRAMES);
        assert_eq!(s.counters.lost_frames, 0);
        assert_eq!(s.end_reason.as_deref(), Some("producer"));
        assert_eq!(s.session_id.as_deref(), Some("sess-é"));
    }
    consumer.shutdown(GRACE).await;
    ingress.shutdown(GRACE).await;
}
