//! WHIP ingest with an in-process Rust publisher (str0m over loopback UDP, Opus from
//! opus-pure; see `whip_support`), against the real `audio-ingress serve` binary and a
//! real `nats-server`: signalling (POST/DELETE/PATCH/OPTIONS), ICE + DTLS, the media
//! path into the stream queue, the `weir` data channel, the refusals shared with the
//! WebSocket door and the session lifecycle (a publisher that vanishes is reaped).
//!
//! Audio check: a 2 s 440 Hz tone in, the frames a plain NATS subscriber receives out;
//! similarity = normalized cross-correlation at the best lag within ±100 ms, required
//! ≥ 0.9 (Opus is lossy; a tone through it correlates > 0.99 here).

use std::time::{Duration, Instant};

use weir_audio_ingress::auth::{Claims, SigningKey, mint, unix_now_s};
use weir_testkit::NatsServer;

use crate::support;
use crate::whip_support;
use support::{Binary, http_get};
use whip_support::{
    Answer, best_ncc, offer, opus_packets, post_offer, record, request, tone, wait_for,
};

/// WHIP on a free loopback UDP port; a silent publisher is reaped after 1 s.
const WHIP: &[(&str, &str)] = &[
    ("whip_udp_listen", "127.0.0.1:0"),
    ("whip_disconnect_timeout_ms", "1000"),
];

async fn whip_json(bin: &Binary) -> serde_json::Value {
    let (status, body) = http_get(bin.admin, "/v1/whip").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

async fn delete(bin: &Binary, location: &str, headers: &[(&str, &str)]) -> Answer {
    request(bin.ws, "DELETE", location, headers, "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_publisher_streams_opus_and_delete_ends_the_stream() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), WHIP).await;
    let logs = record(nats.url()).await;
    let source = tone(2.0);
    let packets = opus_packets(&source);
    assert_eq!(packets.len(), 100);

    let o = offer().await;
    let answer = post_offer(bin.ws, "rust-1", &o.sdp, &[]).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(answer.headers["content-type"], "application/sdp");
    assert!(answer.body.contains("a=candidate"), "{}", answer.body);
    let publisher = o.answered(&answer);
    let location = publisher.location.clone();
    assert!(location.starts_with("/v1/whip/rust-1/"), "{location}");
    let seen = publisher.seen.clone();
    let started = Instant::now();
    let task = tokio::spawn(publisher.run(packets, 100, false, Duration::from_secs(10)));

    assert!(
        wait_for(&logs, Duration::from_secs(8), |l| l
            .get("rust-1")
            .is_some_and(|s| s.frames.len() >= 100))
        .await,
        "100 frames on NATS"
    );
    let connected = seen.lock().expect("seen").connected.expect("connected");
    eprintln!(
        "ICE+DTLS connected {:?} after the answer",
        connected - started
    );

    let del = delete(&bin, &location, &[]).await;
    assert_eq!(del.status, 200, "{del:?}");
    // DELETE answers once the end is handed to NATS: it arrives right after.
    assert!(
        wait_for(&logs, Duration::from_secs(2), |l| l
            .get("rust-1")
            .is_some_and(|s| s.end.is_some()))
        .await
    );
    let log = logs.lock().expect("logs")["rust-1"].clone();
    assert_eq!(log.end.as_deref(), Some("producer"));
    let seqs: Vec<u64> = log.frames.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
    let got: Vec<i16> = log
        .frames
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    let (ncc, lag) = best_ncc(&source, &got, 1_600);
    eprintln!("tone through WHIP: ncc {ncc:.4} at lag {lag} samples");
    assert!(ncc >= 0.9, "ncc {ncc} at lag {lag}");

    // The session closes; the resource is gone.
    let seen = tokio::time::timeout(Duration::from_secs(12), task)
        .await
        .expect("publisher ends")
        .expect("task");
    assert!(seen.channel_open, "the weir data channel opened");
    let closed: Vec<_> = seen
        .events
        .iter()
        .filter(|(_, e)| e["type"] == "closed")
        .collect();
    assert_eq!(closed.len(), 1, "{:?}", seen.types());
    assert_eq!(closed[0].1["reason"], "producer");
    assert_eq!(closed[0].1["frames_published"], 100);
    assert_eq!(closed[0].1["end_delivered"], true);
    assert!(seen.closed.is_some(), "the server closed ICE/DTLS");
    assert_eq!(delete(&bin, &location, &[]).await.status, 404);
    let w = whip_json(&bin).await;
    assert_eq!(w["active_sessions"], 0, "{w}");
    assert_eq!(
        w["sessions_lost"], 0,
        "a DELETE is not a lost publisher: {w}"
    );
    assert_eq!(w["media"]["packets"], 100, "{w}");
    assert_eq!(w["media"]["frames"], 100, "{w}");
    assert_eq!(w["media"]["concealed_frames"], 0, "{w}");
    assert_eq!(w["media"]["rtp_gaps"], 0, "{w}");
    eprintln!(
        "decode cost: mean {} us, max {} us per 20 ms packet",
        w["media"]["decode_us_mean"], w["media"]["decode_us_max"]
    );
    assert!(w["media"]["decode_us_mean"].as_f64().expect("mean") > 0.0);
    // The Prometheus view counts what the JSON view counts.
    assert_eq!(bin.metric("weir_ingress_whip_sessions_total").await, 1.0);
    assert_eq!(
        bin.metric("weir_ingress_whip_packets_decoded_total").await,
        100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_match_the_websocket_door_and_the_whip_rules() {
    let nats = NatsServer::start().expect("nats-server");
    let sets = [
        WHIP,
        &[
            ("whip_max_sessions", "2"),
            ("whip_max_sessions_per_ip", "2"),
        ],
    ]
    .concat();
    let bin = Binary::start_ready(nats.url(), &sets).await;
    let o = offer().await;

    // The same stream-id rules as the WebSocket door.
    for bad in ["a.b", "a%2Ab", "a%20b", &"x".repeat(300)] {
        let a = post_offer(bin.ws, bad, &o.sdp, &[]).await;
        assert_eq!(
            (a.status, a.code().as_str()),
            (400, "invalid_stream_id"),
            "{bad}: {a:?}"
        );
    }
    let a = post_offer(bin.ws, "ok", &o.sdp, &[]).await;
    assert_eq!(a.status, 201, "the same offer under a safe id: {a:?}");
    let wrong_type = request(
        bin.ws,
        "POST",
        "/v1/whip/t1",
        &[("Content-Type", "text/plain")],
        &o.sdp,
    )
    .await;
    assert_eq!(
        (wrong_type.status, wrong_type.code().as_str()),
        (415, "unsupported_media_type")
    );
    let garbage = post_offer(bin.ws, "t2", "hello", &[]).await;
    assert_eq!(
        (garbage.status, garbage.code().as_str()),
        (400, "invalid_offer"),
        "{garbage:?}"
    );
    let huge = post_offer(bin.ws, "t3", &"a".repeat(70_000), &[]).await;
    assert_eq!(
        (huge.status, huge.code().as_str()),
        (413, "offer_too_large"),
        "{huge:?}"
    );
    let no_audio = o.sdp.replace("m=audio", "m=video");
    let a = post_offer(bin.ws, "t4", &no_audio, &[]).await;
    assert_eq!(
        (a.status, a.code().as_str()),
        (400, "invalid_offer"),
        "{a:?}"
    );

    // "ok" is active (admitted above): a second offer for it is a duplicate.
    let dup = post_offer(bin.ws, "ok", &offer().await.sdp, &[]).await;
    assert_eq!(
        (dup.status, dup.code().as_str()),
        (409, "stream_active"),
        "{dup:?}"
    );
    // One more fits under whip_max_sessions = 2, the next does not.
    let second = post_offer(bin.ws, "second", &offer().await.sdp, &[]).await;
    assert_eq!(second.status, 201, "{second:?}");
    let over = post_offer(bin.ws, "third", &offer().await.sdp, &[]).await;
    assert_eq!(
        (over.status, over.code().as_str()),
        (503, "max_sessions"),
        "{over:?}"
    );
    assert_eq!(
        over.headers.get("retry-after").map(String::as_str),
        Some("1")
    );

    // Methods.
    let loc = second.headers["location"].clone();
    let patch = request(
        bin.ws,
        "PATCH",
        &loc,
        &[("Content-Type", "application/trickle-ice-sdpfrag")],
        "a=x",
    )
    .await;
    assert_eq!(
        (patch.status, patch.code().as_str()),
        (405, "trickle_not_supported")
    );
    assert!(patch.headers["allow"].contains("DELETE"));
    let opt = request(bin.ws, "OPTIONS", "/v1/whip/any", &[], "").await;
    assert_eq!(opt.status, 204);
    assert_eq!(opt.headers["accept-post"], "application/sdp");
    assert!(opt.headers["allow"].contains("POST"));
    let get = request(bin.ws, "GET", "/v1/whip/any", &[], "").await;
    assert_eq!(get.status, 405);
    let unknown = delete(
        &bin,
        "/v1/whip/second/00000000000000000000000000000000",
        &[],
    )
    .await;
    assert_eq!(unknown.status, 404);
    let wrong_stream = delete(&bin, &loc.replace("/second/", "/ok/"), &[]).await;
    assert_eq!(
        wrong_stream.status, 404,
        "a resource is only found under its own stream id"
    );
    // Both sessions never connect ICE (nobody drives the publishers): DELETE ends them.
    assert_eq!(delete(&bin, &loc, &[]).await.status, 200);
    let w = whip_json(&bin).await;
    assert!(w["offers_refused"].as_u64().expect("refused") >= 6, "{w}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_vanishes_is_reaped_with_producer_gone() {
    let nats = NatsServer::start().expect("nats-server");
    // Reaped after 1 s of silence, then parked 1 s for a resume (short timings: the
    // mechanism, not the defaults).
    let sets = [WHIP, &[("resume_window_ms", "1000")]].concat();
    let bin = Binary::start_ready(nats.url(), &sets).await;
    let logs = record(nats.url()).await;
    let packets = opus_packets(&tone(2.0));
    let o = offer().await;
    let answer = post_offer(bin.ws, "vanish-1", &o.sdp, &[]).await;
    let publisher = o.answered(&answer);
    let location = publisher.location.clone();
    let seen = publisher.seen.clone();
    // 50 packets (1 s), then silence: no DELETE, no DTLS close, no STUN.
    let task = tokio::spawn(publisher.run(packets, 50, true, Duration::from_secs(6)));
    assert!(
        wait_for(&logs, Duration::from_secs(8), |l| l
            .get("vanish-1")
            .is_some_and(|s| s.frames.len() >= 50))
        .await
    );
    let last_frame = Instant::now();
    assert!(
        wait_for(&logs, Duration::from_secs(5), |l| l
            .get("vanish-1")
            .is_some_and(|s| s.end.is_some()))
        .await,
        "the stream is ended"
    );
    let reaped_after = last_frame.elapsed();
    eprintln!("vanished publisher reaped {reaped_after:?} after its last frame");
    // whip_disconnect_timeout_ms = 1000, checked every 100 ms, then the 1 s window.
    assert!(
        reaped_after <= Duration::from_millis(3_500),
        "{reaped_after:?}"
    );
    let log = logs.lock().expect("logs")["vanish-1"].clone();
    assert_eq!(log.end.as_deref(), Some("producer_gone"));
    assert_eq!(log.frames.len(), 50);
    assert_eq!(delete(&bin, &location, &[]).await.status, 404);
    let w = whip_json(&bin).await;
    assert_eq!(
        (w["active_sessions"].as_u64(), w["sessions_lost"].as_u64()),
        (Some(0), Some(1)),
        "{w}"
    );
    let _ = task.await;
    assert!(seen.lock().expect("seen").connected.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_nats_an_offer_is_refused_not_ready() {
    let bin = Binary::start("nats://127.0.0.1:1", WHIP).await;
    let a = post_offer(bin.ws, "nr", &offer().await.sdp, &[]).await;
    assert_eq!((a.status, a.code().as_str()), (503, "not_ready"), "{a:?}");
    assert_eq!(a.headers.get("retry-after").map(String::as_str), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_tokens_are_checked_on_post_and_delete() {
    let nats = NatsServer::start().expect("nats-server");
    let secret = "0123456789abcdef0123456789abcdef";
    let sets = [
        WHIP,
        &[("auth_required", "true"), ("auth_hs256_secret", secret)],
    ]
    .concat();
    let bin = Binary::start_ready(nats.url(), &sets).await;
    let token = |stream: &str| {
        mint(
            SigningKey::Hs256(secret.as_bytes()),
            &Claims {
                exp: unix_now_s() + 60,
                stream: Some(stream.to_owned()),
                ..Claims::default()
            },
        )
        .expect("token")
    };
    let sdp = offer().await.sdp;
    let none = post_offer(bin.ws, "auth-1", &sdp, &[]).await;
    assert_eq!((none.status, none.code().as_str()), (401, "unauthorized"));
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    let other = format!("Bearer {}", token("someone-else"));
    let wrong = post_offer(bin.ws, "auth-1", &sdp, &[("Authorization", &other)]).await;
    assert_eq!((wrong.status, wrong.code().as_str()), (403, "forbidden"));
    let good = format!("Bearer {}", token("auth-1"));
    let ok = post_offer(bin.ws, "auth-1", &sdp, &[("Authorization", &good)]).await;
    assert_eq!(ok.status, 201, "{ok:?}");
    let loc = ok.headers["location"].clone();
    assert_eq!(delete(&bin, &loc, &[]).await.status, 401);
    assert_eq!(
        delete(&bin, &loc, &[("Authorization", &other)])
            .await
            .status,
        403
    );
    assert_eq!(
        delete(&bin, &loc, &[("Authorization", &good)]).await.status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_markers_reach_the_publisher_over_the_data_channel() {
    let nats = NatsServer::start().expect("nats-server");
    let sets = [WHIP, &[("policy", "gap"), ("extended_consumers", "true")]].concat();
    let bin = Binary::start_ready(nats.url(), &sets).await;
    let packets = opus_packets(&tone(6.0));
    let o = offer().await;
    let answer = post_offer(bin.ws, "gappy", &o.sdp, &[]).await;
    let publisher = o.answered(&answer);
    let location = publisher.location.clone();
    let task = tokio::spawn(publisher.run(packets, 300, false, Duration::from_secs(12)));
    // One second of audio, then NATS stopped for 2 s: the gap policy drops the oldest
    // frames and publishes markers once the server is back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    nats.pause().expect("SIGSTOP");
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.resume().expect("SIGCONT");
    // The rest of the 6 s, then DELETE.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(delete(&bin, &location, &[]).await.status, 200);
    let seen = tokio::time::timeout(Duration::from_secs(12), task)
        .await
        .expect("publisher ends")
        .expect("task");
    let types = seen.types();
    let gaps: Vec<_> = seen
        .events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["type"] == "gap")
        .collect();
    assert!(!gaps.is_empty(), "no gap event: {types:?}");
    for g in &gaps {
        let frames = g["frames"].as_u64().expect("frames");
        assert!(frames > 0, "{g}");
        assert_eq!(g["samples"].as_u64(), Some(frames * 320), "{g}");
        assert!(g["first_seq"].as_u64() <= g["last_seq"].as_u64(), "{g}");
    }
    assert_eq!(
        types.last().map(String::as_str),
        Some("closed"),
        "{types:?}"
    );
    assert!(
        !types.contains(&"overload".to_owned()),
        "gap never overloads: {types:?}"
    );
    eprintln!(
        "gap policy under a 2 s stall: {} gap events on the data channel",
        gaps.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_whip_streams_with_shutdown_and_closes_the_sessions() {
    let nats = NatsServer::start().expect("nats-server");
    let mut bin = Binary::start_ready(nats.url(), WHIP).await;
    let logs = record(nats.url()).await;
    let packets = opus_packets(&tone(4.0));
    let o = offer().await;
    let answer = post_offer(bin.ws, "sd", &o.sdp, &[]).await;
    let publisher = o.answered(&answer);
    let task = tokio::spawn(publisher.run(packets, 200, false, Duration::from_secs(10)));
    assert!(
        wait_for(&logs, Duration::from_secs(8), |l| l
            .get("sd")
            .is_some_and(|s| s.frames.len() >= 25))
        .await
    );
    let pid = bin.child.id().expect("pid");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(10), bin.child.wait())
        .await
        .expect("exits in time")
        .expect("wait");
    assert!(exit.success(), "{exit}");
    let seen = tokio::time::timeout(Duration::from_secs(12), task)
        .await
        .expect("publisher ends")
        .expect("task");
    let closed: Vec<_> = seen
        .events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["type"] == "closed")
        .collect();
    assert_eq!(closed.len(), 1, "{:?}", seen.types());
    assert_eq!(closed[0]["reason"], "shutdown");
    assert_eq!(closed[0]["end_delivered"], true);
    assert!(
        seen.closed.is_some(),
        "the session was closed before the exit"
    );
    assert!(
        wait_for(&logs, Duration::from_secs(2), |l| l
            .get("sd")
            .is_some_and(|s| s.end.is_some()))
        .await
    );
    assert_eq!(
        logs.lock().expect("logs")["sd"].end.as_deref(),
        Some("shutdown")
    );
}

/// `POST /v1/whip/{id}` from the loopback address 127.0.0.`last`: the status and the
/// error code (0 and "" when not answered within 5 s).
async fn post_from(last: u8, to: std::net::SocketAddr, id: &str, sdp: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, last], 0)))
            .ok()?;
        let mut s = socket.connect(to).await.ok()?;
        let req = format!(
            "POST /v1/whip/{id} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Content-Type: application/sdp\r\nContent-Length: {}\r\n\r\n{sdp}",
            sdp.len()
        );
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let code = text
            .split_once("\r\n\r\n")
            .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(b).ok())
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        Some((status, code))
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or((0, String::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_whip_session_nor_aim_stun_elsewhere() {
    let nats = NatsServer::start().expect("nats-server");
    // The default caps: 256 sessions, 64 from one address; connect timeout 10 s.
    let bin = Binary::start_ready(nats.url(), &[("whip_udp_listen", "127.0.0.1:0")]).await;
    // 300 offers that never connect, from 127.0.0.2; their one candidate is on
    // 127.0.0.1, not the HTTP client's address, so it is dropped.
    let sdp = offer().await.sdp;
    let mut created = 0;
    let mut per_ip = 0;
    for i in 0..300 {
        match post_from(2, bin.ws, &format!("flood-{i}"), &sdp).await {
            (201, _) => created += 1,
            (503, code) if code == "max_sessions_per_ip" => per_ip += 1,
            other => panic!("offer {i}: {other:?}"),
        }
    }
    assert_eq!((created, per_ip), (64, 236));
    let w = whip_json(&bin).await;
    assert_eq!(w["active_sessions"], 64, "{w}");
    assert_eq!(w["max_sessions_per_ip"], 64, "{w}");
    assert_eq!(w["candidates_dropped"], 64, "one per accepted offer: {w}");
    // A publisher from another address is created and connects at once.
    let o = offer().await;
    let answer = post_offer(bin.ws, "legit", &o.sdp, &[]).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let publisher = o.answered(&answer);
    let seen = publisher.seen.clone();
    let started = Instant::now();
    let task =
        tokio::spawn(publisher.run(opus_packets(&tone(0.2)), 10, false, Duration::from_secs(3)));
    let _ = task.await;
    let connected = seen.lock().expect("seen").connected;
    let connected = connected.expect("the publisher connected");
    eprintln!("connected {:?} after the answer", connected - started);
    assert!(connected - started < Duration::from_secs(3));
    assert_eq!(whip_json(&bin).await["candidates_dropped"], 64);
}

/// An announcement of worker `w-whip` for the default template (one partition).
fn whip_worker(seq: u64, max: u64, live: u64, listed: &[(&str, u64)]) -> Vec<u8> {
    use weir_protocol::capacity::{Announcement, OwnershipKind, StreamLoad, VERSION};
    let streams: Vec<StreamLoad> = listed
        .iter()
        .map(|(id, lag_ms)| StreamLoad {
            id: (*id).into(),
            lag_ms: *lag_ms,
        })
        .collect();
    Announcement {
        v: VERSION,
        worker: "w-whip".into(),
        instance: "w-whip-1".into(),
        seq,
        sent_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64,
        interval_ms: 1_000,
        subject: weir_protocol::partition::DEFAULT_STREAM_TEMPLATE.into(),
        partitions_total: 1,
        ownership: OwnershipKind::Static,
        lease_bucket: None,
        partitions: vec![0],
        max_streams: max,
        live_streams: live,
        lag_ms: streams.iter().map(|s| s.lag_ms).max().unwrap_or(0),
        rtf_p95: 0.5,
        streams_truncated: (streams.len() as u64) < live,
        streams,
    }
    .encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_events_reach_the_data_channel_and_a_full_worker_refuses_the_offer() {
    use weir_protocol::capacity::{Refusal, RefusalReason, VERSION};
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), WHIP).await;
    let nc = async_nats::connect(nats.url()).await.expect("connect");
    let packets = opus_packets(&tone(8.0));
    let o = offer().await;
    // Nothing announced yet: admitted.
    let answer = post_offer(bin.ws, "wcap", &o.sdp, &[]).await;
    let publisher = o.answered(&answer);
    let seen = std::sync::Arc::clone(&publisher.seen);
    let task = tokio::spawn(publisher.run(packets, 400, false, Duration::from_secs(12)));
    let has = |t: &str| seen.lock().expect("seen").types().iter().any(|x| x == t);
    // The worker lists the stream 900 ms behind (threshold 500 ms): `degraded`.
    let mut seq = 0;
    let deadline = Instant::now() + Duration::from_secs(8);
    while !has("degraded") {
        assert!(Instant::now() < deadline, "no degraded event");
        seq += 1;
        let body = whip_worker(seq, 8, 1, &[("wcap", 900)]);
        nc.publish("weir.capacity.announce.w-whip", body.into())
            .await
            .expect("publish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The worker refuses the stream: `closed` with `no_capacity`, then the session ends.
    let refusal = Refusal {
        v: VERSION,
        worker: "w-whip".into(),
        stream: "wcap".into(),
        reason: RefusalReason::MaxStreams,
        max_streams: 8,
        live_streams: 8,
        sent_at_ms: unix_now_s() * 1_000,
    };
    nc.publish("weir.capacity.refused.wcap", refusal.encode().into())
        .await
        .expect("publish");
    let seen = tokio::time::timeout(Duration::from_secs(12), task)
        .await
        .expect("publisher ends")
        .expect("task");
    let closed: Vec<_> = seen
        .events
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e["type"] == "closed")
        .collect();
    assert_eq!(closed.len(), 1, "{:?}", seen.types());
    assert_eq!(closed[0]["reason"], "no_capacity");
    let degraded = seen
        .events
        .iter()
        .map(|(_, e)| e)
        .find(|e| e["type"] == "degraded")
        .expect("degraded");
    assert_eq!(degraded["lag_ms"], 900);
    assert_eq!(degraded["threshold_ms"], 500);
    assert_eq!(degraded["worker"], "w-whip");
    assert!(
        seen.closed.is_some(),
        "the session ended: {:?}",
        seen.types()
    );

    // Every slot taken: a new offer is refused 503 `no_capacity` with `Retry-After`.
    let deadline = Instant::now() + Duration::from_secs(5);
    let refused = loop {
        seq += 1;
        nc.publish(
            "weir.capacity.announce.w-whip",
            whip_worker(seq, 1, 1, &[]).into(),
        )
        .await
        .expect("publish");
        nc.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let o = offer().await;
        let answer = post_offer(bin.ws, "wfull", &o.sdp, &[]).await;
        if answer.status == 503 {
            break answer;
        }
        assert_eq!(answer.status, 201, "{answer:?}");
        assert_eq!(
            delete(&bin, &answer.headers["location"], &[]).await.status,
            200
        );
        assert!(Instant::now() < deadline, "never refused");
    };
    assert_eq!(refused.code(), "no_capacity", "{refused:?}");
    assert!(refused.headers.contains_key("retry-after"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_with_the_token_resumes_the_stream_and_closes_the_old_one() {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), WHIP).await;
    let logs = record(nats.url()).await;
    let packets = opus_packets(&tone(2.0));

    let o = offer().await;
    let first = post_offer(bin.ws, "whip-res", &o.sdp, &[]).await;
    assert_eq!(first.status, 201, "{first:?}");
    let token = first.headers["weir-resume-token"].clone();
    assert_eq!(
        first.headers["weir-resume-window-ms"], "5000",
        "the default window"
    );
    let expose = &first.headers["access-control-expose-headers"];
    assert!(expose.contains("Weir-Resume-Token"), "{expose}");
    let old = o.answered(&first);
    let old_location = old.location.clone();
    let old_task = tokio::spawn(old.run(packets.clone(), 50, false, Duration::from_secs(10)));
    assert!(
        wait_for(&logs, Duration::from_secs(8), |l| l
            .get("whip-res")
            .is_some_and(|s| s.frames.len() >= 50))
        .await
    );

    // A blip: the publisher comes back with a new session and the token.
    let o = offer().await;
    let answer = post_offer(bin.ws, "whip-res", &o.sdp, &[("Weir-Resume-Token", &token)]).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert_eq!(
        answer.headers["weir-resume-token"], token,
        "the same stream"
    );
    let new = o.answered(&answer);
    let location = new.location.clone();
    assert_ne!(location, old_location);
    let new_task = tokio::spawn(new.run(packets, 50, false, Duration::from_secs(10)));

    assert!(
        wait_for(&logs, Duration::from_secs(8), |l| l
            .get("whip-res")
            .is_some_and(|s| s.frames.len() >= 100))
        .await,
        "the new session's frames on the same stream"
    );
    // At once: the publishers go silent after their packets, and a silent session is
    // reaped after 1 s.
    assert_eq!(delete(&bin, &location, &[]).await.status, 200);
    assert!(
        wait_for(&logs, Duration::from_secs(3), |l| l
            .get("whip-res")
            .is_some_and(|s| s.end.is_some()))
        .await
    );
    // The old session was told and closed.
    let old_seen = tokio::time::timeout(Duration::from_secs(12), old_task)
        .await
        .expect("old session closed")
        .expect("task");
    assert!(
        old_seen
            .events
            .iter()
            .any(|(_, e)| e["type"] == "error" && e["code"] == "taken_over"),
        "{:?}",
        old_seen.types()
    );
    assert!(old_seen.closed.is_some());
    assert_eq!(delete(&bin, &old_location, &[]).await.status, 404);
    let log = logs.lock().expect("logs")["whip-res"].clone();
    assert_eq!(
        log.end.as_deref(),
        Some("producer"),
        "one instance, one end"
    );
    let seqs: Vec<u64> = log.frames.iter().map(|(s, _)| *s).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order: {seqs:?}");
    assert_eq!(&seqs[..50], &(1..=50).collect::<Vec<_>>()[..]);
    assert!(
        seqs[50] > 51,
        "the time between the sessions is declared lost: {seqs:?}"
    );

    let seen = tokio::time::timeout(Duration::from_secs(12), new_task)
        .await
        .expect("new session ends")
        .expect("task");
    let types = seen.types();
    assert_eq!(
        types.first().map(String::as_str),
        Some("resumed"),
        "{types:?}"
    );
    let gap = seen
        .events
        .iter()
        .find(|(_, e)| e["type"] == "gap")
        .map(|(_, e)| e.clone())
        .expect("the resume gap is told");
    assert_eq!(gap["reason"], "resume", "{gap}");
    assert_eq!(gap["first_seq"], 51, "{gap}");
    assert_eq!(gap["last_seq"].as_u64(), Some(seqs[50] - 1), "{gap}");
    assert_eq!(
        bin.metric("weir_ingress_resumes_total{outcome=\"resumed\"}")
            .await,
        1.0
    );
}
