//! The JSON Schemas of the wire contracts (`protocol/schemas/*.json`, generated from the
//! protocol types by `weir_protocol::schema::all`) against what speaks the contracts:
//!
//! - the checked-in files are exactly what the types generate (`WEIR_BLESS=1` rewrites
//!   them, and the golden JSON vectors below);
//! - `golden/json/<schema>/*.json`: what the Rust types write, one file per case
//!   (checked against a fresh serialisation, so they cannot drift from the code), each
//!   valid against its schema; `golden/json/invalid/<schema>/*.json` must be refused;
//! - the audio golden packets (`golden/*.bin`, written by the deployed Python producer
//!   code): each JSON meta is valid exactly when the decoder accepts the meta;
//! - the Python client (`weir.llm` of the installed `weir` package, run by
//!   `support::run_weir_python`): the headers it sends validate, and the error replies
//!   of the schema (every code, plain and enveloped) are read by its refusal handling as
//!   what they say.
//!
//! Validator: the Python `jsonschema` package (`tests/python/validate.py`, run by
//! `support::python`: `WEIR_PYTHON`, else the environment `scripts/ensure-python-env`
//! pins): draft 2020-12, `format` an annotation only, no remote references. Each test
//! validates all its instances in one run of the script ([`Batch`]).

use crate::support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Value, json};
use weir_protocol::WireName;
use weir_protocol::admin::{
    AdapterStats, CacheStats, EstimateSource, FrameStats, HttpRefusal, HttpRefusalError,
    IngressStats, InterruptStats, NatsClientStats, Percentiles, PriorityClassStats, ReadyLine,
    ServiceEstimate, StreamStats, TokenBudgetStats, WindowStats,
};
use weir_protocol::audio::extension::{
    EndReason, Overload, OverloadReason, PossibleLoss, PossibleLossReason,
};
use weir_protocol::audio::{DecodeOptions, Gap, GapReason, Packet, decode, ws};
use weir_protocol::capacity;
use weir_protocol::llm::{
    CancelReply, Capabilities, EnvelopeMeta, ErrorBody, ErrorCode, ErrorDetails, ResponseEnvelope,
    SessionCancelReply,
};

fn protocol_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden_json_dir() -> PathBuf {
    protocol_dir().join("tests/golden/json")
}

fn bless() -> bool {
    std::env::var("WEIR_BLESS").is_ok_and(|v| v == "1")
}

/// Writes `text` to `path` when blessing; otherwise returns whether it differs.
fn check_or_bless(path: &Path, text: &str) -> Option<String> {
    if bless() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
        return None;
    }
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    (on_disk != text).then(|| path.display().to_string())
}

fn pretty(v: &impl Serialize) -> String {
    serde_json::to_string_pretty(v).expect("json") + "\n"
}

fn validate_script() -> PathBuf {
    protocol_dir().join("tests/python/validate.py")
}

/// Instances to validate against checked-in schemas, each expected valid or invalid;
/// [`Batch::check`] validates them all in one run of `tests/python/validate.py`.
#[derive(Default)]
struct Batch {
    cases: Vec<Case>,
}

struct Case {
    schema: String,
    label: String,
    instance: Value,
    valid: bool,
}

impl Batch {
    /// `instance` (named `label` in failures) must be a valid `schema`.
    fn valid(&mut self, schema: &str, label: impl Into<String>, instance: &Value) {
        self.push(schema, label.into(), instance, true);
    }

    /// `instance` (named `label` in failures) must be refused by `schema`.
    fn invalid(&mut self, schema: &str, label: impl Into<String>, instance: &Value) {
        self.push(schema, label.into(), instance, false);
    }

    fn push(&mut self, schema: &str, label: String, instance: &Value, valid: bool) {
        self.cases.push(Case {
            schema: schema.to_owned(),
            label,
            instance: instance.clone(),
            valid,
        });
    }

    /// Validates every case; panics naming each case whose outcome is not the expected
    /// one (schema, label, the violations of an instance expected valid, the instance).
    fn check(self) {
        let mut stdin = Vec::new();
        for c in &self.cases {
            let line = json!({"schema": c.schema, "label": c.label, "instance": c.instance});
            serde_json::to_writer(&mut stdin, &line).expect("json");
            stdin.push(b'\n');
        }
        let out = support::run_python(&[validate_script().as_os_str()], Some(&stdin));
        let results: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("validate.py: {e}: {l}")))
            .collect();
        assert_eq!(
            results.len(),
            self.cases.len(),
            "validate.py answered {} of {} cases:\n{out}",
            results.len(),
            self.cases.len()
        );
        let mut failures = Vec::new();
        for (c, got) in self.cases.iter().zip(&results) {
            let (schema, label, instance) = (&c.schema, &c.label, &c.instance);
            assert_eq!(got["label"], label.as_str(), "validate.py out of order");
            let errors: Vec<&str> = got["errors"]
                .as_array()
                .expect("errors")
                .iter()
                .map(|e| e.as_str().expect("error text"))
                .collect();
            match (c.valid, errors.is_empty()) {
                (true, false) => failures.push(format!(
                    "{label} is not a valid {schema}: {errors:#?}\n{instance}"
                )),
                (false, true) => {
                    failures.push(format!("{label} is valid against {schema}: {instance}"))
                }
                _ => {}
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

#[test]
fn checked_in_schemas_are_the_generated_ones() {
    let all = weir_protocol::schema::all();
    let mut stale = Vec::new();
    for (name, schema) in &all {
        let path = protocol_dir().join(format!("schemas/{name}.json"));
        stale.extend(check_or_bless(&path, &pretty(schema)));
    }
    assert!(
        stale.is_empty(),
        "schemas differ from the types (regenerate: WEIR_BLESS=1 cargo test -p weir-protocol --test schemas): {stale:#?}"
    );
    let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
    for entry in std::fs::read_dir(protocol_dir().join("schemas")).expect("schemas dir") {
        let file = entry.expect("entry").file_name();
        let file = file.to_string_lossy();
        let stem = file.strip_suffix(".json").unwrap_or(&file);
        assert!(
            names.contains(&stem),
            "schemas/{file} is not generated by any type"
        );
    }
}

/// Every golden case, by schema: what the protocol types write.
fn golden_cases() -> Vec<(&'static str, String, Value)> {
    let mut cases = Vec::new();
    let mut add = |schema: &'static str, case: &str, v: Value| {
        cases.push((schema, case.to_owned(), v));
    };
    for &code in ErrorCode::ALL {
        add("llm-error-body", code.as_str(), to(&error_body(code)));
    }
    let request = json!({
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "request_id": "r-1",
        "correlation_id": "c-1", "session_id": "s-1", "ts_ms": 1_700_000_000_000u64,
        "data": {"messages": [{"role": "user", "content": "hi"}]}
    });
    add("llm-request-envelope", "full", request.clone());
    let minimal = json!({"trace_id": 7, "request_id": 42, "ts_ms": "1700000000000"});
    add("llm-request-envelope", "minimal_any_types", minimal.clone());
    let meta = |v: &Value| EnvelopeMeta::detect(&serde_json::to_vec(v).expect("json"));
    let full = meta(&request).expect("an envelope");
    let queue_full = error_body(ErrorCode::QueueFull);
    let err = ResponseEnvelope::error(full.clone(), queue_full);
    add("llm-response-envelope", "error", to(&err));
    let ok = ResponseEnvelope::ok(full, json!({"text": "hello"}));
    add("llm-response-envelope", "ok", to(&ok));
    let ok_minimal = ResponseEnvelope::ok(meta(&minimal).expect("an envelope"), Value::Null);
    add("llm-response-envelope", "ok_minimal", to(&ok_minimal));
    for result in ["queued", "running", "not_found"] {
        let reply = CancelReply {
            request_id: "r-1".into(),
            result: result.into(),
        };
        add("llm-cancel-reply", result, to(&reply));
    }
    let session_cancel = SessionCancelReply {
        session: "s-1".into(),
        result: "cancelled".into(),
        cancelled: 3,
        queued: 2,
        running: 1,
        queued_ids: vec!["r-2".into()],
        running_ids: vec!["r-1".into()],
    };
    add("llm-cancel-session-reply", "cancelled", to(&session_cancel));
    let nothing = SessionCancelReply {
        session: "s-1".into(),
        result: "not_found".into(),
        ..SessionCancelReply::default()
    };
    add("llm-cancel-session-reply", "not_found", to(&nothing));
    for (case, reason) in [
        ("queue_full", OverloadReason::QueueFull),
        ("rate", OverloadReason::Rate),
    ] {
        add("audio-overload-header", case, to(&overload(reason)));
    }
    let mut with_seqs = overload(OverloadReason::MaxAge);
    (with_seqs.dropped_first_seq, with_seqs.dropped_last_seq) = (Some(40), Some(52));
    add("audio-overload-header", "max_age_with_seqs", to(&with_seqs));
    let loss = PossibleLoss {
        first_seq: 101,
        last_seq: 125,
        frames: 25,
        total_frames: 25,
        reason: PossibleLossReason::UnconfirmedAtDisconnect,
    };
    add("audio-possibly-lost-header", "unconfirmed", to(&loss));
    add("audio-ws-control", "end", to(&ws::Control::End));
    for (case, event) in ws_events() {
        add("audio-ws-event", case, to(&event));
    }
    for (case, announcement) in capacity_announcements() {
        add("capacity-announcement", case, to(&announcement));
    }
    add("capacity-refusal", "max_streams", to(&capacity_refusal()));
    add("ingress-stats", "default", to(&IngressStats::default()));
    add("ingress-stats", "full", to(&ingress_stats()));
    add("adapter-stats", "default", to(&AdapterStats::default()));
    add("adapter-stats", "full", to(&adapter_stats()));
    let ready = ReadyLine::new(
        Some("127.0.0.1:4000".into()),
        Some("127.0.0.1:4001".into()),
        None,
    );
    add("ready-line", "ingress", to(&ready));
    add(
        "ready-line",
        "adapter",
        to(&ReadyLine::new(None, Some("127.0.0.1:9".into()), None)),
    );
    for (code, message) in [
        ("not_found", "paths: /metrics, /healthz, /readyz, /v1/stats"),
        ("overloaded", "admin request limit reached"),
        ("stream_active", "stream s1 is already active"),
    ] {
        let refusal = HttpRefusal {
            error: HttpRefusalError {
                code: code.into(),
                message: message.into(),
            },
        };
        add("http-refusal", code, to(&refusal));
    }
    cases
}

fn to(v: &impl Serialize) -> Value {
    serde_json::to_value(v).expect("serialisable")
}

fn error_body(code: ErrorCode) -> ErrorBody {
    let details = match code {
        ErrorCode::QueueFull => ErrorDetails {
            limit: Some(64),
            pending: Some(64),
            retry_after_ms: Some(20),
            ..Default::default()
        },
        ErrorCode::ConcurrencyLimitExceeded => ErrorDetails {
            limit: Some(2),
            in_flight: Some(2),
            waiting: Some(4),
            waited_ms: Some(150),
            key: Some("client:tenant-a".into()),
            ..Default::default()
        },
        ErrorCode::TokenBudgetExceeded => ErrorDetails {
            limit: Some(10_000),
            retry_after_ms: Some(3_018),
            key: Some("client:tenant-a".into()),
            tokens_requested: Some(503),
            tokens_available: Some(0),
            ..Default::default()
        },
        ErrorCode::DeadlineExceeded => ErrorDetails {
            predicted_start_ms: Some(900),
            budget_ms: Some(500),
            estimate_ms: Some(300),
            retry_after_ms: Some(400),
            ..Default::default()
        },
        ErrorCode::BackendError => ErrorDetails {
            backend_status: Some(503),
            retry_after_ms: Some(3000),
            ..Default::default()
        },
        _ => ErrorDetails::default(),
    };
    ErrorBody::new(code, format!("{code} (test)")).with_details(details)
}

fn overload(reason: OverloadReason) -> Overload {
    Overload {
        reason,
        dropped_frames: 12,
        dropped_samples: 3840,
        pending_bytes: 64_000,
        max_bytes: 64_000,
        max_age_ms: 2000,
        dropped_first_seq: None,
        dropped_last_seq: None,
    }
}

fn ws_events() -> Vec<(&'static str, ws::Event)> {
    vec![
        (
            "overload",
            ws::Event::Overload {
                reason: OverloadReason::QueueFull,
                dropped_frames: 12,
                dropped_samples: 3840,
                pending_bytes: 64_000,
                max_bytes: 64_000,
                max_age_ms: 2000,
                frames_published: 480,
            },
        ),
        (
            "gap",
            ws::Event::Gap {
                first_seq: 6,
                last_seq: 10,
                frames: 5,
                samples: 1600,
                reason: GapReason::QueueFull,
                gaps_total: 1,
            },
        ),
        (
            "error",
            ws::Event::Error {
                code: "bad_frame".into(),
                message: "odd frame length 641".into(),
            },
        ),
        (
            "degraded",
            ws::Event::Degraded {
                lag_ms: 740,
                threshold_ms: 500,
                worker: "gpu-a".into(),
            },
        ),
        ("recovered", ws::Event::Recovered { lag_ms: 60 }),
        (
            "closed_no_capacity",
            ws::Event::Closed {
                reason: EndReason::NoCapacity,
                frames_published: 3,
                frames_dropped: 0,
                end_delivered: true,
            },
        ),
        (
            "closed",
            ws::Event::Closed {
                reason: EndReason::ProducerGone,
                frames_published: 480,
                frames_dropped: 12,
                end_delivered: true,
            },
        ),
    ]
}

/// A lease-mode worker with two live streams, and a static-mode one with none.
fn capacity_announcements() -> Vec<(&'static str, capacity::Announcement)> {
    let lease = capacity::Announcement {
        v: capacity::VERSION,
        worker: "gpu-a".into(),
        instance: "7f3a9c01".into(),
        seq: 42,
        sent_at_ms: 1_700_000_000_000,
        interval_ms: capacity::DEFAULT_INTERVAL_MS,
        subject: "audio.{partition}.{stream}".into(),
        partitions_total: 16,
        ownership: capacity::OwnershipKind::Lease,
        lease_bucket: Some("weir_leases".into()),
        partitions: vec![0, 3, 7, 12],
        max_streams: 6,
        live_streams: 2,
        lag_ms: 140,
        rtf_p95: 0.61,
        streams: vec![
            capacity::StreamLoad {
                id: "call-17".into(),
                lag_ms: 140,
            },
            capacity::StreamLoad {
                id: "call-23".into(),
                lag_ms: 20,
            },
        ],
        streams_truncated: false,
    };
    let idle = capacity::Announcement {
        worker: "gpu-b".into(),
        instance: "c0ffee".into(),
        seq: 1,
        ownership: capacity::OwnershipKind::Static,
        lease_bucket: None,
        partitions: (0..16).collect(),
        max_streams: 16,
        live_streams: 0,
        lag_ms: 0,
        rtf_p95: 0.0,
        streams: Vec::new(),
        ..lease.clone()
    };
    vec![("lease", lease), ("static_idle", idle)]
}

fn capacity_refusal() -> capacity::Refusal {
    capacity::Refusal {
        v: capacity::VERSION,
        worker: "gpu-a".into(),
        stream: "call-31".into(),
        reason: capacity::RefusalReason::MaxStreams,
        max_streams: 6,
        live_streams: 6,
        sent_at_ms: 1_700_000_000_500,
    }
}

/// The golden capacity messages decode with the reader's rules: what a worker in
/// another language writes from docs/protocol.md is what the door takes.
#[test]
fn golden_capacity_messages_decode() {
    for (case, a) in capacity_announcements() {
        let subject = capacity::announce_subject(capacity::DEFAULT_PREFIX, &a.worker);
        let path = golden_json_dir().join(format!("capacity-announcement/{case}.json"));
        let bytes = std::fs::read(&path).expect("golden announcement");
        assert_eq!(
            capacity::Announcement::decode(&subject, &bytes),
            Ok(a),
            "{case}"
        );
    }
    let r = capacity_refusal();
    let path = golden_json_dir().join("capacity-refusal/max_streams.json");
    let bytes = std::fs::read(&path).expect("golden refusal");
    let subject = format!("{}.refused.{}", capacity::DEFAULT_PREFIX, r.stream);
    assert_eq!(capacity::Refusal::decode(&subject, &bytes), Ok(r));
}

fn ingress_stats() -> IngressStats {
    let p = Percentiles {
        count: 10,
        p50: 0.4,
        p95: 1.5,
        p99: 2.0,
        max: 2.5,
        mean: 0.6,
    };
    IngressStats {
        active_streams: 3,
        streams_total: 9,
        pending_bytes: 1920,
        pending_frames: 3,
        pending_bytes_limit_per_stream: Some(64_000),
        oldest_frame_age_ms: 12.5,
        queue_wait_ms: p,
        frames: FrameStats {
            offered: 1000,
            admitted: 990,
            handed_over: Some(985),
            published: 980,
            unconfirmed: 5,
            possibly_lost: 0,
            dropped: BTreeMap::from([("queue_full".into(), 10), ("max_age".into(), 0)]),
            would_reject: 0,
        },
        admission_rejects: 1,
        overloads: 1,
        gaps: 2,
        tasks_alive: 14,
        nats_connected: true,
        window: Some(WindowStats {
            mode: Some("confirmed".into()),
            unconfirmed_bytes: 3200,
            unconfirmed_frames: 5,
            limit_bytes: 1 << 20,
            rounds: 77,
            round_ms: p,
            oldest_unconfirmed_age_ms: 3.0,
            disconnects: 0,
        }),
    }
}

fn adapter_stats() -> AdapterStats {
    let p = Percentiles {
        count: 200,
        p50: 120.0,
        p95: 300.0,
        p99: 410.0,
        max: 500.0,
        mean: 140.0,
    };
    AdapterStats {
        offered: 260,
        admitted: 220,
        joined: 5,
        cached: 3,
        completed: 200,
        refused: BTreeMap::from([("queue_full".into(), 40), ("deadline_exceeded".into(), 10)]),
        started: 210,
        started_after_deadline: 0,
        queued_now: 4,
        running_now: 6,
        would_reject: BTreeMap::new(),
        queue_wait_ms: p,
        inference_ms: p,
        backend_busy_ms: 29_400.0,
        backend_useful_ms: 28_000.0,
        slots_acquired: 215,
        slots_released: 209,
        refusal_ms: p,
        service_estimate: Some(ServiceEstimate {
            service_time_ms: Some(300.0),
            source: EstimateSource::Observed,
            samples: 64,
            samples_total: 210,
            quantile: 0.9,
            window: 64,
            half_life: 16.0,
        }),
        cache: CacheStats {
            entries: 12,
            bytes: 40_960,
            max_bytes: 1 << 20,
            ..Default::default()
        },
        nats: NatsClientStats {
            dropped: 2,
            dropped_by_sid: BTreeMap::from([(3, 2)]),
            in_messages: 262,
            taken: 260,
            not_taken: 2,
            ..Default::default()
        },
        stream: StreamStats {
            started: 20,
            chunks: 400,
            bytes: 81_920,
            ttft_ms: p,
            aborted: BTreeMap::from([("caller_gone".into(), 1)]),
        },
        tokens: BTreeMap::from([(
            "client".into(),
            TokenBudgetStats {
                tokens_per_minute: 10_000,
                reserved: 10_060,
                used: 7_900,
                refunded: 2_160,
                overcharged: 0,
                outstanding: 0,
                refused: 80,
                usage_reported: 19,
                usage_clamped: 0,
                usage_missing: 1,
                keys: 1,
                evicted: 0,
            },
        )]),
        priority: BTreeMap::from([
            (
                "batch".into(),
                PriorityClassStats {
                    admitted: 150,
                    refused: 45,
                    displaced: 6,
                    queue_wait_ms: p,
                },
            ),
            (
                "interactive".into(),
                PriorityClassStats {
                    admitted: 70,
                    refused: 5,
                    displaced: 0,
                    queue_wait_ms: p,
                },
            ),
        ]),
        interrupts: InterruptStats {
            session_cancels: 4,
            supersedes: 9,
            cancelled_queued: 6,
            cancelled_running: 3,
        },
    }
}

#[test]
fn golden_json_vectors_are_what_the_types_write_and_validate() {
    let mut stale = Vec::new();
    let mut checked: BTreeMap<&str, usize> = BTreeMap::new();
    let mut batch = Batch::default();
    for (schema, case, value) in golden_cases() {
        let path = golden_json_dir().join(format!("{schema}/{case}.json"));
        stale.extend(check_or_bless(&path, &pretty(&value)));
        batch.valid(schema, path.display().to_string(), &value);
        *checked.entry(schema).or_default() += 1;
    }
    // Every vector on disk validates, also those captured from a service (below).
    for (schema, _) in weir_protocol::schema::all() {
        let dir = golden_json_dir().join(schema);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("read");
            let value: Value = serde_json::from_str(&text).expect("golden JSON");
            batch.valid(schema, path.display().to_string(), &value);
        }
    }
    batch.check();
    assert!(
        stale.is_empty(),
        "golden vectors differ from what the types write (WEIR_BLESS=1 rewrites them): {stale:#?}"
    );
    let typed = [
        "llm-error-body",
        "llm-request-envelope",
        "llm-response-envelope",
        "llm-cancel-reply",
        "llm-cancel-session-reply",
        "audio-overload-header",
        "audio-possibly-lost-header",
        "audio-ws-control",
        "audio-ws-event",
        "ingress-stats",
        "adapter-stats",
        "ready-line",
        "http-refusal",
        "capacity-announcement",
        "capacity-refusal",
    ];
    for schema in typed {
        assert!(
            checked.get(schema).is_some_and(|n| *n > 0),
            "no vector for {schema}"
        );
    }
}

/// `golden/json/llm-capabilities/adapter-*.json` are the adapter's own capabilities
/// documents (`weir_llm_adapter::Config::capabilities` of the default configuration
/// and of one with the JetStream intake, shadow mode, FIFO order and per-key limits),
/// captured from it: the protocol type reads each and writes it back unchanged, so the
/// type (and its schema) is the document the adapter serves. To capture them again,
/// pretty-print `Config::default().capabilities()` and that of `Config::from_toml_str`
/// of: `intake = "jetstream"`, `mode = "shadow"`, `queue_order = "fifo"`,
/// `[session] pending_cap = 0`, `[deadline] default_ms = 0, min_start_budget_ms = 50`,
/// `[idempotency] enabled = false`, `[estimator] initial_ms = 300`, and two `[[limits]]`:
/// `key = "client", limit = 2, on_busy = "reject", tokens_per_minute = 10000` and
/// `key = "body:/model", limit = 4, max_wait_ms = 500, max_waiters = 8`.
#[test]
fn the_capabilities_type_is_the_adapters_document() {
    let dir = golden_json_dir().join("llm-capabilities");
    let mut batch = Batch::default();
    let mut captured = 0;
    for entry in std::fs::read_dir(&dir).expect("golden/json/llm-capabilities") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if !name.starts_with("adapter-") {
            continue;
        }
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
        batch.valid("llm-capabilities", &name, &doc);
        let mut typed: Capabilities =
            serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(to(&typed), doc, "{name} does not round-trip");
        // The running service adds the backend kind and the live estimate.
        typed.estimator.backend = Some("sim".into());
        typed.estimator.current = Some(ServiceEstimate {
            service_time_ms: None,
            source: EstimateSource::None,
            samples: 0,
            samples_total: 0,
            quantile: 0.9,
            window: 64,
            half_life: 16.0,
        });
        batch.valid("llm-capabilities", format!("{name} (served)"), &to(&typed));
        captured += 1;
    }
    batch.check();
    assert!(captured >= 2, "{captured} captured documents");
}

#[test]
fn invalid_golden_vectors_are_refused() {
    let dir = golden_json_dir().join("invalid");
    let mut refused = 0;
    let mut batch = Batch::default();
    for schema_dir in std::fs::read_dir(&dir).expect("golden/json/invalid") {
        let schema_dir = schema_dir.expect("entry").path();
        let schema = schema_dir
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        for entry in std::fs::read_dir(&schema_dir).expect("dir") {
            let path = entry.expect("entry").path();
            let value: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
            batch.invalid(&schema, path.display().to_string(), &value);
            refused += 1;
        }
    }
    batch.check();
    assert!(refused >= 8, "only {refused} invalid vectors");
}

/// Decode errors found in the meta itself (the schema must refuse the meta), and those
/// about the PCM after a valid meta.
const META_ERRORS: [&str; 9] = [
    "invalid_json",
    "missing_field",
    "unknown_type",
    "invalid_seq",
    "unsupported_sample_rate",
    "unsupported_sample_width",
    "unsupported_channels",
    "invalid_gap",
    "session_id_too_long",
];
const PCM_ERRORS: [&str; 3] = ["partial_sample", "pcm_too_large", "unexpected_pcm"];

/// The meta of a packet, when its bytes are a length prefix and UTF-8 JSON.
fn packet_meta(data: &[u8]) -> Option<Value> {
    let len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    let meta = data.get(4..4 + len)?;
    serde_json::from_slice(meta).ok()
}

#[test]
fn audio_golden_packets_validate_exactly_when_the_decoder_takes_their_meta() {
    let golden = protocol_dir().join("tests/golden");
    let manifest = std::fs::read_to_string(golden.join("vectors.json")).expect("vectors.json");
    let vectors: Vec<Value> = serde_json::from_str(&manifest).expect("manifest");
    let mut batch = Batch::default();
    let (mut valid, mut invalid) = (0, 0);
    for vector in &vectors {
        let name = vector["name"].as_str().expect("name");
        let data = std::fs::read(golden.join(vector["file"].as_str().expect("file"))).expect("bin");
        let error = vector["expect"]["error"].as_str();
        let Some(meta) = packet_meta(&data) else {
            // Refused before the meta is JSON (truncated, bad length, not UTF-8).
            assert!(
                error.is_some_and(|e| !META_ERRORS[1..].contains(&e)),
                "{name}"
            );
            continue;
        };
        match error {
            Some(e) if META_ERRORS.contains(&e) => {
                batch.invalid("audio-packet-meta", format!("{name} ({e})"), &meta);
                invalid += 1;
            }
            None => {
                batch.valid("audio-packet-meta", name, &meta);
                valid += 1;
            }
            Some(e) => {
                assert!(PCM_ERRORS.contains(&e), "{name}: unexpected error {e}");
                batch.valid("audio-packet-meta", name, &meta);
                valid += 1;
            }
        }
    }
    assert!(
        valid >= 13 && invalid >= 4,
        "valid {valid}, invalid {invalid}"
    );
    // What weir's own encoder writes validates too.
    let packets = [
        Packet::frame(1, Bytes::from(vec![0u8; 640])),
        Packet::frame(2, Bytes::new())
            .with_session(Some("s-é1 \"q\"".into()))
            .with_captured_at_ms(Some(1_764_500_000_123)),
        Packet::gap(Gap {
            first_seq: 3,
            last_seq: 7,
            samples: 1600,
            reason: GapReason::Rate,
        }),
        Packet::end(8).with_session(Some("s-1".into())),
    ];
    for p in packets {
        let data = p.encode().expect("encodable");
        decode(&data, &DecodeOptions::default()).expect("decodes");
        let meta = packet_meta(&data).expect("meta");
        batch.valid("audio-packet-meta", p.type_name(), &meta);
    }
    batch.check();
}

fn client_script() -> PathBuf {
    protocol_dir().join("tests/python/client_messages.py")
}

#[test]
fn the_python_clients_request_headers_validate() {
    let out = support::run_weir_python(&[client_script().as_os_str(), "headers".as_ref()], None);
    let mut batch = Batch::default();
    let mut n = 0;
    for line in out.lines() {
        let msg: Value = serde_json::from_str(line).expect("script JSON");
        batch.valid("llm-request-headers", line, &msg["headers"]);
        n += 1;
    }
    assert!(n >= 18, "{n} header sets");
    for bad in [
        json!({"Weir-Request-Id": "has space"}),
        json!({"Weir-Timeout-Ms": "1.5"}),
        json!({"Weir-Admission": "drop"}),
        json!({"Weir-Stream": "yes"}),
        json!({"Weir-Supersede": "request"}),
        json!({"Weir-Cancel-Session": "has space"}),
        json!({"Weir-Session-Id": "x".repeat(257)}),
    ] {
        batch.invalid("llm-request-headers", bad.to_string(), &bad);
    }
    batch.check();
}

/// The error replies the adapter sends: headers, then the plain body or the envelope.
fn error_replies() -> Vec<(ErrorBody, Option<Value>, Value)> {
    let request = json!({"trace_id": "t-1", "request_id": "r-1", "ts_ms": 1, "data": {}});
    let meta = EnvelopeMeta::detect(&serde_json::to_vec(&request).expect("json")).expect("env");
    let mut replies = Vec::new();
    for &code in ErrorCode::ALL {
        let body = error_body(code);
        let headers = json!({
            "Weir-Error-Code": code.as_str(),
            "Nats-Service-Error": body.service_error_header(),
            "Nats-Service-Error-Code": code.nats_code().to_string(),
        });
        let envelope = serde_json::to_value(ResponseEnvelope::error(meta.clone(), body.clone()))
            .expect("json");
        replies.push((body.clone(), None, headers.clone()));
        replies.push((body, Some(envelope), headers));
    }
    replies
}

#[test]
fn the_python_client_reads_every_schema_valid_error_reply() {
    let mut batch = Batch::default();
    let mut input = Vec::new();
    for (body, envelope, headers) in error_replies() {
        let wire = match &envelope {
            Some(env) => {
                batch.valid("llm-response-envelope", body.code.as_str(), env);
                env.clone()
            }
            None => {
                let v = serde_json::to_value(&body).expect("json");
                batch.valid("llm-error-body", body.code.as_str(), &v);
                v
            }
        };
        // As the last message of a streamed reply, with the event header.
        let mut streamed = headers.clone();
        streamed["Weir-Stream-Event"] = json!("error");
        batch.valid("llm-stream-event-headers", body.code.as_str(), &streamed);
        input.push(json!({"headers": headers, "body": wire.to_string()}));
    }
    batch.check();
    let stdin = serde_json::to_vec(&input).expect("json");
    let args = [client_script().into_os_string(), "refusals".into()];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    let out = support::run_weir_python(&args, Some(&stdin));
    let seen: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let replies = error_replies();
    assert_eq!(seen.len(), replies.len());
    for ((body, envelope, _), got) in replies.iter().zip(&seen) {
        let what = body.code.as_str();
        assert_eq!(got["code"], body.code.as_str(), "{what}: {got}");
        assert_eq!(got["message"], body.message.as_str(), "{what}");
        assert_eq!(
            got["details"],
            serde_json::to_value(&body.details).expect("json"),
            "{what}"
        );
        assert_eq!(got["nats_code"], body.code.nats_code(), "{what}");
        assert_eq!(
            got["envelope"],
            envelope.clone().unwrap_or(Value::Null),
            "{what}"
        );
    }
}

#[test]
fn stream_event_headers_of_each_event_validate() {
    let mut batch = Batch::default();
    for ok in [
        json!({"Weir-Stream-Event": "queued", "Weir-Queue-Position": "3", "Weir-Predicted-Start-Ms": "1200"}),
        json!({"Weir-Stream-Event": "queued", "Weir-Queue-Position": "1"}),
        json!({"Weir-Stream-Event": "started", "Weir-Queue-Ms": "12.345"}),
        json!({"Weir-Stream-Event": "chunk", "Weir-Stream-Seq": "1"}),
        json!({"Weir-Stream-Event": "end", "Weir-Queue-Ms": "0.100", "Weir-Inference-Ms": "250.000",
               "Weir-Ttft-Ms": "40.000", "Weir-Stream-Chunks": "20", "Weir-Stream-Bytes": "4096",
               "Weir-Stream-Outcome": "ok"}),
        json!({"Weir-Stream-Event": "end", "Weir-Stream-Chunks": "3", "Weir-Stream-Bytes": "96",
               "Weir-Stream-Outcome": "ok", "Weir-Backend": "gpu-b_2"}),
        json!({"Weir-Stream-Event": "end", "Weir-Stream-Chunks": "0", "Weir-Stream-Bytes": "0",
               "Weir-Stream-Outcome": "joined"}),
    ] {
        batch.valid("llm-stream-event-headers", ok.to_string(), &ok);
    }
    for bad in [
        json!({"Weir-Stream-Event": "progress"}),
        json!({"Weir-Stream-Event": "chunk", "Weir-Stream-Seq": "0"}),
        json!({"Weir-Stream-Event": "queued"}),
        json!({"Weir-Stream-Event": "end", "Weir-Stream-Chunks": "1", "Weir-Stream-Bytes": "1",
               "Weir-Stream-Outcome": "maybe"}),
        json!({"Weir-Stream-Event": "end", "Weir-Stream-Chunks": "1", "Weir-Stream-Bytes": "1",
               "Weir-Stream-Outcome": "ok", "Weir-Backend": "two words"}),
        json!({"Weir-Stream-Event": "error", "Weir-Error-Code": "teapot"}),
    ] {
        batch.invalid("llm-stream-event-headers", bad.to_string(), &bad);
    }
    batch.check();
}
