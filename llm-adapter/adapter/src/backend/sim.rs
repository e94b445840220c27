//! Simulated backend: configurable latency distribution, error rate and pause/resume.
//!
//! The reply body echoes the request body; a JSON body with `max_tokens` and without
//! `"stream": true` gets a `usage` member appended to its echo (`prompt_tokens` = body
//! bytes / 4, `completion_tokens` = `max_tokens`), and a streamed reply ends with a `usage` event
//! when the body asks for one (`"include_usage"`, as OpenAI's `stream_options`). A call first waits while the backend is
//! paused, then sleeps its latency, then waits again while paused (a stalled GPU stalls
//! calls already in progress too). Zero latency completes without sleeping.
//!
//! The [`SimHandle`] counts calls independently of the adapter: started, completed,
//! failed, aborted (future dropped before completion), the highest concurrency seen, and
//! calls that *started after their deadline* — the number the load test requires to be
//! zero, measured at the backend rather than trusted from the adapter.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use bytes::Bytes;
use weir_service::sync::locked;

use super::{
    Backend, BackendError, BackendErrorKind, BackendReply, BackendRequest, Call, ChunkTx,
    send_piece,
};
use crate::config::{Latency, SimConfig};

/// The simulated backend.
#[derive(Debug, Clone)]
pub struct SimBackend {
    inner: Arc<SimInner>,
}

#[derive(Debug)]
struct SimInner {
    cfg: SimConfig,
    rng: Mutex<SmallRng>,
    paused: watch::Sender<bool>,
    n: Mutex<SimStats>,
}

/// Controls and counters of a [`SimBackend`]: a clone of it. Cheap to clone.
pub type SimHandle = SimBackend;

/// Counters of a [`SimBackend`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// Calls started.
    pub started: u64,
    /// Calls that returned a reply.
    pub completed: u64,
    /// Calls that returned a simulated error.
    pub failed: u64,
    /// Calls dropped before they returned (deadline, cancel, shutdown).
    pub aborted: u64,
    /// Calls that started when their deadline had already passed.
    pub started_after_deadline: u64,
    /// Calls in progress now.
    pub in_progress: usize,
    /// Most calls in progress at once.
    pub max_concurrent: usize,
    /// Total time calls spent inside the backend, microseconds.
    pub busy_us: u64,
}

impl SimBackend {
    /// A new simulated backend.
    pub fn new(cfg: SimConfig) -> Self {
        let (paused, _) = watch::channel(false);
        Self {
            inner: Arc::new(SimInner {
                cfg,
                rng: Mutex::new(SmallRng::seed_from_u64(cfg.seed)),
                paused,
                n: Mutex::default(),
            }),
        }
    }

    /// A fixed-latency backend without errors.
    pub fn fixed(latency: Duration) -> Self {
        Self::new(SimConfig {
            latency: Latency::Fixed(latency),
            ..SimConfig::default()
        })
    }

    /// The control handle.
    pub fn handle(&self) -> SimHandle {
        self.clone()
    }

    /// Stalls every call (new and in progress) until [`SimHandle::resume`].
    pub fn pause(&self) {
        self.inner.paused.send_replace(true);
    }

    /// Lets stalled calls continue.
    pub fn resume(&self) {
        self.inner.paused.send_replace(false);
    }

    /// Whether the backend is paused.
    pub fn is_paused(&self) -> bool {
        *self.inner.paused.borrow()
    }

    /// The counters.
    pub fn stats(&self) -> SimStats {
        *locked(&self.inner.n)
    }
}

impl SimInner {
    /// Draws the latency and whether the call fails.
    fn draw(&self) -> (Duration, bool) {
        if let (Latency::Fixed(d), 0.0) = (self.cfg.latency, self.cfg.error_rate) {
            return (d, false);
        }
        let mut rng = locked(&self.rng);
        let latency = match self.cfg.latency {
            Latency::Fixed(d) => d,
            Latency::Uniform { min, max } => {
                if max > min {
                    Duration::from_micros(
                        rng.random_range(min.as_micros() as u64..=max.as_micros() as u64),
                    )
                } else {
                    min
                }
            }
            Latency::LogNormal { median, p99 } => {
                // ln X ~ N(mu, sigma): median = e^mu, p99 = e^(mu + 2.326 sigma).
                let m = median.as_secs_f64().max(1e-6);
                let mu = m.ln();
                let sigma = ((p99.as_secs_f64().max(m)).ln() - mu) / 2.326;
                // Box–Muller from two uniforms in (0, 1].
                let u1: f64 = 1.0 - rng.random::<f64>();
                let u2: f64 = rng.random::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                Duration::from_secs_f64((mu + sigma * z).exp().min(3600.0))
            }
        };
        let fail = self.cfg.error_rate > 0.0 && rng.random::<f64>() < self.cfg.error_rate;
        (latency, fail)
    }
}

/// Counts a call as aborted unless it was marked finished.
struct CallGuard {
    inner: Arc<SimInner>,
    started: Instant,
    finished: bool,
}

impl CallGuard {
    /// Counts a call starting now (and whether it started after its deadline).
    fn begin(inner: &Arc<SimInner>, request: &BackendRequest) -> Self {
        let (now, mut n) = (Instant::now(), locked(&inner.n));
        n.started += 1;
        n.started_after_deadline += u64::from(request.deadline.is_some_and(|d| now >= d));
        n.in_progress += 1;
        n.max_concurrent = n.max_concurrent.max(n.in_progress);
        Self {
            inner: inner.clone(),
            started: now,
            finished: false,
        }
    }

    /// Marks the call finished: failed (the simulated error) or completed.
    fn finish(&mut self, fail: bool) -> Result<(), BackendError> {
        self.finished = true;
        if fail {
            locked(&self.inner.n).failed += 1;
            Err(BackendError::new(
                BackendErrorKind::Failed,
                "simulated backend error",
            ))
        } else {
            locked(&self.inner.n).completed += 1;
            Ok(())
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut n = locked(&self.inner.n);
        n.in_progress -= 1;
        n.busy_us += self.started.elapsed().as_micros() as u64;
        n.aborted += u64::from(!self.finished);
    }
}

async fn wait_unpaused(rx: &mut watch::Receiver<bool>) {
    // Err only if the sender is gone, which cannot happen while the backend lives.
    let _ = rx.wait_for(|paused| !*paused).await;
}

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn call(&self, request: BackendRequest) -> Call {
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut guard = CallGuard::begin(&inner, &request);
            let (latency, fail) = inner.draw();
            if *inner.paused.borrow() {
                wait_unpaused(&mut inner.paused.subscribe()).await;
            }
            if !latency.is_zero() {
                let mut paused = inner.paused.subscribe();
                tokio::time::sleep(latency).await;
                if *paused.borrow() {
                    wait_unpaused(&mut paused).await;
                }
            }
            guard.finish(fail)?;
            Ok(BackendReply::body(with_usage(request.body)))
        })
    }

    /// Streaming mode: `tokens` SSE deltas (the body's `max_tokens` if it has one),
    /// the first after `first_token_ms`, then at `tokens_per_second` on a fixed
    /// schedule (no drift), then `data: [DONE]`. A pause stalls the stream.
    fn call_stream(&self, request: BackendRequest, chunks: ChunkTx) -> Call {
        let inner = self.inner.clone();
        Box::pin(async move {
            let mut guard = CallGuard::begin(&inner, &request);
            let (_, fail) = inner.draw();
            let st = inner.cfg.stream;
            let tokens = max_tokens(&request.body).unwrap_or(u64::from(st.tokens));
            let gap = Duration::from_secs_f64(1.0 / st.tokens_per_second);
            let mut paused = inner.paused.subscribe();
            let mut at = Instant::now() + st.first_token;
            for i in 0..tokens {
                tokio::time::sleep_until(at).await;
                if *paused.borrow() {
                    wait_unpaused(&mut paused).await;
                    at = Instant::now();
                }
                if fail {
                    break;
                }
                let piece = format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}]}}\n\n"
                );
                send_piece(&chunks, piece.into()).await?;
                at += gap;
            }
            guard.finish(fail)?;
            if request.body.windows(13).any(|w| w == b"include_usage") {
                let usage = usage_json(request.body.len(), tokens);
                let event = format!("data: {{\"choices\":[],\"usage\":{usage}}}\n\n");
                send_piece(&chunks, event.into()).await?;
            }
            send_piece(&chunks, Bytes::from_static(b"data: [DONE]\n\n")).await?;
            Ok(BackendReply::default())
        })
    }
}

/// The `usage` object of a reply to a body of `body_len` bytes with `completion` tokens.
fn usage_json(body_len: usize, completion: u64) -> String {
    let prompt = (body_len as u64).div_ceil(4);
    format!(
        r#"{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{}}}"#,
        prompt + completion
    )
}

/// The echo of `body` with a `usage` member, when it is a JSON object with
/// `max_tokens` that does not ask for a stream; `body` unchanged otherwise (a
/// streaming body sent to a unary caller is echoed as it is).
fn with_usage(body: Bytes) -> Bytes {
    let Some(n) = max_tokens(&body) else {
        return body;
    };
    if body.windows(8).any(|w| w == b"\"stream\"")
        && serde_json::from_slice::<serde_json::Value>(&body)
            .is_ok_and(|v| v.get("stream") == Some(&serde_json::Value::Bool(true)))
    {
        return body;
    }
    let end = body.trim_ascii_end();
    let Some(open) = end.strip_suffix(b"}") else {
        return body;
    };
    let mut out = Vec::with_capacity(body.len() + 96);
    out.extend_from_slice(open);
    out.extend_from_slice(format!(r#","usage":{}}}"#, usage_json(body.len(), n)).as_bytes());
    out.into()
}

/// `max_tokens` of a JSON body, if it has one (at most 1,000,000).
fn max_tokens(body: &[u8]) -> Option<u64> {
    if !body.windows(10).any(|w| w == b"max_tokens") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("max_tokens")?.as_u64().map(|n| n.min(1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn req(body: &'static str) -> BackendRequest {
        BackendRequest {
            body: Bytes::from_static(body.as_bytes()),
            request_id: None,
            session: None,
            deadline: None,
            max_reply_bytes: usize::MAX,
            trace: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn echoes_after_the_fixed_latency() {
        let b = SimBackend::fixed(Duration::from_millis(50));
        let t0 = Instant::now();
        let reply = b.call(req("hello")).await.expect("reply");
        assert_eq!(reply.body, Bytes::from_static(b"hello"));
        assert_eq!(t0.elapsed(), Duration::from_millis(50));
        let s = b.handle().stats();
        assert_eq!(
            (s.started, s.completed, s.aborted, s.in_progress),
            (1, 1, 0, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_with_max_tokens_is_echoed_with_a_usage() {
        let b = SimBackend::fixed(Duration::ZERO);
        let body = r#"{"max_tokens":7,"prompt":"abc"} "#;
        let reply = b.call(req(body)).await.expect("reply");
        let v: serde_json::Value = serde_json::from_slice(&reply.body).expect("JSON");
        assert_eq!(v["prompt"], "abc");
        // 32 bytes → 8 prompt tokens.
        let usage =
            serde_json::json!({"prompt_tokens": 8, "completion_tokens": 7, "total_tokens": 15});
        assert_eq!(v["usage"], usage);
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let streamed = r#"{"max_tokens":2,"stream_options":{"include_usage":true}}"#;
        b.call_stream(req(streamed), tx).await.expect("stream");
        let mut text = String::new();
        while let Ok(p) = rx.try_recv() {
            text.push_str(&String::from_utf8_lossy(&p));
        }
        assert!(text.ends_with("\"usage\":{\"prompt_tokens\":14,\"completion_tokens\":2,\"total_tokens\":16}}\n\ndata: [DONE]\n\n"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn pause_stalls_calls_until_resume() {
        let b = SimBackend::fixed(Duration::from_millis(10));
        let h = b.handle();
        h.pause();
        let call = tokio::spawn(b.call(req("x")));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!call.is_finished());
        assert_eq!(h.stats().in_progress, 1);
        h.resume();
        let r = tokio::time::timeout(Duration::from_secs(1), call).await;
        assert!(matches!(r, Ok(Ok(Ok(_)))));
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_calls_count_as_aborted_and_late_starts_are_counted() {
        let b = SimBackend::fixed(Duration::from_secs(10));
        let mut r = req("x");
        r.deadline = Some(Instant::now());
        let res = tokio::time::timeout(Duration::from_millis(5), b.call(r)).await;
        assert!(res.is_err());
        let s = b.handle().stats();
        assert_eq!((s.started, s.aborted, s.started_after_deadline), (1, 1, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn error_rate_and_distributions_are_honoured() {
        let b = SimBackend::new(SimConfig {
            latency: Latency::Fixed(Duration::ZERO),
            error_rate: 1.0,
            seed: 3,
            ..SimConfig::default()
        });
        let e = b.call(req("x")).await.expect_err("fails");
        assert_eq!(e.kind(), BackendErrorKind::Failed);

        let b = SimBackend::new(SimConfig {
            latency: Latency::LogNormal {
                median: Duration::from_millis(20),
                p99: Duration::from_millis(100),
            },
            error_rate: 0.0,
            seed: 7,
            ..SimConfig::default()
        });
        let mut v: Vec<Duration> = (0..2000).map(|_| b.inner.draw().0).collect();
        v.sort();
        let median = v[1000].as_secs_f64() * 1000.0;
        let p99 = v[1980].as_secs_f64() * 1000.0;
        assert!((15.0..25.0).contains(&median), "median {median}");
        assert!((70.0..140.0).contains(&p99), "p99 {p99}");

        let b = SimBackend::new(SimConfig {
            latency: Latency::Uniform {
                min: Duration::from_millis(5),
                max: Duration::from_millis(10),
            },
            error_rate: 0.0,
            seed: 7,
            ..SimConfig::default()
        });
        for _ in 0..100 {
            let d = b.inner.draw().0;
            assert!(d >= Duration::from_millis(5) && d <= Duration::from_millis(10));
        }
    }
}
