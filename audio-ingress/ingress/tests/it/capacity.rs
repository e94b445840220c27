//! Admission by recognition capacity end to end: the service in process against a
//! real nats-server; the tests play the recognition workers with plain NATS publishes
//! of `weir_protocol::capacity::Announcement` / `Refusal` (what a worker in any
//! language sends), and a WebSocket producer (tokio-tungstenite).

use std::num::NonZeroU32;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use weir_audio_ingress::service::RunningService;
use weir_audio_producer::jetstream::NatsSink;
use weir_audio_producer::testing::{STEP, pcm, wait_until};
use weir_protocol::StreamId;
use weir_protocol::capacity::{
    Announcement, OwnershipKind, Refusal, RefusalReason, StreamLoad, VERSION, announce_subject,
    refused_subject,
};
use weir_protocol::partition::partition_of;
use weir_testkit::{NatsServer, NatsServerOptions};

use crate::support;

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;
type Svc = RunningService<NatsSink>;

const PREFIX: &str = "weir.capacity";
/// A short announcement interval: a silent worker is gone 1 s after its last one (long
/// enough for the steps between two announcements on a loaded machine).
const INTERVAL_MS: u64 = 400;

async fn start(nats_url: &str, extra: &[(&str, &str)]) -> Svc {
    let mut overrides = vec![
        ("nats.connection_timeout_ms", "500"),
        ("subject", "audio.{partition}.{stream}"),
        ("partitions", "4"),
        ("capacity.max_lag_ms", "500"),
    ];
    overrides.extend_from_slice(extra);
    support::start_in_process(nats_url, &overrides).await
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

/// A worker of the service's template: `partitions` of 4, `max`/`live` slots.
fn ann(worker: &str, seq: u64, partitions: Vec<u32>, max: u64, live: u64) -> Announcement {
    Announcement {
        v: VERSION,
        worker: worker.to_owned(),
        instance: format!("{worker}-1"),
        seq,
        sent_at_ms: unix_ms(),
        interval_ms: INTERVAL_MS,
        subject: "audio.{partition}.{stream}".to_owned(),
        partitions_total: 4,
        ownership: OwnershipKind::Static,
        lease_bucket: None,
        partitions,
        max_streams: max,
        live_streams: live,
        lag_ms: 0,
        rtf_p95: 0.4,
        streams: Vec::new(),
        streams_truncated: live > 0,
    }
}

/// Publishes `a` (its `seq` moved on and sent now, so that a repeat is not a replay)
/// until the service's view has its worker live: the service's subscription may not
/// be on the server yet when the test publishes first.
async fn announce(svc: &Svc, client: &async_nats::Client, a: &mut Announcement) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        a.seq += 1;
        a.sent_at_ms = unix_ms();
        publish(client, announce_subject(PREFIX, &a.worker), a.encode()).await;
        let cap = svc.capacity().expect("capacity on");
        if wait_until(Duration::from_millis(100), || cap.is_live(&a.worker)).await {
            return;
        }
        assert!(Instant::now() < deadline, "{} never heard", a.worker);
    }
}

async fn publish(client: &async_nats::Client, subject: String, payload: Vec<u8>) {
    client
        .publish(subject, payload.into())
        .await
        .expect("publish");
    client.flush().await.expect("flush");
}

async fn client(nats: &NatsServer) -> async_nats::Client {
    async_nats::connect(nats.url()).await.expect("connect")
}

/// A stream id of partition `p` of 4.
fn id_in(p: u32, tag: &str) -> String {
    (0..)
        .map(|i| format!("{tag}-{i}"))
        .find(|s| {
            partition_of(
                &StreamId::parse(s).expect("id"),
                NonZeroU32::new(4).expect("4"),
            ) == p
        })
        .expect("an id")
}

async fn connect(svc: &Svc, id: &str) -> Result<Ws, tungstenite::Error> {
    let url = format!("ws://{}/v1/streams/{id}", svc.ws_addr());
    tokio::time::timeout(STEP, tokio_tungstenite::connect_async(url))
        .await
        .expect("connect in time")
        .map(|(ws, _)| ws)
}

/// Tries to open `id` until it is refused (the announcement reached the door): the
/// status, `Retry-After` and body (a `409`, the previous attempt's stream not finished
/// yet, is tried again).
async fn refused_eventually(svc: &Svc, id: &str) -> (u16, Option<String>, Value) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        match connect(svc, id).await {
            Ok(mut ws) => {
                let _ = ws.close(None).await;
                assert!(Instant::now() < deadline, "{id} never refused");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            r => {
                let refusal = support::refusal(id, r);
                if refusal.0 != 409 {
                    return refusal;
                }
                // The previous attempt's stream (same id) has not finished yet.
                assert!(Instant::now() < deadline, "{id} still active");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

fn assert_no_capacity(refusal: &(u16, Option<String>, Value)) {
    let (status, retry, body) = refusal;
    assert_eq!(*status, 503, "{body}");
    assert_eq!(body["error"]["code"], "no_capacity", "{body}");
    let secs: u64 = retry
        .as_deref()
        .expect("Retry-After")
        .parse()
        .expect("secs");
    assert!((1..=30).contains(&secs), "Retry-After {secs}");
}

/// The sum of the samples of `name` whose labels contain `label` (e.g. `kind="stale"`).
fn metric(name: &str, label: &str) -> f64 {
    support::prometheus()
        .render()
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn nothing_heard_admits_then_full_gone_and_lagging_refuse() {
    let nats = NatsServer::start().expect("nats-server");
    let svc = start(nats.url(), &[]).await;
    let nc = client(&nats).await;
    // No announcement: admitted (recognisers that announce nothing keep working).
    let mut ws = connect(&svc, "quiet-1").await.expect("admitted");
    ws.close(None).await.expect("close");

    // Full: partition 0's worker has every slot taken.
    let full = id_in(0, "full");
    announce(&svc, &nc, &mut ann("w-full", 0, vec![0], 2, 2)).await;
    let refusal = refused_eventually(&svc, &full).await;
    assert_no_capacity(&refusal);
    assert!(
        refusal.2["error"]["message"]
            .as_str()
            .expect("m")
            .contains("full")
    );

    // Lagging: partition 1's worker is 2 s behind.
    let mut lagging = ann("w-lag", 0, vec![1], 8, 1);
    lagging.lag_ms = 2_000;
    announce(&svc, &nc, &mut lagging).await;
    let refusal = refused_eventually(&svc, &id_in(1, "lag")).await;
    assert_no_capacity(&refusal);
    assert!(
        refusal.2["error"]["message"]
            .as_str()
            .expect("m")
            .contains("lagging")
    );

    // A worker with free slots admits on its partition; silent, it is gone after
    // 2.5 intervals and its partition is refused.
    announce(&svc, &nc, &mut ann("w-free", 0, vec![2], 8, 0)).await;
    let mut ws = connect(&svc, &id_in(2, "free")).await.expect("admitted");
    ws.close(None).await.expect("close");
    let silent_since = Instant::now();
    let refusal = refused_eventually(&svc, &id_in(2, "gone")).await;
    let took = silent_since.elapsed();
    assert_no_capacity(&refusal);
    assert!(
        refusal.2["error"]["message"]
            .as_str()
            .expect("m")
            .contains("gone")
    );
    assert!(
        took < Duration::from_millis(2_000),
        "left the view after {took:?}"
    );
    assert_eq!(svc.capacity().expect("on").totals().live_workers, 0);
    assert!(metric("weir_ingress_capacity_refused_total", "reason=\"full\"") >= 1.0);
    svc.shutdown().await;
}

#[tokio::test]
async fn shadow_admits_and_counts() {
    let nats = NatsServer::start().expect("nats-server");
    let svc = start(nats.url(), &[("capacity.mode", "shadow")]).await;
    let nc = client(&nats).await;
    announce(&svc, &nc, &mut ann("w-shadow", 0, vec![3], 1, 1)).await;
    let before = metric(
        "weir_ingress_capacity_shadow_would_reject_total",
        "reason=\"full\"",
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while metric(
        "weir_ingress_capacity_shadow_would_reject_total",
        "reason=\"full\"",
    ) <= before
    {
        assert!(Instant::now() < deadline, "never counted");
        let mut ws = connect(&svc, &id_in(3, "shadow")).await.expect("admitted");
        ws.close(None).await.expect("close");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    svc.shutdown().await;
}

#[tokio::test]
async fn bad_and_spoofed_announcements_are_ignored_counted_and_never_admitted_on() {
    let nats = NatsServer::start().expect("nats-server");
    let svc = start(nats.url(), &[]).await;
    let nc = client(&nats).await;
    // The real worker of partition 0 is full.
    announce(&svc, &nc, &mut ann("w-real", 0, vec![0], 1, 1)).await;
    let stream = id_in(0, "spoof");
    assert_no_capacity(&refused_eventually(&svc, &stream).await);
    let kinds = [
        "invalid_json",
        "unknown_field",
        "out_of_range",
        "subject_mismatch",
        "stale",
    ];
    let before: Vec<f64> = kinds
        .iter()
        .map(|k| {
            metric(
                "weir_ingress_capacity_ignored_total",
                &format!("kind=\"{k}\""),
            )
        })
        .collect();
    let free = ann("w-fake", 1, vec![0], 1_000, 0);
    let subject = announce_subject(PREFIX, "w-fake");
    // Garbage, a negative and a huge number, an unknown member.
    publish(&nc, subject.clone(), b"\x00not json".to_vec()).await;
    let mut v = serde_json::to_value(&free).expect("json");
    v["max_streams"] = serde_json::json!(-5);
    publish(&nc, subject.clone(), v.to_string().into_bytes()).await;
    let mut v = serde_json::to_value(&free).expect("json");
    v["max_streams"] = serde_json::json!(u64::MAX);
    publish(&nc, subject.clone(), v.to_string().into_bytes()).await;
    let mut v = serde_json::to_value(&free).expect("json");
    v["bonus_slots"] = serde_json::json!(100);
    publish(&nc, subject.clone(), v.to_string().into_bytes()).await;
    // A spoofed worker id (the body names another worker than the subject).
    publish(&nc, announce_subject(PREFIX, "w-other"), free.encode()).await;
    // A stale announcement (sent a minute ago).
    let mut stale = free.clone();
    stale.sent_at_ms -= 60_000;
    publish(&nc, subject.clone(), stale.encode()).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    for (k, b) in kinds.iter().zip(&before) {
        let label = format!("kind=\"{k}\"");
        while metric("weir_ingress_capacity_ignored_total", &label) <= *b {
            assert!(Instant::now() < deadline, "{k} not counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // None of them gave partition 0 a slot.
    assert_no_capacity(&support::refusal(&stream, connect(&svc, &stream).await));
    svc.shutdown().await;
}

#[tokio::test]
async fn a_lease_worker_cannot_claim_partitions_the_bucket_gives_another() {
    let nats = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("nats-server");
    let nc = client(&nats).await;
    let js = async_nats::jetstream::new(nc.clone());
    // The bucket as the consumer core's lease ownership makes it.
    js.get_or_create_stream(weir_service::nats::kv_stream_config(
        "leases",
        Duration::from_secs(60),
        1,
    ))
    .await
    .expect("bucket stream");
    let kv = js.get_key_value("leases").await.expect("bucket");
    kv.put("p.0", "w-owner".into()).await.expect("put");
    kv.put("p.1", "w-spoofer".into()).await.expect("put");
    let svc = start(nats.url(), &[]).await;
    let lease = |w: &str, parts: Vec<u32>, max, live| {
        let mut a = ann(w, 0, parts, max, live);
        a.ownership = OwnershipKind::Lease;
        a.lease_bucket = Some("leases".into());
        a
    };
    let before = metric("weir_ingress_capacity_ignored_total", "kind=\"not_owned\"");
    announce(&svc, &nc, &mut lease("w-owner", vec![0], 1, 1)).await;
    assert_no_capacity(&refused_eventually(&svc, &id_in(0, "lease")).await);
    // The door watches the bucket the announcement named; wait for its view.
    let cap = svc.capacity().expect("capacity on");
    assert!(wait_until(STEP, || cap.lease_synced() == Some(true)).await);
    // The spoofer announces partition 0 with free slots: not trusted, still refused.
    let mut spoofer = lease("w-spoofer", vec![0, 1], 100, 0);
    announce(&svc, &nc, &mut spoofer).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while metric("weir_ingress_capacity_ignored_total", "kind=\"not_owned\"") <= before {
        assert!(Instant::now() < deadline, "not_owned not counted");
        announce(&svc, &nc, &mut spoofer).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = id_in(0, "lease2");
    assert_no_capacity(&support::refusal(&id, connect(&svc, &id).await));
    // Its own partition 1 is admitted on its slots.
    let r = connect(&svc, &id_in(1, "lease3")).await;
    let mut ws = match r {
        Ok(ws) => ws,
        Err(e) => panic!("{:?}", support::refusal("p1", Err::<(), _>(e))),
    };
    ws.close(None).await.expect("close");
    // Partition 2 has no owner in the bucket: orphaned.
    let refusal = support::refusal("p2", connect(&svc, &id_in(2, "lease4")).await);
    assert_no_capacity(&refusal);
    assert!(
        refusal.2["error"]["message"]
            .as_str()
            .expect("m")
            .contains("orphaned")
    );
    svc.shutdown().await;
}

async fn next_event(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("event in time")
            .expect("open")
            .expect("ok");
        if let Message::Text(t) = msg {
            let ev: Value = serde_json::from_str(t.as_str()).expect("JSON");
            if !crate::support::is_lifecycle(&ev) {
                return ev;
            }
        }
    }
}

#[tokio::test]
async fn degraded_recovered_and_a_worker_refusal_reach_the_producer() {
    let nats = NatsServer::start().expect("nats-server");
    let svc = start(nats.url(), &[]).await;
    let nc = client(&nats).await;
    let mut a = ann("w-events", 0, vec![0, 1, 2, 3], 8, 0);
    announce(&svc, &nc, &mut a).await;
    let id = "events-1";
    let mut ws = connect(&svc, id).await.expect("admitted");
    ws.send(Message::Binary(pcm(1))).await.expect("frame");
    a.seq += 1;
    a.live_streams = 1;
    a.lag_ms = 900;
    a.streams = vec![StreamLoad {
        id: id.into(),
        lag_ms: 900,
    }];
    a.streams_truncated = false;
    a.sent_at_ms = unix_ms();
    publish(&nc, announce_subject(PREFIX, &a.worker), a.encode()).await;
    let ev = next_event(&mut ws).await;
    assert_eq!(ev["type"], "degraded", "{ev}");
    assert_eq!(ev["lag_ms"], 900);
    assert_eq!(ev["threshold_ms"], 500);
    assert_eq!(ev["worker"], "w-events");
    a.seq += 1;
    a.lag_ms = 20;
    a.streams[0].lag_ms = 20;
    a.sent_at_ms = unix_ms();
    publish(&nc, announce_subject(PREFIX, &a.worker), a.encode()).await;
    let ev = next_event(&mut ws).await;
    assert_eq!(ev, serde_json::json!({"type": "recovered", "lag_ms": 20}));

    // A refusal for a stream this door does not hold is ignored (counted).
    let other = StreamId::parse("not-here").expect("id");
    let refusal = |stream: &str| Refusal {
        v: VERSION,
        worker: "w-events".into(),
        stream: stream.into(),
        reason: RefusalReason::MaxStreams,
        max_streams: 8,
        live_streams: 8,
        sent_at_ms: unix_ms(),
    };
    let before = metric(
        "weir_ingress_capacity_ignored_total",
        "kind=\"refusal_not_held\"",
    );
    publish(
        &nc,
        refused_subject(PREFIX, &other),
        refusal("not-here").encode(),
    )
    .await;
    let sid = StreamId::parse(id).expect("id");
    publish(&nc, refused_subject(PREFIX, &sid), refusal(id).encode()).await;
    let ev = next_event(&mut ws).await;
    assert_eq!(ev["type"], "closed", "{ev}");
    assert_eq!(ev["reason"], "no_capacity");
    let close = loop {
        match tokio::time::timeout(STEP, ws.next())
            .await
            .expect("close in time")
        {
            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {}
            _ => break None,
        }
    };
    assert_eq!(close, Some(1013));
    assert!(
        metric(
            "weir_ingress_capacity_ignored_total",
            "kind=\"refusal_not_held\""
        ) > before
    );
    // The slot is released once the stream finished.
    let cap = svc.capacity().expect("on");
    assert!(wait_until(STEP, || cap.held() == 0).await);
    svc.shutdown().await;
}

/// Runs `tests/python/capacity_client.py SCENARIO` against a fresh service with the
/// default configuration (`capacity.mode = enforce`); its JSON line.
async fn python_scenario(scenario: &str) -> Value {
    let nats = NatsServer::start().expect("nats-server");
    let svc = support::start_in_process(nats.url(), &[]).await;
    let seen = support::capacity_client(svc.ws_addr(), nats.url(), scenario, STEP).await;
    svc.shutdown().await;
    seen
}

#[tokio::test]
async fn python_a_silent_nats_py_recogniser_gets_every_frame_by_default() {
    let seen = python_scenario("silent").await;
    assert_eq!(seen["frames_received"], 25, "{seen}");
}

#[tokio::test]
async fn python_a_full_nats_py_worker_refuses_a_websockets_producer() {
    let seen = python_scenario("full").await;
    assert_eq!(seen["status"], 503, "{seen}");
    assert_eq!(seen["body"]["error"]["code"], "no_capacity", "{seen}");
}

#[tokio::test]
async fn python_a_nats_py_refusal_ends_a_websockets_producer_with_1013() {
    let seen = python_scenario("refusal").await;
    assert_eq!(seen["close"], 1013, "{seen}");
}

/// Median and p99 of `samples`, ms.
fn median_p99(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (
        ms(samples[samples.len() / 2]),
        ms(samples[(samples.len() * 99 / 100).min(samples.len() - 1)]),
    )
}

/// Not a timed assertion: prints the door's refusal latency (`503 no_capacity`, from
/// the upgrade request to the answer) and the admission latency (upgrade to `101`) with
/// the check on (a worker with free slots heard) and off, over real TCP.
#[tokio::test]
async fn admission_and_refusal_latency_figures() {
    const N: usize = 200;
    let nats = NatsServer::start().expect("nats-server");
    let mut figures = Vec::new();
    for mode in ["enforce", "off"] {
        let svc = start(nats.url(), &[("capacity.mode", mode)]).await;
        let nc = client(&nats).await;
        let mut free = ann(&format!("w-free-{mode}"), 0, vec![0, 1, 2], 1_000, 0);
        if mode == "enforce" {
            announce(&svc, &nc, &mut free).await;
        }
        let mut admitted = Vec::with_capacity(N);
        for i in 0..N {
            let id = id_in(i as u32 % 3, &format!("lat-{mode}-{i}"));
            let t = Instant::now();
            let mut ws = connect(&svc, &id).await.expect("admitted");
            admitted.push(t.elapsed());
            ws.close(None).await.expect("close");
            if mode == "enforce" && i % 20 == 19 {
                // Stay live (gone 1 s after the last one) on a loaded machine.
                free.seq += 1;
                free.sent_at_ms = unix_ms();
                publish(&nc, announce_subject(PREFIX, &free.worker), free.encode()).await;
            }
        }
        let (m, p) = median_p99(admitted);
        figures.push(format!(
            "admission, capacity.mode={mode}: median {m:.3} ms, p99 {p:.3} ms"
        ));
        if mode == "enforce" {
            let mut full = ann("w-full-lat", 0, vec![3], 1, 1);
            announce(&svc, &nc, &mut full).await;
            let mut refused = Vec::with_capacity(N);
            for i in 0..N {
                let id = id_in(3, &format!("lat-full-{i}"));
                let t = Instant::now();
                let r = connect(&svc, &id).await;
                refused.push(t.elapsed());
                assert_no_capacity(&support::refusal(&id, r));
                if i % 20 == 19 {
                    // Stay live (gone 1 s after the last one).
                    full.seq += 1;
                    full.sent_at_ms = unix_ms();
                    publish(&nc, announce_subject(PREFIX, &full.worker), full.encode()).await;
                }
            }
            let (m, p) = median_p99(refused);
            figures.push(format!(
                "refusal 503 no_capacity: median {m:.3} ms, p99 {p:.3} ms"
            ));
        }
        svc.shutdown().await;
    }
    for f in figures {
        println!("{f}");
    }
}
