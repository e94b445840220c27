//! OpenAI-compatible HTTP backend (vLLM, llama.cpp server, Ollama's `/v1` API).
//!
//! The request body is POSTed unchanged to `base_url + path` with
//! `Content-Type: application/json` (plus `Authorization: Bearer …` when an API key
//! variable is configured, and `X-Request-Id` when the caller sent a request id). A 2xx
//! answer's body is the reply, unchanged. Anything else is a backend error whose message
//! carries the HTTP status and at most 512 bytes of the backend's error text (never the
//! request body).
//!
//! Connections are pooled (HTTP/1.1 keep-alive, `pool_max_idle_per_host`); a call that
//! the worker aborts (deadline, cancel) drops its connection, which is how vLLM and
//! llama.cpp learn to stop generating. Streaming responses (`"stream": true`) are not
//! interpreted: the whole response body is returned once the server ends it.

use std::time::Duration;

use futures::future::BoxFuture;

use super::{Backend, BackendError, BackendErrorKind, BackendReply, BackendRequest};
use crate::config::OpenAiConfig;

/// Longest piece of a backend error body quoted in the error message.
const MAX_ERROR_TEXT: usize = 512;

/// The HTTP backend.
#[derive(Debug, Clone)]
pub struct OpenAiBackend {
    client: reqwest::Client,
    url: String,
    api_key: Option<String>,
}

impl OpenAiBackend {
    /// Builds the pooled client. Fails when the configured API key variable is unset.
    pub fn new(cfg: &OpenAiConfig, timeout: Duration) -> Result<Self, BackendError> {
        let api_key = match &cfg.api_key_env {
            None => None,
            Some(var) => Some(std::env::var(var).map_err(|_| {
                BackendError::new(
                    BackendErrorKind::Unavailable,
                    format!("backend.openai.api_key_env names {var}, which is not set"),
                )
            })?),
        };
        let client = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .timeout(timeout)
            .pool_max_idle_per_host(cfg.pool_max_idle_per_host)
            .pool_idle_timeout(cfg.pool_idle_timeout)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| {
                BackendError::new(BackendErrorKind::Unavailable, format!("HTTP client: {e}"))
            })?;
        Ok(Self {
            client,
            url: format!("{}{}", cfg.base_url, cfg.path),
            api_key,
        })
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

impl Backend for OpenAiBackend {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn call(
        &self,
        request: BackendRequest,
    ) -> BoxFuture<'static, Result<BackendReply, BackendError>> {
        let mut rb = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(request.body);
        if let Some(key) = &self.api_key {
            rb = rb.bearer_auth(key);
        }
        if let Some(rid) = &request.request_id {
            rb = rb.header("X-Request-Id", rid.as_str());
        }
        Box::pin(async move {
            let resp = rb.send().await.map_err(|e| {
                BackendError::new(classify(&e), format!("HTTP request failed: {e}"))
            })?;
            let status = resp.status();
            let body = resp
                .bytes()
                .await
                .map_err(|e| BackendError::new(classify(&e), format!("HTTP body failed: {e}")))?;
            if status.is_success() {
                Ok(BackendReply::body(body))
            } else {
                let text =
                    String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_TEXT)]).into_owned();
                Err(BackendError::new(
                    BackendErrorKind::Failed,
                    format!("backend answered HTTP {status}: {text}"),
                ))
            }
        })
    }
}
