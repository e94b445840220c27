//! The OpenAI-compatible backend over HTTPS against a local TLS server with a CA
//! generated per test: CA file and client certificate, bounded body reading (a 10 MB
//! reply is refused without being read), and the backend's own 429 / 503 with its
//! `Retry-After` carried to the caller.

use crate::common;
use crate::tls_openai;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::Rig;
use tls_openai::{HUGE_BYTES, TlsOpenAi};
use weir_llm_adapter::backend::openai::OpenAiBackend;
use weir_llm_adapter::config::{BackendKind, Config};
use weir_llm_client::{ClientErrorKind, LlmClient};
use weir_protocol::llm::ErrorCode;

fn backend(toml: &str) -> OpenAiBackend {
    let config = Config::from_toml_str(toml).expect("config");
    let BackendKind::OpenAi(oc) = &config.backend.kind else {
        panic!("openai backend expected")
    };
    OpenAiBackend::new(oc, config.backend.timeout).expect("backend")
}

async fn rig(server: &TlsOpenAi, client_cert: bool) -> Rig {
    let toml = server.backend_toml(client_cert);
    Rig::with_backend(&format!("workers = 2\n{toml}"), Arc::new(backend(&toml))).await
}

#[tokio::test]
async fn https_with_a_ca_file_and_a_client_certificate() {
    let server = TlsOpenAi::start(true).await;
    let mut rig = rig(&server, true).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let body = r#"{"model":"m","messages":[{"role":"user","content":"over tls"}]}"#;
    let r = llm
        .request(body)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("reply over https");
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], body);
    rig.shutdown().await;

    // The same server refuses a client without a certificate: a backend error.
    let mut rig = rig_without_cert(&server).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let e = llm
        .request(body)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect_err("handshake refused");
    assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::BackendError));
    assert!(server.handshake_failures.load(Ordering::Relaxed) >= 1);
    rig.shutdown().await;
}

async fn rig_without_cert(server: &TlsOpenAi) -> Rig {
    rig(server, false).await
}

#[tokio::test]
async fn https_without_the_ca_file_is_refused_by_certificate_verification() {
    let server = TlsOpenAi::start(false).await;
    let toml = format!(
        "[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"{}\"",
        server.base_url
    );
    let mut rig = Rig::with_backend("workers = 1", Arc::new(backend(&toml))).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let e = llm
        .request("{}")
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect_err("unknown CA");
    assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::BackendError));
    rig.shutdown().await;
}

#[tokio::test]
async fn a_reply_larger_than_a_nats_message_is_refused_without_reading_it_all() {
    let server = TlsOpenAi::start(false).await;
    let mut rig = rig(&server, false).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    for body in [r#"{"huge":1}"#, r#"{"huge_cl":1}"#] {
        let before = server.huge_written.load(Ordering::Relaxed);
        let e = llm
            .request(body)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect_err("too large");
        assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::BackendError));
        let limit = e.details().limit.expect("limit in details");
        assert!(
            limit > 512 * 1024 && limit < 1024 * 1024,
            "the cap is max_payload (1 MiB) less header room: {limit}"
        );
        assert!(e.to_string().contains("reading stopped"), "{e}");
        // The server could not write much more than the cap plus socket buffers.
        let written = server.huge_written.load(Ordering::Relaxed) - before;
        assert!(
            (written as usize) < HUGE_BYTES / 2,
            "{body}: the adapter read {written} bytes of {HUGE_BYTES}"
        );
    }
    // The worker is free again.
    assert!(
        llm.request("{}")
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok()
    );
    rig.shutdown().await;
}

#[tokio::test]
async fn backend_429_and_503_carry_its_retry_after() {
    let server = TlsOpenAi::start(false).await;
    let mut rig = rig(&server, false).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let e = llm
        .request(r#"{"busy":1}"#)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect_err("429");
    assert_eq!(e.kind(), ClientErrorKind::Server(ErrorCode::BackendError));
    assert_eq!(e.details().backend_status, Some(429));
    assert_eq!(e.details().retry_after_ms, Some(2000));
    assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
    assert!(e.to_string().contains("slow down"), "{e}");

    let e = llm
        .request(r#"{"down":1}"#)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect_err("503");
    assert_eq!(e.details().backend_status, Some(503));
    let ms = e
        .details()
        .retry_after_ms
        .expect("retry_after_ms from an HTTP date");
    // An HTTP date has whole seconds: 3 s ahead is read as 2..=3 s.
    assert!((1000..=3000).contains(&ms), "{ms}");
    rig.shutdown().await;
}

/// A streamed request reaches the TLS server (CA file + client certificate) and its
/// chunks arrive in order, the SSE deltas unchanged.
#[tokio::test]
async fn a_streamed_request_over_https_arrives_in_order() {
    use futures::StreamExt;
    use weir_llm_client::LlmEvent;
    let server = TlsOpenAi::start(true).await;
    let mut rig = rig(&server, true).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let mut st = llm
        .request(r#"{"model":"m","stream":true,"tokens":40,"gap_ms":3}"#)
        .timeout(Duration::from_secs(10))
        .stream()
        .await
        .expect("stream");
    let mut seqs = Vec::new();
    let mut text = Vec::new();
    let mut end = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(10), st.next())
        .await
        .expect("in time")
    {
        match ev.expect("event") {
            LlmEvent::Chunk { seq, data } => {
                seqs.push(seq);
                text.extend_from_slice(&data);
            }
            LlmEvent::End(e) => end = Some(e),
            _ => {}
        }
    }
    let want: String = (0..40)
        .map(|i| {
            format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n"
            )
        })
        .chain(std::iter::once("data: [DONE]\n\n".to_owned()))
        .collect();
    assert_eq!(String::from_utf8_lossy(&text), want);
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(seqs.len() > 1, "streamed as it came, not at the end");
    let end = end.expect("end");
    assert_eq!(end.chunks, seqs.len() as u64);
    eprintln!(
        "https stream: 40 deltas in {} chunks, ttft {:?}",
        seqs.len(),
        end.ttft
    );
    rig.shutdown().await;
}
