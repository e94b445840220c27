//! The codec's cost per 20 ms chunk, median over rounds.
//!
//! `cargo bench -p weir-audio-telephony --bench codec`
//!
//! - decode: 160 bytes of PCMU / PCMA (8 kHz) → 320 samples at 16 kHz (expansion and
//!   the half-band upsampler);
//! - encode: 320 samples at 16 kHz → 160 bytes (the downsampler and compression).
//!
//! One decoder/encoder per case, its output vector cleared and reused (as the door does
//! per stream), over a noise-like signal so the tables and branches see varied input.

use std::hint::black_box;
use std::time::Instant;

use weir_audio_telephony::codec::{Decoder, Encoder, Encoding, MediaFormat};

/// Chunks per timed round, and rounds (the median is printed).
const CHUNKS_PER_ROUND: u32 = 2_000;
const ROUNDS: usize = 31;

/// Median ns per call of `f` over `ROUNDS` rounds of `CHUNKS_PER_ROUND` calls.
fn median_ns(mut f: impl FnMut()) -> f64 {
    for _ in 0..CHUNKS_PER_ROUND {
        f(); // warm-up
    }
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..CHUNKS_PER_ROUND {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(CHUNKS_PER_ROUND)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let pcm: Vec<i16> = (0..320)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            ((state >> 48) as i16) / 4
        })
        .collect();
    for (name, encoding) in [("PCMU", Encoding::Pcmu), ("PCMA", Encoding::Pcma)] {
        let Ok(format) = MediaFormat::new(encoding, 8000, 1) else {
            unreachable!("{name}/8000 is supported")
        };
        let mut encoder = Encoder::new(format);
        let mut payload = Vec::with_capacity(160);
        encoder.encode(&pcm, &mut payload);
        assert_eq!(payload.len(), 160);

        let mut decoder = Decoder::new(format);
        let mut out = Vec::with_capacity(320);
        let decode = median_ns(|| {
            out.clear();
            let n = decoder.decode(black_box(&payload), &mut out).ok();
            black_box((n, &out));
        });
        let mut bytes = Vec::with_capacity(160);
        let encode = median_ns(|| {
            bytes.clear();
            encoder.encode(black_box(&pcm), &mut bytes);
            black_box(&bytes);
        });
        println!("{name} decode 160 B -> 320 samples (16 kHz): {decode:>7.0} ns per 20 ms chunk");
        println!("{name} encode 320 samples -> 160 B:          {encode:>7.0} ns per 20 ms chunk");
    }
}
