use super::*;
use crate::{ConsumerConfig, ConsumerErrorKind, LeaseConfig};

fn key_of(cfg: &ConsumerConfig) -> Option<String> {
    let e = cfg.validate().expect_err("invalid");
    assert_eq!(e.kind(), ConsumerErrorKind::Config);
    e.config_key().map(str::to_owned)
}

#[test]
fn defaults_announce_every_second_under_weir_capacity() {
    let s = ConsumerConfig::default().validate().expect("valid");
    let c = &s.capacity;
    assert!(c.announce);
    assert_eq!(c.prefix, "weir.capacity");
    assert_eq!(c.interval, Duration::from_secs(1));
    assert!(proto::is_valid_id(&c.worker_id), "{}", c.worker_id);
    assert!(c.worker_id.starts_with('w'));
    assert_eq!(
        c.announce_subject(),
        format!("weir.capacity.announce.{}", c.worker_id)
    );
}

#[test]
fn the_toml_key_reads_every_field_and_refuses_unknown_ones() {
    let cfg: ConsumerConfig = toml::from_str(
        "[capacity]\nannounce = false\nprefix = \"fleet.cap\"\ninterval_ms = 250\nworker_id = \"gpu-a\"\n",
    )
    .expect("parses");
    let s = cfg.validate().expect("valid");
    let c = &s.capacity;
    assert!(!c.announce);
    assert_eq!(c.prefix, "fleet.cap");
    assert_eq!(c.interval, Duration::from_millis(250));
    assert_eq!(c.worker_id, "gpu-a");
    assert!(toml::from_str::<ConsumerConfig>("[capacity]\nslots = 3\n").is_err());
}

#[test]
fn bad_values_name_their_key() {
    for prefix in [
        "",
        "a..b",
        "a.*",
        "a.>",
        "has space",
        ".a",
        &"x".repeat(129),
    ] {
        let mut cfg = ConsumerConfig::default();
        cfg.capacity.prefix = prefix.into();
        assert_eq!(
            key_of(&cfg).as_deref(),
            Some("capacity.prefix"),
            "{prefix:?}"
        );
    }
    for interval_ms in [0, 99, 60_001] {
        let mut cfg = ConsumerConfig::default();
        cfg.capacity.interval_ms = interval_ms;
        assert_eq!(key_of(&cfg).as_deref(), Some("capacity.interval_ms"));
    }
    for id in ["", "a.b", "a b", "*", &"x".repeat(65)] {
        let mut cfg = ConsumerConfig::default();
        cfg.capacity.worker_id = Some(id.into());
        assert_eq!(
            key_of(&cfg).as_deref(),
            Some("capacity.worker_id"),
            "{id:?}"
        );
    }
}

#[test]
fn lease_ownership_announces_the_lease_worker_id() {
    let lease = LeaseConfig {
        worker_id: Some("lw-1".into()),
        ..LeaseConfig::default()
    };
    let mut cfg = ConsumerConfig::leased("a.{partition}.{stream}", 4, lease);
    let s = cfg.validate().expect("valid");
    assert_eq!(s.capacity.worker_id, "lw-1");
    cfg.capacity.worker_id = Some("lw-1".into());
    assert_eq!(cfg.validate().expect("same id").capacity.worker_id, "lw-1");
    cfg.capacity.worker_id = Some("other".into());
    assert_eq!(key_of(&cfg).as_deref(), Some("capacity.worker_id"));
}

#[test]
fn nonces_are_random_safe_ids() {
    let a = random_nonce();
    let b = random_nonce();
    assert_ne!(a, b);
    assert!(proto::is_valid_id(&a) && a.len() == 16, "{a}");
}

/// 512 live streams with 128-byte ids, each an hour behind, and 4,096 partitions: the
/// listed streams alone would take ~80 KB. The announcement the announcer builds stays
/// within `MAX_PAYLOAD_BYTES` (with its margin), lists the most lagging first, says it
/// is truncated, and decodes.
#[tokio::test(start_paused = true)]
async fn an_announcement_of_512_long_ids_and_4096_partitions_fits_and_decodes() {
    use crate::event::{GapCause, GapNotice, StreamEvent};
    use crate::queue::StreamQueue;
    use std::sync::Arc;
    use tokio::time::Instant;
    use weir_protocol::capacity::{MAX_LISTED_STREAMS, MAX_PAYLOAD_BYTES};
    use weir_protocol::stream_id::MAX_STREAM_ID_LEN;

    let cfg = ConsumerConfig {
        max_streams: 1_000,
        capacity: CapacityConfig {
            worker_id: Some("w".repeat(proto::MAX_ID_LEN)),
            ..CapacityConfig::default()
        },
        ..ConsumerConfig::partitioned("audio.{partition}.{stream}", 4_096, 0..4_096)
    };
    let shared = crate::Shared::new(cfg.validate().expect("valid"));
    for i in 0..MAX_LISTED_STREAMS {
        let id = format!("{i:04}{}", "x".repeat(MAX_STREAM_ID_LEN - 4));
        let queue = Arc::new(StreamQueue::new(shared.settings.limits));
        let gap = GapNotice {
            first_seq: 1,
            last_seq: 1,
            samples: None,
            cause: GapCause::Lost,
        };
        queue.push(StreamEvent::Gap(gap), Instant::now());
        shared.registry().open(&id, (i % 4_096) as u32, None, queue);
        // Stream i has waited 1 ms longer than stream i + 1.
        tokio::time::advance(Duration::from_millis(1)).await;
    }
    tokio::time::advance(Duration::from_secs(2 * 3_600)).await;
    let a = super::announcer::announcement(&shared, None, 1, Instant::now());
    let bytes = a.encode();
    assert!(
        bytes.len() <= MAX_PAYLOAD_BYTES - super::announcer::PAYLOAD_MARGIN_BYTES,
        "{} bytes",
        bytes.len()
    );
    let subject = proto::announce_subject(proto::DEFAULT_PREFIX, &a.worker);
    let decoded = proto::Announcement::decode(&subject, &bytes).expect("decodes");
    assert_eq!(decoded.partitions.len(), 4_096);
    assert_eq!(decoded.live_streams, MAX_LISTED_STREAMS as u64);
    assert!(decoded.streams_truncated);
    assert!(
        (200..MAX_LISTED_STREAMS).contains(&decoded.streams.len()),
        "{} listed",
        decoded.streams.len()
    );
    // Most lagging first: the oldest streams, in order.
    for (i, s) in decoded.streams.iter().enumerate() {
        assert!(s.id.starts_with(&format!("{i:04}")), "{i}: {}", s.id);
    }
    assert!(
        decoded
            .streams
            .iter()
            .all(|s| s.lag_ms == proto::MAX_LAG_MS)
    );
}
