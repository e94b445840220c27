//! What the integration tests share: the run environment of a short scenario run.

use std::path::PathBuf;
use std::time::Duration;

use weir_loadtest::ingress::find_ingress_bin;
use weir_loadtest::llm::LlmSettings;
use weir_loadtest::producers::Transport;
use weir_loadtest::scenario::run::{Env, PolicyArg};

/// The built `loadtest` binary and the `audio-ingress` beside the test binary (an
/// `Err` when it is not built); `close` policy, 4 partitions, one consumer worker
/// without reconnects, WebSocket producers, quiet.
pub fn env() -> Env {
    let test_exe = std::env::current_exe().ok();
    Env {
        nats_url: None,
        self_exe: PathBuf::from(env!("CARGO_BIN_EXE_loadtest")),
        ingress_bin: find_ingress_bin(test_exe.as_deref()),
        policy: PolicyArg::Close,
        frame_cost: Duration::ZERO,
        fleet_workers: 1,
        partitions: 4,
        reconnect: false,
        quiet: true,
        llm: LlmSettings::default(),
        ingress_set: Vec::new(),
        naive_floor: None,
        wait_quiet: Duration::ZERO,
        transport: Transport::Ws,
    }
}
