use super::*;
use std::net::IpAddr;
use std::time::Duration;
use weir_audio_producer::config::{DEFAULT_MAX_WAIT, Delivery, Policy, StreamConfigBuilder};

use weir_protocol::partition::DEFAULT_STREAM_TEMPLATE;
use weir_service::admin::RequestLimits;
use weir_service::http::BodyLimits;

/// docs/operations.md § Memory and the metric's docs quote this figure.
#[test]
fn the_memory_bound_at_the_defaults_is_the_documented_sum() {
    let mib = Config::default().memory_bound_bytes() as f64 / f64::from(1 << 20);
    println!("memory bound at the defaults: {mib:.1} MiB");
    assert!((393.0..398.0).contains(&mib), "{mib:.1} MiB");
    // WHIP on: every connection may buffer an offer (4,096 × 64 KiB).
    let mut whip = Config::default();
    whip.server.whip = load(&[], &[("whip_udp_listen", "127.0.0.1:0")])
        .expect("whip on")
        .server
        .whip;
    let with_offers = whip.memory_bound_bytes() as f64 / f64::from(1 << 20);
    assert!(
        (mib + 255.0..mib + 257.0).contains(&with_offers),
        "{with_offers:.1}"
    );
}

fn load(env: &[(&str, &str)], overrides: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::load(&ConfigSources {
        file: None,
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        overrides: overrides
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    })
}

#[test]
fn admin_request_limits_default_to_the_shared_ones_and_flow_from_the_keys() {
    let c = load(&[], &[]).expect("defaults");
    assert_eq!(c.server.admin.request_limits, RequestLimits::default());
    let c = load(
        &[("WEIR_INGRESS_ADMIN_REQUEST_TIMEOUT_MS", "2500")],
        &[("admin.max_concurrent_requests", "3")],
    )
    .expect("valid");
    assert_eq!(
        c.server.admin.request_limits,
        RequestLimits {
            timeout: Duration::from_millis(2500),
            max_concurrent: NonZeroUsize::new(3).expect("3 > 0"),
        }
    );
}

#[test]
fn defaults_are_valid_and_documented() {
    let c = load(&[], &[]).expect("defaults");
    assert_eq!(c, Config::default());
    assert_eq!(c.stream.max_bytes(), 16_000);
    assert_eq!(c.stream.max_age(), Duration::from_millis(500));
    assert_eq!(c.stream.policy(), Policy::Close);
    assert_eq!(c.stream.subject().as_str(), DEFAULT_STREAM_TEMPLATE);
    assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.server.admin.listen.to_string(), "127.0.0.1:9090");
    assert_eq!(
        StreamConfigBuilder::default().build().expect("valid"),
        StreamConfig::default()
    );
    // The raw defaults are the typed ones (each written once, in the typed
    // `Default`s): they validate to the same configuration.
    let raw = RawConfig::default().validate().expect("raw defaults");
    assert_eq!(raw, Config::default());
    assert_eq!(weir_protocol::audio::FRAME_BYTES, 640);
}

#[test]
fn zero_and_absurd_budgets_are_refused_naming_the_key_and_range() {
    let cases = [
        ("max_bytes", "0"),
        ("max_bytes", "100000000000"),
        ("max_age_ms", "0"),
        ("max_age_ms", "3600000"),
        ("max_wait_ms", "501"),
        ("publish_timeout_ms", "0"),
        ("max_frame_bytes", "0"),
        ("max_frame_bytes", "641"),
        ("max_frame_bytes", "64000"),
        ("max_streams", "0"),
        ("ws_send_timeout_ms", "0"),
        ("ws_send_timeout_ms", "60001"),
        ("shadow_ceiling_factor", "1"),
        ("nats.client_capacity", "1"),
        ("grace_period_ms", "999999999"),
        ("max_connections", "0"),
        ("admin.max_connections", "0"),
        ("http_header_timeout_ms", "10"),
        ("http_idle_timeout_ms", "0"),
        ("http_max_header_bytes", "4096"),
        ("admin.request_timeout_ms", "99"),
        ("admin.max_concurrent_requests", "0"),
        ("admin.max_concurrent_requests", "1025"),
    ];
    for (k, v) in cases {
        let err = load(&[], &[(k, v)]).expect_err(k);
        assert_eq!(err.key(), k, "{err}");
        assert!(
            matches!(
                err.kind(),
                ConfigErrorKind::OutOfRange | ConfigErrorKind::Invalid
            ),
            "{err}"
        );
        assert!(err.to_string().contains(k), "{err}");
    }
    let err = load(&[], &[("max_bytes", "0")]).expect_err("zero");
    assert!(err.to_string().contains("6400..=67108864"), "{err}");
}

#[test]
fn env_overrides_file_defaults_and_flags_override_env() {
    let c = load(
        &[
            ("WEIR_INGRESS_MAX_BYTES", "32000"),
            ("WEIR_INGRESS_POLICY", "gap"),
            ("WEIR_INGRESS_EXTENDED_CONSUMERS", "true"),
            ("WEIR_INGRESS_BIN", "/usr/bin/audio-ingress"),
            ("PATH", "/bin"),
        ],
        &[("max_bytes", "48000")],
    )
    .expect("valid");
    assert_eq!(c.stream.max_bytes(), 48_000);
    assert_eq!(c.stream.policy(), Policy::Gap);
    let err = load(&[("WEIR_INGRESS_MAX_BYTES", "lots")], &[]).expect_err("type");
    assert_eq!(err.kind(), ConfigErrorKind::WrongType);
    assert!(err.to_string().contains("WEIR_INGRESS_MAX_BYTES"), "{err}");
}

#[test]
fn partitions_are_bounded_like_the_consumer() {
    let partitioned = ("subject", "audio.{partition}.{stream}");
    let ok = load(&[], &[partitioned, ("partitions", "4096")]).expect("4096");
    assert_eq!(ok.stream.partitions().get(), 4_096);
    // Above the consumers' partition bound: streams no consumer could own.
    let err = load(&[], &[partitioned, ("partitions", "4097")]).expect_err("over");
    assert_eq!(err.kind(), ConfigErrorKind::OutOfRange);
    assert!(err.to_string().contains("partitions"), "{err}");
    assert!(
        weir_audio_consumer::ConsumerConfig {
            partitions: 4_097,
            ..Default::default()
        }
        .validate()
        .is_err(),
        "the consumer refuses the same count"
    );
}

#[test]
fn gap_requires_extended_consumers() {
    let err = load(&[], &[("policy", "gap")]).expect_err("gap");
    assert_eq!(
        (err.key(), err.kind()),
        ("policy", ConfigErrorKind::Conflict)
    );
    let err = load(&[], &[("policy", "drop")]).expect_err("bad");
    assert_eq!(err.key(), "policy");
}

#[test]
fn unknown_keys_and_bad_files_are_refused() {
    let err = load(&[], &[("max_byte", "1")]).expect_err("typo");
    assert_eq!(err.kind(), ConfigErrorKind::UnknownKey);
    assert_eq!(err.key(), "max_byte");
    // A misspelled environment variable too (never ignored silently).
    let err = load(&[("WEIR_INGRESS_MAX_BYTE", "32000")], &[]).expect_err("typo");
    assert_eq!(err.kind(), ConfigErrorKind::UnknownKey);
    assert_eq!(err.key(), "WEIR_INGRESS_MAX_BYTE");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "max_bytes = 32000\nlisten = \"127.0.0.1:0\"\n").expect("write");
    let c = Config::load(&ConfigSources {
        file: Some(path.clone()),
        ..Default::default()
    })
    .expect("file");
    assert_eq!(c.stream.max_bytes(), 32_000);
    assert_eq!(c.server.listen.port(), 0);

    // A decimal key takes a TOML float or integer.
    for (text, permille) in [("max_rate = 2.5\n", 2500), ("max_rate = 3\n", 3000)] {
        std::fs::write(&path, text).expect("write");
        let c = Config::load(&ConfigSources {
            file: Some(path.clone()),
            ..Default::default()
        })
        .expect("decimal");
        assert_eq!(c.stream.max_rate_permille(), permille);
    }
    std::fs::write(&path, "max_rate = \"fast\"\n").expect("write");
    let err = Config::load(&ConfigSources {
        file: Some(path.clone()),
        ..Default::default()
    })
    .expect_err("string for a decimal");
    assert_eq!(err.kind(), ConfigErrorKind::WrongType);

    std::fs::write(&path, "max_bytes = \"big\"\n").expect("write");
    let err = Config::load(&ConfigSources {
        file: Some(path.clone()),
        ..Default::default()
    })
    .expect_err("type");
    assert_eq!(
        (err.key(), err.kind()),
        ("max_bytes", ConfigErrorKind::WrongType)
    );

    std::fs::write(&path, "max_bytes = -5\n").expect("write");
    let err = Config::load(&ConfigSources {
        file: Some(path.clone()),
        ..Default::default()
    })
    .expect_err("negative");
    assert_eq!(
        (err.key(), err.kind()),
        ("max_bytes", ConfigErrorKind::OutOfRange)
    );

    std::fs::write(&path, "[section]\nx = 1\n").expect("write");
    let err = Config::load(&ConfigSources {
        file: Some(path),
        ..Default::default()
    })
    .expect_err("unknown");
    assert_eq!(err.key(), "section");
}

#[test]
fn subject_and_partitions_are_validated() {
    let err = load(&[], &[("subject", "audio.*.{stream}")]).expect_err("wildcard");
    assert_eq!(err.key(), "subject");
    let err = load(&[], &[("subject", "audio.{partition}.{stream}")]).expect_err("p");
    assert_eq!(
        (err.key(), err.kind()),
        ("partitions", ConfigErrorKind::Missing)
    );
    let c = load(
        &[],
        &[
            ("subject", "audio.{partition}.{stream}"),
            ("partitions", "16"),
        ],
    )
    .expect("partitioned");
    assert_eq!(c.stream.partitions().get(), 16);
}

#[test]
fn nats_auth_is_exclusive_and_secrets_are_redacted() {
    let err = load(&[], &[("nats.user", "u")]).expect_err("pw");
    assert_eq!(err.key(), "nats.password");
    let err = load(&[], &[("nats.token", "t"), ("nats.nkey", "SUABC")]).expect_err("two");
    assert_eq!(err.kind(), ConfigErrorKind::Conflict);
    let c = load(&[], &[("nats.user", "u"), ("nats.password", "hunter2")]).expect("ok");
    assert!(!format!("{:?}", c.nats).contains("hunter2"));
    let err = load(&[], &[("nats.creds_file", "/nonexistent/x.creds")]).expect_err("f");
    assert_eq!(err.key(), "nats.creds_file");
    let err = load(&[], &[("nats.url", "not a url at all")]).expect_err("url");
    assert_eq!(err.key(), "nats.url");
    let c = load(&[], &[("nats.url", "nats://a:4222, nats://b:4222")]).expect("urls");
    assert_eq!(c.nats.urls.len(), 2);
}

#[test]
fn every_key_is_settable() {
    let c = load(&[("WEIR_INGRESS_FRAME_HEADERS", "true")], &[]).expect("valid");
    assert!(c.stream.frame_headers());
    assert!(!Config::default().stream.frame_headers());
    let c = load(
        &[("WEIR_INGRESS_DELIVERY", "unconfirmed")],
        &[("confirm_window_ms", "150"), ("confirm_interval_ms", "2")],
    )
    .expect("valid");
    assert_eq!(c.stream.delivery(), Delivery::Unconfirmed);
    assert_eq!(c.stream.confirm_window(), Duration::from_millis(150));
    assert_eq!(c.stream.confirm_interval(), Duration::from_millis(2));
    let err = load(&[], &[("delivery", "maybe")]).expect_err("bad delivery");
    assert_eq!(err.key(), "delivery");
    let err = load(&[], &[("confirm_interval_ms", "400")]).expect_err("too slow");
    assert_eq!(err.key(), "confirm_interval_ms");
    let err = load(&[], &[("confirm_window_min_bytes", "10")]).expect_err("too small");
    assert_eq!(err.key(), "confirm_window_min_bytes");
    let layers = Layers::new(&RawConfig::default());
    assert_eq!(
        keys::uncovered(&layers, SECTIONS),
        (Vec::new(), Vec::new()),
        "SECTIONS documents exactly the keys of RawConfig"
    );
    assert_eq!(SECTIONS.iter().map(|s| s.docs().count()).sum::<usize>(), 80);
    let err = load(&[], &[("jetstream_stream", "a.b")]).expect_err("dot");
    assert_eq!(err.key(), "jetstream_stream");
    let err = load(&[], &[("jetstream_duplicate_window_s", "7200")]).expect_err("window");
    assert_eq!(err.key(), "jetstream_duplicate_window_s");
    let c = load(&[], &[("delivery", "jetstream")]).expect("jetstream");
    assert_eq!(
        c.stream.jetstream().subjects,
        ["inference.whisper.stream.*"]
    );
}

#[test]
fn the_publish_page_is_off_by_default_and_needs_whip() {
    assert!(!load(&[], &[]).expect("defaults").server.publish_page);
    let err = load(&[], &[("publish_page", "true")]).expect_err("no WHIP");
    assert_eq!(err.key(), "publish_page");
    assert_eq!(err.kind(), ConfigErrorKind::Conflict);
    let c = load(
        &[],
        &[("whip_udp_listen", "127.0.0.1:0"), ("publish_page", "true")],
    )
    .expect("on");
    assert!(c.server.publish_page);
}

#[test]
fn whip_keys_validate_and_need_the_udp_socket() {
    assert_eq!(load(&[], &[]).expect("defaults").server.whip, None);
    let c = load(&[], &[("whip_udp_listen", "127.0.0.1:0")]).expect("on");
    let w = c.server.whip.expect("whip on");
    assert_eq!(w.advertise, vec![IpAddr::from([127, 0, 0, 1])]);
    assert_eq!(w.connect_timeout, DEFAULT_WHIP_CONNECT_TIMEOUT);
    assert_eq!(w.disconnect_timeout, DEFAULT_WHIP_DISCONNECT_TIMEOUT);
    assert_eq!(w.max_sessions.get(), DEFAULT_WHIP_MAX_SESSIONS);
    assert_eq!(w.max_sessions_per_ip.get(), DEFAULT_WHIP_MAX_SESSIONS / 4);
    assert!(!w.allow_foreign_candidates);
    let c = load(
        &[],
        &[
            ("whip_udp_listen", "127.0.0.1:0"),
            ("whip_max_sessions", "10"),
            ("whip_allow_foreign_candidates", "true"),
        ],
    )
    .expect("on");
    let w = c.server.whip.expect("whip on");
    assert_eq!(w.max_sessions_per_ip.get(), 2, "a quarter of 10");
    assert!(w.allow_foreign_candidates);
    let err = load(
        &[],
        &[
            ("whip_udp_listen", "127.0.0.1:0"),
            ("whip_max_sessions", "10"),
            ("whip_max_sessions_per_ip", "11"),
        ],
    )
    .expect_err("above the cap");
    assert_eq!(
        (err.key(), err.kind()),
        ("whip_max_sessions_per_ip", ConfigErrorKind::Conflict)
    );
    let c = load(
        &[(
            "WEIR_INGRESS_WHIP_ADVERTISE_IPS",
            "203.0.113.7, 2001:db8::1",
        )],
        &[
            ("whip_udp_listen", "0.0.0.0:8443"),
            ("whip_max_sessions", "3"),
        ],
    )
    .expect("public addresses");
    let w = c.server.whip.expect("whip on");
    assert_eq!(w.advertise.len(), 2);
    assert_eq!(w.max_sessions.get(), 3);
    for (k, v, key) in [
        ("whip_max_sessions", "4", "whip_max_sessions"),
        ("whip_advertise_ips", "1.2.3.4", "whip_advertise_ips"),
    ] {
        let err = load(&[], &[(k, v)]).expect_err("WHIP off");
        assert_eq!((err.key(), err.kind()), (key, ConfigErrorKind::Conflict));
    }
    for (sets, key) in [
        (vec![("whip_udp_listen", "localhost")], "whip_udp_listen"),
        (vec![("whip_udp_listen", "0.0.0.0:0")], "whip_advertise_ips"),
        (
            vec![
                ("whip_udp_listen", "127.0.0.1:0"),
                ("whip_advertise_ips", "0.0.0.0"),
            ],
            "whip_advertise_ips",
        ),
        (
            vec![
                ("whip_udp_listen", "127.0.0.1:0"),
                ("whip_advertise_ips", "x"),
            ],
            "whip_advertise_ips",
        ),
        (
            vec![
                ("whip_udp_listen", "127.0.0.1:0"),
                ("whip_max_sessions", "0"),
            ],
            "whip_max_sessions",
        ),
        (
            vec![
                ("whip_udp_listen", "127.0.0.1:0"),
                ("whip_connect_timeout_ms", "10"),
            ],
            "whip_connect_timeout_ms",
        ),
        (
            vec![
                ("whip_udp_listen", "127.0.0.1:0"),
                ("whip_disconnect_timeout_ms", "999999"),
            ],
            "whip_disconnect_timeout_ms",
        ),
    ] {
        let err = load(&[], &sets).expect_err("refused");
        assert_eq!(err.key(), key, "{sets:?}: {err}");
    }
}

#[test]
fn max_rate_is_a_decimal_in_thousandths_with_zero_for_off() {
    let c = load(&[], &[]).expect("defaults");
    assert_eq!(c.stream.max_rate_permille(), 1500);
    let c = load(&[("WEIR_INGRESS_MAX_RATE", "2.25")], &[]).expect("env");
    assert_eq!(c.stream.max_rate_permille(), 2250);
    let c = load(&[], &[("max_rate", "0")]).expect("off");
    assert_eq!(c.stream.max_rate_permille(), 0);
    for bad in ["0.5", "1001", "-1", "fast", "NaN"] {
        let err = load(&[], &[("max_rate", bad)]).expect_err(bad);
        assert_eq!(err.key(), "max_rate", "{bad}: {err}");
    }
    let c = load(&[], &[("shadow", "true"), ("max_rate", "2")]).expect("shadow");
    assert_eq!(c.stream.enforced_max_rate_permille(), 16_000);
}

#[test]
fn auth_keys_validate_and_never_echo_the_secret() {
    assert_eq!(load(&[], &[]).expect("defaults").server.auth, None);
    let secret = "s3cr3t-s3cr3t-s3cr3t-s3cr3t-s3cr3t";
    let c = load(
        &[("WEIR_INGRESS_AUTH_HS256_SECRET", secret)],
        &[("auth_required", "true")],
    )
    .expect("hs256");
    let auth = c.server.auth.clone().expect("on");
    assert_eq!(auth.leeway_s, 5);
    assert!(!format!("{c:?}").contains("s3cr3t"), "Debug redacts");
    let short = load(
        &[],
        &[
            ("auth_required", "true"),
            ("auth_hs256_secret", "tooshort-SECRET"),
        ],
    )
    .expect_err("short");
    assert_eq!(short.key(), "auth_hs256_secret");
    assert!(!short.to_string().contains("tooshort-SECRET"), "{short}");
    let err = load(&[], &[("auth_required", "true")]).expect_err("no key");
    assert_eq!(err.key(), "auth_required");
    let err = load(&[], &[("auth_hs256_secret", secret)]).expect_err("key without required");
    assert_eq!(err.key(), "auth_required");
    let pk = crate::auth::b64url(&[9u8; 32]);
    let c = load(
        &[],
        &[("auth_required", "true"), ("auth_eddsa_public_key", &pk)],
    )
    .expect("eddsa");
    assert!(matches!(
        c.server.auth.map(|a| a.key),
        Some(crate::auth::AuthKey::EdDsa(_))
    ));
    let err = load(
        &[],
        &[("auth_required", "true"), ("auth_eddsa_public_key", "abc")],
    )
    .expect_err("bad key");
    assert_eq!(err.key(), "auth_eddsa_public_key");
}

#[test]
fn connection_hygiene_keys_default_and_validate() {
    let c = load(&[], &[]).expect("defaults");
    assert_eq!(c.server, ServerConfig::default());
    assert_eq!(c.server.max_connections.get(), 4096);
    assert_eq!(c.server.max_connections_per_ip.get(), 1024);
    assert_eq!(c.server.admin.max_connections.get(), 64);
    assert_eq!(c.server.http_header_timeout, Duration::from_secs(5));
    assert_eq!(c.server.http_body, BodyLimits::default());
    assert_eq!(c.server.http_body.timeout, Duration::from_secs(10));
    assert_eq!(c.server.http_body.min_rate, 1024);
    // Unset, the per-address cap is a quarter of the configured cap: one address
    // never takes every slot.
    for (max, per_ip) in [("100", 25), ("896", 224), ("3", 1), ("1", 1)] {
        let c = load(&[], &[("max_connections", max)]).expect("small cap");
        assert_eq!(c.server.max_connections_per_ip.get(), per_ip, "{max}");
    }
    let c = load(
        &[],
        &[
            ("max_connections", "100"),
            ("max_connections_per_ip", "100"),
        ],
    )
    .expect("set explicitly, up to the cap");
    assert_eq!(c.server.max_connections_per_ip.get(), 100);
    let c = load(
        &[],
        &[("http_body_timeout_ms", "500"), ("http_body_min_rate", "0")],
    )
    .expect("body bounds");
    assert_eq!(c.server.http_body.timeout, Duration::from_millis(500));
    assert_eq!(c.server.http_body.min_rate, 0);
    assert_eq!(
        load(&[], &[("http_body_timeout_ms", "10")])
            .expect_err("too short")
            .key(),
        "http_body_timeout_ms"
    );
    let err = load(
        &[],
        &[
            ("max_connections", "100"),
            ("max_connections_per_ip", "101"),
        ],
    )
    .expect_err("per-ip above the cap");
    assert_eq!(err.key(), "max_connections_per_ip");
    assert_eq!(err.kind(), ConfigErrorKind::Conflict);
}

#[test]
fn the_docs_tables_are_the_generated_ones() {
    let doc = include_str!("../../../../docs/audio-ingress.md");
    assert_eq!(
        keys::stale_docs_sections(doc, &key_table(true), SECTIONS),
        Vec::<&str>::new(),
        "docs/audio-ingress.md: these tables differ from the generated ones; paste the output \
         of `audio-ingress serve --list-keys --markdown`"
    );
}

#[test]
fn precedence_is_file_then_environment_then_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        "max_bytes = 20000\nmax_age_ms = 700\nmax_streams = 10\n",
    )
    .expect("write");
    let env = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let c = Config::load(&ConfigSources {
        file: Some(path),
        env: vec![
            env("WEIR_INGRESS_MAX_BYTES", "24000"),
            env("WEIR_INGRESS_MAX_AGE_MS", "800"),
        ],
        overrides: vec![("max_bytes".to_owned(), "28000".to_owned())],
    })
    .expect("valid");
    assert_eq!(c.stream.max_bytes(), 28_000, "the command line wins");
    assert_eq!(c.stream.max_age(), Duration::from_millis(800), "env > file");
    assert_eq!(c.server.max_streams.get(), 10, "file > default");
    assert_eq!(c.stream.max_wait(), DEFAULT_MAX_WAIT, "the default stays");
}

#[test]
fn text_values_take_the_type_of_the_key() {
    // A secret of digits stays a string; a boolean takes yes/no; a duration in ms
    // takes TOML integer syntax.
    let digits = "12345678901234567890123456789012";
    let c = load(
        &[
            ("WEIR_INGRESS_AUTH_HS256_SECRET", digits),
            ("WEIR_INGRESS_AUTH_REQUIRED", "yes"),
            ("WEIR_INGRESS_NATS_TOKEN", "0042"),
            ("WEIR_INGRESS_IDLE_TIMEOUT_MS", "1_500"),
        ],
        &[("frame_headers", "1")],
    )
    .expect("valid");
    assert_eq!(
        c.server.auth.map(|a| a.key),
        Some(crate::auth::AuthKey::Hs256(digits.as_bytes().to_vec()))
    );
    assert_eq!(c.nats.auth, NatsAuth::Token("0042".to_owned()));
    assert_eq!(c.server.idle_timeout, Duration::from_millis(1_500));
    assert!(c.stream.frame_headers());
    for (var, text) in [
        ("WEIR_INGRESS_IDLE_TIMEOUT_MS", "1500ms"),
        ("WEIR_INGRESS_SHADOW", "on"),
        ("WEIR_INGRESS_MAX_RATE", "fast"),
    ] {
        let err = load(&[(var, text)], &[]).expect_err(text);
        assert_eq!(err.kind(), ConfigErrorKind::WrongType, "{err}");
        assert!(err.to_string().contains(var), "{err}");
    }
    let err = load(&[], &[("max_byts", "1")]).expect_err("typo");
    assert!(
        err.to_string().contains("did you mean `max_bytes`?"),
        "{err}"
    );
}

#[test]
fn shadow_mode_enforces_a_ceiling() {
    let c = StreamConfig::builder().shadow(true).build().expect("valid");
    assert_eq!(c.enforced_max_bytes(), 8 * 16_000);
    assert_eq!(c.enforced_max_age(), Duration::from_secs(4));
    let c = StreamConfig::default();
    assert_eq!(c.enforced_max_bytes(), 16_000);
}

#[test]
fn the_flat_nats_and_admin_names_load_for_one_release_with_a_warning() {
    let sources = ConfigSources {
        file: None,
        env: vec![("WEIR_INGRESS_NATS_URL".into(), "nats://h:4222".into())],
        overrides: vec![
            ("admin".into(), "127.0.0.1:9999".into()),
            ("nats_ping_interval_ms".into(), "1500".into()),
        ],
    };
    let (c, warnings) = Config::load_checked(&sources).expect("loads");
    assert_eq!(c.nats.urls, ["nats://h:4222"]);
    assert_eq!(c.server.admin.listen.to_string(), "127.0.0.1:9999");
    assert_eq!(c.nats.ping_interval, Duration::from_millis(1500));
    let shown: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 3, "{shown:?}");
    for (old, new) in [
        ("nats_url", "nats.url"),
        ("admin", "admin.listen"),
        ("nats_ping_interval_ms", "nats.ping_interval_ms"),
    ] {
        assert!(
            shown
                .iter()
                .any(|w| w.contains(&format!("`{old}`")) && w.contains(&format!("`{new}`"))),
            "{shown:?}"
        );
    }
    // An empty `[admin]` section is the section, not the old `admin` key.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "max_streams = 7\n[admin]\n[nats]\nurl = \"nats://h:1\"\n",
    )
    .expect("write");
    let (c, warnings) = Config::load_checked(&ConfigSources {
        file: Some(file),
        ..ConfigSources::default()
    })
    .expect("loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        (c.server.max_streams.get(), c.nats.urls[0].as_str()),
        (7, "nats://h:1")
    );
    // A refusal names the new key.
    let err = load(&[], &[("nats_user", "u")]).expect_err("no password");
    assert_eq!(err.key(), "nats.password");
    // Every alias leads to a documented key.
    for a in ALIASES {
        assert!(keys::find(SECTIONS, a.new).is_some(), "{}", a.new);
    }
}

#[test]
fn the_default_configuration_has_no_warning() {
    let (c, warnings) = Config::load_checked(&ConfigSources::default()).expect("loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(c.warnings(None).is_empty());
    // The consumers' default idle reap (5 s) against the default hang detection.
    let idle = Duration::from_millis(10_000);
    assert!(c.warnings(Some(idle)).is_empty());
}

#[test]
fn a_bad_timeout_chain_is_a_warning_naming_both_keys_and_the_numbers() {
    let c = load(&[], &[("max_age_ms", "200"), ("publish_timeout_ms", "150")]).expect("loads");
    let w = c.warnings(None);
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].keys(), ["publish_timeout_ms", "max_age_ms"]);
    let text = w[0].to_string();
    assert!(
        text.contains("publish_timeout_ms = 150") && text.contains("max_age_ms = 200"),
        "{text}"
    );
    let c = Config::default();
    let w = c.warnings(Some(Duration::from_millis(5_000)));
    assert_eq!(w.len(), 1, "{w:?}");
    let text = w[0].to_string();
    assert!(
        text.contains("idle_timeout_ms = 5000")
            && text.contains("nats.ping_interval_ms (2000)")
            && text.contains("= 8000 ms"),
        "{text}"
    );
}

#[test]
fn the_capacity_section_is_typed_and_validated() {
    let c = Config::default();
    assert_eq!(c.capacity.mode, CapacityMode::Enforce);
    assert_eq!(c.capacity.prefix, "weir.capacity");
    assert_eq!(c.capacity.max_lag, Duration::from_millis(500));
    let c = load(
        &[("WEIR_INGRESS_CAPACITY__MODE", "shadow")],
        &[
            ("capacity.max_lag_ms", "250"),
            ("capacity.prefix", "asr.cap"),
        ],
    )
    .expect("valid");
    assert_eq!(c.capacity.mode, CapacityMode::Shadow);
    assert_eq!(c.capacity.max_lag, Duration::from_millis(250));
    assert_eq!(c.capacity.prefix, "asr.cap");
    let c = load(&[], &[("capacity.mode", "off")]).expect("off");
    assert_eq!(c.capacity.mode, CapacityMode::Off);
    let err = load(&[], &[("capacity.mode", "maybe")]).expect_err("mode");
    assert_eq!(err.key(), "capacity.mode");
    let err = load(&[], &[("capacity.max_lag_ms", "5")]).expect_err("lag");
    assert_eq!(
        (err.key(), err.kind()),
        ("capacity.max_lag_ms", ConfigErrorKind::OutOfRange)
    );
    let err = load(&[], &[("capacity.prefix", "weir.*")]).expect_err("prefix");
    assert_eq!(err.key(), "capacity.prefix");
}

#[test]
fn the_telephony_keys_are_validated_and_name_the_key() {
    let c = load(&[], &[]).expect("defaults");
    assert_eq!(c.telephony, crate::telephony::TelephonyConfig::default());
    let c = load(
        &[("WEIR_INGRESS_TELEPHONY__REORDER_WINDOW_MS", "100")],
        &[
            ("telephony.out_max_bytes", "96000"),
            ("telephony.out_max_age_ms", "4000"),
        ],
    )
    .expect("valid");
    assert_eq!(c.telephony.reorder_window, Duration::from_millis(100));
    assert_eq!(c.telephony.out.max_bytes, 96_000);
    for (key, value) in [
        ("telephony.subject_prefix", "weir.>"),
        ("telephony.reorder_window_ms", "5000"),
        ("telephony.out_max_bytes", "1000"),
        ("telephony.out_lead_ms", "2000"),
    ] {
        let err = load(&[], &[(key, value)]).expect_err(key);
        assert_eq!(err.key(), key);
    }
    // 15 s of audio cannot be held by an age bound of 10 s.
    let err = load(&[], &[("telephony.out_max_age_ms", "10000")]).expect_err("age < bytes");
    assert_eq!(err.key(), "telephony.out_max_age_ms");
    assert!(err.to_string().contains("15000 ms"), "{err}");
}
