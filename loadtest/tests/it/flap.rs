//! `producer-flap` end to end against the real `audio-ingress` binary and a real
//! nats-server: 20 calls of 8 s, every connection cut (RST) every 2 s. The short run
//! proves the mechanism — socket-level cuts, resumes with token, `last_seq` and
//! `next_seq`, the wire audit — not the defaults' figures (1,000 calls, a cut every
//! 10 s: docs/results/producer-flap.md). Without the `audio-ingress` binary (see
//! `end_to_end`) the tests are skipped with a message.

use std::time::Duration;

use crate::support::env;
use weir_loadtest::scenario::flap::{FlapDesign, FlapReport, FlapSettings, run_design};

const CALLS: usize = 20;

const SETTINGS: FlapSettings = FlapSettings {
    duration: Duration::from_secs(8),
    flap_every: Duration::from_secs(2),
    partitions: 4,
};

async fn run(design: FlapDesign) -> Option<FlapReport> {
    let env = env();
    if let Err(e) = &env.ingress_bin {
        eprintln!("skipped: {e}");
        return None;
    }
    let out = run_design(&env, &SETTINGS, CALLS, design)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{:?}", out.report.notes);
    out.report.flap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_calls_stay_one_instance_and_account_for_every_frame() {
    let Some(f) = run(FlapDesign::WeirResume).await else {
        return;
    };
    let (a, p) = (&f.audit, &f.producers);
    eprintln!("{a:?}\n{p:?}\n{:?}", f.server_resume);
    // Each call is cut at 1 s + its share of 2 s, then every 2 s, never in its last
    // second: 3 cuts for most calls, at least 2 for each.
    assert!(p.cuts >= 2 * CALLS as u64, "{p:?}");
    assert_eq!(
        p.resumes,
        p.cuts + p.unplanned_drops,
        "every drop resumed: {p:?}"
    );
    assert_eq!(p.fresh_reopens, 0, "{p:?}");
    assert_eq!(p.next_seq_mismatches, 0, "{p:?}");
    assert_eq!(
        p.frames_lost_between_attempts, 0,
        "no attempt failed: {p:?}"
    );
    assert_eq!(a.streams, CALLS as u64);
    assert_eq!(
        a.instances, CALLS as u64,
        "one stream instance per call: {a:?}"
    );
    assert_eq!((a.duplicates, a.out_of_order), (0, 0), "{a:?}");
    assert_eq!(a.frames_lost_undeclared, 0, "{a:?}");
    assert_eq!(a.frames_excess, 0, "{a:?}");
    assert_eq!(
        a.frames_published + a.frames_declared_lost,
        a.frames_offered,
        "{a:?}"
    );
    assert_eq!(
        a.ends_by_reason.get("producer"),
        Some(&(CALLS as u64)),
        "{a:?}"
    );
    assert_eq!(a.streams_ok, a.streams, "{:?}", a.failing_examples);
    assert_eq!(
        a.declared_by_reason.get("resume").copied().unwrap_or(0),
        p.door_declared_frames,
        "the markers on NATS are what the door said it declared: {a:?}"
    );
    assert_eq!(a.audit_slow_consumer_events, 0);
    // Resume latency on both sides.
    assert_eq!(p.resume_ms.count, p.resumes, "{p:?}");
    let s = f
        .server_resume
        .as_ref()
        .expect("the door's resume histogram");
    assert_eq!(s.count, p.resumes, "the door timed every resume: {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_resume_every_reconnect_is_a_new_instance() {
    let Some(f) = run(FlapDesign::WeirNoResume).await else {
        return;
    };
    let (a, p) = (&f.audit, &f.producers);
    eprintln!("{a:?}\n{p:?}");
    assert!(p.cuts >= 2 * CALLS as u64, "{p:?}");
    assert_eq!(p.resumes, 0, "{p:?}");
    assert_eq!(p.fresh_reopens, p.cuts + p.unplanned_drops, "{p:?}");
    // Each reopen is a stream instance of its own, seq from 1.
    assert_eq!(a.instances, CALLS as u64 + p.fresh_reopens, "{a:?}");
    assert_eq!(a.streams_ok, 0, "no call kept one instance: {a:?}");
    assert!(
        a.ends_by_reason
            .get("producer_gone")
            .is_some_and(|n| *n >= p.cuts),
        "{a:?}"
    );
    assert_eq!(a.declared_by_reason.get("resume"), None, "{a:?}");
    assert!(f.server_resume.is_none_or(|s| s.count == 0));
}
