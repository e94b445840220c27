//! A local OpenAI-compatible HTTPS server with a CA generated per test (rcgen), serving
//! the cases the backend tests need. Which case is chosen by a word in the body:
//! - `"stream":true` → an SSE stream of `tokens` deltas (default 20), `gap_ms` apart
//!   (default 2), then `data: [DONE]`;
//! - `huge` → a 10 MB body sent in 64 KiB pieces without a `Content-Length`;
//!   `huge_cl` → the same with a `Content-Length`;
//! - `busy` → 429 with `Retry-After: 2`; `down` → 503 with an HTTP-date `Retry-After`
//!   3 s ahead;
//! - anything else → a completion echoing the body.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio_rustls::rustls;

/// Size of the `huge` reply.
pub const HUGE_BYTES: usize = 10 * 1024 * 1024;

/// The running server and the PEM files a client needs.
pub struct TlsOpenAi {
    /// `https://localhost:<port>`.
    pub base_url: String,
    /// The generated CA (PEM file).
    pub ca_file: PathBuf,
    /// A client certificate signed by the CA, and its key (PEM files).
    pub client_cert_file: PathBuf,
    /// See `client_cert_file`.
    pub client_key_file: PathBuf,
    /// Bytes of `huge` replies the server managed to write (stops when the client
    /// stops reading).
    pub huge_written: Arc<AtomicU64>,
    /// TLS handshakes that failed (e.g. no client certificate when one is required).
    pub handshake_failures: Arc<AtomicU64>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsOpenAi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write pem");
    p
}

fn sse(tokens: u64, gap: Duration) -> Response {
    let stream = futures::stream::unfold(0u64, move |i| async move {
        if i > tokens {
            return None;
        }
        if i > 0 {
            tokio::time::sleep(gap).await;
        }
        let line = if i == tokens {
            "data: [DONE]\n\n".to_owned()
        } else {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n"
            )
        };
        Some((Ok::<_, std::io::Error>(Bytes::from(line)), i + 1))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from_stream(stream))
        .expect("response")
}

fn huge(with_length: bool, written: Arc<AtomicU64>) -> Response {
    const PIECE: usize = 64 * 1024;
    let piece = Bytes::from(vec![b'x'; PIECE]);
    let stream = futures::stream::unfold(0usize, move |sent| {
        let piece = piece.clone();
        let written = written.clone();
        async move {
            if sent >= HUGE_BYTES {
                return None;
            }
            written.fetch_add(PIECE as u64, Ordering::Relaxed);
            Some((Ok::<_, std::io::Error>(piece), sent + PIECE))
        }
    });
    let mut b = Response::builder().header("content-type", "application/json");
    if with_length {
        b = b.header("content-length", HUGE_BYTES.to_string());
    }
    b.body(axum::body::Body::from_stream(stream))
        .expect("response")
}

fn number(body: &serde_json::Value, key: &str, default: u64) -> u64 {
    body.get(key).and_then(|v| v.as_u64()).unwrap_or(default)
}

impl TlsOpenAi {
    /// Starts the server; with `require_client_cert` the handshake demands a client
    /// certificate signed by the CA.
    pub async fn start(require_client_cert: bool) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "weir test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().expect("key");
        let server_cert = CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .signed_by(&server_key, &issuer)
            .expect("server cert");
        let client_key = KeyPair::generate().expect("key");
        let mut cp = CertificateParams::new(vec!["weir-llm-adapter".to_owned()]).expect("params");
        cp.distinguished_name
            .push(DnType::CommonName, "weir-llm-adapter");
        let client_cert = cp.signed_by(&client_key, &issuer).expect("client cert");

        let ca_file = write(dir.path(), "ca.pem", &ca_cert.pem());
        let client_cert_file = write(dir.path(), "client.pem", &client_cert.pem());
        let client_key_file = write(dir.path(), "client.key", &client_key.serialize_pem());

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions");
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca_cert.der().clone()).expect("root");
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .expect("verifier");
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let tls = builder
            .with_single_cert(
                vec![server_cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
            )
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let huge_written = Arc::new(AtomicU64::new(0));
        let handshake_failures = Arc::new(AtomicU64::new(0));
        let written = huge_written.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            post(move |body: Bytes| {
                let written = written.clone();
                async move {
                    let text = String::from_utf8_lossy(&body).into_owned();
                    let json: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or_default();
                    if text.contains("\"stream\":true") {
                        return sse(
                            number(&json, "tokens", 20),
                            Duration::from_millis(number(&json, "gap_ms", 2)),
                        );
                    }
                    if text.contains("huge_cl") {
                        return huge(true, written);
                    }
                    if text.contains("huge") {
                        return huge(false, written);
                    }
                    if text.contains("busy") {
                        return (
                            axum::http::StatusCode::TOO_MANY_REQUESTS,
                            [("retry-after", "2")],
                            "slow down",
                        )
                            .into_response();
                    }
                    if text.contains("down") {
                        let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3));
                        return (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            [("retry-after", at)],
                            "maintenance",
                        )
                            .into_response();
                    }
                    axum::Json(serde_json::json!({
                        "object": "chat.completion",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                    }))
                    .into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let failures = handshake_failures.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let app = app.clone();
                let failures = failures.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        failures.fetch_add(1, Ordering::Relaxed);
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(tls),
                            hyper_util::service::TowerToHyperService::new(app),
                        )
                        .await;
                });
            }
        });
        Self {
            base_url: format!("https://localhost:{port}"),
            ca_file,
            client_cert_file,
            client_key_file,
            huge_written,
            handshake_failures,
            _dir: dir,
            task,
        }
    }

    /// The `[backend]` section of an adapter config using this server (CA file always,
    /// the client certificate when `client_cert`).
    pub fn backend_toml(&self, client_cert: bool) -> String {
        let mut s = format!(
            "[backend]\nkind = \"openai\"\ntimeout_ms = 20000\n[backend.openai]\nbase_url = \"{}\"\ntls_ca_file = \"{}\"\n",
            self.base_url,
            self.ca_file.display()
        );
        if client_cert {
            s.push_str(&format!(
                "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
                self.client_cert_file.display(),
                self.client_key_file.display()
            ));
        }
        s
    }
}
