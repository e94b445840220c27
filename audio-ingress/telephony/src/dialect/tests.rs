//! Dialect tests: the carriers' documented examples parse; wrong members are refused
//! with named errors; no input panics.

use super::*;
use crate::codec::Encoding;

// The carriers' documented examples (payloads made valid base64).
const TWILIO_CONNECTED: &str = r#"{"event": "connected", "protocol": "Call", "version": "1.0.0"}"#;
const TWILIO_START: &str = r#"{
  "event": "start",
  "sequenceNumber": "1",
  "start": {
    "accountSid": "ACXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "callSid": "CAXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
    "tracks": ["inbound"],
    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    "customParameters": {"FirstName": "Jane", "LastName": "Doe", "RemoteParty": "Bob"}
  },
  "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
}"#;
const TWILIO_MEDIA: &str = r#"{
  "event": "media",
  "sequenceNumber": "4",
  "media": {"track": "inbound", "chunk": "2", "timestamp": "5", "payload": "no+JhoaJjpzS"},
  "streamSid": "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
}"#;
const TWILIO_MARK: &str = r#"{"event": "mark", "sequenceNumber": "4", "streamSid": "MZXX", "mark": {"name": "my label"}}"#;
const TWILIO_DTMF: &str = r#"{"event": "dtmf", "streamSid": "MZXX", "sequenceNumber": "5", "dtmf": {"track": "inbound_track", "digit": "1"}}"#;
const TWILIO_STOP: &str = r#"{"event": "stop", "sequenceNumber": "5", "stop": {"accountSid": "ACXX", "callSid": "CAXX"}, "streamSid": "MZXX"}"#;

const TELNYX_CONNECTED: &str = r#"{"event": "connected", "version": "1.0.0"}"#;
const TELNYX_START: &str = r#"{
  "event": "start",
  "sequence_number": "1",
  "stream_id": "32DE0DEA-53CB-4B21-89A4-9E1819C043BC",
  "start": {
    "user_id": "3E6F995F-85F7-4705-9741-53B116D28237",
    "call_control_id": "v2:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ",
    "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f",
    "from": "+13122010094",
    "to": "+13122123456",
    "tags": ["TAG1", "TAG2"],
    "client_state": "aGF2ZSBhIG5pY2UgZGF5ID1d",
    "custom_parameters": {"customer_id": "customer_123"},
    "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}
  }
}"#;
const TELNYX_MEDIA: &str = r#"{
  "event": "media",
  "sequence_number": "4",
  "media": {"track": "inbound", "chunk": "2", "timestamp": "5", "payload": "no+JhoaJjpzS"},
  "stream_id": "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"
}"#;
const TELNYX_MARK: &str =
    r#"{"event": "mark", "sequence_number": "7", "stream_id": "32DE", "mark": {"name": "m1"}}"#;
const TELNYX_DTMF: &str = r##"{"event": "dtmf", "sequence_number": "8", "stream_id": "32DE", "occurred_at": "2024-01-01T00:00:00Z", "dtmf": {"digit": "#"}}"##;
const TELNYX_ERROR: &str = r#"{"event": "error", "sequence_number": "9", "stream_id": "32DE", "payload": {"code": 100003, "title": "malformed_frame", "detail": "The received frame is not valid JSON"}}"#;
const TELNYX_STOP: &str = r#"{"event": "stop", "sequence_number": "10", "stop": {"user_id": "3E6F", "call_control_id": "v2:T0"}, "stream_id": "32DE"}"#;

fn err(dialect: Dialect, text: &str) -> DialectError {
    match parse(dialect, text) {
        Ok(ok) => panic!("expected an error for {text}, got {ok:?}"),
        Err(e) => e,
    }
}

#[test]
fn twilio_documented_messages_parse() {
    assert_eq!(
        parse(Dialect::Twilio, TWILIO_CONNECTED).unwrap(),
        Inbound::Connected {
            protocol: Some("Call".into()),
            version: Some("1.0.0".into())
        }
    );
    let Inbound::Start(start) = parse(Dialect::Twilio, TWILIO_START).unwrap() else {
        panic!("not a start")
    };
    assert_eq!(start.seq, Some(1));
    assert_eq!(start.stream_sid, "MZXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX");
    assert_eq!(start.call_id, "CAXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX");
    assert_eq!(
        start.account.as_deref(),
        Some("ACXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX")
    );
    assert_eq!(start.format.encoding, Encoding::Pcmu);
    assert_eq!(start.format.sample_rate, 8000);
    assert_eq!(start.tracks, vec![Track::Inbound]);
    assert_eq!(start.custom.len(), 3);
    assert_eq!(start.custom["FirstName"], "Jane");
    assert_eq!(
        parse(Dialect::Twilio, TWILIO_MEDIA).unwrap(),
        Inbound::Media(Media {
            seq: Some(4),
            chunk: 2,
            timestamp_ms: 5,
            track: Track::Inbound,
            payload: vec![0x9e, 0x8f, 0x89, 0x86, 0x86, 0x89, 0x8e, 0x9c, 0xd2],
        })
    );
    assert_eq!(
        parse(Dialect::Twilio, TWILIO_MARK).unwrap(),
        Inbound::Mark {
            seq: Some(4),
            name: "my label".into()
        }
    );
    assert_eq!(
        parse(Dialect::Twilio, TWILIO_DTMF).unwrap(),
        Inbound::Dtmf { digit: "1".into() }
    );
    assert_eq!(parse(Dialect::Twilio, TWILIO_STOP).unwrap(), Inbound::Stop);
}

#[test]
fn telnyx_documented_messages_parse() {
    assert_eq!(
        parse(Dialect::Telnyx, TELNYX_CONNECTED).unwrap(),
        Inbound::Connected {
            protocol: None,
            version: Some("1.0.0".into())
        }
    );
    let Inbound::Start(start) = parse(Dialect::Telnyx, TELNYX_START).unwrap() else {
        panic!("not a start")
    };
    assert_eq!(start.seq, Some(1));
    assert_eq!(start.stream_sid, "32DE0DEA-53CB-4B21-89A4-9E1819C043BC");
    assert_eq!(
        start.call_id,
        "v2:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ"
    );
    assert_eq!(
        start.account.as_deref(),
        Some("3E6F995F-85F7-4705-9741-53B116D28237")
    );
    assert_eq!(start.format.encoding, Encoding::Pcmu);
    assert!(start.tracks.is_empty());
    assert_eq!(start.custom["customer_id"], "customer_123");
    let Inbound::Media(media) = parse(Dialect::Telnyx, TELNYX_MEDIA).unwrap() else {
        panic!("not media")
    };
    assert_eq!(
        (media.seq, media.chunk, media.timestamp_ms),
        (Some(4), 2, 5)
    );
    assert_eq!(media.payload.len(), 9);
    assert_eq!(
        parse(Dialect::Telnyx, TELNYX_MARK).unwrap(),
        Inbound::Mark {
            seq: Some(7),
            name: "m1".into()
        }
    );
    assert_eq!(
        parse(Dialect::Telnyx, TELNYX_DTMF).unwrap(),
        Inbound::Dtmf { digit: "#".into() }
    );
    assert_eq!(
        parse(Dialect::Telnyx, TELNYX_ERROR).unwrap(),
        Inbound::Error {
            code: Some("100003".into()),
            title: Some("malformed_frame".into()),
            detail: Some("The received frame is not valid JSON".into()),
        }
    );
    assert_eq!(parse(Dialect::Telnyx, TELNYX_STOP).unwrap(), Inbound::Stop);
}

#[test]
fn telnyx_formats_pcma_and_l16_accepted_others_refused() {
    let with = |enc: &str, rate: u32| {
        TELNYX_START
            .replace(r#""encoding": "PCMU""#, &format!(r#""encoding": "{enc}""#))
            .replace(
                r#""sample_rate": 8000"#,
                &format!(r#""sample_rate": {rate}"#),
            )
    };
    for (enc, rate, want) in [
        ("PCMA", 8000, Encoding::Pcma),
        ("L16", 8000, Encoding::L16),
        ("L16", 16000, Encoding::L16),
    ] {
        let Inbound::Start(s) = parse(Dialect::Telnyx, &with(enc, rate)).unwrap() else {
            panic!("not a start")
        };
        assert_eq!((s.format.encoding, s.format.sample_rate), (want, rate));
    }
    for (enc, rate) in [
        ("G722", 16000),
        ("OPUS", 48000),
        ("AMR-WB", 16000),
        ("PCMU", 16000),
        ("L16", 24000),
    ] {
        let e = err(Dialect::Telnyx, &with(enc, rate));
        assert_eq!(e.code(), "unsupported_format");
        assert!(e.message().contains(enc), "{e}");
        assert!(e.message().contains("start.media_format"), "{e}");
    }
    let stereo = TELNYX_START.replace(r#""channels": 1"#, r#""channels": 2"#);
    assert_eq!(err(Dialect::Telnyx, &stereo).code(), "unsupported_format");
}

#[test]
fn twilio_alaw_accepted_other_encodings_refused() {
    let alaw = TWILIO_START.replace("audio/x-mulaw", "audio/x-alaw");
    let Inbound::Start(s) = parse(Dialect::Twilio, &alaw).unwrap() else {
        panic!("not a start")
    };
    assert_eq!(s.format.encoding, Encoding::Pcma);
    let l16 = TWILIO_START.replace("audio/x-mulaw", "audio/x-l16");
    let e = err(Dialect::Twilio, &l16);
    assert_eq!(e.kind(), DialectErrorKind::UnsupportedFormat);
    assert!(e.message().contains("audio/x-l16"), "{e}");
}

#[test]
fn numbers_as_json_numbers_are_accepted() {
    let text = r#"{"event":"media","sequenceNumber":4,"media":{"track":"outbound","chunk":2,"timestamp":5,"payload":"AAEC"}}"#;
    assert_eq!(
        parse(Dialect::Twilio, text).unwrap(),
        Inbound::Media(Media {
            seq: Some(4),
            chunk: 2,
            timestamp_ms: 5,
            track: Track::Outbound,
            payload: vec![0, 1, 2],
        })
    );
    let start = TELNYX_START.replace(r#""sample_rate": 8000"#, r#""sample_rate": "8000""#);
    assert!(matches!(
        parse(Dialect::Telnyx, &start),
        Ok(Inbound::Start(_))
    ));
}

#[test]
fn unknown_members_ignored_unknown_events_are_other() {
    let extra = TWILIO_MEDIA.replace(
        r#""event": "media","#,
        r#""event": "media", "future": {"a": [1, 2, {"b": null}]}, "x": 1.5,"#,
    );
    assert!(matches!(
        parse(Dialect::Twilio, &extra),
        Ok(Inbound::Media(_))
    ));
    for d in [Dialect::Twilio, Dialect::Telnyx] {
        assert_eq!(
            parse(d, r#"{"event":"something_new","data":{"x":1}}"#).unwrap(),
            Inbound::Other {
                event: "something_new".into()
            }
        );
    }
    // Twilio does not send `error`: an unknown event there.
    assert_eq!(
        parse(Dialect::Twilio, r#"{"event":"error"}"#).unwrap(),
        Inbound::Other {
            event: "error".into()
        }
    );
}

/// Each case's refusal has the code and names the member.
fn assert_refusals(cases: &[(Dialect, &str, &str, &str)]) {
    for (dialect, text, code, needle) in cases {
        let e = err(*dialect, text);
        assert_eq!(e.code(), *code, "{text}: {e}");
        assert_eq!(e.kind().code(), *code);
        assert!(e.message().contains(needle), "{text}: {e} lacks {needle:?}");
    }
}

#[test]
fn media_refusals_name_the_member() {
    assert_refusals(&[
        (
            Dialect::Twilio,
            r#"{"event":"media","media":{"track":"inbound","chunk":"1","timestamp":"0","payload":"!!!"}}"#,
            "invalid_base64",
            "media.payload is not base64",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","media":{"track":"inbound","chunk":"1","timestamp":"0","payload":"AAE"}}"#,
            "invalid_base64",
            "media.payload",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","media":{"track":"inbound","chunk":"x","timestamp":"0","payload":""}}"#,
            "invalid_field",
            "media.chunk",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","media":{"track":"inbound","chunk":-1,"timestamp":"0","payload":""}}"#,
            "invalid_field",
            "media.chunk",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","media":{"track":"inbound","chunk":"1","payload":""}}"#,
            "missing_field",
            "media.timestamp is missing",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","media":{"track":"sideways","chunk":"1","timestamp":"0","payload":""}}"#,
            "invalid_field",
            "media.track",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","media":{"track":"inbound","chunk":"1","timestamp":"0","payload":7}}"#,
            "invalid_field",
            "media.payload is not a string",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","media":"AAAA"}"#,
            "invalid_field",
            "media is not an object",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media"}"#,
            "missing_field",
            "media is missing",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"media","sequenceNumber":"1.5","media":{}}"#,
            "invalid_field",
            "sequenceNumber",
        ),
        (
            Dialect::Twilio,
            r#"{"media":{}}"#,
            "missing_field",
            "event is missing",
        ),
        (
            Dialect::Twilio,
            r#"{"event":3}"#,
            "invalid_field",
            "event is not a string",
        ),
        (Dialect::Twilio, r#"[1,2]"#, "invalid_json", "JSON"),
        (
            Dialect::Twilio,
            r#"{"event":"media""#,
            "invalid_json",
            "JSON",
        ),
    ]);
}

#[test]
fn other_messages_refusals_name_the_member() {
    assert_refusals(&[
        (
            Dialect::Twilio,
            r#"{"event":"mark","mark":{}}"#,
            "missing_field",
            "mark.name",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"dtmf","dtmf":{"digit":1}}"#,
            "invalid_field",
            "dtmf.digit",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"start","start":{"streamSid":"MZ","callSid":"CA","mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000},"customParameters":{"n":5}}}"#,
            "invalid_field",
            "start.customParameters.n is not a string",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"start","start":{"streamSid":"MZ","mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000}}}"#,
            "missing_field",
            "start.callSid",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"start","start":{"streamSid":"MZ","callSid":"CA","tracks":"inbound","mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":8000}}}"#,
            "invalid_field",
            "start.tracks",
        ),
        (
            Dialect::Twilio,
            r#"{"event":"start","start":{"streamSid":"MZ","callSid":"CA"}}"#,
            "missing_field",
            "start.mediaFormat is missing",
        ),
        (
            Dialect::Telnyx,
            r#"{"event":"start","start":{"call_control_id":"v2","media_format":{"encoding":"PCMU","sample_rate":8000}}}"#,
            "missing_field",
            "stream_id",
        ),
        (
            Dialect::Telnyx,
            r#"{"event":"start","stream_id":"s","start":{"call_control_id":"v2","media_format":{"encoding":"PCMU"}}}"#,
            "missing_field",
            "start.media_format.sample_rate",
        ),
        (
            Dialect::Telnyx,
            r#"{"event":"media","sequence_number":true,"media":{}}"#,
            "invalid_field",
            "sequence_number",
        ),
    ]);
}

#[test]
fn too_large_is_refused_before_parsing() {
    let text = format!(
        r#"{{"event":"media","pad":"{}"}}"#,
        "a".repeat(MAX_MESSAGE_BYTES)
    );
    let e = err(Dialect::Twilio, &text);
    assert_eq!(e.kind(), DialectErrorKind::TooLarge);
    assert_eq!(e.code(), "too_large");
    // Not JSON at all, but too large: still TooLarge (nothing was parsed).
    let junk = "{".repeat(MAX_MESSAGE_BYTES + 1);
    assert_eq!(err(Dialect::Telnyx, &junk).code(), "too_large");
    assert_eq!(detect(&junk), None);
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    let depth = (MAX_MESSAGE_BYTES - 64) / 2;
    let nest = |inner: &str| format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth));
    // Inside a member that is read: serde_json's recursion limit refuses it.
    let read = format!(r#"{{"event":"media","media":{{"chunk":{}}}}}"#, nest("1"));
    assert!(read.len() <= MAX_MESSAGE_BYTES);
    assert_eq!(err(Dialect::Twilio, &read).code(), "invalid_json");
    // Inside an ignored member: skipped without recursion, the message goes on.
    let ignored = format!(r#"{{"event":"media","x":{}}}"#, nest(""));
    assert_eq!(
        err(Dialect::Twilio, &ignored).to_string(),
        "media is missing"
    );
}

#[test]
fn detect_from_first_messages() {
    assert_eq!(detect(TWILIO_CONNECTED), Some(Dialect::Twilio));
    assert_eq!(detect(TWILIO_START), Some(Dialect::Twilio));
    assert_eq!(detect(TWILIO_MEDIA), Some(Dialect::Twilio));
    assert_eq!(detect(TELNYX_CONNECTED), Some(Dialect::Telnyx));
    assert_eq!(detect(TELNYX_START), Some(Dialect::Telnyx));
    assert_eq!(detect(TELNYX_MEDIA), Some(Dialect::Telnyx));
    assert_eq!(detect(r#"{"event":"media"}"#), None);
    assert_eq!(detect("not json"), None);
    assert_eq!(detect(r#"{"streamSid":"a","stream_id":"b"}"#), None);
}

#[test]
fn dialect_names() {
    assert_eq!(Dialect::Twilio.to_string(), "twilio");
    assert_eq!(Dialect::Telnyx.to_string(), "telnyx");
    assert_eq!("twilio".parse::<Dialect>(), Ok(Dialect::Twilio));
    assert_eq!("Telnyx".parse::<Dialect>(), Ok(Dialect::Telnyx));
    assert!("vonage".parse::<Dialect>().is_err());
}

#[test]
fn outbound_messages_match_the_carriers_shapes() {
    let v = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
    assert_eq!(
        v(&media_message(Dialect::Twilio, "MZ1", &[0, 1, 2, 0xff])),
        serde_json::json!({"event":"media","streamSid":"MZ1","media":{"payload":"AAEC/w=="}})
    );
    assert_eq!(
        v(&media_message(Dialect::Telnyx, "ignored", &[0, 1, 2])),
        serde_json::json!({"event":"media","media":{"payload":"AAEC"}})
    );
    assert_eq!(
        v(&mark_message(Dialect::Twilio, "MZ1", "say \"hi\"\n\u{1}")),
        serde_json::json!({"event":"mark","streamSid":"MZ1","mark":{"name":"say \"hi\"\n\u{1}"}})
    );
    assert_eq!(
        v(&mark_message(Dialect::Telnyx, "x", "m")),
        serde_json::json!({"event":"mark","mark":{"name":"m"}})
    );
    assert_eq!(
        v(&clear_message(Dialect::Twilio, "MZ\\1")),
        serde_json::json!({"event":"clear","streamSid":"MZ\\1"})
    );
    assert_eq!(
        v(&clear_message(Dialect::Telnyx, "x")),
        serde_json::json!({"event":"clear"})
    );
    // What the door sends, the door can read back (the carrier echoes marks).
    let Inbound::Media(m) = parse(
        Dialect::Twilio,
        &media_message(Dialect::Twilio, "MZ1", &[9; 160]).replace(
            r#""media":{"#,
            r#""media":{"track":"outbound","chunk":"1","timestamp":"0","#,
        ),
    )
    .unwrap() else {
        panic!("not media")
    };
    assert_eq!(m.payload, vec![9; 160]);
}

/// A small deterministic generator (xorshift64*), so the fuzz loop needs no new crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Bytes a mutation writes: JSON's structure, numbers, escapes, literals.
const ALPHABET: &[u8] = br#"{}[]":,0123456789-.eE+/=\ abcnulltrue"#;

/// `seed` truncated, with bytes replaced, removed, or a piece of it repeated.
fn mutate(rng: &mut Rng, seed: &str) -> String {
    let mut bytes = seed.as_bytes().to_vec();
    match rng.below(4) {
        0 => bytes.truncate(rng.below(bytes.len())),
        1 => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(bytes.len());
                bytes[i] = ALPHABET[rng.below(ALPHABET.len())];
            }
        }
        2 => {
            for _ in 0..1 + rng.below(4) {
                if !bytes.is_empty() {
                    let i = rng.below(bytes.len());
                    bytes.remove(i);
                }
            }
        }
        _ => {
            let i = rng.below(bytes.len());
            let j = i + rng.below(bytes.len() - i);
            let piece = bytes[i..j].to_vec();
            let at = rng.below(bytes.len());
            bytes.splice(at..at, piece);
        }
    }
    // The seeds and the alphabet are ASCII: every mutation is valid UTF-8.
    String::from_utf8(bytes).unwrap()
}

#[test]
fn mutated_and_truncated_messages_never_panic() {
    const CASES: usize = 6000;
    let seeds: Vec<(Dialect, &str)> = vec![
        (Dialect::Twilio, TWILIO_CONNECTED),
        (Dialect::Twilio, TWILIO_START),
        (Dialect::Twilio, TWILIO_MEDIA),
        (Dialect::Twilio, TWILIO_MARK),
        (Dialect::Twilio, TWILIO_DTMF),
        (Dialect::Twilio, TWILIO_STOP),
        (Dialect::Telnyx, TELNYX_CONNECTED),
        (Dialect::Telnyx, TELNYX_START),
        (Dialect::Telnyx, TELNYX_MEDIA),
        (Dialect::Telnyx, TELNYX_MARK),
        (Dialect::Telnyx, TELNYX_DTMF),
        (Dialect::Telnyx, TELNYX_ERROR),
        (Dialect::Telnyx, TELNYX_STOP),
    ];
    let codes = [
        "too_large",
        "invalid_json",
        "missing_field",
        "invalid_field",
        "invalid_base64",
        "unsupported_format",
    ];
    let mut rng = Rng(0x5eed_1234_abcd_0031);
    let (mut ok, mut refused) = (0usize, 0usize);
    for case in 0..CASES {
        let (dialect, seed) = seeds[case % seeds.len()];
        assert!(parse(dialect, seed).is_ok(), "seed message refused: {seed}");
        let text = mutate(&mut rng, seed);
        // Both entry points, both dialects: Ok or Err, never a panic.
        let _ = detect(&text);
        for d in [Dialect::Twilio, Dialect::Telnyx] {
            match parse(d, &text) {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert!(codes.contains(&e.code()), "{e:?}");
                    assert!(!e.message().is_empty());
                    refused += 1;
                }
            }
        }
    }
    assert_eq!(ok + refused, 2 * CASES);
    assert!(ok > 100 && refused > 1000, "ok {ok}, refused {refused}");
}

#[test]
fn escaped_strings_are_read_too() {
    // JSON may escape '/' (and anything else): the owned path gives the same result.
    let text = r#"{"event":"media","media":{"track":"in\u0062ound","chunk":"\u0032","timestamp":"5","payload":"\/w=="}}"#;
    let Inbound::Media(m) = parse(Dialect::Twilio, text).unwrap() else {
        panic!("not media")
    };
    assert_eq!(
        (m.track, m.chunk, m.payload),
        (Track::Inbound, 2, vec![0xff])
    );
}

#[test]
fn twilio_start_falls_back_to_the_top_level_stream_sid() {
    let text = r#"{"event":"start","streamSid":"MZtop","start":{"callSid":"CA1","mediaFormat":{"encoding":"audio/x-mulaw","sampleRate":"8000","channels":"1"}}}"#;
    let Inbound::Start(s) = parse(Dialect::Twilio, text).unwrap() else {
        panic!("not a start")
    };
    assert_eq!(
        (s.stream_sid.as_str(), s.call_id.as_str()),
        ("MZtop", "CA1")
    );
    assert_eq!((s.account, s.seq), (None, None));
    assert!(s.custom.is_empty() && s.tracks.is_empty());
}

#[test]
fn the_hot_path_reader_answers_as_the_full_reader() {
    const CASES: usize = 20_000;
    let twilio_numbers = TWILIO_MEDIA
        .replace(r#""chunk":"2""#, r#""chunk":2"#)
        .replace(r#""timestamp":"5""#, r#""timestamp":5"#);
    let spaced = TELNYX_MEDIA.replace(':', " : ").replace(',', " ,\n\t");
    let reordered = r#"{"media":{"payload":"/w==","timestamp":"0","track":"inbound","extra":"x","chunk":"1"},"streamSid":"MZ1","event":"media","sequenceNumber":"1"}"#;
    let seeds = [
        TWILIO_MEDIA,
        TELNYX_MEDIA,
        &twilio_numbers,
        &spaced,
        reordered,
    ];
    let mut rng = Rng(0x5eed_fa57_0000_0031);
    let (mut taken, mut refused) = (0usize, 0usize);
    for case in 0..CASES {
        let seed = seeds[case % seeds.len()];
        let text = if case < seeds.len() {
            seed.to_owned()
        } else {
            mutate(&mut rng, seed)
        };
        for dialect in [Dialect::Twilio, Dialect::Telnyx] {
            if let Some(fast) = super::fast::media_message(&text, dialect.seq_member()) {
                assert_eq!(fast, super::parse_full(dialect, &text), "{text}");
                taken += 1;
                refused += usize::from(fast.is_err());
            }
        }
    }
    // The plain shapes are read on the hot path, mutated ones too when still plain.
    assert!(
        taken > CASES / 4 && refused > 100,
        "taken {taken}, refused {refused}"
    );
}
