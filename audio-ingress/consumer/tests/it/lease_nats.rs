//! Lease ownership against one real nats-server with JetStream: the fencing token at
//! work. A foreign write to a held key fences the partition at once (its stream ends
//! with `Handover`, nothing more is handed over) and, the writer not heartbeating, the
//! worker takes the partition back by compare-and-swap (a new instance, with a
//! handover gap); a write that carries the worker's own id (what a renewal that timed
//! out but landed looks like) is adopted, not fenced.

use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use weir_audio_consumer::testing::{client, pcm, publish};
use weir_audio_consumer::{
    Consumer, ConsumerConfig, EndCause, GapCause, LeaseConfig, StreamEvent, StreamInfo,
    channel_factory,
};
use weir_protocol::audio::Packet;
use weir_protocol::fnv1a_32;
use weir_testkit::{NatsServer, NatsServerOptions};

const PARTITIONS: u32 = 4;
const BUCKET: &str = "leases_t";

fn lease() -> LeaseConfig {
    LeaseConfig {
        bucket: BUCKET.into(),
        ttl_ms: 3_000,
        renew_interval_ms: 1_000,
        margin_ms: 500,
        heartbeat_interval_ms: 100,
        heartbeat_timeout_ms: 300,
        replicas: 1,
        worker_id: Some("w0".into()),
    }
}

type Rx = mpsc::Receiver<(StreamInfo, StreamEvent)>;

async fn start(url: &str) -> (Consumer, Rx) {
    let settings = ConsumerConfig {
        max_frame_age_ms: 0,
        ..ConsumerConfig::leased("audio.{partition}.{stream}", PARTITIONS, lease())
    }
    .validate()
    .expect("valid");
    let (tx, rx) = mpsc::channel(10_000);
    let consumer = Consumer::connect(url, settings, channel_factory(tx))
        .await
        .expect("consumer starts");
    delivering_all(&consumer).await;
    (consumer, rx)
}

/// Waits (bounded) until the worker delivers every partition.
async fn delivering_all(consumer: &Consumer) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while consumer.owned_now().len() < PARTITIONS as usize {
        assert!(Instant::now() < deadline, "{:?}", consumer.leases());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Events until `until` matches one (bounded).
async fn until(
    rx: &mut Rx,
    bound: Duration,
    mut until: impl FnMut(&StreamEvent) -> bool,
) -> Vec<(StreamInfo, StreamEvent)> {
    let deadline = Instant::now() + bound;
    let mut out = Vec::new();
    while let Ok(Some(item)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        let stop = until(&item.1);
        out.push(item);
        if stop {
            break;
        }
    }
    out
}

fn subject(stream: &str) -> (u32, String) {
    let p = fnv1a_32(stream.as_bytes()) % PARTITIONS;
    (p, format!("audio.{p}.{stream}"))
}

#[tokio::test]
async fn a_foreign_write_fences_at_once_and_a_silent_writer_is_taken_over() {
    let server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("server");
    let (consumer, mut rx) = start(server.url()).await;
    let producer = client(server.url()).await;
    let (p, subj) = subject("s1");
    for seq in 1..=5 {
        publish(&producer, &subj, Packet::frame(seq, pcm(seq)), &[]).await;
    }
    let got = until(
        &mut rx,
        Duration::from_secs(3),
        |e| matches!(e, StreamEvent::Frame(f) if f.seq == 5),
    )
    .await;
    assert_eq!(got.len(), 5, "{got:?}");
    let rev_before = consumer.leases()[p as usize].revision.expect("revision");

    // Someone else writes the key: the revision moved past ours.
    let kv = jetstream::new(producer.clone())
        .get_key_value(BUCKET)
        .await
        .expect("bucket");
    kv.put(format!("p.{p}"), "intruder".into())
        .await
        .expect("put");
    let fenced = until(&mut rx, Duration::from_secs(2), |e| {
        matches!(e, StreamEvent::End(_))
    })
    .await;
    let end = fenced.iter().find_map(|(_, e)| match e {
        StreamEvent::End(end) => Some(end.clone()),
        _ => None,
    });
    assert_eq!(end.map(|e| e.cause), Some(EndCause::Handover), "{fenced:?}");
    assert!(
        fenced
            .iter()
            .all(|(_, e)| !matches!(e, StreamEvent::Frame(_))),
        "nothing handed over after the fence: {fenced:?}"
    );

    // The intruder does not heartbeat: after the heartbeat timeout the worker takes the
    // partition back by CAS, and the stream continues as a new instance that declares
    // what it did not see.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let l = &consumer.leases()[p as usize];
        if l.delivering && l.revision > Some(rev_before + 1) {
            break;
        }
        assert!(Instant::now() < deadline, "not taken back: {l:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish(&producer, &subj, Packet::frame(9, pcm(9)), &[]).await;
    let again = until(
        &mut rx,
        Duration::from_secs(3),
        |e| matches!(e, StreamEvent::Frame(f) if f.seq == 9),
    )
    .await;
    let gap = again.iter().find_map(|(_, e)| match e {
        StreamEvent::Gap(g) => Some(g.clone()),
        _ => None,
    });
    let gap = gap.expect("a handover gap");
    assert_eq!(
        (gap.first_seq, gap.last_seq, gap.cause),
        (1, 8, GapCause::Handover)
    );
    let instances: std::collections::BTreeSet<u64> =
        got.iter().chain(&again).map(|(i, _)| i.instance).collect();
    assert_eq!(instances.len(), 2, "the stream restarted as a new instance");
    let stats = consumer.shutdown(Duration::from_secs(1)).await;
    assert_eq!(stats.totals.counters.handover_frames, 8);

    // Shutdown released every key.
    let deadline = Instant::now() + Duration::from_secs(3);
    for q in 0..PARTITIONS {
        loop {
            let entry = kv.entry(format!("p.{q}")).await.expect("entry");
            if entry.is_none_or(|e| e.operation != async_nats::jetstream::kv::Operation::Put) {
                break;
            }
            assert!(Instant::now() < deadline, "p.{q} not released");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_write_with_our_own_id_is_adopted_not_fenced() {
    let server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("server");
    let (consumer, mut rx) = start(server.url()).await;
    let producer = client(server.url()).await;
    let (p, subj) = subject("s2");
    publish(&producer, &subj, Packet::frame(1, pcm(1)), &[]).await;
    until(&mut rx, Duration::from_secs(3), |e| {
        matches!(e, StreamEvent::Frame(_))
    })
    .await;

    // As if a renewal had landed after its caller gave up: the key carries our id at a
    // revision the worker does not know. Its next renewal gets WrongLastRevision.
    let kv = jetstream::new(producer.clone())
        .get_key_value(BUCKET)
        .await
        .expect("bucket");
    let landed = kv.put(format!("p.{p}"), "w0".into()).await.expect("put");
    // Over two renewal intervals: the lease is renewed past that revision, still held,
    // and the stream never ended.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let l = &consumer.leases()[p as usize];
        assert!(l.held, "fenced: {l:?}");
        if l.revision > Some(landed) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not renewed past {landed}: {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for seq in 2..=3 {
        publish(&producer, &subj, Packet::frame(seq, pcm(seq)), &[]).await;
    }
    let events = until(
        &mut rx,
        Duration::from_secs(3),
        |e| matches!(e, StreamEvent::Frame(f) if f.seq == 3),
    )
    .await;
    assert!(
        events
            .iter()
            .all(|(_, e)| !matches!(e, StreamEvent::End(_) | StreamEvent::Gap(_))),
        "{events:?}"
    );
    assert_eq!(events.len(), 2);
    consumer.shutdown(Duration::from_secs(1)).await;
}

/// `deploy/nats-server.conf`'s `asr-worker` user has every permission lease ownership
/// needs (bucket creation, CAS, watch, heartbeats, audio from a `producer`) with its
/// own inbox prefix and no `allow_responses`, and `guest` may neither write a lease
/// nor heartbeat.
#[tokio::test]
async fn the_example_server_config_lets_an_asr_worker_lease_and_stops_a_guest() {
    let server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        config: Some(include_str!("../../../../deploy/nats-server.conf").to_owned()),
        ..Default::default()
    })
    .expect("server");
    // Each user subscribes only to its own inboxes: `_INBOX.<user>`.
    let as_user = |user: &'static str, password: &'static str| {
        async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
            .custom_inbox_prefix(format!("_INBOX.{user}"))
            .connect(server.url())
    };
    let worker = as_user("asr-worker", "asr-secret")
        .await
        .expect("asr-worker connects");
    let settings = ConsumerConfig {
        max_frame_age_ms: 0,
        ..ConsumerConfig::leased(
            "audio.{partition}.{stream}",
            PARTITIONS,
            LeaseConfig {
                bucket: "weir_leases".into(),
                ..lease()
            },
        )
    }
    .validate()
    .expect("valid");
    let (tx, mut rx) = mpsc::channel(100);
    let consumer = Consumer::start(worker, settings, channel_factory(tx))
        .await
        .expect("the lease bucket is set up with asr-worker's permissions");
    delivering_all(&consumer).await;
    let guest = as_user("guest", "guest-secret")
        .await
        .expect("guest connects");
    let producer = as_user("producer", "producer-secret")
        .await
        .expect("producer connects");
    let (_, subj) = subject("s3");
    publish(&producer, &subj, Packet::frame(1, pcm(1)), &[]).await;
    let got = until(&mut rx, Duration::from_secs(3), |e| {
        matches!(e, StreamEvent::Frame(_))
    })
    .await;
    assert!(
        got.iter().any(|(_, e)| matches!(e, StreamEvent::Frame(_))),
        "{got:?}"
    );
    // Renewals go on (over two renewal intervals every lease was renewed).
    let before: Vec<Option<u64>> = consumer.leases().iter().map(|l| l.revision).collect();
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let after = consumer.leases();
    assert!(
        after
            .iter()
            .zip(&before)
            .all(|(l, b)| l.delivering && l.revision > *b),
        "{after:?}"
    );
    // A guest's lease write (or heartbeat) never reaches the bucket: the server drops
    // it (a permissions violation), the owner keeps its partitions at its revision.
    let rev0 = consumer.leases()[0].revision;
    for subject in ["$KV.weir_leases.p.0", "weir.lease.weir_leases.heartbeat"] {
        guest
            .publish(subject, "intruder".into())
            .await
            .expect("queued");
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), guest.flush()).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let l = &consumer.leases()[0];
    assert_eq!(l.owner.as_deref(), Some("w0"), "{l:?}");
    assert!(l.delivering && l.revision >= rev0, "{l:?}");
    consumer.shutdown(Duration::from_secs(1)).await;
}
