use super::*;
use weir_protocol::capacity::{StreamLoad, VERSION};

const SUBJECT: &str = "audio.{partition}.{stream}";

fn fleet(partitions: u32) -> Fleet {
    Fleet::new(FleetSettings {
        subject: SUBJECT.to_owned(),
        partitions: NonZeroU32::new(partitions).expect("n"),
        max_lag: Duration::from_millis(500),
    })
}

fn ann(worker: &str, seq: u64, partitions: Vec<u32>, max: u64, live: u64) -> Announcement {
    Announcement {
        v: VERSION,
        worker: worker.to_owned(),
        instance: format!("{worker}-i1"),
        seq,
        sent_at_ms: 0,
        interval_ms: 1_000,
        subject: SUBJECT.to_owned(),
        partitions_total: 2,
        ownership: OwnershipKind::Static,
        lease_bucket: None,
        partitions,
        max_streams: max,
        live_streams: live,
        lag_ms: 0,
        rtf_p95: 0.5,
        streams: Vec::new(),
        streams_truncated: live > 0,
    }
}

fn id(s: &str) -> StreamId {
    StreamId::parse(s).expect("id")
}

/// A stream id of partition `p` of 2.
fn id_in(p: u32) -> StreamId {
    (0..)
        .map(|i| id(&format!("s{i}")))
        .find(|s| partition_of(s, NonZeroU32::new(2).expect("n")) == p)
        .expect("an id")
}

fn refused(d: &Decision) -> Option<RefuseReason> {
    match d {
        Decision::Refuse(NoCapacity { reason, .. }) => Some(*reason),
        Decision::Admit(_) => None,
    }
}

#[test]
fn nothing_heard_admits_and_a_silent_partition_is_admitted() {
    let mut f = fleet(2);
    let now = Instant::now();
    assert_eq!(f.decide(&id_in(0), now), Decision::Admit(None));
    f.accept(ann("w1", 1, vec![0], 2, 0), now)
        .expect("accepted");
    assert_eq!(f.decide(&id_in(0), now), Decision::Admit(Some("w1".into())));
    // Partition 1 is nobody's announced partition: a silent worker may serve it.
    assert_eq!(f.decide(&id_in(1), now), Decision::Admit(None));
}

#[test]
fn full_counts_the_streams_admitted_but_not_listed_yet() {
    let mut f = fleet(2);
    let now = Instant::now();
    f.accept(ann("w1", 1, vec![0, 1], 2, 1), now)
        .expect("accepted");
    let a = id("a");
    let Decision::Admit(w) = f.decide(&a, now) else {
        panic!("admitted")
    };
    let (tx, _rx) = mpsc::channel(1);
    let token = f.hold(&a, w, tx);
    assert_eq!(refused(&f.decide(&id("b"), now)), Some(RefuseReason::Full));
    f.release("a", token);
    assert_eq!(refused(&f.decide(&id("b"), now)), None);
}

#[test]
fn lagging_and_gone_refuse_with_a_bounded_retry_after() {
    let mut f = fleet(2);
    let now = Instant::now();
    let mut a = ann("w1", 1, vec![0, 1], 4, 0);
    a.lag_ms = 2_600;
    f.accept(a, now).expect("accepted");
    match f.decide(&id("x"), now) {
        Decision::Refuse(NoCapacity {
            reason,
            retry_after,
            ..
        }) => {
            assert_eq!(reason, RefuseReason::Lagging);
            assert_eq!(retry_after, Duration::from_millis(2_100));
        }
        d => panic!("{d:?}"),
    }
    let later = now + Duration::from_millis(2_600);
    match f.decide(&id("x"), later) {
        Decision::Refuse(NoCapacity {
            reason,
            retry_after,
            ..
        }) => {
            assert_eq!(reason, RefuseReason::Gone);
            assert!(RETRY_AFTER_RANGE.0 <= retry_after && retry_after <= RETRY_AFTER_RANGE.1);
        }
        d => panic!("{d:?}"),
    }
    assert_eq!(f.totals(later).live_workers, 0);
}

#[test]
fn replays_other_subjects_and_second_instances_are_ignored() {
    let mut f = fleet(2);
    let now = Instant::now();
    f.accept(ann("w1", 2, vec![0], 4, 0), now)
        .expect("accepted");
    assert_eq!(
        f.accept(ann("w1", 2, vec![0], 4, 0), now).err(),
        Some("seq_not_increasing")
    );
    let mut other = ann("w1", 9, vec![0], 4, 0);
    other.instance = "intruder".into();
    assert_eq!(
        f.accept(other.clone(), now).err(),
        Some("instance_conflict")
    );
    // Once the first is gone, the second instance takes over.
    let later = now + Duration::from_secs(3);
    assert!(f.accept(other, later).is_ok());
    let mut elsewhere = ann("w2", 1, vec![0], 4, 0);
    elsewhere.partitions_total = 3;
    assert_eq!(f.accept(elsewhere, now).err(), Some("other_subject"));
}

#[test]
fn the_lease_bucket_decides_the_owner_and_claims_of_others_are_not_trusted() {
    let mut f = fleet(2);
    let now = Instant::now();
    let lease = |w: &str, parts: Vec<u32>, max, live| {
        let mut a = ann(w, 1, parts, max, live);
        a.ownership = OwnershipKind::Lease;
        a.lease_bucket = Some("leases".into());
        a
    };
    let first = f.accept(lease("full", vec![0], 1, 1), now).expect("ok");
    assert_eq!(first.watch_bucket.as_deref(), Some("leases"));
    f.set_owner(0, Some("full".into()));
    f.set_lease_synced(true);
    // A spoofer claims partition 0 with free slots: the bucket says it is `full`'s.
    let spoof = f
        .accept(lease("spoofer", vec![0], 100, 0), now)
        .expect("ok");
    assert_eq!(spoof.not_owned, 1);
    assert_eq!(refused(&f.decide(&id_in(0), now)), Some(RefuseReason::Full));
    // Partition 1 has no owner: orphaned.
    assert_eq!(
        refused(&f.decide(&id_in(1), now)),
        Some(RefuseReason::Orphaned)
    );
    // An owner that never announced (a silent worker) is admitted.
    f.set_owner(1, Some("silent".into()));
    assert_eq!(f.decide(&id_in(1), now), Decision::Admit(None));
}

#[test]
fn listed_streams_get_degraded_then_recovered() {
    let mut f = fleet(2);
    let now = Instant::now();
    f.accept(ann("w1", 1, vec![0, 1], 4, 0), now).expect("ok");
    let (tx, mut rx) = mpsc::channel(4);
    f.hold(&id("a"), Some("w1".into()), tx);
    let mut a = ann("w1", 2, vec![0, 1], 4, 1);
    a.lag_ms = 800;
    a.streams = vec![StreamLoad {
        id: "a".into(),
        lag_ms: 800,
    }];
    a.streams_truncated = false;
    assert_eq!(f.accept(a.clone(), now).expect("ok").degraded_sent, 1);
    assert!(matches!(
        rx.try_recv(),
        Ok(Notice::Lag(Event::Degraded { lag_ms: 800, .. }))
    ));
    a.seq = 3;
    a.lag_ms = 10;
    a.streams[0].lag_ms = 10;
    f.accept(a, now).expect("ok");
    assert_eq!(
        rx.try_recv().ok(),
        Some(Notice::Lag(Event::Recovered { lag_ms: 10 }))
    );
}

#[test]
fn retry_after_of_a_full_worker_follows_the_rate_slots_free() {
    let mut f = fleet(2);
    let t0 = Instant::now();
    let mut a = ann("w1", 1, vec![0, 1], 4, 4);
    f.accept(a.clone(), t0).expect("ok");
    let retry = |f: &Fleet, now| match f.decide(&id("x"), now) {
        Decision::Refuse(NoCapacity {
            reason: RefuseReason::Full,
            retry_after,
            ..
        }) => retry_after,
        d => panic!("{d:?}"),
    };
    // Nothing freed yet: the announcement interval.
    assert_eq!(retry(&f, t0), Duration::from_secs(1));
    // One slot freed and retaken, every 4 s: about 4 s a slot.
    for k in 1..=3u64 {
        let now = t0 + Duration::from_secs(4 * k);
        a.seq += 1;
        a.live_streams = 3;
        f.accept(a.clone(), now - Duration::from_millis(10))
            .expect("ok");
        a.seq += 1;
        a.live_streams = 4;
        f.accept(a.clone(), now).expect("ok");
    }
    let r = retry(&f, t0 + Duration::from_secs(12));
    assert!(
        Duration::from_secs(3) <= r && r <= Duration::from_secs(5),
        "{r:?}"
    );
}

#[test]
fn a_reused_id_is_bound_to_the_new_stream_and_the_old_ticket_releases_nothing() {
    let mut f = fleet(2);
    let now = Instant::now();
    f.accept(ann("w1", 1, vec![0, 1], 3, 0), now).expect("ok");
    let a = id("a");
    let (tx1, _rx1) = mpsc::channel(1);
    let old = f.hold(&a, Some("w1".into()), tx1);
    // The first stream finished; its ticket has not dropped when the id comes back.
    let new = f.reserve(Some("w1".into()));
    let (tx2, mut rx2) = mpsc::channel(1);
    assert!(f.bind(&a, new, tx2));
    assert_eq!(f.unlisted.get("w1"), Some(&1), "the old stream let go");
    f.release("a", old);
    let tx = f.refusal_sender(&a, "w1").expect("still held");
    tx.try_send(Notice::Refused).expect("sent");
    assert_eq!(rx2.try_recv().ok(), Some(Notice::Refused));
    f.release("a", new);
    assert_eq!(f.held_count(), 0);
    assert!(f.unlisted.is_empty());
}

#[test]
fn a_duplicate_refused_by_the_registry_leaves_the_holder_alone() {
    let mut f = fleet(2);
    let now = Instant::now();
    f.accept(ann("w1", 1, vec![0, 1], 2, 0), now).expect("ok");
    let a = id("a");
    let (tx, _rx) = mpsc::channel(1);
    let holder = f.hold(&a, Some("w1".into()), tx);
    // A second connection for the same id: reserved, never bound (409), dropped.
    let dup = f.reserve(Some("w1".into()));
    assert_eq!(refused(&f.decide(&id("b"), now)), Some(RefuseReason::Full));
    f.release("a", dup);
    assert!(f.refusal_sender(&a, "w1").is_ok());
    assert_eq!(refused(&f.decide(&id("b"), now)), None);
    f.release("a", holder);
    assert!(f.unlisted.is_empty());
}

#[test]
fn a_worker_that_stops_listing_its_partitions_gets_no_new_stream() {
    let mut f = fleet(2);
    let now = Instant::now();
    f.accept(ann("w1", 1, vec![0, 1], 4, 0), now).expect("ok");
    assert_eq!(refused(&f.decide(&id_in(0), now)), None);
    // Its last announcement at shutdown: live, no partitions.
    f.accept(ann("w1", 2, vec![], 4, 0), now).expect("ok");
    assert_eq!(refused(&f.decide(&id_in(0), now)), Some(RefuseReason::Gone));
    assert_eq!(refused(&f.decide(&id_in(1), now)), Some(RefuseReason::Gone));
}

#[test]
fn a_lease_owner_not_delivering_the_partition_gets_no_new_stream() {
    let mut f = fleet(2);
    let now = Instant::now();
    let mut a = ann("w1", 1, vec![0], 4, 0);
    a.ownership = OwnershipKind::Lease;
    a.lease_bucket = Some("weir_leases".into());
    f.accept(a, now).expect("ok");
    f.set_owner(0, Some("w1".into()));
    f.set_owner(1, Some("w1".into()));
    f.set_lease_synced(true);
    assert_eq!(refused(&f.decide(&id_in(0), now)), None);
    // Partition 1 was taken over, its feed not started yet.
    assert_eq!(
        refused(&f.decide(&id_in(1), now)),
        Some(RefuseReason::Orphaned)
    );
}

#[test]
fn recovered_waits_for_room_and_a_refusal_from_another_worker_is_ignored() {
    let mut f = fleet(2);
    let now = Instant::now();
    f.accept(ann("w1", 1, vec![0, 1], 4, 0), now).expect("ok");
    f.accept(ann("w2", 1, vec![], 4, 0), now).expect("ok");
    let (tx, mut rx) = mpsc::channel(1);
    f.hold(&id("a"), Some("w1".into()), tx);
    let listed = |seq, lag| {
        let mut a = ann("w1", seq, vec![0, 1], 4, 1);
        a.lag_ms = lag;
        a.streams = vec![StreamLoad {
            id: "a".into(),
            lag_ms: lag,
        }];
        a.streams_truncated = false;
        a
    };
    f.accept(listed(2, 900), now).expect("ok");
    // The producer has not taken `degraded` yet: the queue (1) is full.
    f.accept(listed(3, 10), now).expect("ok");
    assert!(matches!(
        rx.try_recv(),
        Ok(Notice::Lag(Event::Degraded { .. }))
    ));
    f.accept(listed(4, 10), now).expect("ok");
    assert_eq!(
        rx.try_recv().ok(),
        Some(Notice::Lag(Event::Recovered { lag_ms: 10 }))
    );
    assert_eq!(
        f.refusal_sender(&id("a"), "w2").err(),
        Some("refusal_other_worker")
    );
    assert!(f.refusal_sender(&id("a"), "w1").is_ok());
    assert_eq!(
        f.refusal_sender(&id("zz"), "w1").err(),
        Some("refusal_not_held")
    );
}
