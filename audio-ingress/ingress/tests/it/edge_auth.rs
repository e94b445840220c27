//! Producer authentication, against the real binary: with
//! `auth_required`, a stream needs a signed token before the upgrade — 401 without or
//! with a bad one, 403 out of scope — from the `Authorization` header or the
//! `access_token` query parameter; `audio-ingress token` mints them (HS256 and EdDSA);
//! neither the secret nor a token appears in the logs.

use crate::support;

use std::process::Stdio;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use support::{Binary, STEP, raw_request};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use weir_testkit::NatsServer;

const SECRET: &str = "edge-auth-test-secret-0123456789abcdef";

/// `audio-ingress token <args>` → the token (or the public key).
async fn token(args: &[&str], secret: Option<&str>) -> String {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_audio-ingress"));
    cmd.arg("token")
        .args(args)
        .env_remove("WEIR_INGRESS_AUTH_HS256_SECRET");
    if let Some(s) = secret {
        cmd.env("WEIR_INGRESS_AUTH_HS256_SECRET", s);
    }
    let out = tokio::time::timeout(STEP, cmd.output())
        .await
        .expect("in time")
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_owned()
}

/// Opens `id` with an optional bearer token and query; streams one frame and `end`.
async fn open(bin: &Binary, id: &str, bearer: Option<&str>, query: &str) -> Result<u16, u16> {
    let mut req = format!("ws://{}/v1/streams/{id}{query}", bin.ws)
        .into_client_request()
        .expect("request");
    if let Some(t) = bearer {
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("header"),
        );
    }
    match tokio::time::timeout(STEP, tokio_tungstenite::connect_async(req))
        .await
        .expect("in time")
    {
        Ok((mut ws, _)) => {
            ws.send(Message::Binary(vec![0u8; 640].into()))
                .await
                .expect("frame");
            ws.send(Message::Text(r#"{"type":"end"}"#.into()))
                .await
                .expect("end");
            while let Some(Ok(m)) = ws.next().await {
                if let Message::Close(f) = m {
                    return Ok(f.map_or(0, |f| u16::from(f.code)));
                }
            }
            Ok(0)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("{id}: {e}"),
    }
}

async fn refusal_body(bin: &Binary, path: &str, extra: &str) -> (u16, Value, String) {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13{extra}\r\n\r\n"
    );
    let (status, body) = raw_request(bin.ws, &req).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::Null),
        body,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hs256_tokens_gate_the_upgrade() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[("auth_required", "true"), ("auth_hs256_secret", SECRET)],
    )
    .await;

    // Missing → 401 with the JSON body and WWW-Authenticate.
    let req = "GET /v1/streams/s1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let (status, body) = raw_request(bin.ws, req).await;
    assert_eq!(status, 401, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["error"]["code"], "unauthorized");
    assert_eq!(open(&bin, "s1", None, "").await, Err(401));
    // Invalid (garbage, another secret) → 401.
    assert_eq!(open(&bin, "s1", Some("not.a.token"), "").await, Err(401));
    let other = token(
        &["--stream", "s1"],
        Some("another-secret-another-secret-123"),
    )
    .await;
    assert_eq!(open(&bin, "s1", Some(&other), "").await, Err(401));
    // Valid but for another stream → 403.
    let t1 = token(&["--stream", "s1"], Some(SECRET)).await;
    let (status, v, _) = refusal_body(
        &bin,
        "/v1/streams/s2",
        &format!("\r\nAuthorization: Bearer {t1}"),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(v["error"]["code"], "forbidden");
    // Valid: header, query parameter, prefix.
    assert_eq!(open(&bin, "s1", Some(&t1), "").await, Ok(1000));
    assert_eq!(
        open(
            &bin,
            "s1",
            None,
            &format!("?access_token={t1}&session_id=x")
        )
        .await,
        Ok(1000)
    );
    let tp = token(
        &["--stream-prefix", "tenant-a-", "--ttl-s", "60"],
        Some(SECRET),
    )
    .await;
    assert_eq!(open(&bin, "tenant-a-7", Some(&tp), "").await, Ok(1000));
    assert_eq!(open(&bin, "tenant-b-7", Some(&tp), "").await, Err(403));
    let (status, limits) = support::http_get(bin.admin, "/v1/limits").await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&limits).expect("json");
    assert_eq!(v["edge"]["auth_required"], true, "{limits}");
    assert_eq!(v["edge"]["max_connections"], 4096, "{limits}");
    assert!(!limits.contains(SECRET), "no secret in /v1/limits");
    let rejects = |r: &str| format!("weir_ingress_admission_rejects_total{{reason=\"{r}\"}}");
    assert_eq!(bin.metric(&rejects("unauthorized")).await, 4.0);
    assert_eq!(bin.metric(&rejects("forbidden")).await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eddsa_tokens_and_the_secret_never_logged() {
    let nats = NatsServer::start().expect("nats-server");
    let seed = "KioqKioqKioqKioqKioqKioqKioqKioqKioqKioqKio"; // 32 x '*'
    let public = token(&["--eddsa-seed", seed, "--print-public-key"], None).await;
    let bin = Binary::start_ready(
        nats.url(),
        &[
            ("auth_required", "true"),
            ("auth_eddsa_public_key", &public),
        ],
    )
    .await;
    let t = token(&["--stream", "ed-1", "--eddsa-seed", seed], None).await;
    assert_eq!(open(&bin, "ed-1", Some(&t), "").await, Ok(1000));
    let hs = token(&["--stream", "ed-1"], Some(SECRET)).await;
    assert_eq!(
        open(&bin, "ed-1", Some(&hs), "").await,
        Err(401),
        "HS256 refused"
    );

    // Debug logs of a run with the HS256 secret: neither it nor a token shows up.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--nats-url", nats.url(), "--set", "auth_required=true"])
        .env("WEIR_INGRESS_AUTH_HS256_SECRET", SECRET)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        child.stdout.take().expect("stdout"),
    ));
    let ready: Value = serde_json::from_str(
        &tokio::time::timeout(STEP, lines.next_line())
            .await
            .expect("ready in time")
            .expect("read")
            .expect("line"),
    )
    .expect("json");
    let ws: std::net::SocketAddr = ready["ws"].as_str().expect("ws").parse().expect("addr");
    let t = token(&["--stream", "logged"], Some(SECRET)).await;
    for extra in [
        format!("\r\nAuthorization: Bearer {t}"),
        "\r\nAuthorization: Bearer junk.junk.junk".into(),
    ] {
        let req = format!(
            "GET /v1/streams/logged HTTP/1.1\r\nHost: x\r\nConnection: close{extra}\r\n\r\n"
        );
        raw_request(ws, &req).await;
    }
    child.start_kill().expect("kill");
    let mut stderr = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .await
        .expect("stderr");
    assert!(
        stderr.contains("audio-ingress serving"),
        "logs were captured"
    );
    assert!(!stderr.contains(SECRET), "secret logged");
    assert!(!stderr.contains(&t), "token logged");
}

/// An HS256 token with exactly these claims (JSON), signed with [`SECRET`].
fn raw_token(claims: &Value) -> String {
    weir_audio_ingress::auth::mint(
        weir_audio_ingress::auth::SigningKey::Hs256(SECRET.as_bytes()),
        claims,
    )
    .expect("mint")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_not_yet_valid_is_refused_401_beyond_the_leeway() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[
            ("auth_required", "true"),
            ("auth_hs256_secret", SECRET),
            ("auth_leeway_s", "5"),
        ],
    )
    .await;
    let now = weir_audio_ingress::auth::unix_now_s();
    let exp = now + 7200;
    let with_nbf = |id: &str, nbf: Value| {
        raw_token(&serde_json::json!({"exp": exp, "stream": id, "nbf": nbf}))
    };
    // An hour ahead: not valid yet.
    let t = with_nbf("nbf-hour", (now + 3600).into());
    assert_eq!(open(&bin, "nbf-hour", Some(&t), "").await, Err(401));
    let (status, v, _) = refusal_body(
        &bin,
        "/v1/streams/nbf-hour",
        &format!("\r\nAuthorization: Bearer {t}"),
    )
    .await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "unauthorized", "{v}");
    // Past the leeway by a minute: refused; a malformed `nbf` too.
    let t = with_nbf("nbf-min", (now + 65).into());
    assert_eq!(open(&bin, "nbf-min", Some(&t), "").await, Err(401));
    let t = with_nbf("nbf-text", "soon".into());
    assert_eq!(open(&bin, "nbf-text", Some(&t), "").await, Err(401));
    // Within the leeway (clock skew), or already reached: accepted.
    let t = with_nbf("nbf-skew", (now + 2).into());
    assert_eq!(open(&bin, "nbf-skew", Some(&t), "").await, Ok(1000));
    let t = with_nbf("nbf-past", (now - 60).into());
    assert_eq!(open(&bin, "nbf-past", Some(&t), "").await, Ok(1000));
    let rejects = "weir_ingress_admission_rejects_total{reason=\"unauthorized\"}";
    assert_eq!(bin.metric(rejects).await, 4.0);
}
