//! Decoder behaviour: golden vectors written by the deployed Python producer, every
//! malformed-packet case with its specific error kind, and property tests (arbitrary
//! bytes never panic; encode → decode round-trips).

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use weir_protocol::audio::{
    DecodeErrorKind as K, DecodeOptions, Gap, GapReason, Packet, PacketBody, decode,
};

fn hex(s: &str) -> Bytes {
    let v: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect();
    Bytes::from(v)
}

/// `[u32 BE len][meta][pcm]` with an arbitrary meta string.
fn raw(meta: &str, pcm: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u32(meta.len() as u32);
    b.put_slice(meta.as_bytes());
    b.put_slice(pcm);
    b.freeze()
}

fn kind_of(data: Bytes) -> K {
    decode(&data, &DecodeOptions::default())
        .expect_err("must be refused")
        .kind()
}

const FMT: &str = r#""sample_rate":16000,"sample_width":2,"channels":1"#;

// Produced by: json.dumps(meta, ensure_ascii=False).encode(); struct.pack(">I", len) + meta + pcm
// with meta = {"type": "frame", "seq": 1, ..., "session_id": "s-é1"} and pcm = bytes(range(8)).
const PY_FRAME: &str = "0000006a7b2274797065223a20226672616d65222c2022736571223a20312c202273616d706c655f72617465223a2031363030302c202273616d706c655f7769647468223a20322c20226368616e6e656c73223a20312c202273657373696f6e5f6964223a2022732dc3a931227d0001020304050607";
// meta = {"type": "end", "seq": 26, "sample_rate": 16000, "sample_width": 2, "channels": 1}
const PY_END: &str = "000000527b2274797065223a2022656e64222c2022736571223a2032362c202273616d706c655f72617465223a2031363030302c202273616d706c655f7769647468223a20322c20226368616e6e656c73223a20317d";

#[test]
fn python_frame_golden_vector_decodes() {
    let p = decode(&hex(PY_FRAME), &DecodeOptions::default()).expect("decodes");
    assert_eq!(p.seq, 1);
    assert_eq!(p.session_id.as_deref(), Some("s-\u{e9}1"));
    assert_eq!(
        p.body,
        PacketBody::Frame {
            pcm: Bytes::from_static(&[0, 1, 2, 3, 4, 5, 6, 7])
        }
    );
    assert_eq!(p.samples(), 4);
}

#[test]
fn python_end_golden_vector_decodes() {
    let p = decode(&hex(PY_END), &DecodeOptions::default()).expect("decodes");
    assert_eq!((p.seq, p.body), (26, PacketBody::End));
    assert_eq!(p.session_id, None);
}

#[test]
fn any_key_order_spacing_and_unknown_keys_are_accepted() {
    let meta = r#"  { "channels" : 1 , "future" : {"x": [1,2]}, "seq":7,"sample_width":2,
        "sample_rate":16000, "type":"frame" }  "#;
    let p = decode(&raw(meta, &[0; 640]), &DecodeOptions::default()).expect("decodes");
    assert_eq!(p.seq, 7);
    assert_eq!(p.pcm().len(), 640);
}

#[test]
fn encoder_matches_deployed_layout() {
    let pcm = Bytes::from(vec![1u8; 640]);
    let bytes = Packet::frame(3, pcm.clone())
        .with_session(Some("abc".into()))
        .encode()
        .expect("encodes");
    let meta_len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[4..4 + meta_len]).expect("json");
    assert_eq!(
        meta,
        serde_json::json!({"type":"frame","seq":3,"sample_rate":16000,"sample_width":2,"channels":1,"session_id":"abc"})
    );
    assert_eq!(&bytes[4 + meta_len..], &pcm[..]);
}

/// The capture time travels as the meta key `captured_at_ms`, written after
/// `session_id` (and before gap fields), so the meta stays in the deployed key order.
#[test]
fn captured_at_ms_round_trips_in_key_order() {
    let pcm = Bytes::from(vec![2u8; 640]);
    let packet = Packet::frame(9, pcm.clone())
        .with_session(Some("s1".into()))
        .with_captured_at_ms(Some(1_764_500_000_123));
    let bytes = packet.encode().expect("encodes");
    let meta_len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let meta = std::str::from_utf8(&bytes[4..4 + meta_len]).expect("utf8");
    assert_eq!(
        meta,
        r#"{"type":"frame","seq":9,"sample_rate":16000,"sample_width":2,"channels":1,"session_id":"s1","captured_at_ms":1764500000123}"#
    );
    let back = decode(&bytes, &DecodeOptions::default()).expect("decodes");
    assert_eq!(back.captured_at_ms, Some(1_764_500_000_123));
    assert_eq!(back, packet);
    // Without a session the key follows `channels`; on a gap it precedes the gap fields.
    let gap = Packet::gap(Gap {
        first_seq: 2,
        last_seq: 4,
        samples: 960,
        reason: GapReason::MaxAge,
    })
    .with_captured_at_ms(Some(7));
    let bytes = gap.encode().expect("encodes");
    let meta_len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let meta = std::str::from_utf8(&bytes[4..4 + meta_len]).expect("utf8");
    assert_eq!(
        meta,
        r#"{"type":"gap","seq":4,"sample_rate":16000,"sample_width":2,"channels":1,"captured_at_ms":7,"first_seq":2,"frames":3,"samples":960,"reason":"max_age"}"#
    );
    assert_eq!(
        decode(&bytes, &DecodeOptions::default()).expect("decodes"),
        gap
    );
    // `end` carries it too when set; `encode_packet_ref` from borrowed parts is identical.
    let end = Packet::end(5).with_captured_at_ms(Some(u64::MAX));
    let bytes = end.encode().expect("encodes");
    assert_eq!(
        bytes,
        weir_protocol::audio::encode_packet_ref(
            5,
            weir_protocol::audio::AudioFormat::DEPLOYED,
            None,
            Some(u64::MAX),
            weir_protocol::audio::BodyRef::End
        )
        .expect("encodes")
    );
    assert_eq!(
        decode(&bytes, &DecodeOptions::default()).expect("decodes"),
        end
    );
}

/// Absent: `None` (the deployed producers never write it), and the encoder then writes
/// exactly the deployed meta.
#[test]
fn captured_at_ms_absent_is_none_and_not_written() {
    let p = decode(&hex(PY_FRAME), &DecodeOptions::default()).expect("decodes");
    assert_eq!(p.captured_at_ms, None);
    let bytes = Packet::frame(1, Bytes::new()).encode().expect("encodes");
    assert!(
        !std::str::from_utf8(&bytes[4..])
            .expect("utf8")
            .contains("captured_at_ms")
    );
}

/// Lenient: a `captured_at_ms` of the wrong JSON type (string, negative, fraction,
/// null, object, out of u64 range) is treated as absent, never as a reason to refuse
/// the packet — an extension key must not make a packet undecodable.
#[test]
fn captured_at_ms_of_wrong_type_is_absent_not_an_error() {
    for bad in [
        r#""1764500000123""#,
        "-5",
        "1.5",
        "null",
        "true",
        r#"{"ms":1}"#,
        "[1]",
        "1e3",
        "18446744073709551616",
    ] {
        let meta = format!(r#"{{"type":"frame","seq":3,{FMT},"captured_at_ms":{bad}}}"#);
        let p = decode(&raw(&meta, &[0; 640]), &DecodeOptions::default())
            .unwrap_or_else(|e| panic!("{bad}: {e}"));
        assert_eq!(p.captured_at_ms, None, "{bad}");
        assert_eq!((p.seq, p.pcm().len()), (3, 640), "{bad}");
    }
    // Any position and spacing, like every other key.
    let meta = format!(r#"{{ "captured_at_ms" : 42 , "type":"frame","seq":3,{FMT}}}"#);
    let p = decode(&raw(&meta, &[]), &DecodeOptions::default()).expect("decodes");
    assert_eq!(p.captured_at_ms, Some(42));
    assert_eq!(
        decode(
            &raw(
                &format!(r#"{{"type":"end","seq":4,{FMT},"captured_at_ms":0}}"#),
                &[]
            ),
            &DecodeOptions::default()
        )
        .expect("decodes")
        .captured_at_ms,
        Some(0)
    );
}

#[test]
fn empty_frame_is_valid() {
    let p = decode(
        &raw(&format!(r#"{{"type":"frame","seq":1,{FMT}}}"#), &[]),
        &DecodeOptions::default(),
    )
    .expect("decodes");
    assert_eq!(p.samples(), 0);
}

#[test]
fn malformed_packets_get_specific_kinds() {
    let frame = |extra: &str| format!(r#"{{"type":"frame","seq":1,{FMT}{extra}}}"#);
    let cases: Vec<(&str, Bytes, K)> = vec![
        ("empty", Bytes::new(), K::Truncated),
        ("3 bytes", Bytes::from_static(&[0, 0, 0]), K::Truncated),
        (
            "length past end",
            Bytes::from_static(&[0, 0, 0, 9, b'{', b'}']),
            K::MetaLengthOutOfRange,
        ),
        (
            "huge length",
            Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, b'{']),
            K::MetaLengthOutOfRange,
        ),
        (
            "meta too large",
            raw(&format!("{:5000}", "{}"), &[]),
            K::MetaTooLarge,
        ),
        ("not json", raw("{type: frame}", &[]), K::InvalidJson),
        ("json array", raw("[1,2]", &[]), K::InvalidJson),
        (
            "seq is string",
            raw(&format!(r#"{{"type":"frame","seq":"1",{FMT}}}"#), &[]),
            K::InvalidJson,
        ),
        (
            "seq negative",
            raw(&format!(r#"{{"type":"frame","seq":-1,{FMT}}}"#), &[]),
            K::InvalidJson,
        ),
        (
            "no type",
            raw(&format!(r#"{{"seq":1,{FMT}}}"#), &[]),
            K::MissingField,
        ),
        (
            "no seq",
            raw(&format!(r#"{{"type":"frame",{FMT}}}"#), &[]),
            K::MissingField,
        ),
        (
            "no rate",
            raw(
                r#"{"type":"frame","seq":1,"sample_width":2,"channels":1}"#,
                &[],
            ),
            K::MissingField,
        ),
        (
            "unknown type",
            raw(&format!(r#"{{"type":"audio","seq":1,{FMT}}}"#), &[]),
            K::UnknownType,
        ),
        (
            "seq zero",
            raw(&format!(r#"{{"type":"frame","seq":0,{FMT}}}"#), &[]),
            K::InvalidSeq,
        ),
        (
            "8 kHz",
            raw(
                r#"{"type":"frame","seq":1,"sample_rate":8000,"sample_width":2,"channels":1}"#,
                &[],
            ),
            K::UnsupportedSampleRate,
        ),
        (
            "8-bit",
            raw(
                r#"{"type":"frame","seq":1,"sample_rate":16000,"sample_width":1,"channels":1}"#,
                &[],
            ),
            K::UnsupportedSampleWidth,
        ),
        (
            "stereo",
            raw(
                r#"{"type":"frame","seq":1,"sample_rate":16000,"sample_width":2,"channels":2}"#,
                &[],
            ),
            K::UnsupportedChannels,
        ),
        ("odd pcm", raw(&frame(""), &[0; 641]), K::PartialSample),
        (
            "pcm too large",
            raw(&frame(""), &vec![0; 32_002]),
            K::PcmTooLarge,
        ),
        (
            "end with pcm",
            raw(&format!(r#"{{"type":"end","seq":2,{FMT}}}"#), &[0; 2]),
            K::UnexpectedPcm,
        ),
        (
            "gap first > seq",
            raw(
                &format!(
                    r#"{{"type":"gap","seq":2,{FMT},"first_seq":3,"samples":320,"reason":"queue_full"}}"#
                ),
                &[],
            ),
            K::InvalidGap,
        ),
        (
            "gap frames wrong",
            raw(
                &format!(
                    r#"{{"type":"gap","seq":4,{FMT},"first_seq":3,"frames":5,"samples":320,"reason":"queue_full"}}"#
                ),
                &[],
            ),
            K::InvalidGap,
        ),
        (
            "gap no samples",
            raw(
                &format!(r#"{{"type":"gap","seq":4,{FMT},"first_seq":3,"reason":"queue_full"}}"#),
                &[],
            ),
            K::MissingField,
        ),
        (
            "long session",
            raw(
                &frame(&format!(r#","session_id":"{}""#, "x".repeat(300))),
                &[],
            ),
            K::SessionIdTooLong,
        ),
    ];
    for (name, data, kind) in cases {
        assert_eq!(kind_of(data), kind, "case {name}");
    }
    // Invalid UTF-8 inside a correctly sized meta.
    let mut b = BytesMut::new();
    b.put_u32(2);
    b.put_slice(&[0xff, 0xfe]);
    assert_eq!(kind_of(b.freeze()), K::InvalidUtf8);
}

#[test]
fn gap_round_trips_and_unknown_reason_is_tolerated() {
    let gap = Gap {
        first_seq: 5,
        last_seq: 9,
        samples: 1600,
        reason: GapReason::MaxAge,
    };
    let bytes = Packet::gap(gap).encode().expect("encodes");
    let p = decode(&bytes, &DecodeOptions::default()).expect("decodes");
    assert_eq!(p.seq, 9);
    assert_eq!(p.body, PacketBody::Gap(gap));
    assert_eq!(gap.frames(), 5);

    let future = raw(
        &format!(
            r#"{{"type":"gap","seq":4,{FMT},"first_seq":3,"samples":640,"reason":"solar_flare"}}"#
        ),
        &[],
    );
    let p = decode(&future, &DecodeOptions::default()).expect("decodes");
    assert!(matches!(
        p.body,
        PacketBody::Gap(Gap {
            reason: GapReason::Other,
            ..
        })
    ));
}

#[test]
fn encoder_refuses_invalid_packets() {
    assert!(Packet::frame(0, Bytes::new()).encode().is_err());
    assert!(
        Packet::frame(1, Bytes::from_static(&[0; 3]))
            .encode()
            .is_err()
    );
    let bad = Gap {
        first_seq: 4,
        last_seq: 3,
        samples: 0,
        reason: GapReason::QueueFull,
    };
    assert!(Packet::gap(bad).encode().is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode(&Bytes::from(data), &DecodeOptions::default());
    }

    #[test]
    fn arbitrary_meta_with_valid_prefix_never_panics(meta in ".{0,200}", pcm in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = decode(&raw(&meta, &pcm), &DecodeOptions::default());
    }

    #[test]
    fn frame_round_trips(seq in 1u64..u64::MAX, samples in 0usize..2000, session in proptest::option::of("[ -~\u{e9}\u{4e2d}\"\\\\]{0,40}"), captured in proptest::option::of(any::<u64>())) {
        let pcm = Bytes::from((0..samples * 2).map(|i| i as u8).collect::<Vec<u8>>());
        let packet = Packet::frame(seq, pcm).with_session(session).with_captured_at_ms(captured);
        let decoded = decode(&packet.encode().expect("encodes"), &DecodeOptions::default()).expect("decodes");
        prop_assert_eq!(decoded, packet);
    }

    #[test]
    fn end_round_trips(seq in 1u64..u64::MAX) {
        let packet = Packet::end(seq);
        let decoded = decode(&packet.encode().expect("encodes"), &DecodeOptions::default()).expect("decodes");
        prop_assert_eq!(decoded, packet);
    }
}
