//! Behaviour of the resamplers on signals, and of the decoder/encoder on payloads.

use super::*;
use std::f64::consts::PI;

/// `n` samples of a sine at `freq_hz`, sampled at `rate_hz`, with `amplitude`.
fn tone(freq_hz: f64, rate_hz: f64, amplitude: f64, n: usize) -> Vec<i16> {
    (0..n)
        .map(|i| (amplitude * (2.0 * PI * freq_hz * i as f64 / rate_hz).sin()).round() as i16)
        .collect()
}

/// Amplitude of the `freq_hz` component of `x` (a single DFT bin; exact when `x` holds
/// whole periods).
fn amplitude_at(x: &[i16], freq_hz: f64, rate_hz: f64) -> f64 {
    let w = 2.0 * PI * freq_hz / rate_hz;
    let (re, im) = x.iter().enumerate().fold((0.0, 0.0), |(re, im), (i, &s)| {
        let s = f64::from(s);
        (re + s * (w * i as f64).cos(), im - s * (w * i as f64).sin())
    });
    2.0 * (re * re + im * im).sqrt() / x.len() as f64
}

/// A deterministic noise-like signal (LCG), full scale.
fn noise(n: usize, seed: u64) -> Vec<i16> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (state >> 48) as u16 as i16
        })
        .collect()
}

fn format(encoding: Encoding, rate: u32) -> MediaFormat {
    MediaFormat::new(encoding, rate, 1).expect("a supported format")
}

#[test]
fn upsampled_tone_image_is_at_least_45_db_down() {
    let x = tone(1000.0, 8000.0, 16000.0, 1000);
    let mut y = Vec::new();
    Upsampler2x::new().process(&x, &mut y);
    assert_eq!(y.len(), 2000);
    // Past the filter's start-up; 1024 samples = 64 periods of 1 kHz, 448 of 7 kHz.
    let steady = &y[200..200 + 1024];
    let tone_amp = amplitude_at(steady, 1000.0, 16000.0);
    let image_amp = amplitude_at(steady, 7000.0, 16000.0);
    let down_db = 20.0 * (tone_amp / image_amp).log10();
    println!("1 kHz tone {tone_amp:.1}, 7 kHz image {image_amp:.3}: {down_db:.1} dB down");
    assert!(
        (tone_amp - 16000.0).abs() < 16000.0 * 0.005,
        "tone amplitude {tone_amp}"
    );
    assert!(down_db >= 45.0, "image only {down_db} dB down");
}

/// The worst cases at the mask's edges, through the real resamplers: a 3.4 kHz tone's
/// image at 4.6 kHz after upsampling, and a 4.6 kHz tone's alias at 3.4 kHz after
/// downsampling, both ≥ 45 dB below the tone (G.711's own SNR is about 38 dB).
#[test]
fn images_and_aliases_at_the_band_edges_are_at_least_45_db_down() {
    let x = tone(3400.0, 8000.0, 16000.0, 1000);
    let mut y = Vec::new();
    Upsampler2x::new().process(&x, &mut y);
    let steady = &y[200..200 + 1040]; // 13 × 80 samples: whole periods of both
    let image_db = 20.0
        * (amplitude_at(steady, 3400.0, 16000.0) / amplitude_at(steady, 4600.0, 16000.0)).log10();

    let x = tone(4600.0, 16000.0, 16000.0, 2000);
    let mut y = Vec::new();
    Downsampler2x::new().process(&x, &mut y);
    let alias_db = 20.0 * (16000.0 / amplitude_at(&y[100..100 + 800], 3400.0, 8000.0)).log10();
    println!(
        "3.4 kHz image at 4.6 kHz {image_db:.1} dB down; 4.6 kHz alias at 3.4 kHz {alias_db:.1} dB down"
    );
    assert!(image_db >= 45.0, "image only {image_db} dB down");
    assert!(alias_db >= 45.0, "alias only {alias_db} dB down");
}

#[test]
fn tone_survives_up_then_down() {
    let x = tone(1000.0, 8000.0, 12000.0, 800);
    let mut up = Vec::new();
    Upsampler2x::new().process(&x, &mut up);
    let mut back = Vec::new();
    Downsampler2x::new().process(&up, &mut back);
    assert_eq!(back.len(), x.len());
    // Each direction delays by the same 1.25 ms: 10 samples at 8 kHz per direction.
    let delay = Upsampler2x::DELAY_OUT_SAMPLES / 2 + Downsampler2x::DELAY_OUT_SAMPLES;
    assert_eq!(delay, 20);
    let (a, b) = (&x[100..700], &back[100 + delay..700 + delay]);
    let dot = |p: &[i16], q: &[i16]| {
        p.iter()
            .zip(q)
            .map(|(&u, &v)| f64::from(u) * f64::from(v))
            .sum::<f64>()
    };
    let corr = dot(a, b) / (dot(a, a) * dot(b, b)).sqrt();
    let max_err = a
        .iter()
        .zip(b)
        .map(|(&u, &v)| (i32::from(u) - i32::from(v)).abs())
        .max();
    println!("up → down correlation {corr:.7}, largest sample error {max_err:?}");
    assert!(corr > 0.999, "correlation {corr}");
}

#[test]
fn upsampler_even_outputs_are_the_delayed_input() {
    let x = noise(300, 7);
    let mut y = Vec::new();
    Upsampler2x::new().process(&x, &mut y);
    let d = Upsampler2x::DELAY_OUT_SAMPLES;
    for (k, &s) in x.iter().enumerate().take((y.len() - d) / 2) {
        assert_eq!(y[d + 2 * k], s, "output {}", d + 2 * k);
    }
    assert!(
        y[..d].iter().step_by(2).all(|&s| s == 0),
        "history starts silent"
    );
}

#[test]
fn unit_gain_at_dc_both_ways() {
    let x = vec![10_000i16; 400];
    let mut up = Vec::new();
    Upsampler2x::new().process(&x, &mut up);
    assert!(
        up[100..].iter().all(|&s| s == 10_000),
        "up: {:?}",
        &up[100..110]
    );
    let mut down = Vec::new();
    Downsampler2x::new().process(&x, &mut down);
    assert!(
        down[50..].iter().all(|&s| s == 10_000),
        "down: {:?}",
        &down[50..60]
    );
}

#[test]
fn full_scale_saturates_instead_of_wrapping() {
    // A full-scale square wave overshoots (Gibbs); the output clips, never wraps.
    let x: Vec<i16> = (0..400)
        .map(|i| if (i / 8) % 2 == 0 { i16::MAX } else { i16::MIN })
        .collect();
    let mut up = Vec::new();
    Upsampler2x::new().process(&x, &mut up);
    let mut odd = up[100..].iter().skip(1).step_by(2);
    assert!(odd.any(|&s| s == i16::MAX), "overshoot saturated to MAX");
    for w in up[100..].windows(2) {
        // Wrapping would put a +32767 next to a large negative value inside a half-period.
        assert!(
            (i32::from(w[0]) - i32::from(w[1])).abs() < 40_000,
            "jump {w:?}"
        );
    }
}

/// Same output whether a stream comes in one call or cut in pieces of `size`.
fn chunked<T: Clone>(input: &[T], size: usize, mut f: impl FnMut(&[T])) {
    for piece in input.chunks(size) {
        f(piece);
    }
}

#[test]
fn resamplers_do_not_depend_on_chunking() {
    let x = noise(1601, 11);
    let mut whole_up = Vec::new();
    Upsampler2x::new().process(&x, &mut whole_up);
    let mut whole_down = Vec::new();
    Downsampler2x::new().process(&x, &mut whole_down);
    assert_eq!(whole_down.len(), 800);
    for size in [1, 7, 160] {
        let (mut up, mut up_out) = (Upsampler2x::new(), Vec::new());
        chunked(&x, size, |p| up.process(p, &mut up_out));
        assert_eq!(up_out, whole_up, "upsampler, chunks of {size}");
        let (mut down, mut down_out) = (Downsampler2x::new(), Vec::new());
        chunked(&x, size, |p| down.process(p, &mut down_out));
        assert_eq!(down_out, whole_down, "downsampler, chunks of {size}");
    }
}

#[test]
fn decoder_and_encoder_do_not_depend_on_chunking() {
    let pcm = noise(1600, 3); // 200 ms at 8 kHz, the most a payload may hold
    let bytes: Vec<u8> = pcm.iter().map(|&s| s as u8).collect();
    for (encoding, rate) in [
        (Encoding::Pcmu, 8000),
        (Encoding::Pcma, 8000),
        (Encoding::L16, 8000),
        (Encoding::L16, 16000),
    ] {
        let f = format(encoding, rate);
        let mut whole = Vec::new();
        let n = Decoder::new(f).decode(&bytes, &mut whole).expect("decodes");
        assert_eq!(n, whole.len());
        assert_eq!(n, Decoder::new(f).samples_16k(bytes.len()));
        let mut whole_enc = Vec::new();
        Encoder::new(f).encode(&pcm, &mut whole_enc);
        for size in [2, 14, 160] {
            let (mut dec, mut out) = (Decoder::new(f), Vec::new());
            chunked(&bytes, size, |p| {
                dec.decode(p, &mut out).expect("decodes");
            });
            assert_eq!(out, whole, "{f:?} decode, chunks of {size}");
        }
        for size in [1, 7, 160] {
            let (mut enc, mut out) = (Encoder::new(f), Vec::new());
            chunked(&pcm, size, |p| enc.encode(p, &mut out));
            assert_eq!(out, whole_enc, "{f:?} encode, chunks of {size}");
        }
    }
}

#[test]
fn decoder_sizes_for_a_20_ms_chunk() {
    let mut out = Vec::new();
    for (encoding, rate, bytes) in [
        (Encoding::Pcmu, 8000, 160),
        (Encoding::Pcma, 8000, 160),
        (Encoding::L16, 8000, 320),
        (Encoding::L16, 16000, 640),
    ] {
        let mut dec = Decoder::new(format(encoding, rate));
        out.clear();
        assert_eq!(
            dec.decode(&vec![0xD5; bytes], &mut out),
            Ok(320),
            "{encoding}/{rate}"
        );
        assert_eq!(out.len(), 320);
        assert_eq!(dec.samples_16k(bytes), 320);
    }
    let mut enc = Encoder::new(format(Encoding::Pcmu, 8000));
    let mut payload = Vec::new();
    enc.encode(&[0; 320], &mut payload);
    assert_eq!(payload, vec![0xFF; 160], "µ-law silence");
}

#[test]
fn l16_is_big_endian() {
    let mut dec = Decoder::new(format(Encoding::L16, 16000));
    let mut out = Vec::new();
    assert_eq!(dec.decode(&[0x12, 0x34, 0xFF, 0xFE], &mut out), Ok(2));
    assert_eq!(out, [0x1234, -2]);

    let mut enc = Encoder::new(format(Encoding::L16, 16000));
    let mut bytes = Vec::new();
    enc.encode(&[0x1234, -2], &mut bytes);
    assert_eq!(bytes, [0x12, 0x34, 0xFF, 0xFE]);

    // At 8 kHz the samples come back on the upsampler's even outputs, after its delay.
    let mut dec = Decoder::new(format(Encoding::L16, 8000));
    let samples = [0x1234i16, -2, 0x0102, i16::MIN];
    let mut payload: Vec<u8> = samples.iter().flat_map(|s| s.to_be_bytes()).collect();
    payload.extend(std::iter::repeat_n(0, 2 * 16));
    let mut out = Vec::new();
    dec.decode(&payload, &mut out).expect("decodes");
    let d = Upsampler2x::DELAY_OUT_SAMPLES;
    let evens: Vec<i16> = (0..4).map(|k| out[d + 2 * k]).collect();
    assert_eq!(evens, samples);
}

#[test]
fn encoder_8k_round_trips_a_tone_through_the_decoder() {
    // 16 kHz 1 kHz tone → PCMA → back to 16 kHz: the tone survives G.711 + both filters.
    let x = tone(1000.0, 16000.0, 10000.0, 3200);
    let f = format(Encoding::Pcma, 8000);
    let mut payload = Vec::new();
    Encoder::new(f).encode(&x, &mut payload);
    assert_eq!(payload.len(), 1600);
    let mut back = Vec::new();
    Decoder::new(f)
        .decode(&payload, &mut back)
        .expect("decodes");
    let steady = &back[400..400 + 2048];
    let amp = amplitude_at(steady, 1000.0, 16000.0);
    assert!((amp - 10000.0).abs() < 100.0, "amplitude {amp}");
}

#[test]
fn reset_forgets_the_history() {
    let f = format(Encoding::Pcmu, 8000);
    let payload: Vec<u8> = noise(160, 5).iter().map(|&s| s as u8).collect();
    let mut fresh = Vec::new();
    Decoder::new(f)
        .decode(&payload, &mut fresh)
        .expect("decodes");
    let mut dec = Decoder::new(f);
    let mut out = Vec::new();
    dec.decode(&[0x80; 160], &mut out).expect("decodes");
    dec.reset();
    out.clear();
    dec.decode(&payload, &mut out).expect("decodes");
    assert_eq!(out, fresh);

    let pcm = noise(321, 9);
    let mut fresh = Vec::new();
    Encoder::new(f).encode(&pcm, &mut fresh);
    let mut enc = Encoder::new(f);
    let mut bytes = Vec::new();
    enc.encode(&noise(321, 1), &mut bytes); // leaves an odd sample pending
    enc.reset();
    bytes.clear();
    enc.encode(&pcm, &mut bytes);
    assert_eq!(bytes, fresh);
}

#[test]
fn formats_are_validated() {
    for (encoding, rate) in [
        (Encoding::Pcmu, 8000),
        (Encoding::Pcma, 8000),
        (Encoding::L16, 8000),
        (Encoding::L16, 16000),
    ] {
        let f = MediaFormat::new(encoding, rate, 1).expect("supported");
        assert_eq!((f.encoding, f.sample_rate), (encoding, rate));
    }
    assert_eq!(format(Encoding::Pcmu, 8000).bytes_per_sample(), 1);
    assert_eq!(format(Encoding::L16, 8000).bytes_per_sample(), 2);
    assert_eq!(format(Encoding::Pcma, 8000).samples_per_ms(), 8);
    assert_eq!(format(Encoding::L16, 8000).samples_per_ms(), 8);
    assert_eq!(format(Encoding::L16, 16000).samples_per_ms(), 16);
    for (encoding, rate, channels) in [
        (Encoding::Pcmu, 16000, 1),
        (Encoding::Pcma, 16000, 1),
        (Encoding::L16, 44100, 1),
        (Encoding::L16, 8000, 2),
        (Encoding::Pcmu, 8000, 0),
    ] {
        let err = MediaFormat::new(encoding, rate, channels).expect_err("unsupported");
        assert_eq!(
            err,
            CodecError::UnsupportedFormat {
                encoding,
                sample_rate: rate,
                channels
            }
        );
        assert_eq!(err.code(), "unsupported_format");
    }
    let msg = MediaFormat::new(Encoding::Pcmu, 16000, 1)
        .expect_err("unsupported")
        .to_string();
    assert!(msg.contains("PCMU/16000"), "{msg}");
}

#[test]
fn bad_payloads_are_refused_with_nothing_appended() {
    let mut out = vec![7i16];
    let mut mu = Decoder::new(format(Encoding::Pcmu, 8000));
    let err = mu.decode(&[], &mut out).expect_err("empty");
    assert_eq!(
        (err.clone(), err.code()),
        (CodecError::Empty, "empty_payload")
    );

    let mut l16 = Decoder::new(format(Encoding::L16, 16000));
    let err = l16.decode(&[1, 2, 3], &mut out).expect_err("odd");
    assert_eq!(
        (err.clone(), err.code()),
        (CodecError::PartialSample { len: 3 }, "partial_sample")
    );

    // 200 ms is the most: 1600 µ-law bytes pass, 1601 do not.
    let err = mu.decode(&[0xFF; 1601], &mut out).expect_err("too long");
    assert_eq!(
        (err.clone(), err.code()),
        (
            CodecError::TooLong {
                ms: 201,
                max_ms: MAX_CHUNK_MS
            },
            "payload_too_long"
        )
    );
    let err = l16
        .decode(&vec![0; 2 * 16 * 250], &mut out)
        .expect_err("too long");
    assert_eq!(
        err,
        CodecError::TooLong {
            ms: 250,
            max_ms: 200
        }
    );
    assert_eq!(out, [7], "nothing appended on errors");

    assert_eq!(mu.decode(&[0xFF; 1600], &mut out), Ok(3200));
    assert_eq!(l16.decode(&vec![0; 2 * 16 * 200], &mut out), Ok(3200));
}
