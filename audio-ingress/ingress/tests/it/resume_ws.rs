//! Resumable WebSocket streams against the real binary and a real nats-server: a
//! connection cut at socket level (RST, not a close) and resumed with the stream's
//! token continues the same stream instance, the frames in between declared lost; bad
//! resumes are refused with distinct codes; racing resumes leave one producer.
//!
//! Timings: the first test runs the **default** configuration (5 s window); the
//! refusal test shortens `resume_window_ms` to 1 s to prove the expiry mechanism
//! without waiting 5 s.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{self, Message};
use weir_audio_producer::testing::{Collector, STEP, pcm, wait_until};
use weir_protocol::audio::extension::{EndReason, PossibleLossReason};
use weir_testkit::NatsServer;

use crate::support::{self, Binary};

type Ws = WebSocketStream<TcpStream>;

/// Opens `path` on its own TCP connection (so that the test can cut it with a reset).
async fn connect(bin: &Binary, path: &str) -> Result<Ws, tungstenite::Error> {
    let tcp = TcpStream::connect(bin.ws).await.expect("tcp");
    let url = format!("ws://{}{path}", bin.ws);
    tokio::time::timeout(STEP, tokio_tungstenite::client_async(url, tcp))
        .await
        .expect("upgrade in time")
        .map(|(ws, _)| ws)
}

/// Cuts the connection at socket level: linger 0, then drop (the kernel sends RST).
fn cut(ws: Ws) {
    #[allow(deprecated)]
    ws.get_ref()
        .set_linger(Some(Duration::ZERO))
        .expect("linger");
    drop(ws);
}

/// The next text event (skipping `ack`s unless `acks`).
async fn next_event(ws: &mut Ws, acks: bool) -> Value {
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("event in time")
            .expect("open")
            .expect("ok");
        if let Message::Text(t) = msg {
            let ev: Value = serde_json::from_str(t.as_str()).expect("JSON");
            if acks || ev["type"] != "ack" {
                return ev;
            }
        }
    }
}

/// Reads events until the close frame: (events without acks, close code).
async fn until_close(ws: &mut Ws) -> (Vec<Value>, Option<u16>) {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(STEP, ws.next())
            .await
            .expect("in time")
        {
            Some(Ok(Message::Text(t))) => {
                let ev: Value = serde_json::from_str(t.as_str()).expect("JSON");
                if ev["type"] != "ack" {
                    events.push(ev);
                }
            }
            Some(Ok(Message::Close(f))) => return (events, f.map(|f| u16::from(f.code))),
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return (events, None),
        }
    }
}

async fn send_frames(ws: &mut Ws, seqs: std::ops::RangeInclusive<u64>) {
    for seq in seqs {
        ws.send(Message::Binary(pcm(seq))).await.expect("frame");
    }
}

/// Waits for an `ack` of at least `seq` (the door acknowledges once a second).
async fn acked(ws: &mut Ws, seq: u64) -> u64 {
    loop {
        let ev = next_event(ws, true).await;
        if ev["type"] == "ack" && ev["seq"].as_u64().unwrap_or(0) >= seq {
            return ev["seq"].as_u64().unwrap_or(0);
        }
    }
}

fn resume_path(id: &str, token: &str, last_seq: u64, next_seq: u64) -> String {
    format!("/v1/streams/{id}?resume_token={token}&last_seq={last_seq}&next_seq={next_seq}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_resumes_the_same_stream_with_the_loss_declared() {
    let nats = NatsServer::start().expect("nats-server");
    let collector = Collector::start(nats.url(), "inference.whisper.stream.*").await;
    let bin = Binary::start_ready(nats.url(), &[]).await;

    let mut ws = connect(&bin, "/v1/streams/flap-1").await.expect("open");
    let opened = next_event(&mut ws, false).await;
    assert_eq!(opened["type"], "opened", "{opened}");
    assert_eq!(opened["resume_window_ms"], 5000, "the default window");
    let token = opened["resume_token"].as_str().expect("token").to_owned();
    send_frames(&mut ws, 1..=30).await;
    let last = acked(&mut ws, 30).await;
    assert_eq!(last, 30);
    // Frames 31 and 32 were offered into the dying connection: never sent here.
    cut(ws);

    let mut ws = connect(&bin, &resume_path("flap-1", &token, 30, 33))
        .await
        .expect("resumed");
    let resumed = next_event(&mut ws, false).await;
    assert_eq!(resumed["type"], "resumed", "{resumed}");
    assert_eq!(resumed["seq"], 30);
    assert_eq!(resumed["next_seq"], 33);
    assert_eq!(resumed["gap"]["first_seq"], 31);
    assert_eq!(resumed["gap"]["last_seq"], 32);
    assert_eq!(resumed["gap"]["frames"], 2);
    assert_eq!(resumed["gap"]["samples"], 640);
    assert_eq!(resumed["resume_token"], token.as_str());
    // Told as a gap too (declared in a header under the default `close` policy).
    let gap = next_event(&mut ws, false).await;
    assert_eq!(
        (
            &gap["type"],
            &gap["reason"],
            &gap["first_seq"],
            &gap["last_seq"]
        ),
        (&"gap".into(), &"resume".into(), &31.into(), &32.into()),
        "{gap}"
    );
    send_frames(&mut ws, 33..=40).await;
    ws.send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("end");
    let (events, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1000), "{events:?}");
    let closed = events.last().expect("closed");
    assert_eq!(closed["reason"], "producer", "{events:?}");

    assert!(
        wait_until(STEP, || collector.log("flap-1").end.is_some()).await,
        "the one end arrives"
    );
    let log = collector.log("flap-1");
    let end = log.end.as_ref().expect("end");
    assert_eq!(end.packet.seq, 41, "one stream instance: seq went on");
    assert_eq!(end.ext.end_reason, Some(EndReason::Producer));
    assert!(log.in_order(), "{:?}", log.seqs);
    let expected: Vec<u64> = (1..=30).chain(33..=40).collect();
    assert_eq!(log.frames, expected, "no duplicate, nothing out of order");
    // The default `close` policy declares the loss on the next packet.
    let (carrier, decl) = log
        .declarations
        .iter()
        .find(|(_, d)| d.reason == PossibleLossReason::Resume)
        .expect("the resume loss is declared");
    assert_eq!(*carrier, 33);
    assert_eq!((decl.first_seq, decl.last_seq, decl.frames), (31, 32, 2));
    assert_eq!(
        log.missing(),
        vec![31, 32],
        "the declared hole, nothing else"
    );
    assert_eq!(
        bin.metric("weir_ingress_resumes_total{outcome=\"resumed\"}")
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_resumes_are_refused_with_distinct_codes_and_leave_the_stream_parked() {
    let nats = NatsServer::start().expect("nats-server");
    let collector = Collector::start(nats.url(), "inference.whisper.stream.*").await;
    // A 1 s window: the expiry mechanism, not the default.
    let bin = Binary::start_ready(nats.url(), &[("resume_window_ms", "1000")]).await;
    let refused = |r: Result<Ws, tungstenite::Error>, what: &str| {
        let (status, _, body) = support::refusal(what, r);
        (
            status,
            body["error"]["code"].as_str().unwrap_or("").to_owned(),
        )
    };

    let mut a = connect(&bin, "/v1/streams/res-a").await.expect("a");
    let ta = next_event(&mut a, false).await["resume_token"]
        .as_str()
        .expect("token")
        .to_owned();
    let mut b = connect(&bin, "/v1/streams/res-b").await.expect("b");
    let tb = next_event(&mut b, false).await["resume_token"]
        .as_str()
        .expect("token")
        .to_owned();
    send_frames(&mut a, 1..=5).await;
    acked(&mut a, 5).await;
    // A resume the door refuses never cuts off the live producer.
    let r = connect(&bin, &resume_path("res-a", &ta, 9, 10)).await;
    assert_eq!(refused(r, "ahead, live"), (409, "resume_ahead".into()));
    let r = connect(
        &bin,
        &format!("/v1/streams/res-a?resume_token={ta}&last_seq=5"),
    )
    .await;
    assert_eq!(refused(r, "no next_seq"), (400, "invalid_request".into()));
    send_frames(&mut a, 6..=6).await;
    assert_eq!(acked(&mut a, 6).await, 6, "the live connection goes on");
    cut(a);

    let forged = "A".repeat(ta.len());
    let r = connect(&bin, &resume_path("res-a", &forged, 6, 7)).await;
    assert_eq!(refused(r, "forged"), (401, "resume_invalid".into()));
    let r = connect(&bin, &resume_path("res-a", "not-a-token", 6, 7)).await;
    assert_eq!(refused(r, "malformed"), (401, "resume_invalid".into()));
    let r = connect(&bin, &resume_path("res-a", &tb, 6, 7)).await;
    assert_eq!(refused(r, "cross-stream"), (403, "resume_mismatch".into()));
    let r = connect(&bin, &resume_path("res-a", &ta, 7, 8)).await;
    assert_eq!(refused(r, "seq ahead"), (409, "resume_ahead".into()));
    let r = connect(&bin, &resume_path("res-a", &ta, 6, 6)).await;
    assert_eq!(
        refused(r, "next_seq behind"),
        (400, "invalid_request".into())
    );
    let r = connect(&bin, &resume_path("res-a", &ta, 6, 1_000_000)).await;
    assert_eq!(refused(r, "absurd loss"), (400, "invalid_request".into()));
    let r = connect(&bin, "/v1/streams/res-a?resume_token=x&last_seq=-1").await;
    assert_eq!(refused(r, "bad number"), (400, "invalid_request".into()));

    // Every refusal left the stream parked: the real resume still works.
    let mut a = connect(&bin, &resume_path("res-a", &ta, 6, 7))
        .await
        .expect("resume after refusals");
    assert_eq!(next_event(&mut a, false).await["type"], "resumed");
    send_frames(&mut a, 7..=7).await;
    a.send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("end");
    let (_, code) = until_close(&mut a).await;
    assert_eq!(code, Some(1000));
    // Reused after the end.
    let r = connect(&bin, &resume_path("res-a", &ta, 7, 8)).await;
    assert_eq!(refused(r, "after the end"), (410, "resume_ended".into()));

    // Past the window: the stream ended `producer_gone`, the token is expired.
    cut(b);
    assert!(
        wait_until(STEP, || collector.log("res-b").end.is_some()).await,
        "the parked stream ends after the window"
    );
    let end = collector.log("res-b").end.expect("end");
    assert_eq!(end.ext.end_reason, Some(EndReason::ProducerGone));
    let r = connect(&bin, &resume_path("res-b", &tb, 0, 1)).await;
    assert_eq!(refused(r, "expired"), (410, "resume_expired".into()));
    assert_eq!(
        collector.log("res-a").end.expect("a ended").packet.seq,
        8,
        "a stayed one instance through the refusals"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_resumes_leave_exactly_one_producer() {
    let nats = NatsServer::start().expect("nats-server");
    let collector = Collector::start(nats.url(), "inference.whisper.stream.*").await;
    let bin = Binary::start_ready(nats.url(), &[]).await;

    let mut old = connect(&bin, "/v1/streams/race-1").await.expect("open");
    let token = next_event(&mut old, false).await["resume_token"]
        .as_str()
        .expect("token")
        .to_owned();
    send_frames(&mut old, 1..=5).await;
    acked(&mut old, 5).await;
    // The old connection is still up: two resumes race for the stream.
    let path = resume_path("race-1", &token, 5, 6);
    let (r1, r2) = tokio::join!(connect(&bin, &path), connect(&bin, &path));
    // The old connection is told and closed with 4001.
    let (events, code) = until_close(&mut old).await;
    assert_eq!(code, Some(4001), "{events:?}");
    assert_eq!(events.last().expect("error")["code"], "taken_over");
    // Of the two, exactly one holds the stream in the end: an accepted one that was
    // then taken over is closed with 4001 too; a refused one got 409 taken_over.
    let mut live = Vec::new();
    for r in [r1, r2] {
        match r {
            Ok(mut ws) => {
                let first = next_event(&mut ws, false).await;
                assert_eq!(first["type"], "resumed", "{first}");
                live.push(ws);
            }
            Err(e) => {
                let (status, _, body) = support::refusal("the losing resume", Err::<(), _>(e));
                assert_eq!(
                    (status, body["error"]["code"].as_str()),
                    (409, Some("taken_over"))
                );
            }
        }
    }
    let mut survivor = None;
    for mut ws in live {
        // A taken-over connection gets its close at once; the survivor gets nothing.
        match tokio::time::timeout(Duration::from_millis(500), ws.next()).await {
            Err(_) => {
                assert!(survivor.is_none(), "two producers hold the stream");
                survivor = Some(ws);
            }
            Ok(msg) => {
                let (events, code) = match msg {
                    Some(Ok(Message::Text(t))) => {
                        let ev: Value = serde_json::from_str(t.as_str()).expect("JSON");
                        let (mut rest, code) = until_close(&mut ws).await;
                        rest.insert(0, ev);
                        (rest, code)
                    }
                    Some(Ok(Message::Close(f))) => (vec![], f.map(|f| u16::from(f.code))),
                    other => panic!("unexpected {other:?}"),
                };
                assert_eq!(code, Some(4001), "{events:?}");
            }
        }
    }
    let mut ws = survivor.expect("exactly one producer holds the stream");
    send_frames(&mut ws, 6..=8).await;
    ws.send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("end");
    let (_, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1000));
    assert!(wait_until(STEP, || collector.log("race-1").end.is_some()).await);
    let log = collector.log("race-1");
    assert_eq!(log.frames, (1..=8).collect::<Vec<u64>>());
    assert_eq!(log.end.expect("end").packet.seq, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_open_of_a_parked_stream_starts_a_new_instance() {
    let nats = NatsServer::start().expect("nats-server");
    let collector = Collector::start(nats.url(), "inference.whisper.stream.*").await;
    let bin = Binary::start_ready(nats.url(), &[]).await;

    let mut ws = connect(&bin, "/v1/streams/plain-1").await.expect("open");
    send_frames(&mut ws, 1..=3).await;
    acked(&mut ws, 3).await;
    cut(ws);
    // Once the door noticed (until then the id is attached: 409 `stream_active`, as
    // before resume existed)...
    let deadline = tokio::time::Instant::now() + STEP;
    while bin.metric("weir_ingress_resume_parked_total").await < 1.0 {
        assert!(tokio::time::Instant::now() < deadline, "never parked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... a producer without resume support reconnects: as before resume existed, the
    // old instance ends (`producer_gone`) and a new one starts from seq 1.
    let mut ws = connect(&bin, "/v1/streams/plain-1")
        .await
        .expect("a new instance");
    assert_eq!(next_event(&mut ws, false).await["type"], "opened");
    send_frames(&mut ws, 1..=2).await;
    ws.send(Message::Text(r#"{"type":"end"}"#.into()))
        .await
        .expect("end");
    let (events, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1000), "{events:?}");
    assert!(
        wait_until(STEP, || collector.log("plain-1").frames.len() == 5).await,
        "{:?}",
        collector.log("plain-1").seqs
    );
    assert_eq!(collector.log("plain-1").frames, vec![1, 2, 3, 1, 2]);
}
