//! The deploy kit against the real binary: `deploy/audio-ingress.toml` starts
//! `audio-ingress serve` as the systemd unit would (secret from the environment), and
//! every `weir_ingress_*` and `process_*` metric named by the alerting rules or the
//! dashboard is in its first `/metrics` scrape; every `weir_consumer_*` one is exported
//! by the consumer core (what a recognition worker embeds) from its start.

// The consumer core's test helpers live with it (consumer/tests).
#[path = "../../consumer/tests/consumer_support/mod.rs"]
mod consumer_support;
mod support;

use std::collections::BTreeSet;

use consumer_support::{Book, Recorder, connect_options};
use support::{Binary, STEP, http_get};
use weir_audio_ingress::consumer::{Consumer, ConsumerConfig};
use weir_testkit::NatsServer;
use weir_testkit::deploy;

fn missing(
    refs: &BTreeSet<(String, &'static str)>,
    prefixes: &[&str],
    have: &BTreeSet<String>,
) -> Vec<String> {
    refs.iter()
        .filter(|(n, _)| prefixes.iter().any(|p| n.starts_with(p)))
        .filter(|(n, _)| !have.contains(n))
        .map(|(n, f)| format!("{n} (in deploy/{f})"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_and_dashboard_name_only_metrics_the_binary_and_the_consumer_export() {
    let refs = deploy::referenced().expect("deploy files");
    let server = NatsServer::start().expect("nats-server");

    // As the systemd unit runs it (its ExecStart arguments, the example configuration
    // as shipped, the token secret from the environment); only the addresses are made
    // local.
    let args = deploy::unit_exec_args("audio-ingress.service", "ExecStart").expect("unit");
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let secret = "deploy-kit-test-secret-of-at-least-32-bytes";
    let ingress = Binary::start_with(
        &args,
        &[("WEIR_INGRESS_AUTH_HS256_SECRET", secret)],
        server.url(),
        &[],
    )
    .await;
    assert!(ingress.wait_ready(200).await, "ready on the example config");
    let (status, text) = http_get(ingress.admin, "/metrics").await;
    assert_eq!(status, 200);
    let scraped = deploy::scraped(&text);
    let gone = missing(
        &refs,
        &["weir_ingress_", "weir_build_", "process_"],
        &scraped,
    );
    assert!(
        gone.is_empty(),
        "not exported by audio-ingress serve: {gone:?}"
    );
    // The bound it reports is the configuration's, and RSS is below it.
    let bound = ingress.metric("weir_ingress_memory_bound_bytes").await;
    let rss = ingress.metric("process_resident_memory_bytes").await;
    assert!(rss > 1e6 && rss < bound, "rss {rss}, bound {bound}");

    // The consumer core registers its metrics when it starts, with whatever recorder
    // the worker installed (here: the same Prometheus recorder the ingress uses).
    let recorder = weir_audio_ingress::metrics::prometheus_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
    let settings = ConsumerConfig::default().validate().expect("valid");
    let consumer = tokio::time::timeout(
        STEP,
        Consumer::connect_with(
            connect_options(),
            server.url(),
            settings,
            Recorder::factory("deploy-kit", Book::default()),
        ),
    )
    .await
    .expect("consumer starts in time")
    .expect("consumer starts");
    let scraped = deploy::scraped(&handle.render());
    let gone = missing(&refs, &["weir_consumer_"], &scraped);
    assert!(
        gone.is_empty(),
        "not exported by the consumer core: {gone:?}"
    );
    consumer.shutdown(std::time::Duration::from_secs(1)).await;
}
