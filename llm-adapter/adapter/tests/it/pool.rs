//! The backend pool over a real nats-server: three sim backends from `[[backends]]`,
//! one paused mid-run (a stalled backend: accepts calls, sends nothing). It is ejected
//! within a second of its stall becoming detectable, and no caller with budget left is
//! answered with an error.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{STEP, connect};
use weir_llm_adapter::Config;
use weir_llm_client::LlmClient;

/// `b` is the cheapest (weight 1): it takes every request it can finish in time, so it
/// is busy when it stalls.
const POOL: &str = "\
[[backends]]\nname = \"a\"\nslots = 2\nweight = 2\n[backends.sim]\nlatency_ms = 50\n\
[[backends]]\nname = \"b\"\nslots = 2\n[backends.sim]\nlatency_ms = 50\n\
[[backends]]\nname = \"c\"\nslots = 2\nweight = 2\n[backends.sim]\nlatency_ms = 50\n\
[pool]\nstall_factor = 3\nstall_floor_ms = 100\n";

#[tokio::test]
async fn a_stalled_backend_of_three_is_ejected_and_no_caller_gets_an_error() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let adapter_client = connect(server.url()).await;
    let config = Config::from_toml_str(POOL).expect("config");
    assert_eq!(config.admission.workers.get(), 6);
    let built =
        weir_llm_adapter::backend::pool_from_config(&config, &adapter_client).expect("pool");
    let stalled = built.sim("b").expect("b is a sim").clone();
    let adapter = tokio::time::timeout(
        STEP,
        weir_llm_adapter::start_pool(
            adapter_client,
            weir_llm_adapter::AdapterEvents::new(),
            config,
            built.backends,
        ),
    )
    .await
    .expect("start in time")
    .expect("start");
    let caller = connect(server.url()).await;
    caller.flush().await.expect("flush");
    let llm = Arc::new(LlmClient::new(caller.clone(), "llm.infer"));
    let view = adapter.view();

    // 3 s at 50 requests/s (the pool does 120/s, b alone 40/s, a and c 80/s), 2 s
    // budgets; b stalls at 1 s.
    let t0 = Instant::now();
    let mut calls = Vec::new();
    let mut paused = None;
    let mut stall_seen_at = None;
    let mut ejected_at = None;
    for i in 0..150u32 {
        let at = t0 + Duration::from_millis(20 * u64::from(i));
        tokio::time::sleep_until(at.into()).await;
        if i == 50 {
            stalled.pause();
            paused = Some(stalled.stats().started);
            // A call in flight on b stalls from now.
            if view.backends()[1].busy > 0 {
                stall_seen_at = Some(Instant::now());
            }
        }
        // Otherwise the stall begins with the first call on b after the pause (and is
        // detectable 3 estimates later).
        if let Some(n) = paused
            && stall_seen_at.is_none()
            && stalled.stats().started > n
        {
            stall_seen_at = Some(Instant::now());
        }
        if ejected_at.is_none() && view.backends()[1].ejections > 0 {
            ejected_at = Some(Instant::now());
        }
        let llm = llm.clone();
        calls.push(tokio::spawn(async move {
            llm.request(format!("r{i}"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
        }));
    }
    let mut outcomes: BTreeMap<String, u32> = BTreeMap::new();
    for c in calls {
        let r = tokio::time::timeout(STEP, c)
            .await
            .expect("answered in time")
            .expect("task");
        let key = match r {
            Ok(_) => "ok".to_owned(),
            Err(e) => format!("{:?}", e.kind()),
        };
        *outcomes.entry(key).or_default() += 1;
    }
    let (first_call, ejected_at) = (
        stall_seen_at.expect("b had a call at or after the pause"),
        ejected_at.expect("b was ejected"),
    );
    // b's estimate is about 50 ms: a call there is a stall after about 150 ms without
    // a byte (seen here within the 20 ms of the sampling).
    let after = ejected_at.saturating_duration_since(first_call);
    println!("outcomes {outcomes:?}; ejected {after:?} after the stall began");
    assert!(
        after <= Duration::from_millis(200 + 1000),
        "ejected {after:?} after the stall began"
    );
    assert_eq!(
        outcomes.get("ok"),
        Some(&150),
        "every caller answered ok: {outcomes:?}"
    );
    let b = &view.backends()[1];
    assert_eq!(b.name, "b");
    assert!(b.ejections >= 1 && b.failovers >= 1, "{b:?}");
    let stats = view.stats();
    assert_eq!(stats.started_after_deadline, 0);
    stalled.resume();
    tokio::time::timeout(STEP, adapter.shutdown())
        .await
        .expect("shutdown in time");
}
