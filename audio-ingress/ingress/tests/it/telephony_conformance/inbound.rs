//! Inbound: the carrier's G.711 chunks become weir frames on NATS.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use weir_audio_producer::testing::{Collector, StreamLog};
use weir_testkit::NatsServer;

use super::{CHUNK, Carrier, FRAME, MAX_LAG, MIN_NCC, data, reference};
use crate::support::{self, Binary};
use crate::whip_support::{NatsLog, best_ncc, record, wait_for};

/// The stream's PCM laid out by seq (frame `s` at `(s − 1) × 320`; zeros where none).
fn timeline(log: &NatsLog) -> Vec<i16> {
    let last = log.frames.iter().map(|(s, _)| *s).max().unwrap_or(0) as usize;
    let mut out = vec![0i16; last * FRAME];
    for (seq, pcm) in &log.frames {
        let at = (*seq as usize - 1) * FRAME;
        let n = pcm.len().min(FRAME);
        out[at..at + n].copy_from_slice(&pcm[..n]);
    }
    out
}

/// Seqs declared lost: inside a gap packet or a `Weir-Possibly-Lost` range.
fn declared(log: &StreamLog) -> BTreeSet<u64> {
    let mut out = BTreeSet::new();
    for g in &log.gaps {
        out.extend(g.first_seq..=g.last_seq);
    }
    for (_, d) in &log.declarations {
        out.extend(d.first_seq..=d.last_seq);
    }
    if let Some(d) = log.end.as_ref().and_then(|e| e.ext.possibly_lost.as_ref()) {
        out.extend(d.first_seq..=d.last_seq);
    }
    out
}

/// Seconds of the speech fixture a call sends by default: enough for the mechanism
/// (every chunk a frame, in order, the sound of FFmpeg's decode); the whole 15.9 s
/// (`WEIR_TELEPHONY_SPEECH_S=16`) gives the figures in docs/results/telephony.md.
const SPEECH_S: f64 = 6.0;

/// The first `WEIR_TELEPHONY_SPEECH_S` seconds (from [`SPEECH_S`], the default, to 16:
/// the late-chunk case delays chunk 250) of the speech fixture of `enc`, as a file the
/// call and the reference decode both read.
fn speech(enc: &str) -> tempfile::TempPath {
    let whole = std::fs::read(data(if enc == "PCMA" {
        "speech-8k.alaw"
    } else {
        "speech-8k.ulaw"
    }))
    .expect("fixture");
    let secs = std::env::var("WEIR_TELEPHONY_SPEECH_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| (SPEECH_S..=16.0).contains(s))
        .unwrap_or(SPEECH_S);
    let n = ((secs * 8000.0) as usize).min(whole.len());
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    std::io::Write::write_all(&mut file, &whole[..n]).expect("write clip");
    file.into_temp_path()
}

/// One inbound call: what NATS saw for the stream and the carrier's report.
struct Inbound {
    report: Value,
    log: StreamLog,
    pcm: NatsLog,
    chunks: u64,
    /// The G.711 the carrier sent (removed on drop).
    audio: tempfile::TempPath,
}

async fn inbound_call(id: &str, route: &str, dialect: &str, enc: &str, extra: &[&str]) -> Inbound {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;
    let collector = Collector::start(nats.url(), "inference.whisper.stream.>").await;
    let logs = record(nats.url()).await;
    let file = speech(enc);
    let bytes = std::fs::metadata(&file).expect("clip").len() as usize;
    let chunks = bytes.div_ceil(CHUNK) as u64;
    let mut args = vec!["--dialect", dialect, "--encoding", enc, "--stream-id", id];
    args.extend(["--audio", file.to_str().expect("utf-8")]);
    args.extend(extra);
    let report = Carrier::start(&bin, route, &args)
        .finish(Duration::from_secs(60))
        .await;
    assert!(
        collector.wait_ends(1, support::STEP).await,
        "{id}: the end reached NATS"
    );
    assert!(
        wait_for(&logs, Duration::from_secs(2), |l| l
            .get(id)
            .is_some_and(|s| s.end.is_some()))
        .await
    );
    let pcm = logs.lock().expect("logs")[id].clone();
    Inbound {
        report,
        log: collector.log(id),
        pcm,
        chunks,
        audio: file,
    }
}

/// Every chunk a frame, seqs 1..=N, nothing declared, the sound of the reference.
fn assert_lossless(id: &str, call: &Inbound, enc: &str) {
    let (log, chunks) = (&call.log, call.chunks);
    assert_eq!(call.report["chunks_sent"], chunks, "{id}");
    let end = log.end.as_ref().expect("end");
    let reason = end.ext.end_reason.map(|r| format!("{r:?}"));
    assert_eq!(log.frames.len() as u64, chunks, "{id}: one frame per chunk");
    assert_eq!(
        log.frames,
        (1..=chunks).collect::<Vec<_>>(),
        "{id}: seqs from 1 without holes, in order"
    );
    assert!(
        log.gaps.is_empty() && log.declarations.is_empty(),
        "{id}: {log:?}"
    );
    assert!(log.missing().is_empty() && log.in_order(), "{id}");
    assert!(
        call.pcm.frames.iter().all(|(_, p)| p.len() == FRAME),
        "{id}: every frame 20 ms at 16 kHz"
    );
    let want = reference(&call.audio, enc);
    let (ncc, lag) = best_ncc(&want, &timeline(&call.pcm), MAX_LAG);
    eprintln!(
        "{id}: {chunks} chunks → {} frames, 0 declared, end {reason:?}; ncc {ncc:.4} at lag {lag} samples ({:.2} ms)",
        log.frames.len(),
        lag as f64 / 16.0
    );
    assert!(ncc >= MIN_NCC, "{id}: ncc {ncc:.4} at lag {lag}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twilio_mulaw_speech_arrives_whole_and_sounds_like_ffmpegs_decode() {
    let id = "tel-twilio-ulaw";
    let call = inbound_call(id, "/v1/telephony/twilio", "twilio", "PCMU", &[]).await;
    assert_lossless(id, &call, "PCMU");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telnyx_pcmu_speech_arrives_whole_and_sounds_like_ffmpegs_decode() {
    let id = "tel-telnyx-pcmu";
    let call = inbound_call(id, "/v1/telephony/telnyx", "telnyx", "PCMU", &[]).await;
    assert_lossless(id, &call, "PCMU");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telnyx_pcma_on_the_detecting_route_arrives_whole_and_sounds_like_ffmpegs_decode() {
    let id = "tel-telnyx-pcma";
    let call = inbound_call(id, "/v1/telephony", "telnyx", "PCMA", &[]).await;
    assert_lossless(id, &call, "PCMA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_permuted_within_60_ms_come_out_in_order_with_nothing_declared() {
    let id = "tel-shuffled";
    let call = inbound_call(
        id,
        "/v1/telephony/twilio",
        "twilio",
        "PCMU",
        &["--shuffle-ms", "60"],
    )
    .await;
    let order: Vec<u64> = call.report["send_order_head"]
        .as_array()
        .expect("order")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert!(
        order.windows(2).any(|w| w[0] > w[1]),
        "the carrier did permute: {order:?}"
    );
    assert_lossless(id, &call, "PCMU");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_later_than_the_window_are_declared_never_out_of_order() {
    let id = "tel-late";
    // Chunks 100, 150, 151 and 250: 200–400 ms late, beyond the 60 ms window.
    let late = [100u64, 150, 151, 250];
    let call = inbound_call(
        id,
        "/v1/telephony/twilio",
        "twilio",
        "PCMU",
        &["--delay-chunks", "100:200,150:200,151:200,250:400"],
    )
    .await;
    let log = &call.log;
    let frames: BTreeSet<u64> = log.frames.iter().copied().collect();
    let declared = declared(log);
    let last = log.end.as_ref().expect("end").packet.seq - 1;
    let holes: Vec<u64> = (1..=last).filter(|s| !frames.contains(s)).collect();
    let undeclared: Vec<u64> = holes
        .iter()
        .copied()
        .filter(|s| !declared.contains(s))
        .collect();
    eprintln!(
        "{id}: {} chunks, {} frames, holes {holes:?}, gap packets {:?}, declarations {:?}",
        call.chunks,
        log.frames.len(),
        log.gaps,
        log.declarations
    );
    assert!(log.in_order(), "{id}: 0 out of order");
    assert!(
        undeclared.is_empty(),
        "{id}: holes not declared: {undeclared:?}"
    );
    assert_eq!(
        holes.len(),
        late.len(),
        "{id}: exactly the late chunks are missing"
    );
    assert_eq!(
        log.frames.len() as u64 + holes.len() as u64,
        call.chunks,
        "{id}: every chunk accounted for once"
    );
    // The late chunks' slots are the holes (the door keeps the timeline).
    assert_eq!(holes, late, "{id}");
    let want = reference(&call.audio, "PCMU");
    let (ncc, lag) = best_ncc(&want, &timeline(&call.pcm), MAX_LAG);
    eprintln!("{id}: ncc {ncc:.4} at lag {lag}");
    assert!(ncc >= MIN_NCC, "{id}: ncc {ncc:.4} at lag {lag}");
}
