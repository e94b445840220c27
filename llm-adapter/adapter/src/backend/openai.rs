//! OpenAI-compatible HTTP(S) backend (vLLM, llama.cpp server, Ollama's `/v1` API, hosted
//! endpoints).
//!
//! The request body is POSTed unchanged to `base_url + path` with
//! `Content-Type: application/json` (plus `Authorization: Bearer …` when an API key
//! variable is configured, `X-Request-Id` when the caller sent a request id, and the W3C
//! `traceparent` / `tracestate` of [`BackendRequest::trace`]). A 2xx
//! answer's body is the reply, unchanged. HTTPS uses rustls with the ring provider (the
//! one async-nats already brings in), the system's roots plus `tls_ca_file`, and a client
//! certificate when `tls_cert_file` + `tls_key_file` are set.
//!
//! Invariants a reader must not break:
//! - a body is never read whole before it is checked: it is read chunk by chunk, a
//!   unary reply stops at [`BackendRequest::max_reply_bytes`] (the NATS `max_payload`
//!   less header room) and fails [`BackendErrorKind::TooLarge`], a `Content-Length`
//!   over it fails before any body byte is read, and an error body is read up to
//!   [`MAX_ERROR_TEXT`] bytes only; so the memory of one call is bounded by the cap
//!   whatever the backend sends;
//! - the request's deadline is checked between chunks (the worker also drops the call at
//!   the deadline; the check ends a call that keeps delivering bytes in time);
//! - a streamed reply ([`Backend::call_stream`]) is handed on piece by piece through a
//!   bounded channel: a slow reader stops the HTTP read (TCP backpressure to the
//!   backend), nothing accumulates here;
//! - 429 and 503 are the backend's own overload: [`BackendErrorKind::Overloaded`] with
//!   its `Retry-After` (seconds or an HTTP date), which the caller gets as
//!   `retry_after_ms`; other non-2xx answers are [`BackendErrorKind::Failed`]. Messages
//!   carry the status and at most [`MAX_ERROR_TEXT`] bytes of the backend's text, never
//!   the request body.
//!
//! Connections are pooled (HTTP/1.1 keep-alive, `pool_max_idle_per_host`); a call that
//! the worker aborts (deadline, cancel, a streaming caller gone) drops its connection,
//! which is how vLLM and llama.cpp learn to stop generating.

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;
use weir_protocol::llm::headers as h;

use super::{
    Backend, BackendError, BackendErrorKind, BackendReply, BackendRequest, Call, ChunkTx,
    send_piece,
};
use crate::config::OpenAiConfig;

/// Longest piece of a backend error body read and quoted in the error message.
pub const MAX_ERROR_TEXT: usize = 512;

/// Longest `Retry-After` honoured (a larger hint is clamped to it).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The HTTP backend.
#[derive(Debug, Clone)]
pub struct OpenAiBackend {
    client: reqwest::Client,
    url: String,
    api_key: Option<String>,
}

fn unavailable(message: String) -> BackendError {
    BackendError::new(BackendErrorKind::Unavailable, message)
}

/// A setup failure caused by `source` (an I/O or TLS error).
fn unavailable_because(
    message: String,
    source: impl Into<weir_service::error::Source>,
) -> BackendError {
    BackendError::with_source(BackendErrorKind::Unavailable, message, source)
}

fn read_file(key: &str, path: &std::path::Path) -> Result<Vec<u8>, BackendError> {
    std::fs::read(path).map_err(|e| unavailable_because(format!("{key} {}", path.display()), e))
}

impl OpenAiBackend {
    /// Builds the pooled client. Fails when the configured API key variable is unset, or
    /// a CA / client certificate file cannot be read or parsed (the message names the
    /// key).
    pub fn new(cfg: &OpenAiConfig, timeout: Duration) -> Result<Self, BackendError> {
        let api_key = (cfg.api_key_env.as_ref())
            .map(|var| {
                std::env::var(var).map_err(|_| {
                    unavailable(format!(
                        "backend.openai.api_key_env names {var}, which is not set"
                    ))
                })
            })
            .transpose()?;
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(cfg.connect_timeout)
            .timeout(timeout)
            .pool_max_idle_per_host(cfg.pool_max_idle_per_host)
            .pool_idle_timeout(cfg.pool_idle_timeout)
            .tcp_nodelay(true);
        if let Some(path) = &cfg.tls_ca_file {
            let pem = read_file("backend.openai.tls_ca_file", path)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                unavailable_because(format!("backend.openai.tls_ca_file {}", path.display()), e)
            })?;
            if certs.is_empty() {
                return Err(unavailable(format!(
                    "backend.openai.tls_ca_file {}: no PEM certificate in it",
                    path.display()
                )));
            }
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        if let (Some(cert), Some(key)) = (&cfg.tls_cert_file, &cfg.tls_key_file) {
            let mut pem = read_file("backend.openai.tls_cert_file", cert)?;
            pem.push(b'\n');
            pem.extend(read_file("backend.openai.tls_key_file", key)?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                unavailable_because(
                    format!(
                        "backend.openai.tls_cert_file / tls_key_file ({}, {})",
                        cert.display(),
                        key.display()
                    ),
                    e,
                )
            })?;
            builder = builder.identity(id);
        }
        let client = builder
            .build()
            .map_err(|e| unavailable_because("HTTP client".into(), e))?;
        Ok(Self {
            client,
            url: format!("{}{}", cfg.base_url, cfg.path),
            api_key,
        })
    }

    fn post(&self, request: &BackendRequest) -> reqwest::RequestBuilder {
        let mut rb = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(request.body.clone());
        if let Some(key) = &self.api_key {
            rb = rb.bearer_auth(key);
        }
        if let Some(rid) = &request.request_id {
            rb = rb.header("X-Request-Id", rid.as_str());
        }
        if let Some(t) = &request.trace {
            rb = rb.header(h::TRACEPARENT, t.parent.to_string());
            if let Some(state) = &t.state {
                rb = rb.header(h::TRACESTATE, state.as_str());
            }
        }
        rb
    }
}

fn classify(e: &reqwest::Error) -> BackendErrorKind {
    if e.is_timeout() {
        BackendErrorKind::Timeout
    } else if e.is_connect() {
        BackendErrorKind::Unavailable
    } else {
        BackendErrorKind::Failed
    }
}

/// `Retry-After` as a duration from now: delta-seconds or an HTTP date; `None` when
/// absent or unreadable. Clamped to [`MAX_RETRY_AFTER`].
pub fn retry_after(value: Option<&str>, now: SystemTime) -> Option<Duration> {
    let v = value?.trim();
    let d = match v.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(v)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(d.min(MAX_RETRY_AFTER))
}

/// The next body chunk, or `None` at the end; a deadline that passed between chunks is
/// a [`BackendErrorKind::Timeout`].
async fn next_chunk(
    resp: &mut reqwest::Response,
    deadline: Option<Instant>,
) -> Result<Option<Bytes>, BackendError> {
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Err(BackendError::new(
            BackendErrorKind::Timeout,
            "deadline passed while reading the reply body",
        ));
    }
    resp.chunk()
        .await
        .map_err(|e| BackendError::with_source(classify(&e), "HTTP body failed", e))
}

fn too_large(limit: usize) -> BackendError {
    BackendError::new(
        BackendErrorKind::TooLarge,
        format!(
            "backend reply exceeds {limit} bytes (the NATS max_payload less header room); reading stopped"
        ),
    )
    .with_limit(u64::try_from(limit).unwrap_or(u64::MAX))
}

/// Reads a unary body up to `limit` bytes.
async fn read_capped(
    resp: &mut reqwest::Response,
    limit: usize,
    deadline: Option<Instant>,
) -> Result<Bytes, BackendError> {
    if resp
        .content_length()
        .is_some_and(|n| usize::try_from(n).map_or(true, |n| n > limit))
    {
        return Err(too_large(limit));
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = next_chunk(resp, deadline).await? {
        if body.len() + chunk.len() > limit {
            return Err(too_large(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The error for a non-2xx answer; reads at most [`MAX_ERROR_TEXT`] bytes of its body.
async fn failure(mut resp: reqwest::Response, deadline: Option<Instant>) -> BackendError {
    let status = resp.status();
    let retry = retry_after(
        resp.headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
        SystemTime::now(),
    );
    let mut text = Vec::new();
    while text.len() < MAX_ERROR_TEXT {
        match next_chunk(&mut resp, deadline).await {
            Ok(Some(c)) => text.extend_from_slice(&c[..c.len().min(MAX_ERROR_TEXT - text.len())]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&text).into_owned();
    // Only an overloaded backend's retry hint is passed on.
    let (kind, retry) = match status.as_u16() {
        429 | 503 => (BackendErrorKind::Overloaded, retry),
        _ => (BackendErrorKind::Failed, None),
    };
    BackendError::new(kind, format!("backend answered HTTP {status}: {text}"))
        .with_status(status.as_u16())
        .with_retry_after(retry)
}

/// Sends the request; a non-2xx answer is the error ([`failure`]).
async fn send(
    rb: reqwest::RequestBuilder,
    deadline: Option<Instant>,
) -> Result<reqwest::Response, BackendError> {
    let resp = rb
        .send()
        .await
        .map_err(|e| BackendError::with_source(classify(&e), "HTTP request failed", e))?;
    if resp.status().is_success() {
        Ok(resp)
    } else {
        Err(failure(resp, deadline).await)
    }
}

impl Backend for OpenAiBackend {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn call(&self, request: BackendRequest) -> Call {
        let rb = self.post(&request);
        Box::pin(async move {
            let mut resp = send(rb, request.deadline).await?;
            let body = read_capped(&mut resp, request.max_reply_bytes, request.deadline).await?;
            Ok(BackendReply::body(body))
        })
    }

    fn call_stream(&self, request: BackendRequest, chunks: ChunkTx) -> Call {
        let rb = self.post(&request);
        Box::pin(async move {
            let mut resp = send(rb, request.deadline).await?;
            while let Some(chunk) = next_chunk(&mut resp, request.deadline).await? {
                if !chunk.is_empty() {
                    send_piece(&chunks, chunk).await?;
                }
            }
            Ok(BackendReply::default())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates_and_clamps() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after(Some(" 7 "), now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(None, now), None);
        assert_eq!(retry_after(Some("soon"), now), None);
        assert_eq!(retry_after(Some("99999999"), now), Some(MAX_RETRY_AFTER));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(Some(&later), now),
            Some(Duration::from_secs(30))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after(Some(&past), now), Some(Duration::ZERO));
    }

    #[tokio::test]
    async fn a_refused_connection_keeps_the_http_error_as_source() {
        // A port held bound but not listening for the whole test: a connection there is
        // refused, and no test running beside this one can take the port meanwhile
        // (a port that was merely free a moment ago could be).
        let held = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("a socket");
        let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("an address");
        held.bind(&any.into()).expect("bound");
        let port = held
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .expect("its address")
            .port();
        let rb = reqwest::Client::new().post(format!("http://127.0.0.1:{port}/v1/chat"));
        let e = send(rb, None).await.expect_err("nothing listens");
        assert_eq!(e.kind(), BackendErrorKind::Unavailable);
        assert_eq!(e.message(), "HTTP request failed");
        let cause = std::error::Error::source(&e)
            .and_then(|c| c.downcast_ref::<reqwest::Error>())
            .expect("reqwest::Error kept");
        assert!(cause.is_connect(), "{cause:?}");
        assert!(e.to_string().starts_with("HTTP request failed: "));
        assert!(!e.to_string().contains(['\r', '\n']));
    }

    #[test]
    fn an_unreadable_file_keeps_the_io_error() {
        let e = read_file(
            "backend.openai.tls_ca_file",
            std::path::Path::new("/nonexistent/ca.pem"),
        )
        .expect_err("no such file");
        assert_eq!(e.kind(), BackendErrorKind::Unavailable);
        let io = std::error::Error::source(&e)
            .and_then(|c| c.downcast_ref::<std::io::Error>())
            .expect("io::Error kept");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }
}
