//! `asr-shortfall` end to end against real nats-servers: 4 calls against one GPU worker
//! with 2 slots, each design. The weir designs need the `audio-ingress` binary (see
//! `end_to_end`); without it that part is skipped with a message.

use std::time::Duration;

use crate::support::env;
use weir_loadtest::gpu::GpuModel;
use weir_loadtest::scenario::asr::{AsrDesign, AsrSettings, shortfall};

const SETTINGS: AsrSettings = AsrSettings {
    workers: 1,
    model: GpuModel { slots: 2, rtf: 0.8 },
    partitions: 4,
    duration: Duration::from_secs(3),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_naive_recogniser_admits_every_call_and_falls_behind() {
    let out = shortfall::run_design(&env(), &SETTINGS, 4, AsrDesign::Naive)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let a = out.report.asr.expect("an asr section");
    assert_eq!((a.offered, a.admitted, a.refused), (4, 4, 0), "{a:?}");
    assert_eq!(a.stale_drops, 0, "the naive recogniser drops nothing");
    assert!(
        a.frames_handed > 0 && a.frames_handed <= a.frames_sent_admitted,
        "{a:?}"
    );
    // 4 streams on a GPU that keeps up with 2.5: the lag grows through the call.
    assert!(a.lag_ms.max > 500.0, "{a:?}");
    assert!(a.naive_buffered_frames_max.is_some_and(|n| n > 0), "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_with_capacity_admission_refuses_what_the_slots_cannot_serve() {
    let env = env();
    if let Err(e) = &env.ingress_bin {
        eprintln!("skipped: {e}");
        return;
    }
    let out = shortfall::run_design(&env, &SETTINGS, 4, AsrDesign::WeirOn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let a = out.report.asr.expect("an asr section");
    assert_eq!(a.offered, 4, "{a:?}");
    assert!(a.admitted >= 2, "{a:?}");
    assert_eq!(a.admitted + a.refused, 4, "{a:?}");
    assert_eq!(a.refused_at_door, a.refusals_with_retry_after, "{a:?}");
    assert_eq!(a.stale_drops, 0, "{a:?}");
    assert!(a.within_max_age_pct.is_some_and(|p| p >= 99.0), "{a:?}");
    let off = shortfall::run_design(&env, &SETTINGS, 4, AsrDesign::WeirOff)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let b = off.report.asr.expect("an asr section");
    assert_eq!((b.admitted, b.refused), (4, 0), "admission off: {b:?}");
}
