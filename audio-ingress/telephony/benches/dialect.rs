//! Parse cost of the hot-path message: a carrier `media` message with a 20 ms PCMU
//! payload (160 bytes), Twilio and Telnyx. Plain `Instant` loop; prints the median
//! ns per message over batches.

use std::hint::black_box;
use std::time::Instant;

use base64::Engine as _;
use weir_audio_telephony::dialect::{Dialect, Inbound, parse};

const BATCHES: usize = 41;
const PER_BATCH: usize = 20_000;

fn median_ns_per_message(dialect: Dialect, text: &str) -> f64 {
    let mut per_msg: Vec<f64> = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let start = Instant::now();
        for _ in 0..PER_BATCH {
            match parse(dialect, black_box(text)) {
                Ok(Inbound::Media(m)) => {
                    black_box(m.payload);
                }
                other => panic!("not media: {other:?}"),
            }
        }
        per_msg.push(start.elapsed().as_nanos() as f64 / PER_BATCH as f64);
    }
    per_msg.sort_by(f64::total_cmp);
    per_msg[BATCHES / 2]
}

fn main() {
    let payload: Vec<u8> = (0..160u32).map(|i| (i * 37 % 256) as u8).collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&payload);
    let twilio = format!(
        r#"{{"event":"media","sequenceNumber":"4","media":{{"track":"inbound","chunk":"2","timestamp":"5","payload":"{b64}"}},"streamSid":"MZ18ad3ab5a668481ce02b83e7395059f0"}}"#
    );
    let telnyx = format!(
        r#"{{"event":"media","sequence_number":"4","media":{{"track":"inbound","chunk":"2","timestamp":"5","payload":"{b64}"}},"stream_id":"32de0dea-53cb-4b21-89a4-9e1819c043bc"}}"#
    );
    for (name, dialect, text) in [
        ("twilio", Dialect::Twilio, &twilio),
        ("telnyx", Dialect::Telnyx, &telnyx),
    ] {
        let ns = median_ns_per_message(dialect, text);
        println!(
            "dialect/{name}: media message ({} bytes, 160-byte payload): median {ns:.0} ns/message ({BATCHES} batches of {PER_BATCH})",
            text.len()
        );
    }
}
