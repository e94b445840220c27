//! A short `worker-failover` run on a real 3-node nats-server cluster, with real worker
//! processes (this package's `loadtest lease-worker`), one of them SIGKILLed and
//! restarted. Generous asserts only: no double delivery, no undeclared loss, every
//! orphaned partition re-owned, the report complete. The timings are printed, not
//! asserted (2 shared cores).
//!
//! `NATS_SERVER_BIN=/usr/sbin/nats-server cargo test -p weir-loadtest --test failover -- --nocapture`

use std::path::PathBuf;
use std::time::Duration;

use weir_loadtest::report::{REQUIRED_KEYS, missing_keys};
use weir_loadtest::scenario::Scenario;
use weir_loadtest::scenario::failover::{self, FailoverEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_process_s_partitions_are_re_owned_without_double_delivery() {
    let env = FailoverEnv {
        self_exe: PathBuf::from(env!("CARGO_BIN_EXE_loadtest")),
        workers: 3,
        partitions: 16,
        lease_ttl: weir_audio_consumer::DEFAULT_LEASE_TTL,
        fps: 10,
        quiet: true,
        // WEIR_FAILOVER_KEEP_LOGS=DIR keeps the workers' logs of a failing run.
        keep_logs: std::env::var_os("WEIR_FAILOVER_KEEP_LOGS").map(PathBuf::from),
    };
    // Kill at 3 s, down 2 s, 4 s after the restart.
    let plan = failover::plan(
        Scenario::WorkerFailover,
        Some(Duration::from_secs(9)),
        Some(Duration::from_secs(2)),
    )
    .expect("plan");
    let out = tokio::time::timeout(Duration::from_secs(60), failover::run(&env, &plan, 30))
        .await
        .expect("the run ends in time")
        .expect("the run");
    let r = &out.report;
    let f = r.failover.as_ref().expect("a failover report");
    println!("{}", weir_loadtest::app::one_line(r));
    let t = f.takeover.as_ref().expect("a takeover");
    let a = &f.frames;
    assert!(t.orphaned > 0, "the victim held partitions: {f:?}");
    assert_eq!(t.reowned, t.orphaned, "every orphan re-owned: {t:?}");
    assert_eq!(a.double_deliveries, 0, "{a:?}; cpu {:?}", f.cpu);
    assert_eq!(a.undeclared, 0, "{a:?}");
    // A hole at a stream's tail has no later packet to reveal it; a handful may fall
    // on a partition changing hands at the run's end.
    assert!(a.undeclared_tail <= a.published / 100, "{a:?}");
    assert!(
        a.handover_declared > 0,
        "the takeover declared its gaps: {a:?}"
    );
    // 30 streams × 10 frames/s × 9 s = 2,700 nominal; the victim's share of the
    // down time is lost in the handover, the rest is handed over.
    assert!(a.published >= 1_500 && a.handed >= a.published / 2, "{a:?}");
    let v = serde_json::to_value(r).expect("json");
    assert_eq!(missing_keys(&v, REQUIRED_KEYS), Vec::<String>::new());
    assert!(
        v["failover"]["takeover"]["reowned_ms_max"].is_number(),
        "{v}"
    );
    assert!(v["failover"]["frames"]["double_deliveries"].is_number());
}
