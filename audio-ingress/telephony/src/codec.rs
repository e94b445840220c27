//! PLACEHOLDER (branch i31-dialect only): the minimal `Encoding` / `MediaFormat` /
//! `CodecError` surface from the contract's codec section, so that `dialect` builds
//! while the real codec module is written on its own branch. Drop this file at merge
//! in favour of the real `codec.rs`. No G.711, no resampling here.

/// A carrier payload encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// G.711 µ-law.
    Pcmu,
    /// G.711 A-law.
    Pcma,
    /// 16-bit linear PCM, big-endian (RFC 3551).
    L16,
}

/// A validated carrier media format (mono).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaFormat {
    /// The payload encoding.
    pub encoding: Encoding,
    /// Samples per second: 8000 (PCMU, PCMA, L16) or 16000 (L16).
    pub sample_rate: u32,
}

impl MediaFormat {
    /// PCMU/PCMA: 8000 Hz only; L16: 8000 or 16000 Hz; one channel.
    pub fn new(encoding: Encoding, sample_rate: u32, channels: u32) -> Result<Self, CodecError> {
        let rate_ok = match encoding {
            Encoding::Pcmu | Encoding::Pcma => sample_rate == 8000,
            Encoding::L16 => sample_rate == 8000 || sample_rate == 16000,
        };
        if !rate_ok || channels != 1 {
            return Err(CodecError::UnsupportedFormat {
                encoding,
                sample_rate,
                channels,
            });
        }
        Ok(Self {
            encoding,
            sample_rate,
        })
    }
}

/// Why a format or payload is refused.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The encoding / rate / channel combination is not supported.
    #[error("unsupported media format: {encoding:?} at {sample_rate} Hz, {channels} channel(s)")]
    UnsupportedFormat {
        /// The encoding asked for.
        encoding: Encoding,
        /// The rate asked for.
        sample_rate: u32,
        /// The channel count asked for.
        channels: u32,
    },
}

impl CodecError {
    /// A stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            CodecError::UnsupportedFormat { .. } => "unsupported_format",
        }
    }
}
