//! The LLM side of a run: a request generator against a front (bounded adapter or the
//! naive task-per-message front) over a simulated backend.

use std::time::Duration;

use crate::ingress::Design;
use crate::report::LlmReport;

/// Settings of the LLM side.
#[derive(Debug, Clone)]
pub struct LlmSettings {
    /// Backend workers (concurrent inferences).
    pub workers: usize,
    /// Mean simulated inference time.
    pub latency: Duration,
    /// Deadline given to every request.
    pub deadline: Duration,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            workers: 4,
            latency: Duration::from_millis(100),
            deadline: Duration::from_secs(2),
        }
    }
}

/// The report of a scenario that does not drive the LLM side.
pub fn not_run() -> LlmReport {
    LlmReport {
        enabled: false,
        front: "not run in this scenario".into(),
        ..Default::default()
    }
}

/// A running LLM side.
#[derive(Debug)]
pub struct LlmRun {
    _private: (),
}

impl LlmRun {
    /// Starts the front and the generator.
    pub async fn start(
        _nats_url: &str,
        _design: Design,
        _sessions: usize,
        _factor: f64,
        _settings: &LlmSettings,
    ) -> Result<Self, String> {
        Err("the LLM side is not integrated yet".into())
    }

    /// Stops sending new requests.
    pub fn stop_offering(&self) {}

    /// Whether nothing is outstanding.
    pub fn idle(&self) -> bool {
        true
    }

    /// Pauses or resumes the backend.
    pub fn pause_backend(&self, _paused: bool) {}

    /// Requests held by the front.
    pub fn in_flight(&self) -> u64 {
        0
    }

    /// The report.
    pub fn report(&self, _wall: Duration) -> LlmReport {
        not_run()
    }

    /// Stops everything.
    pub async fn stop(self) {}
}
