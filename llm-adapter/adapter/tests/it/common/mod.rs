//! Shared helpers of the NATS integration tests: a real nats-server per test, a client
//! with short timeouts, an adapter running in-process with the sim backend.
#![allow(dead_code)]

pub mod bin;

use std::sync::Arc;
use std::time::Duration;

use weir_llm_adapter::backend::Backend;
use weir_llm_adapter::backend::sim::{SimBackend, SimHandle};
use weir_llm_adapter::{AdapterHandle, Config};
use weir_testkit::NatsServer;

/// Upper bound of any single await in these tests.
pub const STEP: Duration = Duration::from_secs(10);

/// Connects with test-friendly timeouts.
pub async fn connect(url: &str) -> async_nats::Client {
    let c = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .ping_interval(Duration::from_secs(1))
        .connect(url);
    tokio::time::timeout(STEP, c)
        .await
        .expect("connect in time")
        .expect("connect")
}

/// A server, the adapter on it and a client connection for callers.
pub struct Rig {
    pub server: NatsServer,
    pub adapter: Option<AdapterHandle>,
    pub caller: async_nats::Client,
    pub sim: Option<SimHandle>,
}

impl Rig {
    /// Starts server + adapter (config TOML, sim backend with `latency`).
    pub async fn with_sim(config: &str, latency: Duration) -> Self {
        let sim = SimBackend::fixed(latency);
        let handle = sim.handle();
        let mut rig = Self::with_backend(config, Arc::new(sim)).await;
        rig.sim = Some(handle);
        rig
    }

    /// Starts server + adapter (config TOML) with the sim backend in streaming mode:
    /// `first_token_ms`, then `tokens_per_second` (a body's `max_tokens` tokens).
    pub async fn with_sim_stream(
        config: &str,
        first_token_ms: u64,
        tokens_per_second: u64,
    ) -> Self {
        let toml = format!(
            "{config}\n[backend.sim]\nfirst_token_ms = {first_token_ms}\ntokens_per_second = {tokens_per_second}\n"
        );
        let cfg = Config::from_toml_str(&toml).expect("config");
        let weir_llm_adapter::config::BackendKind::Sim(sim) = cfg.backend.kind else {
            panic!("sim backend expected")
        };
        let sim = SimBackend::new(sim);
        let handle = sim.handle();
        let mut rig = Self::with_backend(&toml, Arc::new(sim)).await;
        rig.sim = Some(handle);
        rig
    }

    /// Starts server + adapter with any backend.
    pub async fn with_backend(config: &str, backend: Arc<dyn Backend>) -> Self {
        let server = NatsServer::start().expect("nats-server (run scripts/ensure-nats-server)");
        let adapter_client = connect(server.url()).await;
        let config = Config::from_toml_str(config).expect("valid config");
        let adapter = tokio::time::timeout(
            STEP,
            weir_llm_adapter::start(adapter_client, config, backend),
        )
        .await
        .expect("start in time")
        .expect("start");
        let caller = connect(server.url()).await;
        // Make sure the service subscriptions reached the server before callers send.
        tokio::time::timeout(STEP, caller.flush())
            .await
            .expect("flush")
            .expect("flush");
        Self {
            server,
            adapter: Some(adapter),
            caller,
            sim: None,
        }
    }

    pub fn adapter(&self) -> &AdapterHandle {
        self.adapter.as_ref().expect("running")
    }

    pub fn sim(&self) -> &SimHandle {
        self.sim.as_ref().expect("sim backend")
    }

    pub async fn shutdown(&mut self) {
        if let Some(a) = self.adapter.take() {
            tokio::time::timeout(STEP, a.shutdown())
                .await
                .expect("shutdown in time");
        }
    }
}

/// A body asking for a streamed reply of `tokens` tokens (OpenAI style; the sim
/// backend reads `max_tokens`).
pub fn stream_body(tokens: u64) -> String {
    format!(r#"{{"model":"m","stream":true,"max_tokens":{tokens}}}"#)
}

/// Polls `f` every 10 ms until it is true, at most `within`.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < within,
            "condition not reached within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The adapter started the way the binary starts it (its client counts its own events,
/// `AdapterEvents`), on `server` with `config` (the URL and short timeouts are set here),
/// the sim backend at a fixed `latency`.
pub async fn adapter_like_the_binary(
    server: &NatsServer,
    mut config: Config,
    latency: Duration,
) -> AdapterHandle {
    config.nats.client.urls = vec![server.url().to_owned()];
    config.nats.client.connection_timeout = Duration::from_millis(500);
    config.nats.client.ping_interval = Duration::from_secs(1);
    let events = weir_llm_adapter::AdapterEvents::new();
    let client = tokio::time::timeout(
        STEP,
        weir_llm_adapter::connect_with_events(&config.nats, &events),
    )
    .await
    .expect("connect in time")
    .expect("connect");
    let sim = SimBackend::fixed(latency);
    tokio::time::timeout(
        STEP,
        weir_llm_adapter::start_pool(client, events, config, vec![Arc::new(sim)]),
    )
    .await
    .expect("start in time")
    .expect("start")
}
