use super::*;
use weir_protocol::WireName;
use weir_service::admin::RequestLimits;

use weir_testkit::names::assert_serde_names;

#[test]
fn wire_names_are_the_serde_names_or_unchanged() {
    use crate::admission::{CancelResult, StopReason};
    use crate::intake::TermReason;
    assert_serde_names::<Mode>();
    assert_serde_names::<CancelResult>();
    assert_serde_names::<crate::trace::TraceKind>();
    let names = |all: &[&'static str]| all.to_vec();
    let stops: Vec<_> = StopReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        stops,
        names(&["caller_gone", "caller_stalled", "publish_timeout"])
    );
    let terms: Vec<_> = TermReason::ALL.iter().map(|r| r.to_string()).collect();
    let want = [
        "expired",
        "invalid",
        "no_reply",
        "no_headers",
        "request_id_conflict",
        "session_cap",
        "key_limit",
        "wait_expired",
        "slot_store",
    ];
    assert_eq!(terms, want);
}

#[test]
fn backend_kind_names_are_unchanged() {
    let kind = |text: &str| Config::from_toml_str(text).expect("valid").backend.kind;
    assert_eq!(Config::default().backend.kind.name(), "sim");
    let nats = kind("[backend]\nkind = \"nats\"\n[backend.nats]\nsubject = \"svc\"");
    assert_eq!(nats.name(), "nats");
    let openai = "[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"https://x/\"";
    assert_eq!(kind(openai).name(), "openai");
}

fn err(text: &str) -> ConfigError {
    Config::from_toml_str(text).expect_err("must be refused")
}

#[test]
fn one_nats_auth_method_at_a_time() {
    let e = err("[nats]\nuser = \"u\"\npassword = \"p\"\ntoken = \"t\"\n");
    assert!(e.to_string().contains("nats.token"), "{e}");
    assert!(e.to_string().contains("user, token"), "{e}");
    let e = err("[nats]\ntoken = \"t\"\nnkey = \"SUAK\"\n");
    assert!(e.to_string().contains("one authentication method"), "{e}");
    assert!(Config::from_toml_str("[nats]\ntoken = \"t\"\n").is_ok());
}

#[test]
fn nats_secrets_never_appear_in_debug_output() {
    for (toml, secret) in [
        ("user = \"weir\"\npassword = \"pa55-word\"", "pa55-word"),
        ("token = \"t0ken-value\"", "t0ken-value"),
        ("nkey = \"SUAKSEEDVALUE\"", "SUAKSEEDVALUE"),
    ] {
        let c = Config::from_toml_str(&format!("[nats]\n{toml}\n")).expect("valid");
        let shown = format!("{c:?}");
        assert!(!shown.contains(secret), "{secret} in {shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}

#[test]
fn defaults_are_valid_and_documented_values() {
    let c = Config::default();
    assert_eq!(c.admission.workers.get(), 8);
    assert_eq!(c.admission.queue_capacity.get(), 256);
    assert_eq!(
        c.admission.session.pending_cap.map(NonZeroUsize::get),
        Some(5)
    );
    assert!(c.admission.session.ordering);
    assert_eq!(c.admission.deadline.default, Some(Duration::from_secs(30)));
    assert_eq!(c.admission.mode, Mode::Enforce);
    assert!(c.admission.limits.is_empty());
    assert_eq!(c.backend.kind.name(), "sim");
    assert_eq!(c.service.subject, "llm.infer");
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:9091");
    assert_eq!(c.admin.max_connections.get(), 64);
    assert_eq!(c.admin.header_timeout, Duration::from_secs(5));
    assert_eq!(c.admin.idle_timeout, Duration::from_secs(10));
}

#[test]
fn deadline_defaults_are_adaptive_and_the_new_keys_are_checked() {
    let c = Config::default();
    assert_eq!(
        c.admission.deadline.min_start_budget, None,
        "unset = adaptive"
    );
    assert_eq!(c.admission.deadline.reply_margin, Duration::from_millis(20));
    assert!(c.admission.deadline.predict);
    assert_eq!(c.admission.queue_order, QueueOrder::Edf);
    assert_eq!(c.admission.deadline.overtake_share_pct, 50);
    assert_eq!(c.admission.estimator, EstimatorConfig::default());
    let v = c.capabilities();
    assert_eq!(v["deadline"]["start_budget"], "adaptive");
    assert_eq!(v["deadline"]["reply_margin_ms"], 20);
    assert_eq!(v["queue_order"], "edf");
    assert_eq!(v["deadline"]["overtake_share_pct"], 50);
    assert_eq!(v["estimator"]["initial_ms"], serde_json::Value::Null);
    assert_eq!(v["estimator"]["quantile"], 0.9);

    let c = Config::from_toml_str(
        "queue_order = \"fifo\"\n[deadline]\nmin_start_budget_ms = 0\nreply_margin_ms = 5\npredict = false\novertake_share_pct = 0\n[estimator]\ninitial_ms = 80\nwindow = 32\nhalf_life = 8\nquantile = 0.95",
    )
    .expect("valid");
    assert_eq!(
        c.admission.deadline.min_start_budget,
        Some(Duration::ZERO),
        "set = fixed"
    );
    assert_eq!(c.capabilities()["deadline"]["start_budget"], "fixed");
    assert_eq!(c.admission.deadline.reply_margin, Duration::from_millis(5));
    assert!(!c.admission.deadline.predict);
    assert_eq!(c.admission.queue_order, QueueOrder::Fifo);
    assert_eq!(c.admission.deadline.overtake_share_pct, 0);
    assert_eq!(
        c.admission.estimator.initial,
        Some(Duration::from_millis(80))
    );
    assert_eq!(
        (
            c.admission.estimator.window,
            c.admission.estimator.half_life
        ),
        (32, 8.0)
    );

    assert_eq!(err("queue_order = \"lifo\"").key(), "queue_order");
    assert_eq!(
        err("[deadline]\novertake_share_pct = 95").key(),
        "deadline.overtake_share_pct"
    );
    assert_eq!(
        err("[deadline]\nmin_start_budget_ms = -1").key(),
        "deadline.min_start_budget_ms"
    );
    assert_eq!(
        err("[estimator]\nwindow = 8\nhalf_life = 16").key(),
        "estimator.half_life"
    );
    assert_eq!(
        err("[estimator]\nquantile = 1.5").key(),
        "estimator.quantile"
    );
    assert_eq!(err("[estimator]\nwindow = 0").key(), "estimator.window");
    assert_eq!(err("[estimator]\nseed_ms = 5").key(), "estimator.seed_ms");
}

#[test]
fn session_cap_zero_means_unlimited() {
    let c = Config::from_toml_str("[session]\npending_cap = 0").expect("valid");
    assert_eq!(c.admission.session.pending_cap, None);
}

#[test]
fn capabilities_show_null_for_disabled_limits() {
    let c = Config::from_toml_str(
        "[session]\npending_cap = 0\n[deadline]\ndefault_ms = 0\n[idempotency]\nenabled = false",
    )
    .expect("valid");
    let v = c.capabilities();
    assert_eq!(v["session"]["pending_cap"], serde_json::Value::Null);
    assert_eq!(v["deadline"]["default_ms"], serde_json::Value::Null);
    assert_eq!(
        v["deadline"]["min_start_budget_ms"],
        serde_json::Value::Null
    );
    assert_eq!(v["idempotency"], serde_json::Value::Null);
    assert_eq!(v["limits"], serde_json::json!([]));
    let v = Config::default().capabilities();
    assert_eq!(v["session"]["pending_cap"], 5);
    assert_eq!(v["queue_capacity"], 256);
    assert_eq!(v["mode"], "enforce");
    assert_eq!(v["headers"]["request_id"], "Weir-Request-Id");
}

#[test]
fn negative_fractional_and_non_numeric_caps_are_refused_with_the_key() {
    for bad in ["-1", "2.5", "\"five\"", "true"] {
        let e = err(&format!("[session]\npending_cap = {bad}"));
        assert_eq!(e.key(), "session.pending_cap", "{bad}");
        assert!(
            matches!(
                e.kind(),
                ConfigErrorKind::WrongType | ConfigErrorKind::OutOfRange
            ),
            "{e}"
        );
        assert!(e.to_string().contains("0..=1000000"), "{e}");
    }
    let e = err("workers = 0");
    assert_eq!(e.key(), "workers");
    assert!(e.to_string().contains("1..=4096"), "{e}");
}

#[test]
fn idempotency_max_bytes_defaults_to_64_mib_and_is_range_checked() {
    let c = Config::default();
    let i = c.admission.idempotency.expect("enabled by default");
    assert_eq!(i.max_bytes.get(), 64 * 1024 * 1024);
    assert_eq!(
        c.capabilities()["idempotency"]["max_bytes"],
        64 * 1024 * 1024
    );
    let c = Config::from_toml_str("[idempotency]\nmax_bytes = 1048576").expect("valid");
    assert_eq!(
        c.admission.idempotency.map(|i| i.max_bytes.get()),
        Some(1 << 20)
    );
    for bad in ["0", "1023", "-1", "\"64MiB\"", "68719476737"] {
        let e = err(&format!("[idempotency]\nmax_bytes = {bad}"));
        assert_eq!(e.key(), "idempotency.max_bytes", "{bad}");
        assert!(e.to_string().contains("1024..=68719476736"), "{e}");
    }
}

#[test]
fn subscription_capacity_follows_the_queue_and_the_expected_burst() {
    let c = Config::default();
    assert_eq!(c.nats.client.subscription_capacity, Some(256 + 65_536));
    let c = Config::from_toml_str("queue_capacity = 1000\n[nats]\nexpected_burst = 20000")
        .expect("valid");
    assert_eq!(c.nats.client.subscription_capacity, Some(21_000));
    let c = Config::from_toml_str("[nats]\nsubscription_capacity = 300").expect("valid");
    assert_eq!(c.nats.client.subscription_capacity, Some(300));
    let e = err("queue_capacity = 512\n[nats]\nsubscription_capacity = 500");
    assert_eq!(e.key(), "nats.subscription_capacity");
    assert!(
        e.to_string().contains("smaller than queue_capacity (512)"),
        "{e}"
    );
    let e = err("[nats]\nexpected_burst = -1");
    assert_eq!(e.key(), "nats.expected_burst");
}

#[test]
fn unknown_keys_are_refused_with_their_path() {
    let e = err("queue_capacty = 5");
    assert_eq!(
        (e.key(), e.kind()),
        ("queue_capacty", ConfigErrorKind::UnknownKey)
    );
    let e = err("[session]\npending = 5");
    assert_eq!(e.key(), "session.pending");
    let e = err("[[limits]]\nkey = \"client\"\nlimit = 2\nmax_wait = 5");
    assert_eq!(e.key(), "limits[0].max_wait");
}

#[test]
fn the_key_table_lists_every_key_with_its_default_and_range() {
    let (undocumented, extra) = keys::uncovered(&layers(), SECTIONS);
    assert!(
        undocumented.is_empty(),
        "keys without docs: {undocumented:?}"
    );
    assert!(extra.is_empty(), "docs without keys: {extra:?}");
    let layers = layers();
    let rows: Vec<keys::KeyRow> = SECTIONS
        .iter()
        .flat_map(|s| keys::rows(&layers, s))
        .collect();
    let get = |k: &str| {
        rows.iter()
            .find(|r| r.name == k)
            .unwrap_or_else(|| panic!("{k} listed"))
    };
    assert_eq!(get("stream.window").default.as_deref(), Some("16"));
    assert_eq!(
        get("stream.window").range,
        "0..=100000 (0 = no acknowledgements)"
    );
    assert_eq!(get("stream.ack_timeout_ms").default, None, "follows nats");
    assert!(
        get("stream.ack_timeout_ms")
            .help
            .contains("nats.publish_timeout_ms")
    );
    assert_eq!(get("stream.ack_timeout_ms").ty, "integer");
    assert_eq!(get("backend.openai.tls_ca_file").default, None);
    assert_eq!(
        get("backend.openai.base_url").default.as_deref(),
        Some("http://127.0.0.1:8000")
    );
    assert_eq!(
        get("backend.sim.first_token_ms").default.as_deref(),
        Some("20")
    );
    assert_eq!(get("backend.sim.p99_ms").ty, "integer");
    assert_eq!(
        get("service.status_subject").default.as_deref(),
        Some("llm.status")
    );
    assert_eq!(get("workers").range, "1..=4096");
    assert_eq!(get("limits[].max_wait_ms").default.as_deref(), Some("1000"));
    assert_eq!(get("limits[].on_busy").default.as_deref(), Some("wait"));
    assert_eq!(
        get("admin.request_timeout_ms").default.as_deref(),
        Some("10000")
    );
    assert_eq!(
        get("admin.max_concurrent_requests").default.as_deref(),
        Some("8")
    );
    assert!(rows.len() > 100, "{} keys", rows.len());
    // Every numeric key has typed bounds for `validate` to check.
    for r in &rows {
        let range = keys::range(SECTIONS, &r.name);
        if r.ty == "integer" {
            assert!(range.bounds().is_some(), "{}: {}", r.name, r.range);
        }
        if r.ty == "decimal" {
            assert!(
                matches!(range, Range::Decimal { .. }),
                "{}: {}",
                r.name,
                r.range
            );
        }
    }
}

/// docs/llm-adapter.md holds the tables `--list-keys --markdown` prints; this
/// fails when they differ (regenerate them with that command).
#[test]
fn the_docs_tables_are_the_generated_ones() {
    let doc = include_str!("../../../../docs/llm-adapter.md");
    assert_eq!(
        keys::stale_docs_sections(doc, &key_table(true), SECTIONS),
        Vec::<&str>::new(),
        "docs/llm-adapter.md: these tables differ from the generated ones; paste the output \
         of `llm-adapter serve --list-keys --markdown`"
    );
}

#[test]
fn admin_request_limits_default_to_the_shared_ones_and_flow_from_the_keys() {
    assert_eq!(
        Config::default().admin.request_limits,
        RequestLimits::default()
    );
    let c = Config::from_toml_str(
        "[admin]
request_timeout_ms = 2500
max_concurrent_requests = 3",
    )
    .expect("valid");
    assert_eq!(
        c.admin.request_limits,
        RequestLimits {
            timeout: Duration::from_millis(2500),
            max_concurrent: NonZeroUsize::new(3).expect("3 > 0"),
        }
    );
    for bad in [
        "request_timeout_ms = 99",
        "max_concurrent_requests = 0",
        "max_concurrent_requests = 1025",
    ] {
        let e = err(&format!("[admin]\n{bad}"));
        assert!(e.key().starts_with("admin."), "{e}");
        assert!(bad.starts_with(e.key().trim_start_matches("admin.")), "{e}");
    }
}

fn load(
    file: Option<&str>,
    env: &[(&str, &str)],
    set: &[(&str, &str)],
) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("adapter.toml");
    if let Some(text) = file {
        std::fs::write(&path, text).expect("write");
    }
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    Config::load(&ConfigSources {
        file: file.map(|_| path.clone()),
        env: pairs(env),
        overrides: pairs(set),
    })
}

#[test]
fn precedence_is_file_then_environment_then_command_line() {
    let file = "workers = 2
queue_capacity = 100
[session]
pending_cap = 7
[nats]
url = \"nats://file:4222\"
";
    let c = load(
        Some(file),
        &[
            ("WEIR_LLM_QUEUE_CAPACITY", "200"),
            ("WEIR_LLM_WORKERS", "3"),
        ],
        &[("workers", "4"), ("nats.url", "nats://flag:4222")],
    )
    .expect("valid");
    assert_eq!(
        c.admission.workers.get(),
        4,
        "the command line beats the environment"
    );
    assert_eq!(
        c.admission.queue_capacity.get(),
        200,
        "the environment beats the file"
    );
    assert_eq!(
        c.admission.session.pending_cap.map(NonZeroUsize::get),
        Some(7),
        "the file beats the default"
    );
    assert_eq!(c.nats.client.url_list(), "nats://flag:4222");
    assert_eq!(
        c.admission.deadline.max,
        Duration::from_secs(120),
        "the default stays"
    );
    // A refusal says where the value came from.
    let e = load(Some("workers = 0\n"), &[], &[]).expect_err("zero");
    assert!(e.to_string().contains("adapter.toml"), "{e}");
    let e = load(None, &[("WEIR_LLM_WORKERS", "0")], &[]).expect_err("zero");
    assert!(e.to_string().contains("WEIR_LLM_WORKERS"), "{e}");
}

/// The old loader typed environment values by their text alone: a numeric token
/// was an integer, refused as "expected a string". A value takes its key's type.
#[test]
fn a_numeric_nats_token_from_the_environment_is_a_string() {
    let c = load(None, &[("WEIR_LLM_NATS__TOKEN", "123456")], &[]).expect("valid");
    let shown = format!("{:?}", c.nats.client);
    assert!(!shown.contains("123456"), "redacted: {shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
    let c = load(
        None,
        &[
            ("WEIR_LLM_SERVICE__VERSION", "1.2.3"),
            ("WEIR_LLM_SERVICE__NAME", "42"),
        ],
        &[],
    )
    .expect("valid");
    assert_eq!(
        (c.service.version.as_str(), c.service.name.as_str()),
        ("1.2.3", "42")
    );
}

#[test]
fn limits_elements_are_keys_with_their_index() {
    let file = "[[limits]]\nkey = \"client\"\nlimit = 1\n[[limits]]\nkey = \"session\"\nlimit = 2\nmax_wait_ms = -3\n";
    let e = load(Some(file), &[], &[]).expect_err("negative");
    assert_eq!(e.key(), "limits[1].max_wait_ms", "{e}");
    assert!(e.to_string().contains("1..=3600000"), "{e}");
    let file = "[[limits]]\nkey = \"client\"\nlimit = 1\n";
    let c = load(
        Some(file),
        &[],
        &[("limits[0].limit", "5"), ("limits[0].on_busy", "reject")],
    )
    .expect("valid");
    assert_eq!(c.admission.limits[0].limit.get(), 5);
    assert_eq!(c.admission.limits[0].on_busy, OnBusy::Reject);
    let e = load(Some(file), &[], &[("limits[0].max_waiter", "5")]).expect_err("typo");
    assert_eq!(
        (e.key(), e.kind()),
        ("limits[0].max_waiter", ConfigErrorKind::UnknownKey)
    );
    assert!(e.to_string().contains("`limits[].max_waiters`"), "{e}");
    assert_eq!(err("[[limits]]\nlimit = 1").key(), "limits[0].key");
}

#[test]
fn limits_parse_with_defaults_and_validation() {
    let c = Config::from_toml_str(
        r#"
        [[limits]]
        key = "client"
        limit = 2
        [[limits]]
        name = "model"
        key = "body:/model"
        limit = 4
        on_busy = "reject"
        "#,
    )
    .expect("valid");
    assert_eq!(c.admission.limits.len(), 2);
    assert_eq!(c.admission.limits[0].name, "client");
    assert_eq!(
        c.admission.limits[0].on_busy,
        OnBusy::Wait {
            max_wait: Duration::from_secs(1),
            max_waiters: 100
        }
    );
    assert_eq!(c.admission.limits[1].key, KeySource::Body("/model".into()));
    assert_eq!(c.admission.limits[1].on_busy, OnBusy::Reject);

    let e = err("[[limits]]\nkey = \"client\"");
    assert_eq!(e.key(), "limits[0].limit");
    let e = err("[[limits]]\nkey = \"header\"\nlimit = 1");
    assert_eq!(e.key(), "limits[0].key");
    let e = err("[[limits]]\nkey = \"client\"\nlimit = 1\nmax_wait_ms = -3");
    assert_eq!(e.key(), "limits[0].max_wait_ms");
    let e = err("[[limits]]\nkey = \"client\"\nlimit = 1\n[[limits]]\nkey = \"client\"\nlimit = 2");
    assert_eq!(e.key(), "limits[1].name");
}

#[test]
fn intake_defaults_to_core_and_jetstream_keys_are_checked_with_their_names() {
    assert_eq!(Config::default().intake, Intake::Core);
    let c = Config::from_toml_str("intake = \"jetstream\"\nworkers = 3").expect("valid");
    let j = c.intake.jetstream().expect("jetstream");
    assert_eq!(j.stream, "WEIR_LLM_INTAKE");
    assert_eq!(j.subject, "llm.intake");
    assert_eq!(j.consumer, "weir-llm");
    assert_eq!(j.ack_wait, Duration::from_secs(10));
    assert_eq!(j.progress_interval, Duration::from_millis(3333));
    assert_eq!(j.max_ack_pending.get(), 3, "defaults to workers");
    assert!(j.forward && j.file_storage);
    assert_eq!(c.capabilities()["intake"]["kind"], "jetstream");
    assert_eq!(Config::default().capabilities()["intake"]["kind"], "core");
    for (text, key) in [
        ("intake = \"kafka\"", "intake"),
        (
            "[jetstream]\nack_wait_ms = 1000\nprogress_interval_ms = 1000",
            "jetstream.progress_interval_ms",
        ),
        (
            "workers = 4\n[jetstream]\nmax_ack_pending = 2",
            "jetstream.max_ack_pending",
        ),
        ("[jetstream]\nstream = \"a.b\"", "jetstream.stream"),
        ("[jetstream]\nconsumer = \"\"", "jetstream.consumer"),
        ("[jetstream]\nsubject = \"llm.*\"", "jetstream.subject"),
        ("[jetstream]\nstorage = \"disk\"", "jetstream.storage"),
        ("[jetstream]\nack_wait_ms = 5", "jetstream.ack_wait_ms"),
        (
            "[jetstream]\nsession_bucket = \"x y\"",
            "jetstream.session_bucket",
        ),
        (
            "[jetstream]\nreply_bucket = \"weir_llm_sessions\"",
            "jetstream.reply_bucket",
        ),
        ("[jetstream]\nmax_deliver = 0", "jetstream.max_deliver"),
        ("[jetstream]\nwat = 1", "jetstream.wat"),
    ] {
        let e = Config::from_toml_str(text).expect_err(text);
        assert_eq!(e.key(), key, "{text}: {e}");
    }
}

#[test]
fn backend_and_service_values_are_checked() {
    assert_eq!(err("[backend]\nkind = \"gpu\"").key(), "backend.kind");
    assert_eq!(
        err("[backend]\nkind = \"nats\"").key(),
        "backend.nats.subject"
    );
    assert_eq!(
        err("[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"ftp://x\"").key(),
        "backend.openai.base_url"
    );
    assert_eq!(
        err("[backend.openai]\nbase_url = \"https://\"").key(),
        "backend.openai.base_url"
    );
    assert_eq!(
        err("[backend.openai]\nbase_url = \"https://x\"\ntls_cert_file = \"c.pem\"").key(),
        "backend.openai.tls_key_file"
    );
    assert_eq!(
        err("[backend.openai]\nbase_url = \"http://x\"\ntls_ca_file = \"ca.pem\"").key(),
        "backend.openai.tls_ca_file"
    );
    let c = Config::from_toml_str(
        "[backend]\nkind = \"openai\"\n[backend.openai]\nbase_url = \"https://api.example.com/\"\ntls_ca_file = \"ca.pem\"",
    )
    .expect("https accepted");
    let BackendKind::OpenAi(o) = &c.backend.kind else {
        panic!("openai expected");
    };
    assert_eq!(o.base_url, "https://api.example.com");
    assert_eq!(
        o.tls_ca_file.as_deref(),
        Some(std::path::Path::new("ca.pem"))
    );
    assert_eq!(
        err("[backend.sim]\nerror_rate = 1.5").key(),
        "backend.sim.error_rate"
    );
    assert_eq!(
        err("[backend.sim]\np99_ms = 50").key(),
        "backend.sim.p99_ms"
    );
    assert_eq!(
        err("[backend.sim]\ndistribution = \"lognormal\"\nmin_ms = 5").key(),
        "backend.sim.min_ms"
    );
    let c = Config::from_toml_str(
        "[backend.sim]\ndistribution = \"uniform\"\nmin_ms = 5\nlatency_ms = 30",
    )
    .expect("uniform");
    let BackendKind::Sim(sim) = c.backend.kind else {
        panic!("sim expected");
    };
    assert_eq!(
        sim.latency,
        Latency::Uniform {
            min: Duration::from_millis(5),
            max: Duration::from_millis(30)
        }
    );
    assert_eq!(
        err("[service]\nsubject = \"a..b\"").key(),
        "service.subject"
    );
    assert_eq!(err("[service]\nversion = \"1.0\"").key(), "service.version");
    assert_eq!(err("[service]\nname = \"a b\"").key(), "service.name");
    assert_eq!(err("[admin]\nlisten = \"localhost\"").key(), "admin.listen");
    assert_eq!(
        err("[admin]\nmax_connections = 0").key(),
        "admin.max_connections"
    );
    assert_eq!(
        err("[admin]\nheader_timeout_ms = 5").key(),
        "admin.header_timeout_ms"
    );
    assert_eq!(
        err("[deadline]\ndefault_ms = 10\nmax_ms = 5").key(),
        "deadline.default_ms"
    );
    assert_eq!(err("[trace]\nsubject = \"ev.*\"").key(), "trace.subject");
    assert_eq!(err("mode = \"loud\"").key(), "mode");
    assert_eq!(err("[nats]\nuser = \"u\"").key(), "nats.password");
    assert_eq!(err("workers = [").kind(), ConfigErrorKind::File);
}

#[test]
fn env_overrides_are_typed_and_nested() {
    let c = load(
        Some("workers = 2"),
        &[
            ("WEIR_LLM_WORKERS", "3"),
            ("WEIR_LLM_SESSION__PENDING_CAP", "0"),
            ("WEIR_LLM_BACKEND__SIM__ERROR_RATE", "0.25"),
            ("WEIR_LLM_MODE", "shadow"),
            ("WEIR_LLM_NATS_URL", "nats://x"),
            ("WEIR_LLM_CONFIG", "ignored.toml"),
            ("OTHER", "1"),
        ],
        &[],
    )
    .expect("valid");
    assert_eq!(c.admission.workers.get(), 3);
    assert_eq!(c.admission.session.pending_cap, None);
    assert_eq!(c.admission.mode, Mode::Shadow);
    match c.backend.kind {
        BackendKind::Sim(s) => assert_eq!(s.error_rate, 0.25),
        other => panic!("unexpected {other:?}"),
    }
    let e = load(None, &[("WEIR_LLM_SESSION__PENDING_CAP", "-2")], &[]).expect_err("refused");
    assert_eq!(e.key(), "session.pending_cap");
    let e = load(None, &[("WEIR_LLM_LIMITS__0", "1")], &[]).expect_err("refused");
    assert!(e.to_string().contains("WEIR_LLM_LIMITS__0"), "{e}");
    let e = load(None, &[("WEIR_LLM_QUEUE_CAPACTY", "5")], &[]).expect_err("typo");
    assert_eq!(
        (e.key(), e.kind()),
        ("queue_capacty", ConfigErrorKind::UnknownKey)
    );
    assert!(e.to_string().contains("WEIR_LLM_QUEUE_CAPACTY"), "{e}");
    assert!(
        e.to_string().contains("did you mean `queue_capacity`?"),
        "{e}"
    );
}

#[test]
fn the_default_configuration_has_no_warning() {
    let (c, warnings) = Config::load_checked(&ConfigSources::default()).expect("loads");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(c.warnings().is_empty(), "{:?}", c.warnings());
    let durable = Config::from_toml_str("intake = \"jetstream\"").expect("valid");
    assert!(durable.warnings().is_empty(), "{:?}", durable.warnings());
}

#[test]
fn a_bad_timeout_chain_is_a_warning_naming_both_keys_and_the_numbers() {
    let c = Config::from_toml_str("[deadline]\nmax_ms = 30000\n[backend]\ntimeout_ms = 45000\n")
        .expect("loads");
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].keys(), ["backend.timeout_ms", "deadline.max_ms"]);
    let text = w[0].to_string();
    assert!(
        text.contains("backend.timeout_ms = 45000") && text.contains("deadline.max_ms = 30000"),
        "{text}"
    );
    let c = Config::from_toml_str(
        "intake = \"jetstream\"\n[backend]\ntimeout_ms = 5000\n[jetstream]\nack_wait_ms = 5000\n",
    )
    .expect("loads");
    let w = c.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].keys(), ["jetstream.ack_wait_ms", "backend.timeout_ms"]);
    assert!(
        w[0].to_string().contains("jetstream.ack_wait_ms = 5000"),
        "{}",
        w[0]
    );
}

#[test]
fn nats_and_admin_are_the_shared_sections_with_the_adapter_keys_beside_them() {
    let c = Config::from_toml_str(
        "[nats]\nurl = \"nats://h:1\"\nclient_capacity = 64\nexpected_burst = 10\n\
         [admin]\nmax_connections = 10000\nheader_timeout_ms = 200\n",
    )
    .expect("loads");
    assert_eq!(c.nats.client.urls, ["nats://h:1"]);
    assert_eq!(c.nats.client.client_capacity, 64);
    assert_eq!(c.nats.client.subscription_capacity, Some(256 + 10));
    assert_eq!(c.admin.max_connections.get(), 10_000);
    assert_eq!(c.admin.header_timeout, Duration::from_millis(200));
    // The flattened sections still refuse an unknown key, with the nearest one.
    let e = err("[nats]\nurll = \"nats://h:1\"\n");
    assert_eq!(
        (e.key(), e.kind()),
        ("nats.urll", ConfigErrorKind::UnknownKey)
    );
    assert!(e.to_string().contains("did you mean `nats.url`?"), "{e}");
    let e = err("[admin]\nmax_connection = 3\n");
    assert_eq!(e.kind(), ConfigErrorKind::UnknownKey);
    // The chosen ranges: connect 100..=60000 ms, admin connections 1..=10000.
    let e = err("[nats]\nconnection_timeout_ms = 99\n");
    assert_eq!(e.allowed(), Some("100..=60000 ms"));
    let e = err("[admin]\nmax_connections = 10001\n");
    assert_eq!(e.allowed(), Some("1..=10000"));
}

#[test]
fn token_budgets_parse_and_refusals_name_the_key() {
    let c = Config::from_toml_str(
        "[[limits]]\nkey = \"client\"\nlimit = 8\ntokens_per_minute = 10000\n\
         [[limits]]\nkey = \"service\"\nlimit = 64\n",
    )
    .expect("valid");
    let t = c.admission.limits[0].tokens.expect("a budget");
    assert_eq!(
        (
            t.tokens_per_minute.get(),
            t.default_max_tokens,
            t.max_keys.get()
        ),
        (10_000, 256, 10_000)
    );
    assert_eq!(c.admission.limits[1].tokens, None, "0 = no budget");
    let caps = c.capabilities();
    assert_eq!(caps["limits"][0]["tokens_per_minute"], 10_000);
    assert_eq!(caps["limits"][0]["default_max_tokens"], 256);
    assert!(caps["limits"][1]["tokens_per_minute"].is_null());
    for (extra, key) in [
        ("tokens_per_minute = -1", "limits[0].tokens_per_minute"),
        (
            "tokens_per_minute = 2000000000",
            "limits[0].tokens_per_minute",
        ),
        (
            "tokens_per_minute = 100\ndefault_max_tokens = 0",
            "limits[0].default_max_tokens",
        ),
        (
            "tokens_per_minute = 100\ndefault_max_tokens = 101",
            "limits[0].default_max_tokens",
        ),
        (
            "tokens_per_minute = 1000\nmax_token_keys = 0",
            "limits[0].max_token_keys",
        ),
        ("tokens_per_minte = 100", "limits[0].tokens_per_minte"),
    ] {
        let e = err(&format!("[[limits]]\nkey = \"client\"\nlimit = 1\n{extra}"));
        assert_eq!(e.key(), key, "{extra}: {e}");
        assert!(e.to_string().contains(key), "{e}");
    }
}

#[test]
fn priority_keys_parse_and_refusals_name_the_key() {
    use crate::admission::Priority;
    let c = Config::from_toml_str(
        "[priority]\nbatch_delay_ms = 500\n\
         [[limits]]\nkey = \"client\"\nlimit = 8\npriority = \"Batch\"\n\
         [[limits]]\nkey = \"service\"\nlimit = 64\n",
    )
    .expect("valid");
    assert_eq!(c.admission.priority.batch_delay, Duration::from_millis(500));
    assert_eq!(c.admission.limits[0].priority, Some(Priority::Batch));
    assert_eq!(c.admission.limits[1].priority, None);
    assert_eq!(
        Config::default().admission.priority.batch_delay,
        crate::admission::DEFAULT_BATCH_DELAY
    );
    let caps = c.capabilities();
    assert_eq!(caps["limits"][0]["priority"], "batch");
    assert!(caps["limits"][1]["priority"].is_null());
    assert_eq!(caps["priority"]["batch_delay_ms"], 500);
    for (toml, key) in [
        (
            "[[limits]]\nkey = \"client\"\nlimit = 1\npriority = \"urgent\"",
            "limits[0].priority",
        ),
        ("[priority]\nbatch_delay_ms = -1", "priority.batch_delay_ms"),
        (
            "[priority]\nbatch_delay_ms = 3600001",
            "priority.batch_delay_ms",
        ),
        ("[priority]\nbatch_dely_ms = 1", "priority.batch_dely_ms"),
    ] {
        let e = err(toml);
        assert_eq!(e.key(), key, "{toml}: {e}");
        assert!(e.to_string().contains(key), "{e}");
    }
}
