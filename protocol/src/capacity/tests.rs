use super::*;
use crate::WireName;

fn sample() -> Announcement {
    Announcement {
        v: VERSION,
        worker: "w1".into(),
        instance: "a1b2c3".into(),
        seq: 7,
        sent_at_ms: 1_000_000,
        interval_ms: 1_000,
        subject: "audio.{partition}.{stream}".into(),
        partitions_total: 8,
        ownership: OwnershipKind::Lease,
        lease_bucket: Some("weir_leases".into()),
        partitions: vec![0, 3, 5],
        max_streams: 6,
        live_streams: 2,
        lag_ms: 120,
        rtf_p95: 0.42,
        streams: vec![
            StreamLoad {
                id: "call-1".into(),
                lag_ms: 120,
            },
            StreamLoad {
                id: "call-2".into(),
                lag_ms: 0,
            },
        ],
        streams_truncated: false,
    }
}

const SUBJECT: &str = "weir.capacity.announce.w1";

fn kind_of(json: &serde_json::Value) -> CapacityErrorKind {
    let bytes = serde_json::to_vec(json).expect("json");
    Announcement::decode(SUBJECT, &bytes)
        .expect_err("refused")
        .kind()
}

fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
    let mut v = serde_json::to_value(sample()).expect("json");
    v[field] = value;
    v
}

#[test]
fn a_valid_announcement_round_trips() {
    let a = sample();
    let back = Announcement::decode(SUBJECT, &a.encode()).expect("valid");
    assert_eq!(back, a);
    assert_eq!(back.free_slots(), 4);
    assert_eq!(announce_subject(DEFAULT_PREFIX, "w1"), SUBJECT);
    assert_eq!(last_token(SUBJECT), "w1");
}

#[test]
fn garbage_negative_huge_and_unknown_are_refused_by_kind() {
    use CapacityErrorKind as K;
    let bad = |p: &[u8]| {
        Announcement::decode(SUBJECT, p)
            .expect_err("refused")
            .kind()
    };
    assert_eq!(bad(b"not json"), K::InvalidJson);
    assert_eq!(bad(b"[]"), K::InvalidJson);
    assert_eq!(bad(&vec![b' '; MAX_PAYLOAD_BYTES + 1]), K::TooLarge);
    assert_eq!(kind_of(&with("max_streams", (-1).into())), K::InvalidJson);
    assert_eq!(
        kind_of(&with("max_streams", 2_000_000.into())),
        K::OutOfRange
    );
    assert_eq!(kind_of(&with("max_streams", 0.into())), K::OutOfRange);
    assert_eq!(kind_of(&with("live_streams", 7.into())), K::OutOfRange);
    assert_eq!(kind_of(&with("lag_ms", u64::MAX.into())), K::OutOfRange);
    assert_eq!(kind_of(&with("rtf_p95", (-0.5).into())), K::OutOfRange);
    assert_eq!(kind_of(&with("rtf_p95", 1e9.into())), K::OutOfRange);
    assert_eq!(
        kind_of(&with("partitions", serde_json::json!([8]))),
        K::OutOfRange
    );
    assert_eq!(
        kind_of(&with("partitions", serde_json::json!([1, 1]))),
        K::OutOfRange
    );
    assert_eq!(kind_of(&with("interval_ms", 5.into())), K::OutOfRange);
    assert_eq!(kind_of(&with("seq", 0.into())), K::OutOfRange);
    assert_eq!(
        kind_of(&with("streams_truncated", true.into())),
        K::OutOfRange
    );
    assert_eq!(kind_of(&with("surprise", 1.into())), K::UnknownField);
    assert_eq!(kind_of(&with("v", 2.into())), K::UnsupportedVersion);
    assert_eq!(kind_of(&with("worker", "w2".into())), K::SubjectMismatch);
    assert_eq!(kind_of(&with("worker", "w.1".into())), K::InvalidId);
    assert_eq!(kind_of(&with("instance", "".into())), K::InvalidId);
    assert_eq!(
        kind_of(&with("lease_bucket", serde_json::Value::Null)),
        K::OutOfRange
    );
    let spoofed_stream = serde_json::json!([{"id": "a.>", "lag_ms": 0}]);
    let mut v = with("streams", spoofed_stream);
    v["live_streams"] = 1.into();
    assert_eq!(kind_of(&v), K::InvalidId);
    let mut missing = serde_json::to_value(sample()).expect("json");
    missing
        .as_object_mut()
        .expect("object")
        .remove("max_streams");
    assert_eq!(kind_of(&missing), K::InvalidJson);
}

#[test]
fn stale_and_future_announcements_are_refused() {
    let a = sample();
    assert!(a.check_fresh(a.sent_at_ms).is_ok());
    assert!(a.check_fresh(a.sent_at_ms + 2_500).is_ok());
    let stale = a.check_fresh(a.sent_at_ms + 2_501).expect_err("stale");
    assert_eq!(stale.kind(), CapacityErrorKind::Stale);
    assert!(a.check_fresh(a.sent_at_ms - MAX_CLOCK_AHEAD_MS).is_ok());
    let ahead = a.check_fresh(a.sent_at_ms - MAX_CLOCK_AHEAD_MS - 1);
    assert_eq!(ahead.expect_err("future").kind(), CapacityErrorKind::Stale);
}

#[test]
fn a_refusal_names_its_stream_on_its_subject() {
    let stream = StreamId::parse("call-9").expect("id");
    let r = Refusal {
        v: VERSION,
        worker: "w1".into(),
        stream: "call-9".into(),
        reason: RefusalReason::MaxStreams,
        max_streams: 6,
        live_streams: 6,
        sent_at_ms: 1,
    };
    let subject = refused_subject(DEFAULT_PREFIX, &stream);
    assert_eq!(subject, "weir.capacity.refused.call-9");
    assert_eq!(Refusal::decode(&subject, &r.encode()).expect("valid"), r);
    let other = Refusal::decode("weir.capacity.refused.call-8", &r.encode());
    assert_eq!(
        other.expect_err("mismatch").kind(),
        CapacityErrorKind::SubjectMismatch
    );
    assert_eq!(RefusalReason::MaxStreams.as_str(), "max_streams");
}

#[test]
fn ids_and_prefixes() {
    assert!(is_valid_id("gpu-worker_01"));
    assert!(!is_valid_id("w*"));
    assert!(!is_valid_id(&"x".repeat(65)));
    assert!(is_valid_prefix("weir.capacity"));
    assert!(!is_valid_prefix("weir..capacity"));
    assert!(!is_valid_prefix("weir.>"));
    assert!(!is_valid_prefix(""));
    assert_eq!(gone_after(1_000), std::time::Duration::from_millis(2_500));
}
