//! Streamed replies (`Weir-Stream: 1`) against a real nats-server: the event order
//! queued → started → chunk × N → end, refusals as the usual error reply, cancel by
//! request id, a caller that stops reading (aborted after its window, counted) or goes
//! away (no responders), `llm.status`, and the time to the first chunk.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Rig, STEP, connect, eventually, stream_body};
use futures::StreamExt;
use weir_llm_adapter::service::StatusReply;
use weir_llm_client::{ClientErrorKind, LlmClient, LlmEvent, LlmStream};
use weir_protocol::llm::ErrorCode;
use weir_protocol::llm::stream as s;

/// Collects a stream to its end (bounded by [`STEP`]).
async fn collect(mut st: LlmStream) -> Vec<Result<LlmEvent, ClientErrorKind>> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(STEP, async {
        while let Some(ev) = st.next().await {
            out.push(ev.map_err(|e| e.kind()));
        }
    })
    .await;
    out
}

#[tokio::test]
async fn queued_started_chunks_in_order_then_end() {
    let mut rig = Rig::with_sim_stream("workers = 1\nqueue_capacity = 8", 10, 200).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    // The first stream holds the only worker (~100 ms), so the second one waits.
    let first = llm
        .request(stream_body(20))
        .timeout(STEP)
        .stream()
        .await
        .expect("stream");
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    let second = llm
        .request(stream_body(30))
        .request_id("s-2")
        .timeout(STEP)
        .stream()
        .await
        .expect("stream");
    let (a, b) = tokio::join!(collect(first), collect(second));
    for (events, tokens) in [(&a, 20), (&b, 30)] {
        let mut text = Vec::new();
        let mut seqs = Vec::new();
        for ev in events.iter() {
            if let Ok(LlmEvent::Chunk { seq, data }) = ev {
                assert!(data.ends_with(b"\n\n"), "whole SSE events per chunk");
                seqs.push(*seq);
                text.extend_from_slice(data);
            }
        }
        let want: String = (0..tokens)
            .map(|i| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}]}}\n\n"))
            .chain(std::iter::once("data: [DONE]\n\n".to_owned()))
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&text),
            want,
            "deltas unchanged, in order"
        );
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
        assert!(
            seqs.len() < tokens as usize,
            "coalesced: {} messages for {tokens} tokens",
            seqs.len()
        );
        let Some(Ok(LlmEvent::End(end))) = events.last() else {
            panic!("ends with end: {events:?}")
        };
        assert_eq!(end.chunks, seqs.len() as u64);
        assert_eq!(end.bytes, text.len() as u64);
        assert!(end.ttft.is_some() && end.inference_time.is_some());
        assert_eq!(
            end.backend.as_deref(),
            Some("default"),
            "Weir-Backend on end"
        );
    }
    // The second: queued (position 1) → started (after waiting) → chunks → end.
    let Some(Ok(LlmEvent::Queued { position, .. })) = b.first() else {
        panic!("queued first: {b:?}")
    };
    assert_eq!(*position, 1);
    let Some(Ok(LlmEvent::Started { queue_time })) = b.get(1) else {
        panic!("started second: {b:?}")
    };
    assert!(queue_time.expect("queue wait") > Duration::from_millis(50));
    // The first did not wait: no queued event.
    assert!(
        matches!(a.first(), Some(Ok(LlmEvent::Started { .. }))),
        "{a:?}"
    );
    let stats = rig.adapter().stats();
    assert_eq!(stats.stream.started, 2);
    assert_eq!(stats.stream.ttft_ms.count, 2);
    assert!(stats.stream.chunks >= 2);
    rig.shutdown().await;
}

#[tokio::test]
async fn a_refusal_replaces_the_events_with_the_usual_error_reply() {
    let mut rig = Rig::with_sim_stream("workers = 1\nqueue_capacity = 1", 10, 50).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let running = llm
        .request(stream_body(20))
        .timeout(STEP)
        .stream()
        .await
        .expect("1");
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    let queued = llm
        .request(stream_body(5))
        .timeout(STEP)
        .stream()
        .await
        .expect("2");
    eventually(STEP, || rig.adapter().stats().queued_now == 1).await;
    let refused = collect(
        llm.request(stream_body(5))
            .timeout(STEP)
            .stream()
            .await
            .expect("3"),
    )
    .await;
    assert_eq!(
        refused,
        vec![Err(ClientErrorKind::Server(ErrorCode::QueueFull))],
        "one error reply, nothing else"
    );
    // A malformed Weir-Stream value is invalid_request, never ignored.
    let mut hm = async_nats::HeaderMap::new();
    hm.insert(s::STREAM, "yes");
    let r = rig
        .caller
        .request_with_headers("llm.infer", hm, Bytes::from_static(b"{}"))
        .await
        .expect("reply");
    let rh = r.headers.expect("headers");
    assert_eq!(
        rh.get("Weir-Error-Code").map(|v| v.as_str()),
        Some("invalid_request")
    );
    drop((running, queued));
    rig.shutdown().await;
}

#[tokio::test]
async fn cancel_by_request_id_stops_the_stream() {
    let mut rig = Rig::with_sim_stream("workers = 1", 5, 100).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let mut st = llm
        .request(stream_body(1000))
        .request_id("long-1")
        .timeout(STEP)
        .stream()
        .await
        .expect("stream");
    // Read until a chunk arrived, then cancel.
    loop {
        match tokio::time::timeout(STEP, st.next()).await.expect("event") {
            Some(Ok(LlmEvent::Chunk { .. })) => break,
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    let c = llm.cancel("long-1").await.expect("cancel");
    assert_eq!(c.result, "running");
    let rest = collect(st).await;
    assert_eq!(
        rest.last(),
        Some(&Err(ClientErrorKind::Server(ErrorCode::Cancelled))),
        "{rest:?}"
    );
    eventually(STEP, || rig.sim().stats().aborted == 1).await;
    rig.shutdown().await;
}

/// A raw NATS caller that asks for a stream and reads only what it is told to.
async fn raw_stream(client: &async_nats::Client, body: String) -> async_nats::Subscriber {
    let inbox = client.new_inbox();
    let sub = client.subscribe(inbox.clone()).await.expect("subscribe");
    let mut hm = async_nats::HeaderMap::new();
    hm.insert(s::STREAM, "1");
    client
        .publish_with_reply_and_headers("llm.infer", inbox, hm, body.into())
        .await
        .expect("publish");
    sub
}

fn event(m: &async_nats::Message) -> String {
    m.headers
        .as_ref()
        .and_then(|h| h.get(s::STREAM_EVENT))
        .map(|v| v.as_str().to_owned())
        .unwrap_or_default()
}

#[tokio::test]
async fn a_caller_that_stops_acknowledging_is_aborted_after_its_window() {
    let mut rig = Rig::with_sim_stream(
        "workers = 1\n[stream]\nwindow = 4\nack_timeout_ms = 300\nchunk_interval_ms = 0",
        1,
        1000,
    )
    .await;
    let caller = connect(rig.server.url()).await;
    let mut sub = raw_stream(&caller, stream_body(100_000)).await;
    // Never acknowledge: read chunks until the error reply arrives.
    let mut chunks = 0;
    let mut fourth_at = None;
    let err = loop {
        let m = tokio::time::timeout(STEP, sub.next())
            .await
            .expect("in time")
            .expect("msg");
        match event(&m).as_str() {
            "chunk" => {
                chunks += 1;
                if chunks == 4 {
                    fourth_at = Some(Instant::now());
                }
            }
            "error" => break m,
            _ => {}
        }
    };
    let waited = fourth_at.expect("4 chunks").elapsed();
    assert_eq!(chunks, 4, "exactly one window of chunks");
    let hm = err.headers.expect("headers");
    assert_eq!(
        hm.get("Weir-Error-Code").map(|v| v.as_str()),
        Some("cancelled")
    );
    eprintln!(
        "caller stopped acknowledging: aborted {waited:?} after the window filled (ack timeout 300 ms)"
    );
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_millis(600),
        "{waited:?}"
    );
    let stats = rig.adapter().stats();
    assert_eq!(stats.stream.aborted.get("caller_stalled"), Some(&1));
    eventually(STEP, || rig.sim().stats().aborted == 1).await;
    rig.shutdown().await;
}

#[tokio::test]
async fn a_caller_that_goes_away_is_noticed_by_no_responders() {
    let mut rig = Rig::with_sim_stream("workers = 1\n[stream]\nwindow = 0", 1, 200).await;
    let caller = connect(rig.server.url()).await;
    let mut sub = raw_stream(&caller, stream_body(100_000)).await;
    loop {
        let m = tokio::time::timeout(STEP, sub.next())
            .await
            .expect("in time")
            .expect("msg");
        if event(&m) == "chunk" {
            break;
        }
    }
    let gone_at = Instant::now();
    sub.unsubscribe().await.expect("unsubscribe");
    eventually(STEP, || {
        rig.adapter().stats().stream.aborted.get("caller_gone") == Some(&1)
    })
    .await;
    eprintln!(
        "caller gone: aborted {:?} after it unsubscribed",
        gone_at.elapsed()
    );
    assert!(gone_at.elapsed() < Duration::from_secs(1));
    eventually(STEP, || rig.sim().stats().aborted == 1).await;
    rig.shutdown().await;
}

async fn status(client: &async_nats::Client, rid: &str) -> StatusReply {
    let m = tokio::time::timeout(STEP, client.request("llm.status", rid.to_owned().into()))
        .await
        .expect("in time")
        .expect("reply");
    serde_json::from_slice(&m.payload).expect("status json")
}

#[tokio::test]
async fn status_by_request_id_queued_running_done_not_found() {
    let mut rig = Rig::with_sim_stream("workers = 1\nqueue_capacity = 8", 5, 100).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let a = llm
        .request(stream_body(30))
        .request_id("st-a")
        .timeout(STEP)
        .stream()
        .await
        .expect("a");
    let b = llm
        .request(stream_body(3))
        .request_id("st-b")
        .timeout(STEP)
        .stream()
        .await
        .expect("b");
    eventually(STEP, || rig.adapter().stats().queued_now == 1).await;
    let sa = status(&rig.caller, "st-a").await;
    assert_eq!(sa.status, "running");
    assert!(sa.elapsed_ms.is_some());
    let sb = status(&rig.caller, "st-b").await;
    assert_eq!((sb.status.as_str(), sb.position), ("queued", Some(1)));
    assert_eq!(status(&rig.caller, "nobody").await.status, "not_found");
    let (ea, eb) = tokio::join!(collect(a), collect(b));
    assert!(matches!(ea.last(), Some(Ok(LlmEvent::End(_)))));
    assert!(matches!(eb.last(), Some(Ok(LlmEvent::End(_)))));
    assert_eq!(status(&rig.caller, "st-b").await.status, "done");
    let bad = rig
        .caller
        .request("llm.status", Bytes::from_static(b"has space"))
        .await
        .expect("reply");
    assert_eq!(
        bad.headers
            .and_then(|h| h.get("Weir-Error-Code").map(|v| v.as_str().to_owned())),
        Some("invalid_request".to_owned())
    );
    rig.shutdown().await;
}

#[tokio::test]
async fn unary_callers_of_a_streaming_body_are_unchanged() {
    let mut rig = Rig::with_sim_stream("workers = 2", 1, 1000).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    // Without Weir-Stream the sim answers the unary way (echo), as before.
    let r = llm
        .request(stream_body(5))
        .timeout(STEP)
        .send()
        .await
        .expect("unary");
    assert_eq!(&r.body[..], stream_body(5).as_bytes());
    assert_eq!(rig.adapter().stats().stream.started, 0);
    rig.shutdown().await;
}

#[tokio::test]
async fn the_streaming_call_keeps_the_local_session_cap() {
    let mut rig = Rig::with_sim_stream("workers = 2", 5, 100).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer")
        .local_session_cap(std::num::NonZeroUsize::new(1));
    let first = llm
        .request(stream_body(20))
        .session("call-1")
        .timeout(STEP)
        .stream()
        .await
        .expect("first");
    let second = llm
        .request(stream_body(20))
        .session("call-1")
        .timeout(STEP)
        .stream()
        .await;
    assert_eq!(
        second.err().map(|e| e.kind()),
        Some(ClientErrorKind::LocalSessionCap),
        "refused locally while the first stream holds the slot"
    );
    assert!(matches!(
        collect(first).await.last(),
        Some(Ok(LlmEvent::End(_)))
    ));
    // The slot went with the finished stream.
    let third = llm
        .request(stream_body(2))
        .session("call-1")
        .timeout(STEP)
        .stream()
        .await
        .expect("third");
    assert!(matches!(
        collect(third).await.last(),
        Some(Ok(LlmEvent::End(_)))
    ));
    rig.shutdown().await;
}

#[tokio::test]
async fn a_streaming_retry_with_the_same_id_joins_and_is_told_so() {
    let mut rig = Rig::with_sim_stream("workers = 1", 5, 100).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let first = llm
        .request(stream_body(10))
        .request_id("same-1")
        .timeout(STEP)
        .stream()
        .await
        .expect("first");
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    let retry = llm
        .request(stream_body(10))
        .request_id("same-1")
        .timeout(STEP)
        .stream()
        .await
        .expect("retry");
    let (a, b) = tokio::join!(collect(first), collect(retry));
    let Some(Ok(LlmEvent::End(ea))) = a.last() else {
        panic!("{a:?}")
    };
    assert!(!ea.joined && ea.chunks > 0, "{ea:?}");
    assert_eq!(b.len(), 1, "the joiner gets only end: {b:?}");
    let Some(Ok(LlmEvent::End(eb))) = b.last() else {
        panic!("{b:?}")
    };
    assert!(eb.joined && eb.chunks == 0 && eb.bytes == 0, "{eb:?}");
    // From the completion cache, the same.
    let cached = collect(
        llm.request(stream_body(10))
            .request_id("same-1")
            .timeout(STEP)
            .stream()
            .await
            .expect("cached"),
    )
    .await;
    assert!(
        matches!(cached.as_slice(), [Ok(LlmEvent::End(e))] if e.joined),
        "{cached:?}"
    );
    assert_eq!(rig.sim().stats().started, 1, "inference ran once");
    rig.shutdown().await;
}

/// The queue time of a unary request, from its `Weir-Queue-Ms` reply header.
async fn unary_queue_ms(client: &async_nats::Client) -> f64 {
    let r = tokio::time::timeout(STEP, client.request("llm.infer", Bytes::from_static(b"{}")))
        .await
        .expect("in time")
        .expect("reply");
    let hm = r.headers.expect("headers");
    assert_eq!(hm.get("Weir-Error-Code"), None, "{hm:?}");
    hm.get(weir_protocol::llm::headers::QUEUE_MS)
        .and_then(|v| v.as_str().parse().ok())
        .expect("Weir-Queue-Ms")
}

#[tokio::test]
async fn a_running_stream_never_holds_back_a_unary_request_while_a_worker_is_free() {
    // Two workers, idle and waiting; a stream of 20 tokens at 10/s holds one ~2 s.
    let mut rig = Rig::with_sim_stream("workers = 2", 0, 10).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let llm = LlmClient::new(rig.caller.clone(), "llm.infer");
    let t0 = Instant::now();
    let st = llm
        .request(stream_body(20))
        .timeout(STEP)
        .stream()
        .await
        .expect("stream");
    // Read (and so acknowledge) the stream meanwhile.
    let reader = tokio::spawn(collect(st));
    eventually(STEP, || rig.adapter().stats().running_now == 1).await;
    // Unary requests one after the other: each finds the other worker free.
    let mut queue_ms = Vec::new();
    for _ in 0..3 {
        queue_ms.push(unary_queue_ms(&rig.caller).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let events = reader.await.expect("reader");
    let stream_took = t0.elapsed();
    assert!(
        matches!(events.last(), Some(Ok(LlmEvent::End(_)))),
        "{events:?}"
    );
    eprintln!("unary queue times behind a {stream_took:?} stream: {queue_ms:?} ms");
    assert!(
        stream_took >= Duration::from_millis(1500),
        "{stream_took:?}"
    );
    assert!(
        queue_ms.iter().all(|&q| q < 200.0),
        "a unary request waited for the stream: {queue_ms:?} ms"
    );
    rig.shutdown().await;
}
