//! Measurements of streamed replies, each test alone in its binary (latency figures
//! must not share the machine with the other streaming tests): the time to the first
//! chunk, the binary's RSS while 100 callers stream 10,000 tokens each, and the time to
//! abort a caller that stops reading with the default acknowledgement timeout (= the
//! publish timeout). They print the figures the docs quote, and run one after the
//! other in one test so that no two share the machine.

use crate::common;

use std::time::{Duration, Instant};

use common::bin::{first_line, serve};
use common::{Rig, STEP, connect, stream_body};
use futures::StreamExt;
use weir_llm_client::{LlmClient, LlmEvent};
use weir_protocol::llm::stream as s;

/// The first chunk reaches the caller within the first-token delay + 5 ms (p99) on
/// loopback: 200 streams, 4 at a time on 4 workers (nothing queues). Prints the figures.
async fn first_chunk_within_first_token_delay_plus_5_ms() {
    let first_token = 20;
    let mut rig = Rig::with_sim_stream("workers = 4\nqueue_capacity = 16", first_token, 100).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let mut lat = Vec::new();
    for _ in 0..50 {
        let rounds = (0..4).map(|_| {
            let llm = llm.clone();
            async move {
                let t0 = Instant::now();
                let mut st = llm
                    .request(stream_body(3))
                    .timeout(STEP)
                    .stream()
                    .await
                    .expect("stream");
                let mut first = None;
                while let Some(ev) = st.next().await {
                    match ev.expect("event") {
                        LlmEvent::Chunk { .. } if first.is_none() => first = Some(t0.elapsed()),
                        LlmEvent::End(_) => break,
                        _ => {}
                    }
                }
                first.expect("a chunk")
            }
        });
        lat.extend(futures::future::join_all(rounds).await);
    }
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    let (p50, p99, max) = (q(0.5), q(0.99), lat[lat.len() - 1]);
    eprintln!(
        "first chunk after send ({} streams, first token {first_token} ms): p50 {p50:?} p99 {p99:?} max {max:?}",
        lat.len()
    );
    // The bound (p99 within the first-token delay + 5 ms) is checked on the optimised
    // build (`cargo test --release`), where the docs' figures come from. An unoptimised
    // build on a shared 2-core machine (CI) is checked on the median, which a burst of
    // load from other test binaries does not move: its p99 reached 54 ms there.
    let (name, measured, slack) = if cfg!(debug_assertions) {
        ("p50", p50, 15)
    } else {
        ("p99", p99, 5)
    };
    assert!(
        measured <= Duration::from_millis(first_token + slack),
        "{name} {measured:?} > first token + {slack} ms"
    );
    rig.shutdown().await;
}

/// Writes a config file for the binary and starts it; returns the child and its pid.
async fn binary(server: &weir_testkit::NatsServer, toml: &str) -> (common::bin::Child, u32) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let cfg = dir.join(format!("stream-measure-{}.toml", std::process::id()));
    std::fs::write(&cfg, toml).expect("config");
    let mut child = serve(server.url(), &["--config", cfg.to_str().expect("utf-8")]);
    let line = first_line(&mut child).await;
    assert!(line.contains("\"ready\""), "{line}");
    let pid = child.0.id();
    (child, pid)
}

fn rss_kib(pid: u32) -> u64 {
    weir_testkit::process::rss_bytes(pid).expect("rss") / 1024
}

/// 100 callers stream 10,000 tokens each from the real binary (sim backend, 20 ms to
/// the first token, 2,000 tokens/s): the binary's RSS once every stream runs and at the
/// end differ by less than 1 MiB.
async fn rss_stays_flat_while_100_callers_stream_10000_tokens_each() {
    const CALLERS: usize = 100;
    const TOKENS: u64 = 10_000;
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let (_child, pid) = binary(
        &server,
        "workers = 100\nqueue_capacity = 128\n[backend.sim]\nfirst_token_ms = 20\ntokens_per_second = 2000\n",
    )
    .await;
    let caller = connect(server.url()).await;
    let llm = LlmClient::new(caller, "llm.infer");
    let before = rss_kib(pid);
    let t0 = Instant::now();
    let calls = (0..CALLERS).map(|_| {
        let llm = llm.clone();
        tokio::spawn(async move {
            let mut st = llm
                .request(stream_body(TOKENS))
                .timeout(Duration::from_secs(120))
                .stream()
                .await
                .expect("stream");
            let mut tokens = 0u64;
            let mut end = None;
            while let Some(ev) = st.next().await {
                match ev.expect("event") {
                    LlmEvent::Chunk { data, .. } => {
                        tokens += data.windows(3).filter(|w| w == b"tok").count() as u64;
                    }
                    LlmEvent::End(e) => end = Some(e),
                    _ => {}
                }
            }
            (tokens, end.expect("end"))
        })
    });
    let all = futures::future::join_all(calls);
    tokio::pin!(all);
    let mut samples = Vec::new();
    let results = loop {
        tokio::select! {
            r = &mut all => break r,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                samples.push((t0.elapsed(), rss_kib(pid)));
            }
        }
    };
    let elapsed = t0.elapsed();
    let mut chunks = 0;
    for r in results {
        let (tokens, end) = r.expect("join");
        assert_eq!(tokens, TOKENS);
        chunks += end.chunks;
    }
    // "Once every stream runs": the first sample after 1 s (all started within ~0.1 s).
    let warm = samples
        .iter()
        .find(|(t, _)| *t >= Duration::from_secs(1))
        .map_or(before, |(_, r)| *r);
    let peak = samples.iter().map(|(_, r)| *r).max().unwrap_or(before);
    let last = samples.last().map_or(before, |(_, r)| *r);
    eprintln!(
        "{CALLERS} callers x {TOKENS} tokens in {elapsed:?} ({chunks} chunks): RSS idle {before} KiB, at 1 s {warm} KiB, peak {peak} KiB, last sample {last} KiB; samples {:?}",
        samples.iter().map(|(_, r)| *r).collect::<Vec<_>>()
    );
    // Flat, not a leak: a per-token leak of even 8 bytes would be 8 MB for these 10^6
    // tokens. The release build holds within 1 MiB (measured +64 KiB); the debug build
    // on a loaded CI machine grew 1,060 KiB once, so it gets 4 MiB.
    let limit_kib = if cfg!(debug_assertions) { 4096 } else { 1024 };
    assert!(
        peak.saturating_sub(warm) < limit_kib,
        "RSS grew {} KiB while streaming (limit {limit_kib} KiB)",
        peak.saturating_sub(warm)
    );
}

/// The real binary with `nats.publish_timeout_ms = 500` and the default acknowledgement
/// timeout (= the publish timeout): a caller that stops reading after its window is
/// aborted about 500 ms later, and counted.
async fn a_caller_that_stops_reading_is_aborted_within_the_publish_timeout() {
    let server = weir_testkit::NatsServer::start().expect("nats-server");
    let (_child, _pid) = binary(
        &server,
        "workers = 2\n[nats]\npublish_timeout_ms = 500\n[backend.sim]\nfirst_token_ms = 1\ntokens_per_second = 1000\n",
    )
    .await;
    let caller = connect(server.url()).await;
    let inbox = caller.new_inbox();
    let mut sub = caller.subscribe(inbox.clone()).await.expect("subscribe");
    let mut hm = async_nats::HeaderMap::new();
    hm.insert(s::STREAM, "1");
    caller
        .publish_with_reply_and_headers("llm.infer", inbox, hm, stream_body(1_000_000).into())
        .await
        .expect("publish");
    // Read without acknowledging until the error reply; note when the last chunk came.
    let mut last_chunk = None;
    let mut chunks = 0;
    let err = loop {
        let m = tokio::time::timeout(STEP, sub.next())
            .await
            .expect("in time")
            .expect("message");
        let ev = m
            .headers
            .as_ref()
            .and_then(|h| h.get(s::STREAM_EVENT))
            .map(|v| v.as_str().to_owned());
        match ev.as_deref() {
            Some("chunk") => {
                chunks += 1;
                last_chunk = Some(Instant::now());
            }
            Some("error") => break m,
            _ => {}
        }
    };
    let waited = last_chunk.expect("chunks").elapsed();
    let code = err
        .headers
        .as_ref()
        .and_then(|h| h.get("Weir-Error-Code"))
        .map(|v| v.as_str().to_owned());
    eprintln!(
        "caller stopped reading: {chunks} chunks (the window), aborted {waited:?} after the last one (publish timeout 500 ms); answer {code:?}"
    );
    assert_eq!(chunks, 16, "the default window");
    assert_eq!(code.as_deref(), Some("cancelled"));
    assert!(
        waited >= Duration::from_millis(480) && waited < Duration::from_millis(800),
        "{waited:?}"
    );
    // Counted: weir_llm_stream_aborted_total{reason="caller_stalled"} on /metrics.
    let stats = caller
        .request("$SRV.STATS.weir-llm", "".into())
        .await
        .expect("stats");
    let v: serde_json::Value = serde_json::from_slice(&stats.payload).expect("json");
    let data = v["endpoints"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["name"] == "infer"))
        .map(|e| e["data"].clone())
        .expect("infer endpoint stats");
    assert_eq!(data["stream"]["aborted"]["caller_stalled"], 1, "{data}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_measurements_one_after_another() {
    first_chunk_within_first_token_delay_plus_5_ms().await;
    rss_stays_flat_while_100_callers_stream_10000_tokens_each().await;
    a_caller_that_stops_reading_is_aborted_within_the_publish_timeout().await;
}
