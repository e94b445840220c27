//! The telephony door against the real binary and a real nats-server, default
//! configuration unless a test says otherwise: a Twilio-dialect client (messages as
//! Twilio's docs show them) checks every refusal of bad input (close code and reason,
//! a counter, a declared end, no audio on NATS), the reorder window (in order within
//! it, declared gaps beyond it, never out of order), and the return path's basics
//! (bot audio paced to the socket, a mark echoed back as an event, `clear`).
//!
//! The conformance run with a client written only from the carriers' docs, recorded
//! speech and a reference decode is `telephony_conformance`.

use std::time::Duration;

use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use weir_audio_producer::testing::{Collector, StreamLog, wait_until};
use weir_protocol::audio::extension::EndReason;
use weir_testkit::NatsServer;

use crate::support::{Binary, STEP};

pub(crate) type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const FRAMES: &str = "inference.whisper.stream.*";

async fn setup(sets: &[(&str, &str)]) -> (NatsServer, Binary, Collector) {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), sets).await;
    let collector = Collector::start(nats.url(), FRAMES).await;
    (nats, bin, collector)
}

pub(crate) async fn connect(bin: &Binary, path: &str) -> Ws {
    let url = format!("ws://{}{path}", bin.ws);
    let (ws, _) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .expect("upgrade");
    ws
}

pub(crate) fn connected() -> Value {
    json!({"event": "connected", "protocol": "Call", "version": "1.0.0"})
}

pub(crate) fn start(stream_id: &str, encoding: &str, rate: u32) -> Value {
    json!({"event": "start", "sequenceNumber": "1", "streamSid": "MZ0001",
        "start": {"accountSid": "AC0001", "streamSid": "MZ0001", "callSid": "CA0001",
            "tracks": ["inbound"], "customParameters": {"stream_id": stream_id},
            "mediaFormat": {"encoding": encoding, "sampleRate": rate, "channels": 1}}})
}

/// A `media` message of chunk `chunk` (20 ms of µ-law: a ramp, so frames differ).
fn media(chunk: u64) -> Value {
    let payload: Vec<u8> = (0..160)
        .map(|i| (i as u8).wrapping_add(chunk as u8))
        .collect();
    media_payload(
        chunk,
        &base64::engine::general_purpose::STANDARD.encode(payload),
    )
}

fn media_payload(chunk: u64, payload: &str) -> Value {
    json!({"event": "media", "sequenceNumber": (chunk + 1).to_string(), "streamSid": "MZ0001",
        "media": {"track": "inbound", "chunk": chunk.to_string(),
            "timestamp": (chunk * 20).to_string(), "payload": payload}})
}

pub(crate) fn stop() -> Value {
    json!({"event": "stop", "sequenceNumber": "999", "streamSid": "MZ0001",
        "stop": {"accountSid": "AC0001", "callSid": "CA0001"}})
}

pub(crate) async fn send(ws: &mut Ws, v: &Value) {
    let _ = ws.send(Message::Text(v.to_string().into())).await;
}

/// Reads until the close frame (bounded): the text messages and the close (code, reason).
pub(crate) async fn until_close(ws: &mut Ws) -> (Vec<Value>, Option<(u16, String)>) {
    let deadline = Instant::now() + STEP;
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => panic!("no close within {STEP:?}"),
            Ok(None) | Ok(Some(Err(_))) => return (texts, None),
            Ok(Some(Ok(Message::Text(t)))) => {
                texts.push(serde_json::from_str(t.as_str()).expect("JSON from the door"));
            }
            Ok(Some(Ok(Message::Close(f)))) => {
                return (
                    texts,
                    f.map(|f| (u16::from(f.code), f.reason.as_str().to_owned())),
                );
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

async fn log_with_end(c: &Collector, stream: &str) -> StreamLog {
    wait_until(STEP, || c.log(stream).end.is_some()).await;
    c.log(stream)
}

fn end_reason(log: &StreamLog) -> Option<EndReason> {
    log.end.as_ref().and_then(|e| e.ext.end_reason)
}

/// One bad-input case: what to send after `connected`, and the close expected.
struct Case {
    name: &'static str,
    /// The stream id its `start` names (`""`: no `start`).
    id: &'static str,
    messages: Vec<Message>,
    close: u16,
    code: &'static str,
    /// The stream was opened (a `start` came first): it must end `error`, with
    /// exactly this many frames published before.
    opened_frames: Option<usize>,
}

fn text(v: Value) -> Message {
    Message::Text(v.to_string().into())
}

fn cases() -> Vec<Case> {
    let opened = |id: &str| text(start(id, "audio/x-mulaw", 8000));
    let mut backwards = vec![opened("c-backwards")];
    backwards.extend((1..=100).map(|c| text(media(c))));
    backwards.push(text(media(10)));
    vec![
        Case {
            name: "invalid base64",
            id: "c-b64",
            messages: vec![opened("c-b64"), text(media_payload(1, "!!!not base64!!!"))],
            close: 1003,
            code: "invalid_base64",
            opened_frames: Some(0),
        },
        Case {
            name: "invalid JSON",
            id: "c-json",
            messages: vec![
                opened("c-json"),
                Message::Text("{\"event\": \"media\",".into()),
            ],
            close: 1003,
            code: "invalid_json",
            opened_frames: Some(0),
        },
        Case {
            name: "wrong mediaFormat",
            id: "c-format",
            messages: vec![text(start("c-format", "audio/x-l24", 48000))],
            close: 1003,
            code: "unsupported_format",
            opened_frames: None,
        },
        Case {
            name: "a payload over 200 ms",
            id: "c-long",
            messages: vec![
                opened("c-long"),
                text(media_payload(
                    1,
                    &base64::engine::general_purpose::STANDARD.encode(vec![0xffu8; 2400]),
                )),
            ],
            close: 1008,
            code: "payload_too_long",
            opened_frames: Some(0),
        },
        Case {
            name: "an empty payload",
            id: "c-empty",
            messages: vec![opened("c-empty"), text(media_payload(1, ""))],
            close: 1008,
            code: "empty_payload",
            opened_frames: Some(0),
        },
        Case {
            name: "a repeated chunk",
            id: "c-repeat",
            messages: vec![opened("c-repeat"), text(media(1)), text(media(1))],
            close: 1008,
            code: "sequence_repeat",
            opened_frames: Some(1),
        },
        Case {
            name: "a chunk far behind",
            id: "c-backwards",
            messages: backwards,
            close: 1008,
            code: "sequence_backwards",
            opened_frames: Some(100),
        },
        Case {
            name: "a chunk far ahead",
            id: "c-jump",
            messages: vec![opened("c-jump"), text(media(1)), text(media(5000))],
            close: 1008,
            code: "sequence_jump",
            opened_frames: Some(1),
        },
        Case {
            name: "media before start",
            id: "",
            messages: vec![text(media(1))],
            close: 1008,
            code: "before_start",
            opened_frames: None,
        },
        Case {
            name: "a second start",
            id: "c-twice",
            messages: vec![opened("c-twice"), text(media(1)), opened("c-twice")],
            close: 1008,
            code: "duplicate_start",
            opened_frames: Some(1),
        },
        Case {
            name: "oversized JSON",
            id: "c-huge",
            messages: vec![
                opened("c-huge"),
                Message::Text(
                    format!("{{\"event\":\"media\",\"pad\":\"{}\"}}", "x".repeat(20_000)).into(),
                ),
            ],
            close: 1009,
            code: "too_large",
            opened_frames: Some(0),
        },
        Case {
            name: "a binary message",
            id: "c-binary",
            messages: vec![opened("c-binary"), Message::Binary(vec![0u8; 640].into())],
            close: 1003,
            code: "binary_message",
            opened_frames: Some(0),
        },
    ]
}

/// Every bad input: a clear close reason, a counter, a declared end (when a stream was
/// opened), and none of its audio on NATS.
#[tokio::test]
async fn bad_input_closes_with_a_reason_a_counter_and_a_declared_end() {
    let (_nats, bin, collector) = setup(&[]).await;
    for case in cases() {
        let mut ws = connect(&bin, "/v1/telephony/twilio").await;
        send(&mut ws, &connected()).await;
        for m in case.messages {
            let _ = ws.send(m).await;
        }
        let (_, close) = until_close(&mut ws).await;
        assert_eq!(
            close,
            Some((case.close, case.code.to_owned())),
            "{}: close code and reason",
            case.name
        );
        let counted = bin
            .metric(&format!(
                "weir_ingress_telephony_bad_input_total{{code=\"{}\"}}",
                case.code
            ))
            .await;
        assert!(counted >= 1.0, "{}: counter {counted}", case.name);
    }
    // Streams that were opened ended `error`, with only the good chunks' frames; the
    // refused starts opened nothing; every packet on NATS decoded.
    for case in cases() {
        match case.opened_frames {
            Some(frames) => {
                let log = log_with_end(&collector, case.id).await;
                assert_eq!(
                    end_reason(&log),
                    Some(EndReason::Error),
                    "{}: {log:?}",
                    case.name
                );
                assert_eq!(log.frames.len(), frames, "{}: frames on NATS", case.name);
                assert!(log.in_order(), "{}", case.name);
            }
            None => assert!(collector.log(case.id).seqs.is_empty(), "{}", case.name),
        }
    }
    assert!(collector.logs().values().all(|l| l.errors == 0));
}

/// A `start` the doors' admission refuses closes with the refusal's code as the reason
/// (1008; a `503` would be 1013) and opens nothing.
#[tokio::test]
async fn a_refused_start_closes_with_the_refusals_code() {
    let (_nats, bin, collector) = setup(&[]).await;
    let mut ws = connect(&bin, "/v1/telephony/twilio").await;
    send(&mut ws, &connected()).await;
    send(&mut ws, &start("bad id", "audio/x-mulaw", 8000)).await;
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1008, "invalid_stream_id".to_owned())));
    assert_eq!(collector.total(), 0);
}

/// A connection that never sends `start` is closed after `telephony.start_timeout_ms`
/// (a short one here: the mechanism) with nothing opened.
#[tokio::test]
async fn no_start_in_time_closes_the_connection() {
    let (_nats, bin, collector) = setup(&[("telephony.start_timeout_ms", "300")]).await;
    let mut ws = connect(&bin, "/v1/telephony").await;
    let t0 = Instant::now();
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1008, "start_timeout".to_owned())));
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(collector.total(), 0);
}

/// In order: every chunk is a 16 kHz frame (seq from 1), `stop` ends the stream
/// `producer`, close 1000. The dialect is read from the first message on
/// `/v1/telephony`.
#[tokio::test]
async fn chunks_in_order_become_frames_and_stop_ends_the_stream() {
    let (_nats, bin, collector) = setup(&[]).await;
    let mut ws = connect(&bin, "/v1/telephony").await;
    send(&mut ws, &connected()).await;
    send(&mut ws, &start("in-order", "audio/x-mulaw", 8000)).await;
    for c in 1..=50 {
        send(&mut ws, &media(c)).await;
    }
    send(&mut ws, &stop()).await;
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1000, "stop".to_owned())));
    let log = log_with_end(&collector, "in-order").await;
    assert_eq!(end_reason(&log), Some(EndReason::Producer));
    assert_eq!(log.frames, (1..=50).collect::<Vec<u64>>());
    assert!(
        log.gaps.is_empty() && log.declarations.is_empty(),
        "{log:?}"
    );
}

/// Shuffled within the window: back in order, no gap. A chunk held back beyond it: its
/// frame is declared lost (reason `source`) and the chunk, arriving later, is dropped —
/// never published out of order.
#[tokio::test]
async fn the_reorder_window_restores_order_and_declares_what_comes_too_late() {
    let (_nats, bin, collector) = setup(&[]).await;
    let mut ws = connect(&bin, "/v1/telephony/twilio").await;
    send(&mut ws, &connected()).await;
    send(&mut ws, &start("reorder", "audio/x-mulaw", 8000)).await;
    // Within 60 ms (3 chunks): 2 before 1, 5 before 3 and 4.
    for c in [2, 1, 5, 3, 4, 6, 7, 8] {
        send(&mut ws, &media(c)).await;
    }
    // Chunk 9 comes after 10..=13: past the window, declared.
    for c in [10, 11, 12, 13, 9, 14] {
        send(&mut ws, &media(c)).await;
    }
    send(&mut ws, &stop()).await;
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1000, "stop".to_owned())));
    let log = log_with_end(&collector, "reorder").await;
    assert!(log.in_order(), "{log:?}");
    let expected: Vec<u64> = (1..=8).chain(10..=14).collect();
    assert_eq!(
        log.frames, expected,
        "chunk k is seq k; 9 is declared: {log:?}"
    );
    // A declaration rides on the next packet and is repeated on the end: counted once
    // by its range.
    let ranges: std::collections::BTreeSet<(u64, u64)> = log
        .declarations
        .iter()
        .map(|(_, d)| (d.first_seq, d.last_seq))
        .collect();
    assert_eq!(
        ranges.into_iter().collect::<Vec<_>>(),
        vec![(9, 9)],
        "{log:?}"
    );
    assert!(
        log.gaps.is_empty(),
        "the default policy declares in a header: {log:?}"
    );
    assert!(
        log.declarations
            .iter()
            .all(|(_, d)| d.reason == weir_protocol::audio::extension::PossibleLossReason::Source),
        "{log:?}"
    );
    let late = bin
        .metric("weir_ingress_telephony_chunks_total{outcome=\"late\"}")
        .await;
    assert_eq!(late, 1.0);
}

/// The return path: 1 s of bot audio published in one message with a mark reaches the
/// carrier as 50 µ-law `media` messages paced at real time (not in a burst), then the
/// mark; the carrier's echo of the mark comes back as a `mark` event on NATS; `clear`
/// is answered with what was dropped and sends the carrier's `clear`.
#[tokio::test]
async fn bot_audio_is_paced_to_the_carrier_and_marks_come_back() {
    let (nats, bin, _collector) = setup(&[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let mut events = client
        .subscribe("weir.voice.events.bot")
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let mut ws = connect(&bin, "/v1/telephony/twilio").await;
    send(&mut ws, &connected()).await;
    send(&mut ws, &start("bot", "audio/x-mulaw", 8000)).await;
    let started = next_event(&mut events).await;
    assert_eq!(started["type"], "started", "{started}");
    // 1 s of a 440 Hz tone, 16 kHz s16le.
    let pcm: Vec<u8> = (0..16_000)
        .flat_map(|i| {
            let s = (f64::sin(i as f64 * 2.0 * std::f64::consts::PI * 440.0 / 16_000.0) * 8000.0)
                as i16;
            s.to_le_bytes()
        })
        .collect();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Weir-Mark", "reply-1");
    let t0 = Instant::now();
    client
        .publish_with_headers("weir.voice.out.bot", headers, pcm.into())
        .await
        .expect("publish");
    client.flush().await.expect("flush");
    let mut arrivals = Vec::new();
    let mark = loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("message");
        let Message::Text(t) = msg else { continue };
        let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
        match v["event"].as_str() {
            Some("media") => {
                assert_eq!(v["streamSid"], "MZ0001");
                let payload = base64::engine::general_purpose::STANDARD
                    .decode(v["media"]["payload"].as_str().expect("payload"))
                    .expect("base64");
                assert_eq!(payload.len(), 160, "20 ms of µ-law");
                arrivals.push(t0.elapsed());
            }
            Some("mark") => break v,
            other => panic!("unexpected {other:?}: {v}"),
        }
    };
    assert_eq!(arrivals.len(), 50);
    assert_eq!(mark["mark"]["name"], "reply-1");
    let span = arrivals[49] - arrivals[0];
    // 49 intervals of 20 ms: paced, not a burst (generous bounds for a loaded machine).
    assert!(
        span >= Duration::from_millis(900) && span <= Duration::from_millis(1300),
        "{span:?}"
    );
    // The carrier played it: its echo becomes the `mark` event.
    send(
        &mut ws,
        &json!({"event": "mark", "sequenceNumber": "60", "streamSid": "MZ0001",
            "mark": {"name": "reply-1"}}),
    )
    .await;
    let ev = next_event(&mut events).await;
    assert_eq!(ev, json!({"type": "mark", "name": "reply-1"}));
    // Barge-in on an empty queue: answered, and the carrier's `clear` is sent.
    let reply = client
        .request("weir.voice.ctl.bot", r#"{"type":"clear"}"#.into())
        .await
        .expect("reply");
    let cleared: Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(cleared["type"], "cleared", "{cleared}");
    let clear = loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("in time")
            .expect("open")
            .expect("message");
        if let Message::Text(t) = msg {
            break serde_json::from_str::<Value>(t.as_str()).expect("JSON");
        }
    };
    assert_eq!(clear, json!({"event": "clear", "streamSid": "MZ0001"}));
    send(&mut ws, &stop()).await;
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1000, "stop".to_owned())));
}

async fn next_event(sub: &mut async_nats::Subscriber) -> Value {
    let msg = tokio::time::timeout(STEP, sub.next())
        .await
        .expect("an event in time")
        .expect("subscription open");
    serde_json::from_slice(&msg.payload).expect("JSON event")
}

/// Reads the carrier's messages for `within`: (media count, the other events).
async fn carrier_reads(ws: &mut Ws, within: Duration) -> (usize, Vec<Value>) {
    let deadline = Instant::now() + within;
    let (mut media, mut other) = (0, Vec::new());
    while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline, ws.next()).await {
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
            if v["event"] == "media" {
                media += 1;
            } else {
                other.push(v);
            }
        }
    }
    (media, other)
}

/// `clear` during playback drops the rest at once and names both marks never played;
/// the carrier's `clear` comes before anything else and no media follows it. A reply's
/// last partial frame is sent (padded), not held for the next reply. A bot message
/// with a bad mark is refused whole and does not hold up the next one.
#[tokio::test]
async fn clear_during_playback_tail_frames_and_refused_marks() {
    let (nats, bin, _collector) = setup(&[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let mut events = client
        .subscribe("weir.voice.events.play")
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let mut ws = connect(&bin, "/v1/telephony/twilio").await;
    send(&mut ws, &connected()).await;
    send(&mut ws, &start("play", "audio/x-mulaw", 8000)).await;
    assert_eq!(next_event(&mut events).await["type"], "started");
    let say = |mark: &'static str, bytes: usize| {
        let client = client.clone();
        async move {
            let mut headers = async_nats::HeaderMap::new();
            if !mark.is_empty() {
                headers.insert("Weir-Mark", mark);
            }
            client
                .publish_with_headers("weir.voice.out.play", headers, vec![1u8; bytes].into())
                .await
                .expect("publish");
            client.flush().await.expect("flush");
        }
    };
    say("a", 32_000).await;
    say("b", 32_000).await;
    let (played, _) = carrier_reads(&mut ws, Duration::from_millis(300)).await;
    assert!(played >= 5, "{played} frames before the clear");
    let reply = client
        .request("weir.voice.ctl.play", r#"{"type":"clear"}"#.into())
        .await
        .expect("reply");
    let cleared: Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(cleared["type"], "cleared");
    assert_eq!(cleared["unplayed_marks"], json!(["a", "b"]), "{cleared}");
    let dropped = cleared["frames"].as_u64().expect("frames");
    assert!(
        dropped + played as u64 >= 95 && dropped + played as u64 <= 100,
        "{cleared} after {played}"
    );
    // At most one frame in flight, then the carrier's clear, then nothing.
    let (before_clear, rest) = {
        let mut media = 0;
        loop {
            let msg = tokio::time::timeout(STEP, ws.next())
                .await
                .expect("in time")
                .expect("open")
                .expect("message");
            let Message::Text(t) = msg else { continue };
            let v: Value = serde_json::from_str(t.as_str()).expect("JSON");
            if v["event"] == "clear" {
                break (
                    media,
                    carrier_reads(&mut ws, Duration::from_millis(200)).await,
                );
            }
            media += 1;
        }
    };
    assert!(
        before_clear <= 3,
        "{before_clear} media between the clear and the carrier's clear"
    );
    assert_eq!(rest.0, 0, "no media after the carrier's clear");

    // A reply of 100 ms and 50 samples: 6 frames, the last padded.
    say("", 3_200 + 100).await;
    let (frames, _) = carrier_reads(&mut ws, Duration::from_millis(400)).await;
    assert_eq!(frames, 6);

    // A mark name over 256 bytes: refused with its audio, told; the next message plays.
    let long: &'static str = Box::leak("m".repeat(300).into_boxed_str());
    say(long, 640).await;
    let err = loop {
        let ev = next_event(&mut events).await;
        if ev["type"] == "error" {
            break ev;
        }
    };
    assert_eq!(err["code"], "invalid_mark_name", "{err}");
    say("", 640).await;
    let (frames, _) = carrier_reads(&mut ws, Duration::from_millis(300)).await;
    assert_eq!(
        frames, 1,
        "the refused message queued nothing; the next one plays"
    );
    send(&mut ws, &stop()).await;
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1000, "stop".to_owned())));
}

/// Bot audio beyond the call's bound is refused whole and told on NATS (`overload`,
/// `source: bot_audio`, with its mark); what was queued keeps playing.
#[tokio::test]
async fn bot_audio_over_the_bound_is_refused_and_told() {
    let (nats, bin, _collector) = setup(&[
        ("telephony.out_max_bytes", "65536"),
        ("telephony.out_max_age_ms", "5000"),
    ])
    .await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let mut events = client
        .subscribe("weir.voice.events.full")
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let mut ws = connect(&bin, "/v1/telephony/twilio").await;
    send(&mut ws, &connected()).await;
    send(&mut ws, &start("full", "audio/x-mulaw", 8000)).await;
    assert_eq!(next_event(&mut events).await["type"], "started");
    for mark in ["one", "two", "three"] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Weir-Mark", mark);
        client
            .publish_with_headers("weir.voice.out.full", headers, vec![0u8; 32_000].into())
            .await
            .expect("publish");
    }
    client.flush().await.expect("flush");
    let over = loop {
        let ev = next_event(&mut events).await;
        if ev["type"] == "overload" {
            break ev;
        }
    };
    assert_eq!(over["source"], "bot_audio", "{over}");
    assert_eq!(over["reason"], "queue_full", "{over}");
    assert_eq!(over["mark"], "three", "{over}");
    assert_eq!(over["frames"], 50, "{over}");
    let queued = bin.metric("weir_ingress_telephony_out_queue_bytes").await;
    assert!(queued <= 65_536.0, "{queued}");
    send(&mut ws, &stop()).await;
    let (_, close) = until_close(&mut ws).await;
    assert_eq!(close, Some((1000, "stop".to_owned())));
}
