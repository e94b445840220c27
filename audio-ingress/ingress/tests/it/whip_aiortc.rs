//! WHIP interop with aiortc: a real WebRTC stack nobody here wrote
//! (`tests/python/whip_publisher.py`, aiortc 1.16.0 pinned in
//! `scripts/ensure-python-env`), against the real `audio-ingress serve` binary and a
//! real `nats-server`, on loopback only (aioice's host-address lookup is patched to
//! 127.0.0.1; no ICE server).
//!
//! - A WAV file in (3 s, a 200→3,000 Hz chirp at 16 kHz mono, so a wrong alignment
//!   cannot look right), decoded frames out through a plain NATS subscriber. Similarity:
//!   normalized cross-correlation of the received PCM against the WAV at the best lag
//!   within ±250 ms, required ≥ 0.9 (Opus at aiortc's bitrate is lossy; a
//!   resample 16→48→16 kHz and a codec both sit in the path). The end (`producer`)
//!   arrives on DELETE, the `closed` event on the `weir` data channel, then 404.
//! - NATS stopped (SIGSTOP) for 6 s under 10 WHIP streams, default configuration:
//!   every stream gets its `overload` over the data channel (or ends) within `max_age`
//!   and one confirmation round of the pause — bounded here by [`SIGNAL_WITHIN`] — and
//!   at most [`MAX_STALE_PER_STREAM`] of its frames reach the subscriber later than
//!   [`STALE_AFTER_MS`] after weir admitted them, as in the end-to-end bound test
//!   (`stall_bound_e2e.rs`).
//!
//! Python comes from `WEIR_PYTHON` or `scripts/ensure-python-env` (as the other
//! interop tests); a Python without aiortc fails the test with the fix in the message.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use weir_testkit::NatsServer;

// The consumer core's test helpers live with it (audio-ingress/consumer/tests).
use crate::support;
use crate::whip_support;
use support::Binary;
use whip_support::{best_ncc, record, wait_for};

/// How long after the pause every stream must have its overload (or end): `max_age`
/// (500 ms) + one confirmation round, given 500 ms here (a round is a few ms on an
/// idle machine; the rest is room for `max_wait`, the data channel and a loaded CI
/// box). Measured on 2 cores: 531–548 ms and 500–597 ms (two runs).
const SIGNAL_WITHIN: Duration = Duration::from_millis(1_000);
/// A frame delivered later than this after weir admitted it is stale.
const STALE_AFTER_MS: i64 = 1_500;
/// Stale frames tolerated per signalled stream: 0.5 s of audio.
const MAX_STALE_PER_STREAM: usize = 25;
/// How long NATS stays stopped.
const PAUSE: Duration = Duration::from_secs(6);

fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The Python of the interop tests, checked for aiortc.
fn python() -> std::path::PathBuf {
    let py = weir_audio_consumer::testing::python();
    let check = std::process::Command::new(&py)
        .args(["-c", "import aiortc"])
        .output()
        .expect("run python");
    assert!(
        check.status.success(),
        "{} cannot import aiortc; run scripts/ensure-python-env (it pins aiortc): {}",
        py.display(),
        String::from_utf8_lossy(&check.stderr)
    );
    py
}

/// Runs the aiortc publisher with `args`; every JSON line it prints, as it prints it.
struct Publisher {
    child: tokio::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Publisher {
    fn start(bin: &Binary, args: &[&str]) -> Self {
        let endpoint = format!("http://{}/v1/whip", bin.ws);
        let mut child = tokio::process::Command::new(python())
            .arg(support::script("whip_publisher.py"))
            .args(["--endpoint", &endpoint])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the aiortc publisher");
        let stdout = child.stdout.take().expect("stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = std::sync::Arc::clone(&lines);
        let reader = tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = r.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    out.lock().expect("lines").push(v);
                }
            }
        });
        Self {
            child,
            lines,
            reader,
        }
    }

    /// Waits (bounded) for the process to exit; its lines.
    async fn finish(mut self, bound: Duration) -> Vec<Value> {
        let status = tokio::time::timeout(bound, self.child.wait())
            .await
            .expect("the publisher exits in time")
            .expect("wait");
        assert!(status.success(), "publisher failed: {status}");
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.reader).await;
        self.lines.lock().expect("lines").clone()
    }
}

fn of<'a>(lines: &'a [Value], event: &str, stream: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["event"] == event && l["stream"] == stream)
        .collect()
}

/// 3 s of a 200→3,000 Hz linear chirp, 16 kHz mono s16, amplitude 0.3 of full scale.
fn chirp() -> Vec<i16> {
    let (rate, secs, f0, f1) = (16_000.0, 3.0, 200.0, 3_000.0);
    let n = (rate * secs) as usize;
    (0..n)
        .map(|i| {
            let t = i as f64 / rate;
            let phase = 2.0 * std::f64::consts::PI * (f0 * t + (f1 - f0) / (2.0 * secs) * t * t);
            (9_830.0 * phase.sin()) as i16
        })
        .collect()
}

fn write_wav(path: &Path, pcm: &[i16]) {
    let data_len = (pcm.len() * 2) as u32;
    let mut b = Vec::with_capacity(44 + pcm.len() * 2);
    b.extend_from_slice(b"RIFF");
    b.extend_from_slice(&(36 + data_len).to_le_bytes());
    b.extend_from_slice(b"WAVEfmt ");
    b.extend_from_slice(&16u32.to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes()); // PCM
    b.extend_from_slice(&1u16.to_le_bytes()); // mono
    b.extend_from_slice(&16_000u32.to_le_bytes());
    b.extend_from_slice(&32_000u32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&16u16.to_le_bytes());
    b.extend_from_slice(b"data");
    b.extend_from_slice(&data_len.to_le_bytes());
    for s in pcm {
        b.extend_from_slice(&s.to_le_bytes());
    }
    std::fs::write(path, b).expect("write wav");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiortc_publishes_a_wav_and_the_frames_on_nats_match_it() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[("whip_udp_listen", "127.0.0.1:0")]).await;
    let logs = record(nats.url()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let wav = dir.path().join("chirp.wav");
    let source = chirp();
    write_wav(&wav, &source);

    let p = Publisher::start(
        &bin,
        &[
            "--ids",
            "aiortc-wav",
            "--wav",
            wav.to_str().expect("utf-8"),
            "--end",
            "delete",
        ],
    );
    let lines = p.finish(Duration::from_secs(40)).await;
    let posted = of(&lines, "posted", "aiortc-wav");
    assert_eq!(posted.len(), 1, "{lines:?}");
    assert_eq!(posted[0]["status"], 201, "{lines:?}");
    assert!(
        of(&lines, "state", "aiortc-wav")
            .iter()
            .any(|l| l["state"] == "connected"),
        "{lines:?}"
    );
    assert_eq!(of(&lines, "deleted", "aiortc-wav")[0]["status"], 200);
    assert_eq!(
        of(&lines, "deleted_again", "aiortc-wav")[0]["status"],
        404,
        "the resource is gone after DELETE"
    );
    let dc: Vec<&Value> = of(&lines, "dc", "aiortc-wav")
        .into_iter()
        .map(|l| &l["data"])
        .filter(|d| !support::is_lifecycle(d))
        .collect();
    assert_eq!(dc.len(), 1, "only the closed event: {dc:?}");
    assert_eq!(
        (&dc[0]["type"], &dc[0]["reason"]),
        (&"closed".into(), &"producer".into())
    );
    assert_eq!(dc[0]["end_delivered"], true);

    assert!(
        wait_for(&logs, Duration::from_secs(2), |l| l
            .get("aiortc-wav")
            .is_some_and(|s| s.end.is_some()))
        .await,
        "the end reached NATS"
    );
    let log = logs.lock().expect("logs")["aiortc-wav"].clone();
    assert_eq!(log.end.as_deref(), Some("producer"));
    assert_eq!(dc[0]["frames_published"], log.frames.len());
    let got: Vec<i16> = log
        .frames
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    // 150 frames of audio; aiortc may add or drop a packet or two at the ends.
    assert!(
        (140..=160).contains(&log.frames.len()),
        "{} frames for 3 s",
        log.frames.len()
    );
    let (ncc, lag) = best_ncc(&source, &got, 4_000);
    eprintln!(
        "aiortc WAV through WHIP: {} frames, ncc {ncc:.4} at lag {lag} samples ({:.1} ms)",
        log.frames.len(),
        lag as f64 / 16.0
    );
    assert!(
        ncc >= 0.9,
        "decoded audio does not match the WAV: ncc {ncc:.4} at lag {lag}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_paused_under_10_whip_streams_signals_every_publisher_over_the_data_channel() {
    let nats = NatsServer::start().expect("nats-server");
    // Default configuration (close policy, 500 ms / 16,000 bytes, confirmed delivery).
    let bin = Binary::start_ready(nats.url(), &[("whip_udp_listen", "127.0.0.1:0")]).await;
    let logs = record(nats.url()).await;
    let ids: Vec<String> = (0..10).map(|i| format!("whip-stall-{i}")).collect();
    let p = Publisher::start(
        &bin,
        &[
            "--ids",
            &ids.join(","),
            "--tone-seconds",
            "14",
            "--end",
            "hold",
            "--hold-seconds",
            "14",
        ],
    );
    assert!(
        wait_for(&logs, Duration::from_secs(20), |l| ids
            .iter()
            .all(|id| l.get(id).is_some_and(|s| s.frames.len() >= 50)))
        .await,
        "every stream delivers a second of audio first"
    );
    let paused_at = unix_s();
    nats.pause().expect("SIGSTOP");
    tokio::time::sleep(PAUSE).await;
    nats.resume().expect("SIGCONT");
    let lines = p.finish(Duration::from_secs(30)).await;
    assert!(
        wait_for(&logs, Duration::from_secs(10), |l| ids
            .iter()
            .all(|id| l.get(id).is_some_and(|s| s.end.is_some())))
        .await,
        "every stream's end reaches NATS after the resume"
    );
    let logs = logs.lock().expect("logs").clone();
    let mut signal_ms = Vec::new();
    for id in &ids {
        let dc: Vec<&Value> = of(&lines, "dc", id)
            .into_iter()
            .filter(|l| !support::is_lifecycle(&l["data"]))
            .collect();
        let first_signal = dc
            .iter()
            .find(|l| l["data"]["type"] == "overload" || l["data"]["type"] == "closed")
            .unwrap_or_else(|| panic!("{id}: no overload nor closed event: {lines:?}"));
        let after = first_signal["t"].as_f64().expect("t") - paused_at;
        signal_ms.push((after * 1e3) as i64);
        assert!(
            after > 0.0 && after <= SIGNAL_WITHIN.as_secs_f64(),
            "{id}: signalled {after:.3} s after the pause: {first_signal}"
        );
        let types: Vec<&Value> = dc.iter().map(|l| &l["data"]["type"]).collect();
        assert_eq!(types, ["overload", "closed"], "{id}");
        let log = &logs[id];
        assert_eq!(log.end.as_deref(), Some("overload"), "{id}");
        // `closed` waits for the stream to finish: it reports the frames the server
        // confirmed (none counted that the subscriber did not get) and the `end`
        // delivered after the resume.
        let closed = &dc[1]["data"];
        assert_eq!(closed["end_delivered"], true, "{id}: {closed}");
        let published = closed["frames_published"]
            .as_u64()
            .expect("frames_published");
        assert!(
            published > 0 && published <= log.frames.len() as u64,
            "{id}: closed says {published} published, the subscriber got {}",
            log.frames.len()
        );
        let stale = log.ages_ms.iter().filter(|&&a| a > STALE_AFTER_MS).count();
        assert!(
            stale <= MAX_STALE_PER_STREAM,
            "{id}: {stale} frames delivered more than {STALE_AFTER_MS} ms after admission"
        );
        // The session was ended: ICE/DTLS closed by the server.
        assert!(
            of(&lines, "state", id)
                .iter()
                .any(|l| l["state"] == "closed" || l["state"] == "failed"),
            "{id}: session not closed: {:?}",
            of(&lines, "state", id)
        );
    }
    signal_ms.sort_unstable();
    let stale: BTreeMap<&String, usize> = ids
        .iter()
        .map(|id| {
            let n = logs[id]
                .ages_ms
                .iter()
                .filter(|&&a| a > STALE_AFTER_MS)
                .count();
            (id, n)
        })
        .collect();
    eprintln!(
        "10 WHIP streams, NATS paused {PAUSE:?}: overload on the data channel {signal_ms:?} ms after the pause; stale frames per stream {stale:?}"
    );
}
