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
    let c = s.capacity();
    assert!(c.announce());
    assert_eq!(c.prefix(), "weir.capacity");
    assert_eq!(c.interval(), Duration::from_secs(1));
    assert!(proto::is_valid_id(c.worker_id()), "{}", c.worker_id());
    assert!(c.worker_id().starts_with('w'));
    assert_eq!(
        c.announce_subject(),
        format!("weir.capacity.announce.{}", c.worker_id())
    );
}

#[test]
fn the_toml_key_reads_every_field_and_refuses_unknown_ones() {
    let cfg: ConsumerConfig = toml::from_str(
        "[capacity]\nannounce = false\nprefix = \"fleet.cap\"\ninterval_ms = 250\nworker_id = \"gpu-a\"\n",
    )
    .expect("parses");
    let s = cfg.validate().expect("valid");
    let c = s.capacity();
    assert!(!c.announce());
    assert_eq!(c.prefix(), "fleet.cap");
    assert_eq!(c.interval(), Duration::from_millis(250));
    assert_eq!(c.worker_id(), "gpu-a");
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
    assert_eq!(s.capacity().worker_id(), "lw-1");
    cfg.capacity.worker_id = Some("lw-1".into());
    assert_eq!(
        cfg.validate().expect("same id").capacity().worker_id(),
        "lw-1"
    );
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
