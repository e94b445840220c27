//! WebSocket consistency, against the real binary with the
//! default configuration: protocol violations close with 1002 / 1007 / 1009 and end the
//! stream with `error`; a client's close is echoed; `["end"]` is not an end; every
//! refusal before the upgrade carries the JSON body. The client is a raw socket that
//! writes frames by hand (tungstenite refuses to send most of these).

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use support::{Binary, STEP, raw_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use weir_testkit::NatsServer;

const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;

/// A hand-made WebSocket client.
struct RawWs {
    s: TcpStream,
    buf: Vec<u8>,
}

impl RawWs {
    async fn connect(addr: SocketAddr, path: &str) -> Self {
        let mut s = tokio::time::timeout(STEP, TcpStream::connect(addr))
            .await
            .expect("in time")
            .expect("connect");
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("request");
        let mut ws = Self { s, buf: Vec::new() };
        let head = ws.read_until_head().await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        ws
    }

    async fn read_until_head(&mut self) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..i]).to_string();
                self.buf.drain(..i + 4);
                return head;
            }
            let mut chunk = [0u8; 1024];
            let n = tokio::time::timeout_at(deadline, self.s.read(&mut chunk))
                .await
                .expect("head in time")
                .expect("read");
            assert!(n > 0, "closed before the response head");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn send(&mut self, opcode: u8, payload: &[u8], masked: bool) {
        let mut f = vec![0x80 | opcode];
        let mask_bit = if masked { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => f.push(mask_bit | n as u8),
            n if n <= 0xffff => {
                f.push(mask_bit | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(mask_bit | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let key = [0x37, 0xfa, 0x21, 0x3d];
        if masked {
            f.extend_from_slice(&key);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        } else {
            f.extend_from_slice(payload);
        }
        // The server may close while a large frame is still being written.
        let _ = self.s.write_all(&f).await;
    }

    /// Reads server frames until a close frame or EOF: (text events, close code).
    async fn until_close(&mut self) -> (Vec<Value>, Option<u16>) {
        let deadline = Instant::now() + STEP;
        let mut events = Vec::new();
        loop {
            while let Some((opcode, payload, used)) = parse_frame(&self.buf) {
                self.buf.drain(..used);
                match opcode {
                    TEXT => {
                        let ev: Value = serde_json::from_slice(&payload).expect("JSON event");
                        if !support::is_lifecycle(&ev) {
                            events.push(ev);
                        }
                    }
                    CLOSE => {
                        let code = (payload.len() >= 2)
                            .then(|| u16::from_be_bytes([payload[0], payload[1]]));
                        return (events, code);
                    }
                    _ => {}
                }
            }
            let mut chunk = [0u8; 4096];
            let n = match tokio::time::timeout_at(deadline, self.s.read(&mut chunk))
                .await
                .expect("close in time")
            {
                Ok(0) | Err(_) => return (events, None),
                Ok(n) => n,
            };
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// One unmasked server frame at the start of `b`: (opcode, payload, bytes used).
fn parse_frame(b: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    if b.len() < 2 {
        return None;
    }
    let opcode = b[0] & 0x0f;
    let (len, start) = match b[1] & 0x7f {
        126 => (u16::from_be_bytes([*b.get(2)?, *b.get(3)?]) as usize, 4),
        127 => (
            u64::from_be_bytes(b.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n as usize, 2),
    };
    let payload = b.get(start..start + len)?.to_vec();
    Some((opcode, payload, start + len))
}

fn close_payload(code: u16) -> Vec<u8> {
    code.to_be_bytes().to_vec()
}

/// Waits (bounded) until `weir_ingress_ends_total{reason}` reaches `n`.
async fn ends(bin: &Binary, reason: &str, n: f64) -> bool {
    let deadline = Instant::now() + STEP;
    let key = format!("weir_ingress_ends_total{{reason=\"{reason}\"}}");
    while Instant::now() < deadline {
        if bin.metric(&key).await >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn closed_reason(events: &[Value]) -> Option<&str> {
    events
        .iter()
        .find(|e| e["type"] == "closed")
        .and_then(|e| e["reason"].as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violations_close_1002_1007_1009_and_end_the_stream_with_error() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;

    // Invalid UTF-8 in a text message: 1007.
    let mut ws = RawWs::connect(bin.ws, "/v1/streams/bad-utf8").await;
    ws.send(BINARY, &[0u8; 640], true).await;
    ws.send(TEXT, &[0xff, 0xfe, b'{'], true).await;
    let (events, code) = ws.until_close().await;
    assert_eq!(code, Some(1007), "{events:?}");
    assert_eq!(events[0]["code"], "invalid_utf8", "{events:?}");
    assert_eq!(closed_reason(&events), Some("error"), "{events:?}");

    // An unmasked frame from the client: 1002.
    let mut ws = RawWs::connect(bin.ws, "/v1/streams/unmasked").await;
    ws.send(BINARY, &[0u8; 640], false).await;
    let (events, code) = ws.until_close().await;
    assert_eq!(code, Some(1002), "{events:?}");
    assert_eq!(closed_reason(&events), Some("error"), "{events:?}");

    // A message over 64 KiB: 1009.
    let mut ws = RawWs::connect(bin.ws, "/v1/streams/too-big").await;
    ws.send(BINARY, &vec![0u8; 70_000], true).await;
    let (events, code) = ws.until_close().await;
    assert_eq!(code, Some(1009), "{events:?}");
    assert_eq!(closed_reason(&events), Some("error"), "{events:?}");

    // A close code a client may not send (1005): echoed as 1002, the stream ends error.
    let mut ws = RawWs::connect(bin.ws, "/v1/streams/bad-close").await;
    ws.send(BINARY, &[0u8; 640], true).await;
    ws.send(CLOSE, &close_payload(1005), true).await;
    let (_, code) = ws.until_close().await;
    assert_eq!(code, Some(1002));

    assert!(
        ends(&bin, "error", 4.0).await,
        "four streams ended with error"
    );
    assert_eq!(
        bin.metric("weir_ingress_ends_total{reason=\"producer_gone\"}")
            .await,
        0.0,
        "none as producer_gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_close_is_echoed_and_an_array_is_not_an_end() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;

    // Close 1000 without `end`: the echo comes back; the stream ends producer_gone.
    let mut ws = RawWs::connect(bin.ws, "/v1/streams/client-close").await;
    ws.send(BINARY, &[0u8; 640], true).await;
    ws.send(CLOSE, &close_payload(1000), true).await;
    let (_, code) = ws.until_close().await;
    assert_eq!(code, Some(1000), "close echoed");
    assert!(ends(&bin, "producer_gone", 1.0).await);

    // `["end"]` is not `{"type":"end"}`: a bad message (1003), not a normal end.
    let mut ws = RawWs::connect(bin.ws, "/v1/streams/array-end").await;
    ws.send(TEXT, br#"["end"]"#, true).await;
    let (events, code) = ws.until_close().await;
    assert_eq!(code, Some(1003), "{events:?}");
    assert_eq!(events[0]["code"], "bad_message", "{events:?}");
}

/// (status, parsed JSON body) of a raw request to the WebSocket port.
async fn refusal(bin: &Binary, request_line: &str, headers: &str) -> (u16, Value) {
    let req = format!("{request_line}\r\nHost: x\r\nConnection: close{headers}\r\n\r\n");
    let (status, body) = raw_request(bin.ws, &req).await;
    let json = serde_json::from_str(&body).unwrap_or(Value::Null);
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_before_the_upgrade_has_the_json_body() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;
    let upgrade = "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13";
    let cases = [
        (
            "GET /v1/streams/%ff%fe HTTP/1.1",
            upgrade,
            400,
            "invalid_stream_id",
        ),
        (
            "GET /v1/streams/dup?session_id=a&session_id=b HTTP/1.1",
            upgrade,
            400,
            "invalid_request",
        ),
        (
            "GET /v1/streams/ff?session_id=%ff HTTP/1.1",
            upgrade,
            400,
            "invalid_request",
        ),
        ("GET /v1/streams/plain HTTP/1.1", "", 0, "invalid_upgrade"),
        (
            "GET /v1/streams/v8 HTTP/1.1",
            "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8",
            0,
            "invalid_upgrade",
        ),
        ("GET /elsewhere HTTP/1.1", "", 404, "not_found"),
        (
            "POST /v1/streams/x HTTP/1.1",
            "\r\nContent-Length: 0",
            405,
            "method_not_allowed",
        ),
    ];
    for (line, headers, status, code) in cases {
        let (got, body) = refusal(&bin, line, headers).await;
        if status != 0 {
            assert_eq!(got, status, "{line}: {body}");
        } else {
            assert!((400..500).contains(&got), "{line}: {got} {body}");
        }
        assert_eq!(body["error"]["code"], code, "{line}: {got} {body}");
        assert!(body["error"]["message"].is_string(), "{line}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_message_with_a_duplicate_key_is_refused_1003_not_an_end() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;
    // A parser that keeps the last (or the first) duplicate decides differently from
    // one that keeps the other: any repeated key, at any depth and however it is
    // escaped, is a bad message.
    let cases: [&[u8]; 5] = [
        br#"{"type":"x","type":"end"}"#,
        br#"{"type":"end","type":"x"}"#,
        br#"{"type":"end","type":"end"}"#,
        br#"{"type":"end","t\u0079pe":"end"}"#,
        br#"{"type":"end","meta":{"k":1,"k":2}}"#,
    ];
    for (i, text) in cases.iter().enumerate() {
        let mut ws = RawWs::connect(bin.ws, &format!("/v1/streams/dup-key-{i}")).await;
        ws.send(BINARY, &[0u8; 640], true).await;
        ws.send(TEXT, text, true).await;
        let (events, code) = ws.until_close().await;
        let shown = String::from_utf8_lossy(text);
        assert_eq!(code, Some(1003), "{shown}: {events:?}");
        assert_eq!(events[0]["code"], "bad_message", "{shown}: {events:?}");
        assert!(
            events[0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("duplicate")),
            "{shown}: {events:?}"
        );
        assert_eq!(closed_reason(&events), Some("error"), "{shown}: {events:?}");
        // `closed` comes once the stream has finished: the frame before the bad
        // message is published, the `end` delivered.
        let closed = events
            .iter()
            .find(|e| e["type"] == "closed")
            .expect("closed");
        assert_eq!(closed["frames_published"], 1, "{shown}: {closed}");
        assert_eq!(closed["end_delivered"], true, "{shown}: {closed}");
    }
    assert!(ends(&bin, "error", cases.len() as f64).await);
    assert_eq!(
        bin.metric("weir_ingress_ends_total{reason=\"producer\"}")
            .await,
        0.0,
        "none ended as a producer's end"
    );
}
