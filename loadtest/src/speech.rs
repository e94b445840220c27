//! Speech-like 16 kHz s16le PCM for the synthetic producers.
//!
//! A real recogniser never sees silence or a pure tone, and a compressing transport
//! would treat either unfairly, so each producer sends a clip that looks like speech to
//! a level meter: a voiced fundamental (110–230 Hz, chosen per stream) with two
//! formant-like partials, shaped by a syllable-rate envelope (about 4 syllables per
//! second, with short pauses between "words"), plus a little noise.
//!
//! Invariants: a clip is a whole number of 640-byte frames, deterministic for a seed, and
//! rendered once; [`SpeechClip::frame`] only slices it (no copy, no allocation), so the
//! producers' per-frame cost is the WebSocket send alone.

use std::f64::consts::TAU;

use bytes::Bytes;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use weir_protocol::audio::{FRAME_BYTES, FRAME_SAMPLES, SAMPLE_RATE};

/// A pre-rendered loop of speech-like audio.
#[derive(Debug, Clone)]
pub struct SpeechClip {
    pcm: Bytes,
    frames: usize,
}

impl SpeechClip {
    /// Renders `frames` frames (20 ms each) of speech-like audio, seeded by `seed`.
    /// `frames` is clamped to at least 1.
    pub fn render(seed: u64, frames: usize) -> Self {
        let frames = frames.max(1);
        let mut rng = SmallRng::seed_from_u64(seed);
        let f0 = rng.random_range(110.0..230.0);
        let formant1 = rng.random_range(500.0..900.0);
        let formant2 = rng.random_range(1100.0..2200.0);
        let syllable_hz = rng.random_range(3.0..5.0);
        let word_hz = rng.random_range(0.4..0.8);
        let samples = frames * FRAME_SAMPLES;
        let mut pcm = Vec::with_capacity(samples * 2);
        let rate = f64::from(SAMPLE_RATE);
        for n in 0..samples {
            let t = n as f64 / rate;
            // Syllables: a raised sine at the syllable rate; words: a slower gate that
            // leaves short pauses.
            let syllable = (0.5 - 0.5 * (TAU * syllable_hz * t).cos()).powi(2);
            let word = if (TAU * word_hz * t).sin() > -0.6 {
                1.0
            } else {
                0.05
            };
            let voiced = 0.6 * (TAU * f0 * t).sin()
                + 0.25 * (TAU * formant1 * t).sin()
                + 0.12 * (TAU * formant2 * t).sin();
            let noise: f64 = rng.random_range(-0.03..0.03);
            let v = (voiced * syllable * word + noise) * 0.5 * f64::from(i16::MAX);
            let s = v.clamp(f64::from(i16::MIN), f64::from(i16::MAX)) as i16;
            pcm.extend_from_slice(&s.to_le_bytes());
        }
        Self {
            pcm: Bytes::from(pcm),
            frames,
        }
    }

    /// Frame `index` of the loop (wraps around), 640 bytes.
    pub fn frame(&self, index: u64) -> Bytes {
        let i = (index % self.frames as u64) as usize;
        self.pcm.slice(i * FRAME_BYTES..(i + 1) * FRAME_BYTES)
    }

    /// Number of frames in the loop.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// The whole loop as samples.
    pub fn samples(&self) -> Vec<i16> {
        let pairs = self.pcm.chunks_exact(2);
        pairs.map(|b| i16::from_le_bytes([b[0], b[1]])).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_whole_and_deterministic() {
        let a = SpeechClip::render(7, 50);
        let b = SpeechClip::render(7, 50);
        assert_eq!(a.frames(), 50);
        for i in 0..120 {
            assert_eq!(a.frame(i).len(), FRAME_BYTES);
            assert_eq!(a.frame(i), b.frame(i));
        }
        assert_eq!(a.frame(3), a.frame(53));
    }

    #[test]
    fn looks_like_speech_not_silence() {
        let clip = SpeechClip::render(1, 100);
        let energies: Vec<f64> = (0..100)
            .map(|i| {
                let f = clip.frame(i);
                let sum: f64 = f
                    .chunks_exact(2)
                    .map(|c| f64::from(i16::from_le_bytes([c[0], c[1]])).powi(2))
                    .sum();
                (sum / FRAME_SAMPLES as f64).sqrt()
            })
            .collect();
        let max = energies.iter().cloned().fold(0.0, f64::max);
        let min = energies.iter().cloned().fold(f64::MAX, f64::min);
        assert!(max > 3000.0, "loud syllables, got {max}");
        assert!(min < max / 5.0, "an envelope, got min {min} max {max}");
    }
}
