//! The capacity loop with a real recognition worker: the consumer core (one slot,
//! announcing every 200 ms) behind the in-process ingress, on a real nats-server, and
//! the producers on the plain Python `websockets` package (`capacity_client.py`).
//!
//! - `capacity.mode = enforce` (the default): once the worker announces its one slot
//!   taken, a second producer is refused `503 no_capacity` at the door;
//! - `capacity.mode = off`: the second producer is admitted, the worker refuses it for
//!   `max_streams`, and the producer is told — `closed` with reason `no_capacity`,
//!   close 1013 — instead of streaming into silence.

use serde_json::Value;
use weir_audio_consumer::{CapacityConfig, Consumer, ConsumerConfig, StreamEvent, StreamHandler};
use weir_audio_producer::testing::STEP;
use weir_testkit::NatsServer;

use crate::support;

/// A recogniser that takes each frame at once.
struct Quick;

impl StreamHandler for Quick {
    async fn on_event(&mut self, _event: StreamEvent) {}
}

async fn run(scenario: &str, mode: &str) -> Value {
    let nats = NatsServer::start().expect("nats-server");
    let settings = ConsumerConfig {
        max_streams: 1,
        idle_timeout_ms: 2_000,
        capacity: CapacityConfig {
            interval_ms: 200,
            ..CapacityConfig::default()
        },
        ..ConsumerConfig::default()
    }
    .validate()
    .expect("valid");
    let worker = Consumer::connect(nats.url(), settings, |_: &_| Quick)
        .await
        .expect("worker");
    let svc = support::start_in_process(nats.url(), &[("capacity.mode", mode)]).await;
    let seen = support::capacity_client(svc.ws_addr(), nats.url(), scenario, 2 * STEP).await;
    svc.shutdown().await;
    let stats = worker.shutdown(STEP).await;
    let refused = stats.totals.frames_refused;
    serde_json::json!({"python": seen, "worker_frames_refused": refused})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_announcing_worker_gets_the_next_producer_refused_at_the_door() {
    let seen = run("worker-door", "enforce").await;
    assert_eq!(seen["python"]["status"], 503, "{seen}");
    assert_eq!(
        seen["python"]["body"]["error"]["code"], "no_capacity",
        "{seen}"
    );
    // Refused before any audio: the worker never saw the second stream.
    assert_eq!(seen["worker_frames_refused"], 0, "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_worker_refuses_is_ended_for_its_producer_with_the_check_off() {
    let seen = run("worker-refusal", "off").await;
    assert_eq!(seen["python"]["close"], 1013, "{seen}");
    assert!(seen["worker_frames_refused"].as_u64() > Some(0), "{seen}");
}
