//! Carrier audio ↔ weir's 16 kHz mono i16 samples.
//!
//! Carriers send and expect G.711 (PCMU µ-law, PCMA A-law) at 8 kHz, or L16 (16-bit
//! **big-endian**, RFC 3551) at 8 or 16 kHz, mono. A [`Decoder`] turns one payload into
//! 16 kHz samples; an [`Encoder`] turns 16 kHz samples into payload bytes.
//!
//! Invariants:
//! - a [`MediaFormat`] made by [`MediaFormat::new`] is one of PCMU/8000, PCMA/8000,
//!   L16/8000, L16/16000, mono; nothing else gets that far (a hand-built one with another
//!   rate is read as 8 kHz, G.711 always is);
//! - [`Decoder::decode`] either appends the whole payload's audio or, on an error,
//!   nothing; for 8 kHz formats it appends exactly twice the payload's samples
//!   ([`Decoder::samples_16k`]), for L16/16000 the samples themselves (byte-swapped);
//! - 8 kHz formats go through the stateful half-band resamplers of `resample`
//!   ([`Upsampler2x`] inbound, [`Downsampler2x`] outbound): a stream's history carries
//!   across payloads, so cutting a stream differently gives the same samples, and each
//!   direction delays the audio by 1.25 ms; `reset` after a gap drops that history;
//! - nothing here allocates per sample: the output vectors grow, nothing else.
//!
//! Decisions. G.711 comes from the `audio-codec-algorithms` crate (no_std,
//! `forbid(unsafe_code)`, no dependencies, its tables made with the ITU-T G.191 tools);
//! the tests here check it against the G.711 reference points and for every code. The
//! resampler is a fixed 2:1 half-band
//! polyphase FIR rather than `rubato`: that crate resamples by arbitrary ratios with
//! sinc or FFT kernels and brings rustfft/realfft into the build, costing more CPU per
//! 20 ms chunk than 2:1 needs; a half-band filter does one dot product per output pair.

mod resample;

pub use audio_codec_algorithms::{
    decode_alaw as alaw_to_linear, decode_ulaw as mulaw_to_linear, encode_alaw as linear_to_alaw,
    encode_ulaw as linear_to_mulaw,
};
pub use resample::{Downsampler2x, Upsampler2x};

/// The largest payload accepted, in milliseconds of audio (carriers send 20 ms).
pub const MAX_CHUNK_MS: usize = 200;

/// A carrier's audio encoding; displayed as `PCMU`, `PCMA`, `L16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::Display)]
#[strum(serialize_all = "UPPERCASE")]
pub enum Encoding {
    /// G.711 µ-law, 8 kHz.
    Pcmu,
    /// G.711 A-law, 8 kHz.
    Pcma,
    /// Linear 16-bit big-endian (RFC 3551), 8 or 16 kHz.
    L16,
}

/// A carrier stream's audio format, mono.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MediaFormat {
    /// The encoding.
    pub encoding: Encoding,
    /// Samples per second: 8000, or 16000 for L16.
    pub sample_rate: u32,
}

impl MediaFormat {
    /// Validates a format: PCMU/PCMA at 8000 Hz only, L16 at 8000 or 16000 Hz, one
    /// channel.
    pub fn new(encoding: Encoding, sample_rate: u32, channels: u32) -> Result<Self, CodecError> {
        let rate_ok = match encoding {
            Encoding::Pcmu | Encoding::Pcma => sample_rate == 8000,
            Encoding::L16 => sample_rate == 8000 || sample_rate == 16000,
        };
        if rate_ok && channels == 1 {
            Ok(Self {
                encoding,
                sample_rate,
            })
        } else {
            Err(CodecError::UnsupportedFormat {
                encoding,
                sample_rate,
                channels,
            })
        }
    }

    /// Bytes per sample on the wire: 1 (G.711) or 2 (L16).
    pub fn bytes_per_sample(&self) -> usize {
        match self.encoding {
            Encoding::Pcmu | Encoding::Pcma => 1,
            Encoding::L16 => 2,
        }
    }

    /// Samples per millisecond: 8, or 16 for L16/16000.
    pub fn samples_per_ms(&self) -> usize {
        if self.is_16k() { 16 } else { 8 }
    }

    /// Already at weir's rate (no resampling): L16/16000 only.
    fn is_16k(&self) -> bool {
        self.encoding == Encoding::L16 && self.sample_rate == 16000
    }
}

/// Why a format or a payload was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CodecError {
    /// Not PCMU/8000, PCMA/8000, L16/8000 or L16/16000 mono.
    #[error(
        "unsupported media format {encoding}/{sample_rate} with {channels} channel(s): \
         PCMU and PCMA at 8000 Hz, L16 at 8000 or 16000 Hz, mono"
    )]
    UnsupportedFormat {
        /// The encoding asked for.
        encoding: Encoding,
        /// The sample rate asked for.
        sample_rate: u32,
        /// The channel count asked for.
        channels: u32,
    },
    /// A payload with no bytes.
    #[error("empty media payload")]
    #[strum(serialize = "empty_payload")]
    Empty,
    /// An L16 payload of an odd number of bytes.
    #[error("media payload of {len} bytes is not whole 16-bit samples")]
    PartialSample {
        /// The payload's length in bytes.
        len: usize,
    },
    /// A payload longer than [`MAX_CHUNK_MS`].
    #[error("media payload of {ms} ms is longer than the {max_ms} ms accepted")]
    #[strum(serialize = "payload_too_long")]
    TooLong {
        /// The payload's duration, rounded up to whole milliseconds.
        ms: usize,
        /// [`MAX_CHUNK_MS`].
        max_ms: usize,
    },
}

impl CodecError {
    /// A stable snake_case code for logs, metrics and events.
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// Carrier payloads → 16 kHz samples, for one inbound stream.
#[derive(Debug, Clone)]
pub struct Decoder {
    format: MediaFormat,
    up: Upsampler2x,
}

impl Decoder {
    /// A decoder with a silent resampler history.
    pub fn new(format: MediaFormat) -> Self {
        Self {
            format,
            up: Upsampler2x::new(),
        }
    }

    /// Appends the payload's audio at 16 kHz to `out` and returns how many samples were
    /// appended ([`samples_16k`](Self::samples_16k) of its length). Errors, with nothing
    /// appended: an empty payload, an L16 payload of an odd length, a payload longer than
    /// [`MAX_CHUNK_MS`].
    pub fn decode(&mut self, payload: &[u8], out: &mut Vec<i16>) -> Result<usize, CodecError> {
        self.check(payload.len())?;
        let before = out.len();
        let be = |b: &[u8]| i16::from_be_bytes([b[0], b[1]]);
        match self.format.encoding {
            Encoding::Pcmu => self
                .up
                .process_iter(payload.iter().map(|&c| mulaw_to_linear(c)), out),
            Encoding::Pcma => self
                .up
                .process_iter(payload.iter().map(|&c| alaw_to_linear(c)), out),
            Encoding::L16 if self.format.is_16k() => out.extend(payload.chunks_exact(2).map(be)),
            Encoding::L16 => self.up.process_iter(payload.chunks_exact(2).map(be), out),
        }
        Ok(out.len() - before)
    }

    /// How many 16 kHz samples a (valid) payload of `payload_len` bytes decodes to.
    pub fn samples_16k(&self, payload_len: usize) -> usize {
        let samples = payload_len / self.format.bytes_per_sample();
        if self.format.is_16k() {
            samples
        } else {
            2 * samples
        }
    }

    /// Drops the resampler's history (after a gap: the next payload is not continuous
    /// with the last one).
    pub fn reset(&mut self) {
        self.up.reset();
    }

    fn check(&self, len: usize) -> Result<(), CodecError> {
        if len == 0 {
            return Err(CodecError::Empty);
        }
        let per_sample = self.format.bytes_per_sample();
        if !len.is_multiple_of(per_sample) {
            return Err(CodecError::PartialSample { len });
        }
        let per_ms = self.format.samples_per_ms();
        let samples = len / per_sample;
        if samples > MAX_CHUNK_MS * per_ms {
            return Err(CodecError::TooLong {
                ms: samples.div_ceil(per_ms),
                max_ms: MAX_CHUNK_MS,
            });
        }
        Ok(())
    }
}

/// 16 kHz samples → carrier payload bytes, for one outbound stream.
#[derive(Debug, Clone)]
pub struct Encoder {
    format: MediaFormat,
    down: Downsampler2x,
}

impl Encoder {
    /// An encoder with a silent resampler history.
    pub fn new(format: MediaFormat) -> Self {
        Self {
            format,
            down: Downsampler2x::new(),
        }
    }

    /// Appends `pcm16k`'s audio in the stream's format to `out`. For 8 kHz formats one
    /// sample (byte for G.711, 2 bytes for L16) per pair of input samples; an odd sample
    /// waits for the next call (see [`Downsampler2x::process`]).
    pub fn encode(&mut self, pcm16k: &[i16], out: &mut Vec<u8>) {
        let samples = pcm16k.len() / 2 + 1;
        match self.format.encoding {
            Encoding::Pcmu => {
                out.reserve(samples);
                self.down
                    .process_with(pcm16k, |s| out.push(linear_to_mulaw(s)));
            }
            Encoding::Pcma => {
                out.reserve(samples);
                self.down
                    .process_with(pcm16k, |s| out.push(linear_to_alaw(s)));
            }
            Encoding::L16 if self.format.is_16k() => {
                out.reserve(2 * pcm16k.len());
                for s in pcm16k {
                    out.extend_from_slice(&s.to_be_bytes());
                }
            }
            Encoding::L16 => {
                out.reserve(2 * samples);
                self.down
                    .process_with(pcm16k, |s| out.extend_from_slice(&s.to_be_bytes()));
            }
        }
    }

    /// Drops the resampler's history and any odd sample waiting.
    pub fn reset(&mut self) {
        self.down.reset();
    }
}

#[cfg(test)]
mod tests;
