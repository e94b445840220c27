//! End to end against a real nats-server: a tiny `steady` run of each design, and the
//! binary's JSON and charts. Asserts that the frame accounting adds up.
//!
//! The bounded design needs the `audio-ingress` binary: `cargo test --workspace` (what
//! scripts/test runs) builds it next to this test; with `cargo test -p weir-loadtest`
//! alone it may be missing, and that part is skipped with a message.

use std::time::Duration;

use weir_loadtest::ingress::Design;
use weir_loadtest::producers::Transport;
use weir_loadtest::report::{REQUIRED_KEYS, RunReport, missing_keys};
use weir_loadtest::scenario::run::{Env, run_one};
use weir_loadtest::scenario::{Scenario, plan};

/// 3 streams × 2 s × 50 frames/s = 300 nominal; allow for start-up spread.
const WS_MIN_SENT: u64 = 240;
/// The same less the WHIP set-up (ICE, DTLS) before the first frame: a fresh-clone CI
/// run under load sent 230 (the WebSocket floor failed it). Half is the floor: the
/// point is that frames flowed and every one is accounted for.
const WHIP_MIN_SENT: u64 = 150;

/// Two consumer workers that reconnect (the fault scenarios restart NATS).
fn env() -> Env {
    Env {
        fleet_workers: 2,
        reconnect: true,
        ..crate::support::env()
    }
}

/// `min_sent`: the floor on frames the producers sent (the cadence held well enough
/// for the run to mean something).
fn check_identities(r: &RunReport, min_sent: u64) {
    let f = &r.frames;
    let e = &f.explained;
    assert_eq!(
        e.ingress_discrepancy, 0,
        "the ingress's counters add up: {f:?}"
    );
    assert_eq!(
        f.unaccounted,
        e.pending_at_end as i64 + e.lost_declared + e.lost_undetected + e.ingress_discrepancy,
        "the decomposition is exact: {f:?}"
    );
    assert_eq!(e.lost_declared + e.lost_undetected, e.lost_after_publish);
    assert_eq!(
        f.offered,
        f.published + f.possibly_lost + f.dropped + e.pending_at_end,
        "{f:?}"
    );
    assert!(
        e.window_discrepancy.unwrap_or(0) == 0,
        "the window's counters add up: {f:?}"
    );
    // Every frame handed to a recogniser was timed or counted as untimed.
    let t = &f.timeliness;
    assert!(t.e2e_latency_ms.count + t.delivered_untimed > 0, "{t:?}");
    // Only frames handed to a recogniser are timed: never the ones the staleness guard
    // dropped (received, counted, declared as stale gaps).
    assert!(f.stale_dropped_by_consumer <= f.received, "{f:?}");
    assert!(
        t.e2e_latency_ms.count + t.delivered_untimed <= f.received - f.stale_dropped_by_consumer,
        "{t:?} {f:?}"
    );
    assert!(f.handed_to_handler <= f.received - f.stale_dropped_by_consumer);
    assert_eq!(
        r.consumer.fleet.max_frame_age_ms,
        Some(1000),
        "the fleet runs the consumer core's default staleness guard"
    );
    assert!(t.delivered_late <= t.e2e_latency_ms.count, "{t:?}");
    assert_eq!(t.late_after_ms, 700.0, "default max_age + one round");
    assert!(
        f.sent_by_producers >= min_sent,
        "producers kept the cadence (at least {min_sent} sent): {f:?}"
    );
    assert!(
        f.received > 0 && f.received <= f.published + f.possibly_lost,
        "{f:?}"
    );
    let v = serde_json::to_value(r).expect("serialises");
    assert_eq!(missing_keys(&v, REQUIRED_KEYS), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_steady_run_accounts_for_every_frame() {
    let env = env();
    let plan = plan(Scenario::Steady, Some(Duration::from_secs(2)), None, 1.0).expect("plan");

    let naive = run_one(&env, &plan, 3, Design::Naive)
        .await
        .expect("naive run");
    check_identities(&naive.report, WS_MIN_SENT);
    assert!(naive.samples.len() >= 15, "sampled every 100 ms");
    assert_eq!(naive.report.ingress.pending_bytes_limit, None);

    match &env.ingress_bin {
        Ok(_) => {
            let bounded = run_one(&env, &plan, 3, Design::Bounded)
                .await
                .expect("bounded run");
            let r = &bounded.report;
            check_identities(r, WS_MIN_SENT);
            assert_eq!(
                r.frames.unaccounted, 0,
                "nothing lost on loopback without faults: {:?}",
                r.frames
            );
            assert_eq!(r.ingress.overloads, 0);
            assert_eq!(r.ingress.pending_bytes_limit, Some(3 * 16_000));
            assert!(r.ingress.pending_bytes_max <= 3 * 16_000);
        }
        Err(why) => eprintln!("bounded design skipped: {why}"),
    }
}

/// `llm-overload --stream`: weir's callers stream (TTFT ≈ the first-token delay when
/// not overloaded), the naive front answers whole replies (TTFT = the whole reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_overload_stream_reports_ttft_and_goodput() {
    let mut env = env();
    env.llm.stream = Some(weir_loadtest::llm::StreamLoad {
        first_token: Duration::from_millis(30),
        tokens: 10,
        tokens_per_second: 100.0,
    });
    let plan = plan(
        Scenario::LlmOverload,
        Some(Duration::from_secs(2)),
        None,
        0.5,
    )
    .expect("plan");
    let naive = run_one(&env, &plan, 1, Design::Naive)
        .await
        .expect("naive run");
    let n = &naive.report.llm;
    assert!(!n.streamed && n.completed > 0, "{n:?}");
    // The naive front's caller waits for the whole reply: 30 + 9 × 10 ms.
    assert!(n.ttft_ms.p50 >= 110.0, "{n:?}");
    match &env.ingress_bin {
        Ok(_) => {
            let bounded = run_one(&env, &plan, 1, Design::Bounded)
                .await
                .expect("bounded run");
            let l = &bounded.report.llm;
            assert!(l.streamed, "{l:?}");
            assert!(l.completed > 0 && l.ttft_ms.count == l.completed, "{l:?}");
            assert!(l.ttft_ms.p50 >= 30.0 && l.ttft_ms.p50 < 100.0, "{l:?}");
            assert_eq!(l.started_after_deadline, 0);
            assert!(l.goodput_per_s > 0.0);
        }
        Err(why) => eprintln!("bounded design skipped: {why}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_steady_run_over_whip_accounts_for_every_frame() {
    let env = Env {
        transport: Transport::Whip,
        ..env()
    };
    if let Err(why) = &env.ingress_bin {
        eprintln!("WHIP run skipped (needs the audio-ingress binary): {why}");
        return;
    }
    let plan = plan(Scenario::Steady, Some(Duration::from_secs(2)), None, 1.0).expect("plan");
    let out = run_one(&env, &plan, 3, Design::Bounded)
        .await
        .expect("bounded run over WHIP");
    let r = &out.report;
    check_identities(r, WHIP_MIN_SENT);
    assert_eq!(r.transport, Transport::Whip);
    assert_eq!(r.producers.counters.connects, 3, "{:?}", r.producers);
    assert!(r.frames.offered >= WHIP_MIN_SENT, "{:?}", r.frames);
    assert_eq!(r.frames.unaccounted, 0, "{:?}", r.frames);
    assert_eq!(r.ingress.overloads, 0);
}

/// `--transport twilio`: Twilio Media Streams on the telephony door, 8 kHz µ-law chunks
/// that the door turns into 16 kHz frames, one for one; `stop` ends each stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_steady_run_over_twilio_accounts_for_every_frame() {
    let env = Env {
        transport: Transport::Twilio,
        ..env()
    };
    if let Err(why) = &env.ingress_bin {
        eprintln!("Twilio run skipped (needs the audio-ingress binary): {why}");
        return;
    }
    let plan = plan(Scenario::Steady, Some(Duration::from_secs(2)), None, 1.0).expect("plan");
    let out = run_one(&env, &plan, 3, Design::Bounded)
        .await
        .expect("bounded run over Twilio");
    let r = &out.report;
    check_identities(r, WS_MIN_SENT);
    assert_eq!(r.transport, Transport::Twilio);
    let p = &r.producers.counters;
    assert_eq!((p.connects, p.refused), (3, 0), "{p:?}");
    assert_eq!((p.ended, p.ended_by_server, p.vanished), (3, 0, 0), "{p:?}");
    assert_eq!(
        p.close_codes.values().sum::<u64>(),
        3,
        "the server closed each socket after `stop`: {p:?}"
    );
    // One 8 kHz chunk sent = one 16 kHz frame read by the ingress.
    assert_eq!(
        r.frames.offered, r.frames.sent_by_producers,
        "{:?}",
        r.frames
    );
    assert_eq!(r.frames.unaccounted, 0, "{:?}", r.frames);
    assert_eq!(r.ingress.overloads, 0);
}

#[test]
fn the_binary_writes_json_and_charts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("out.json");
    let plots = dir.path().join("plots");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args([
            "steady",
            "--streams",
            "2",
            "--design",
            "naive",
            "--duration",
            "1",
            "-q",
            "--json",
        ])
        .arg(&json)
        .arg("--plot")
        .arg(&plots)
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("2 naive"), "{table}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json written")).expect("valid JSON");
    let runs = v.as_array().expect("an array");
    assert_eq!(runs.len(), 1);
    assert_eq!(missing_keys(&runs[0], REQUIRED_KEYS), Vec::<String>::new());
    let svg = std::fs::read_to_string(plots.join("steady-2.svg")).expect("chart written");
    assert!(svg.contains("</svg>"));
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(["nats-pause", "--duration", "3", "--pause", "5"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--duration") && err.contains("--pause"),
        "{err}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loadtest"))
        .args(["steady", "--nats-url", "nats://192.168.1.1:4222"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}

/// `--naive-floor publish`: the measurement mode reads each message and publishes the
/// deployed `frame` packet inline; every frame reaches the consumer, decodable, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publish_floor_delivers_every_frame() {
    let env = Env {
        naive_floor: Some(weir_loadtest::naive::audio::Floor::Publish),
        ..env()
    };
    let plan = plan(Scenario::Steady, Some(Duration::from_secs(2)), None, 1.0).expect("plan");
    let out = run_one(&env, &plan, 3, Design::Naive)
        .await
        .expect("floor run");
    let f = &out.report.frames;
    assert!(f.offered >= WS_MIN_SENT, "{f:?}");
    assert_eq!(f.published, f.offered, "{f:?}");
    assert_eq!(f.received, f.published, "{f:?}");
    assert_eq!(out.report.consumer.fleet.out_of_order_refused, 0);
    assert!(out.report.ingress.cpu_seconds > 0.0);
}
