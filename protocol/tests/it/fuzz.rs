//! Fuzzing on stable Rust, inside `cargo test`: the parsers that read bytes from the
//! network — the audio packet decoder, the header parsers (audio extension headers,
//! LLM headers) and the LLM envelope detector — fed random and mutated inputs for a
//! fixed time each (default 1 s per target).
//!
//! Properties: no input panics; what decodes re-encodes to something that decodes to
//! the same value; header values weir writes parse back to what was written.
//!
//! Nightly (cargo-fuzz, libFuzzer) is not available here, so the engine is proptest's
//! random generation with weir's own mutators (bit flips, truncation, splices, length
//! fields overwritten) applied to valid encodings, which reaches far deeper than
//! uniform random bytes. Longer runs and reproduction:
//!
//! ```text
//! WEIR_FUZZ_SECONDS=600 cargo test --release -p weir-protocol --test fuzz -- --nocapture
//! WEIR_FUZZ_SEED=<seed printed by a failing run> cargo test -p weir-protocol --test fuzz
//! ```
//!
//! A failing input is printed (hex) before the panic is re-raised.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use weir_protocol::WireName;
use weir_protocol::audio::extension::{
    EndReason, Extensions, Overload, OverloadReason, PossibleLoss, PossibleLossReason, headers,
};
use weir_protocol::audio::{DecodeOptions, Gap, GapReason, Packet, decode};
use weir_protocol::llm::envelope::EnvelopeMeta;
use weir_protocol::llm::headers::{self as llm, AdmissionPolicy};

fn budget() -> Duration {
    let s: f64 = std::env::var("WEIR_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(s.clamp(0.01, 86_400.0))
}

fn seed() -> u64 {
    std::env::var("WEIR_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        })
}

/// Runs `check` on values of `strategy` for the time budget; returns the case count.
fn fuzz<T: std::fmt::Debug>(
    target: &str,
    strategy: impl Strategy<Value = T>,
    check: impl Fn(&T),
) -> u64 {
    let seed = seed();
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..8 + target.len().min(24)].copy_from_slice(&target.as_bytes()[..target.len().min(24)]);
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &key),
    );
    let deadline = Instant::now() + budget();
    let mut cases = 0u64;
    while Instant::now() < deadline {
        for _ in 0..64 {
            let value = match strategy.new_tree(&mut runner) {
                Ok(tree) => tree.current(),
                Err(e) => panic!("{target}: strategy failed: {e}"),
            };
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&value))) {
                eprintln!("fuzz {target}: FAILED with WEIR_FUZZ_SEED={seed} on input {value:?}");
                resume_unwind(panic);
            }
            cases += 1;
        }
    }
    eprintln!(
        "fuzz {target}: {cases} cases in {:?} (seed {seed})",
        budget()
    );
    cases
}

/// A valid packet of any kind.
fn packet() -> impl Strategy<Value = Packet> {
    let session = prop::option::of("[ -~]{0,40}|\\PC{0,10}");
    let captured = prop::option::of(any::<u64>());
    prop_oneof![
        (
            any::<u64>(),
            prop::collection::vec(any::<u8>(), 0..64).prop_map(|v| v.len() / 2 * 2)
        )
            .prop_map(|(seq, n)| Packet::frame(seq.max(1), Bytes::from(vec![1u8; n.max(2)]))),
        any::<u64>().prop_map(|s| Packet::end(s.max(1))),
        (1u64..1_000_000, 0u64..1000, any::<u64>()).prop_map(|(first, n, samples)| {
            Packet::gap(Gap {
                first_seq: first,
                last_seq: first + n,
                samples,
                reason: GapReason::Rate,
            })
        }),
    ]
    .prop_flat_map(move |p| {
        (Just(p), session.clone(), captured.clone())
            .prop_map(|(p, s, c)| p.with_session(s).with_captured_at_ms(c))
    })
}

/// One mutation of an encoding.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Overwrite32(usize, u32),
    SetByte(usize, u8),
}

fn mutate(mut b: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let len = b.len().max(1);
        match m {
            Mutation::FlipBit(i, bit) => {
                if let Some(x) = b.get_mut(i % len) {
                    *x ^= 1 << (bit % 8);
                }
            }
            Mutation::Truncate(n) => b.truncate(n % len),
            Mutation::Insert(i, bytes) => {
                let at = i % (b.len() + 1);
                b.splice(at..at, bytes.iter().copied());
            }
            Mutation::Overwrite32(i, v) => {
                let at = i % len;
                for (k, byte) in v.to_be_bytes().into_iter().enumerate() {
                    if let Some(x) = b.get_mut(at + k) {
                        *x = byte;
                    }
                }
            }
            Mutation::SetByte(i, v) => {
                if let Some(x) = b.get_mut(i % len) {
                    *x = *v;
                }
            }
        }
    }
    b
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (
            any::<usize>(),
            prop::collection::vec(
                prop_oneof![
                    any::<u8>(),
                    Just(b'{'),
                    Just(b'}'),
                    Just(b'"'),
                    Just(b':'),
                    Just(0xff)
                ],
                0..16
            )
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (
            0usize..16,
            prop_oneof![any::<u32>(), Just(0), Just(u32::MAX), 0u32..100_000]
        )
            .prop_map(|(i, v)| Mutation::Overwrite32(i, v)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Mutation::SetByte(i, v)),
    ]
}

/// Bytes: uniform random, or a valid encoding with a few mutations.
fn packet_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        4 => (packet(), prop::collection::vec(mutation(), 1..4)).prop_map(|(p, ms)| {
            let encoded = p.encode().map(|b| b.to_vec()).unwrap_or_default();
            mutate(encoded, &ms)
        }),
    ]
}

#[test]
fn fuzz_packet_decoder() {
    let opts = DecodeOptions::default();
    let cases = fuzz("packet_decoder", packet_bytes(), |bytes| {
        let data = Bytes::from(bytes.clone());
        if let Ok(p) = decode(&data, &opts) {
            // What decodes re-encodes to the same packet.
            if let Ok(again) = p.encode() {
                assert_eq!(
                    decode(&again, &opts).as_ref(),
                    Ok(&p),
                    "re-encoding changed it"
                );
            }
        }
    });
    assert!(cases > 0);
}

#[test]
fn fuzz_valid_packets_round_trip() {
    let opts = DecodeOptions::default();
    fuzz("packet_round_trip", packet(), |p| {
        if let Ok(b) = p.encode() {
            let back = decode(&b, &opts);
            assert!(back.is_ok(), "{back:?}");
        }
    });
}

/// Header values: arbitrary text, or a valid value mutated at the character level.
fn header_text() -> impl Strategy<Value = String> {
    let valid = prop_oneof![
        Just(r#"{"reason":"rate","dropped_frames":1,"dropped_samples":320,"pending_bytes":0,"max_bytes":16000,"max_age_ms":500}"#.to_owned()),
        Just(r#"{"first_seq":3,"last_seq":3,"frames":1,"total_frames":1,"reason":"unconfirmed_at_disconnect"}"#.to_owned()),
        Just("producer".to_owned()),
        Just("1".to_owned()),
        Just("1764500000123".to_owned()),
        Just("enqueue".to_owned()),
        Just("12.5".to_owned()),
        Just("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
    ];
    prop_oneof![
        "\\PC{0,64}",
        ".{0,64}",
        (valid, any::<usize>(), "\\PC{0,4}", 0usize..4).prop_map(|(v, at, ins, cut)| {
            let mut chars: Vec<char> = v.chars().collect();
            let at = at % (chars.len() + 1);
            chars.splice(at..(at + cut).min(chars.len()), ins.chars());
            chars.into_iter().collect()
        }),
    ]
}

#[test]
fn fuzz_audio_extension_headers() {
    let names = [
        headers::VERSION,
        headers::CAPTURED_AT_MS,
        headers::END_REASON,
        headers::OVERLOAD,
        headers::POSSIBLY_LOST,
    ];
    fuzz(
        "extension_headers",
        prop::collection::vec(header_text(), 5),
        |values| {
            let ext = Extensions::read(|k| {
                names
                    .iter()
                    .position(|n| *n == k)
                    .map(|i| values[i].as_str())
            });
            assert!(ext.malformed <= 5);
            // What was understood writes back to values that read the same.
            let pairs = ext.to_pairs();
            let again =
                Extensions::read(|k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str()));
            assert_eq!(again.malformed, 0, "{pairs:?}");
            assert_eq!(again.overload, ext.overload);
            assert_eq!(again.possibly_lost, ext.possibly_lost);
        },
    );
}

#[test]
fn fuzz_extension_reports_round_trip() {
    let reasons = prop_oneof![
        Just(OverloadReason::QueueFull),
        Just(OverloadReason::MaxAge),
        Just(OverloadReason::PublishTimeout),
        Just(OverloadReason::Rate),
    ];
    fuzz(
        "extension_round_trip",
        (reasons, any::<[u64; 5]>(), any::<[u64; 4]>()),
        |(reason, o, l)| {
            let overload = Overload {
                reason: *reason,
                dropped_frames: o[0],
                dropped_samples: o[1],
                dropped_first_seq: None,
                dropped_last_seq: None,
                pending_bytes: o[2],
                max_bytes: o[3],
                max_age_ms: o[4],
            };
            assert_eq!(
                Overload::from_header_value(&overload.to_header_value()),
                Some(overload)
            );
            // What the writer produces: 1 <= first_seq <= last_seq (the reader refuses
            // anything else).
            let (first, last) = (l[0].min(l[1]).max(1), l[0].max(l[1]).max(1));
            let loss = PossibleLoss {
                first_seq: first,
                last_seq: last,
                frames: l[2],
                total_frames: l[3],
                reason: PossibleLossReason::UnconfirmedAtDisconnect,
            };
            assert_eq!(
                PossibleLoss::from_header_value(&loss.to_header_value()),
                Some(loss)
            );
            for r in [EndReason::Producer, EndReason::Error, EndReason::Idle] {
                assert_eq!(EndReason::from_wire(r.as_str()), Some(r));
            }
        },
    );
}

#[test]
fn fuzz_llm_headers() {
    fuzz("llm_headers", header_text(), |v| {
        let _ = AdmissionPolicy::parse(v);
        if let Ok(id) = llm::parse_id(llm::REQUEST_ID, v) {
            assert!(
                !id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic()),
                "{id:?}"
            );
        }
        let _ = llm::parse_ms(llm::DEADLINE_MS, v);
        // A trace context that parses formats back to the same parent (version 00).
        if let Some(tc) = llm::TraceContext::from_headers(Some(v), Some(v)) {
            let again = llm::TraceParent::parse(&tc.parent.to_string()).expect("own format");
            assert_eq!(again, tc.parent);
            assert!(tc.state.is_none_or(|s| s.len() <= llm::MAX_TRACESTATE_LEN));
        }
        let _ = llm::parse_trace_id(v);
        if let Some(d) = llm::parse_format_ms(v) {
            let back = llm::parse_format_ms(&llm::format_ms(d)).expect("own format parses");
            // f64 milliseconds: exact to the microsecond up to years, then relative.
            let diff = back.abs_diff(d);
            let tolerance = Duration::from_micros(1) + d / 1_000_000_000;
            assert!(diff <= tolerance, "{d:?} -> {back:?}");
        }
    });
}

/// Envelope bodies: arbitrary bytes, or a deployed envelope mutated.
fn envelope_bytes() -> impl Strategy<Value = Vec<u8>> {
    let id = prop_oneof![
        "[ -~]{0,12}".prop_map(serde_json::Value::String),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
        Just(serde_json::json!({"nested": [1, 2]})),
    ];
    let envelope = (id.clone(), id.clone(), id, any::<u64>()).prop_map(|(t, r, s, ts)| {
        serde_json::json!({"trace_id": t, "request_id": r, "session_id": s, "ts_ms": ts,
            "data": {"prompt": "hi"}})
        .to_string()
        .into_bytes()
    });
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..128),
        2 => envelope.clone(),
        3 => (envelope, prop::collection::vec(mutation(), 1..4)).prop_map(|(b, ms)| mutate(b, &ms)),
    ]
}

#[test]
fn fuzz_envelope_detector() {
    fuzz("envelope", envelope_bytes(), |body| {
        if let Some(meta) = EnvelopeMeta::detect(body) {
            if let Some(r) = meta.request_id_str() {
                assert!(!r.is_empty());
            }
            let _ = meta.session_id_str();
        }
    });
}
