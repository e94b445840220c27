//! The deployed audio packet: `[u32 BE meta length][meta: UTF-8 JSON][PCM s16le]`.
//!
//! One packet per NATS message. The deployed Python producers write the meta with
//! `json.dumps(meta, ensure_ascii=False)`; the decoder therefore accepts any JSON
//! spacing and key order and ignores unknown keys. It validates, in order: the length
//! prefix against the payload, the meta size, UTF-8, JSON, the packet type, `seq`, the
//! audio format, the PCM size and that the PCM is a whole number of samples. Each
//! failure is a distinct [`DecodeErrorKind`]; nothing here panics on input.
//!
//! Types: `frame` (PCM follows) and `end` (no PCM) are the deployed contract. `gap` is
//! the opt-in extension (see [`super::extension`]): it is only ever sent to consumers
//! that declared they understand it, so an old consumer never sees one.
//!
//! Sequence numbers start at 1 and grow by one per frame; `end` takes the next number.
//! A `gap` packet stands for the missing frames `first_seq..=seq`, so the frame after it
//! has `seq + 1`.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;

use crate::WireName;

/// Sample rate of the deployed stack, in Hz.
pub const SAMPLE_RATE: u32 = 16_000;
/// Bytes per sample (s16le).
pub const SAMPLE_WIDTH: u16 = 2;
/// Mono.
pub const CHANNELS: u16 = 1;
/// Samples in one 20 ms frame at 16 kHz.
pub const FRAME_SAMPLES: usize = 320;
/// Bytes in one 20 ms frame of s16le mono.
pub const FRAME_BYTES: usize = FRAME_SAMPLES * SAMPLE_WIDTH as usize;
/// Duration of one standard frame.
pub const FRAME_DURATION: Duration = Duration::from_millis(20);
/// Default upper bound on the JSON meta, in bytes.
pub const DEFAULT_MAX_META_BYTES: usize = 4 * 1024;
/// Default upper bound on the PCM of one packet, in bytes (1 s of audio).
pub const DEFAULT_MAX_PCM_BYTES: usize = 32_000;
/// Longest `session_id` accepted, in bytes.
pub const MAX_SESSION_ID_LEN: usize = 256;

/// Sample format of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AudioFormat {
    /// Samples per second.
    pub sample_rate: u32,
    /// Bytes per sample.
    pub sample_width: u16,
    /// Interleaved channels.
    pub channels: u16,
}

impl AudioFormat {
    /// 16 kHz, s16le, mono: the only format the deployed stack speaks.
    pub const DEPLOYED: Self = Self {
        sample_rate: SAMPLE_RATE,
        sample_width: SAMPLE_WIDTH,
        channels: CHANNELS,
    };

    /// Bytes per sample frame (all channels).
    pub fn bytes_per_sample(&self) -> usize {
        usize::from(self.sample_width) * usize::from(self.channels)
    }
}

impl Default for AudioFormat {
    fn default() -> Self {
        Self::DEPLOYED
    }
}

/// Why frames are missing.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum GapReason {
    /// The producer's queue was full (bytes bound); the oldest frames were dropped.
    QueueFull,
    /// Frames outlived the age bound before they could be published.
    MaxAge,
    /// Publishing to NATS failed or timed out.
    PublishFailed,
    /// The producer sent audio faster than its rate bound (`max_rate` × real time
    /// beyond the burst); the frames over it were dropped.
    Rate,
    /// The producer's connection dropped and it resumed the stream: the frames it
    /// offered that never reached the ingress (in the dead connection, or produced
    /// while it reconnected). Declared once, when the stream resumes.
    Resume,
    /// The audio never reached the ingress from its source: a telephony carrier's
    /// chunks that were missing, or that came later than the reorder window.
    Source,
    /// A reason this version does not know (sent by a newer producer).
    #[serde(other)]
    Other,
}

/// A declared gap: frames `first_seq..=last_seq` were dropped by the producer on
/// purpose, `samples` samples in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gap {
    /// First missing sequence number.
    pub first_seq: u64,
    /// Last missing sequence number (also the gap packet's own `seq`).
    pub last_seq: u64,
    /// Samples missing (per channel), so the consumer can keep its timeline.
    pub samples: u64,
    /// Why they are missing.
    pub reason: GapReason,
}

impl Gap {
    /// Number of frames missing (saturating: never panics, even for a `Gap` built
    /// by hand with `first_seq = 0, last_seq = u64::MAX`).
    pub fn frames(&self) -> u64 {
        self.last_seq
            .saturating_sub(self.first_seq)
            .saturating_add(1)
    }
}

/// What a packet carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketBody {
    /// Audio samples (s16le PCM, a whole number of samples, possibly empty).
    Frame {
        /// The PCM bytes.
        pcm: Bytes,
    },
    /// The stream ended.
    End,
    /// Frames are missing on purpose (extension, opt-in).
    Gap(Gap),
}

/// One decoded (or to-be-encoded) audio packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Sequence number (≥ 1).
    pub seq: u64,
    /// Sample format.
    pub format: AudioFormat,
    /// Optional session id, as the deployed producers send it.
    pub session_id: Option<String>,
    /// When the producer side captured (admitted) the audio, Unix milliseconds: the
    /// meta key `captured_at_ms` (extension; deployed readers ignore unknown keys).
    /// Written on frames by weir's ingress; `None` when absent.
    pub captured_at_ms: Option<u64>,
    /// Payload.
    pub body: PacketBody,
}

impl Packet {
    /// A packet in the deployed format, without session id or capture time.
    fn deployed(seq: u64, body: PacketBody) -> Self {
        Self {
            seq,
            format: AudioFormat::DEPLOYED,
            session_id: None,
            captured_at_ms: None,
            body,
        }
    }

    /// A frame in the deployed format.
    pub fn frame(seq: u64, pcm: Bytes) -> Self {
        Self::deployed(seq, PacketBody::Frame { pcm })
    }

    /// An end packet in the deployed format.
    pub fn end(seq: u64) -> Self {
        Self::deployed(seq, PacketBody::End)
    }

    /// A gap packet; its `seq` is `gap.last_seq`.
    pub fn gap(gap: Gap) -> Self {
        Self::deployed(gap.last_seq, PacketBody::Gap(gap))
    }

    /// Sets the session id.
    pub fn with_session(mut self, session_id: Option<String>) -> Self {
        self.session_id = session_id;
        self
    }

    /// Sets the capture time (Unix ms) written as the meta key `captured_at_ms`.
    pub fn with_captured_at_ms(mut self, captured_at_ms: Option<u64>) -> Self {
        self.captured_at_ms = captured_at_ms;
        self
    }

    /// The wire name of the packet type.
    pub fn type_name(&self) -> &'static str {
        match self.body {
            PacketBody::Frame { .. } => "frame",
            PacketBody::End => "end",
            PacketBody::Gap(_) => "gap",
        }
    }

    /// Samples carried (frames) or declared missing (gaps); 0 for `end`.
    pub fn samples(&self) -> u64 {
        match &self.body {
            PacketBody::Frame { pcm } => (pcm.len() / self.format.bytes_per_sample().max(1)) as u64,
            PacketBody::End => 0,
            PacketBody::Gap(g) => g.samples,
        }
    }

    /// The PCM, empty for anything but a frame.
    pub fn pcm(&self) -> &[u8] {
        match &self.body {
            PacketBody::Frame { pcm } => pcm,
            _ => &[],
        }
    }

    /// Encodes the packet in the deployed layout. The meta is compact JSON with the
    /// keys in the deployed order (`type, seq, sample_rate, sample_width, channels`,
    /// then `session_id`, then `captured_at_ms`, then gap fields).
    pub fn encode(&self) -> Result<Bytes, EncodeError> {
        encode_packet_ref(
            self.seq,
            self.format,
            self.session_id.as_deref(),
            self.captured_at_ms,
            (&self.body).into(),
        )
    }
}

/// A packet body borrowed for encoding: a producer's per-frame path encodes its
/// queued PCM without cloning it into a [`PacketBody`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyRef<'a> {
    /// Audio samples.
    Frame(&'a [u8]),
    /// The stream ended.
    End,
    /// Frames are missing on purpose (extension, opt-in).
    Gap(&'a Gap),
}

impl<'a> From<&'a PacketBody> for BodyRef<'a> {
    fn from(body: &'a PacketBody) -> Self {
        match body {
            PacketBody::Frame { pcm } => Self::Frame(pcm),
            PacketBody::End => Self::End,
            PacketBody::Gap(g) => Self::Gap(g),
        }
    }
}

/// Appends the decimal digits of `n` (what `write!("{n}")` does, without the
/// formatting machinery: this runs once or twice per audio frame).
fn put_decimal(out: &mut BytesMut, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&buf[i..]);
}

/// [`Packet::encode`] from borrowed parts: a producer's per-frame path encodes without
/// building a [`Packet`] (no copy of the session id or the PCM). One allocation of the
/// exact size: the output.
pub fn encode_packet_ref(
    seq: u64,
    format: AudioFormat,
    session_id: Option<&str>,
    captured_at_ms: Option<u64>,
    body: BodyRef<'_>,
) -> Result<Bytes, EncodeError> {
    let mut out = BytesMut::with_capacity(max_packet_len(session_id, body));
    write_packet(&mut out, seq, format, session_id, captured_at_ms, body)?;
    Ok(out.freeze())
}

/// [`encode_packet_ref`] carved out of `arena`: the packet is appended to it and split
/// off, so consecutive packets share one allocation (`BytesMut::reserve` reuses the
/// arena in place once every packet carved from it was dropped, and otherwise
/// allocates a new one of the arena's original capacity). A producer that encodes many
/// small packets this way calls the allocator once per arena, not once per packet, and
/// the thread that frees the packets (the NATS client's) frees an arena, not each one.
/// The packet holds its whole arena alive: memory held is at most the packets' bytes
/// plus one arena.
pub fn encode_packet_in(
    arena: &mut BytesMut,
    seq: u64,
    format: AudioFormat,
    session_id: Option<&str>,
    captured_at_ms: Option<u64>,
    body: BodyRef<'_>,
) -> Result<Bytes, EncodeError> {
    debug_assert!(arena.is_empty(), "the arena holds only split-off packets");
    arena.clear();
    arena.reserve(max_packet_len(session_id, body));
    write_packet(arena, seq, format, session_id, captured_at_ms, body)?;
    Ok(arena.split().freeze())
}

/// An upper bound of the encoded length (session ids are escaped, up to 6 bytes a byte;
/// the rest of the meta fits in 160).
fn max_packet_len(session_id: Option<&str>, body: BodyRef<'_>) -> usize {
    let pcm = match body {
        BodyRef::Frame(pcm) => pcm.len(),
        BodyRef::End | BodyRef::Gap(_) => 0,
    };
    4 + 160 + 6 * session_id.map_or(0, str::len) + pcm
}

/// Appends one packet to `out`; on error `out` is as it was.
fn write_packet(
    out: &mut BytesMut,
    seq: u64,
    format: AudioFormat,
    session_id: Option<&str>,
    captured_at_ms: Option<u64>,
    body: BodyRef<'_>,
) -> Result<(), EncodeError> {
    if seq == 0 {
        return Err(EncodeError::SeqZero);
    }
    let (type_name, pcm): (&[u8], &[u8]) = match body {
        BodyRef::Frame(pcm) => (b"frame", pcm),
        BodyRef::End => (b"end", &[]),
        BodyRef::Gap(g) => {
            if g.first_seq == 0 || g.first_seq > g.last_seq || g.last_seq != seq {
                return Err(EncodeError::InvalidGap);
            }
            (b"gap", &[])
        }
    };
    if !pcm.len().is_multiple_of(format.bytes_per_sample().max(1)) {
        return Err(EncodeError::PartialSample { len: pcm.len() });
    }
    let start = out.len();
    out.put_u32(0); // the meta length, written once the meta is
    out.put_slice(br#"{"type":""#);
    out.put_slice(type_name);
    out.put_slice(br#"","seq":"#);
    put_decimal(out, seq);
    out.put_slice(br#","sample_rate":"#);
    put_decimal(out, u64::from(format.sample_rate));
    out.put_slice(br#","sample_width":"#);
    put_decimal(out, u64::from(format.sample_width));
    out.put_slice(br#","channels":"#);
    put_decimal(out, u64::from(format.channels));
    if let Some(session) = session_id {
        out.put_slice(br#","session_id":"#);
        // Writing to a BytesMut cannot fail; `serde_json` escapes the session id
        // exactly as the deployed `json.dumps(..., ensure_ascii=False)` does.
        let _ = serde_json::to_writer((&mut *out).writer(), session);
    }
    if let Some(at) = captured_at_ms {
        out.put_slice(br#","captured_at_ms":"#);
        put_decimal(out, at);
    }
    if let BodyRef::Gap(g) = body {
        out.put_slice(br#","first_seq":"#);
        put_decimal(out, g.first_seq);
        out.put_slice(br#","frames":"#);
        put_decimal(out, g.frames());
        out.put_slice(br#","samples":"#);
        put_decimal(out, g.samples);
        out.put_slice(br#","reason":""#);
        out.put_slice(g.reason.as_str().as_bytes());
        out.put_slice(b"\"");
    }
    out.put_slice(b"}");
    let Ok(meta_len) = u32::try_from(out.len() - start - 4) else {
        out.truncate(start);
        return Err(EncodeError::MetaTooLarge);
    };
    out[start..start + 4].copy_from_slice(&meta_len.to_be_bytes());
    out.put_slice(pcm);
    Ok(())
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// Sequence numbers start at 1.
    #[error("seq must be >= 1")]
    SeqZero,
    /// The PCM is not a whole number of samples.
    #[error("PCM of {len} bytes is not a whole number of samples")]
    PartialSample {
        /// PCM length in bytes.
        len: usize,
    },
    /// The gap fields are inconsistent (`1 <= first_seq <= last_seq == seq`).
    #[error("gap must satisfy 1 <= first_seq <= last_seq == seq")]
    InvalidGap,
    /// The meta does not fit the u32 length prefix.
    #[error("meta too large")]
    MetaTooLarge,
}

/// Limits and expectations applied while decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeOptions {
    /// The only accepted sample format.
    pub format: AudioFormat,
    /// Largest accepted meta, in bytes.
    pub max_meta_bytes: usize,
    /// Largest accepted PCM, in bytes.
    pub max_pcm_bytes: usize,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            format: AudioFormat::DEPLOYED,
            max_meta_bytes: DEFAULT_MAX_META_BYTES,
            max_pcm_bytes: DEFAULT_MAX_PCM_BYTES,
        }
    }
}

/// Machine-readable reason a packet was refused.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecodeErrorKind {
    /// Fewer than 4 bytes: no length prefix.
    Truncated,
    /// The length prefix points past the end of the payload.
    MetaLengthOutOfRange,
    /// The meta is larger than allowed.
    MetaTooLarge,
    /// The meta is not UTF-8.
    InvalidUtf8,
    /// The meta is not a JSON object, or a field has the wrong JSON type.
    InvalidJson,
    /// A required field is missing.
    MissingField,
    /// `type` is not `frame`, `end` or `gap`.
    UnknownType,
    /// `seq` is 0.
    InvalidSeq,
    /// `sample_rate` is not the expected one.
    UnsupportedSampleRate,
    /// `sample_width` is not the expected one.
    UnsupportedSampleWidth,
    /// `channels` is not the expected one.
    UnsupportedChannels,
    /// The PCM length is not a multiple of the sample size.
    PartialSample,
    /// The PCM is larger than allowed.
    PcmTooLarge,
    /// An `end` or `gap` packet carries PCM.
    UnexpectedPcm,
    /// The gap fields are inconsistent.
    InvalidGap,
    /// `session_id` is longer than allowed.
    SessionIdTooLong,
}

/// A packet could not be decoded; [`DecodeError::kind`] says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid audio packet ({}): {detail}", kind.as_str())]
pub struct DecodeError {
    kind: DecodeErrorKind,
    detail: String,
}

impl DecodeError {
    fn new(kind: DecodeErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// Why the packet was refused.
    pub fn kind(&self) -> DecodeErrorKind {
        self.kind
    }
}

/// The meta as it may arrive: every field optional so a missing one is reported by
/// name rather than as a generic JSON error. Unknown keys are ignored.
#[derive(Deserialize)]
struct RawMeta {
    #[serde(rename = "type")]
    kind: Option<String>,
    seq: Option<u64>,
    sample_rate: Option<u32>,
    sample_width: Option<u16>,
    channels: Option<u16>,
    session_id: Option<String>,
    /// Lenient: an extension key of the wrong type is treated as absent, never as a
    /// reason to refuse the packet (readers ignore what they do not understand).
    captured_at_ms: Option<serde_json::Value>,
    first_seq: Option<u64>,
    frames: Option<u64>,
    samples: Option<u64>,
    reason: Option<GapReason>,
}

fn required<T>(v: Option<T>, name: &str) -> Result<T, DecodeError> {
    v.ok_or_else(|| DecodeError::new(DecodeErrorKind::MissingField, format!("missing {name:?}")))
}

/// The gap a `gap` packet's meta describes, ending at `seq`.
fn gap_of(raw: &RawMeta, seq: u64) -> Result<Gap, DecodeError> {
    let first_seq = required(raw.first_seq, "first_seq")?;
    let gap = Gap {
        first_seq,
        last_seq: seq,
        samples: required(raw.samples, "samples")?,
        reason: required(raw.reason, "reason")?,
    };
    if first_seq == 0 || first_seq > seq || raw.frames.is_some_and(|f| f != gap.frames()) {
        return Err(DecodeError::new(
            DecodeErrorKind::InvalidGap,
            format!("first_seq {first_seq}, seq {seq}, frames {:?}", raw.frames),
        ));
    }
    Ok(gap)
}

/// Decodes one packet. The PCM is a zero-copy slice of `data`.
pub fn decode(data: &Bytes, opts: &DecodeOptions) -> Result<Packet, DecodeError> {
    use DecodeErrorKind as K;
    let Some(prefix) = data.get(..4) else {
        return Err(DecodeError::new(
            K::Truncated,
            format!("{} bytes, need at least 4", data.len()),
        ));
    };
    let meta_len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    let rest = data.len() - 4;
    if meta_len > rest {
        return Err(DecodeError::new(
            K::MetaLengthOutOfRange,
            format!("meta length {meta_len} but only {rest} bytes follow"),
        ));
    }
    if meta_len > opts.max_meta_bytes {
        return Err(DecodeError::new(
            K::MetaTooLarge,
            format!("meta is {meta_len} bytes, limit {}", opts.max_meta_bytes),
        ));
    }
    let meta_bytes = &data[4..4 + meta_len];
    let meta_str = std::str::from_utf8(meta_bytes)
        .map_err(|e| DecodeError::new(K::InvalidUtf8, e.to_string()))?;
    let raw: RawMeta = serde_json::from_str(meta_str)
        .map_err(|e| DecodeError::new(K::InvalidJson, e.to_string()))?;

    let kind = required(raw.kind.as_deref(), "type")?;
    let seq = required(raw.seq, "seq")?;
    if seq == 0 {
        return Err(DecodeError::new(K::InvalidSeq, "seq must be >= 1"));
    }
    let format = AudioFormat {
        sample_rate: required(raw.sample_rate, "sample_rate")?,
        sample_width: required(raw.sample_width, "sample_width")?,
        channels: required(raw.channels, "channels")?,
    };
    let want = opts.format;
    let expect = |kind, name: &str, got: u32, want: u32| match got == want {
        true => Ok(()),
        false => Err(DecodeError::new(
            kind,
            format!("{name} {got}, expected {want}"),
        )),
    };
    expect(
        K::UnsupportedSampleRate,
        "sample_rate",
        format.sample_rate,
        want.sample_rate,
    )?;
    let (width, want_width) = (format.sample_width.into(), want.sample_width.into());
    expect(K::UnsupportedSampleWidth, "sample_width", width, want_width)?;
    let (channels, want_channels) = (format.channels.into(), want.channels.into());
    expect(K::UnsupportedChannels, "channels", channels, want_channels)?;
    if let Some(s) = &raw.session_id
        && s.len() > MAX_SESSION_ID_LEN
    {
        return Err(DecodeError::new(
            K::SessionIdTooLong,
            format!(
                "session_id is {} bytes, limit {MAX_SESSION_ID_LEN}",
                s.len()
            ),
        ));
    }

    let pcm_len = rest - meta_len;
    let body = match kind {
        "frame" => {
            if pcm_len > opts.max_pcm_bytes {
                return Err(DecodeError::new(
                    K::PcmTooLarge,
                    format!("PCM is {pcm_len} bytes, limit {}", opts.max_pcm_bytes),
                ));
            }
            if !pcm_len.is_multiple_of(format.bytes_per_sample().max(1)) {
                return Err(DecodeError::new(
                    K::PartialSample,
                    format!(
                        "PCM of {pcm_len} bytes is not a whole number of {}-byte samples",
                        format.bytes_per_sample()
                    ),
                ));
            }
            PacketBody::Frame {
                pcm: data.slice(4 + meta_len..),
            }
        }
        "end" | "gap" if pcm_len != 0 => {
            return Err(DecodeError::new(
                K::UnexpectedPcm,
                format!("{kind:?} packet carries {pcm_len} bytes of PCM"),
            ));
        }
        "end" => PacketBody::End,
        "gap" => PacketBody::Gap(gap_of(&raw, seq)?),
        other => {
            return Err(DecodeError::new(
                K::UnknownType,
                format!("type {other:?}; expected \"frame\", \"end\" or \"gap\""),
            ));
        }
    };
    Ok(Packet {
        seq,
        format,
        session_id: raw.session_id,
        captured_at_ms: raw
            .captured_at_ms
            .as_ref()
            .and_then(serde_json::Value::as_u64),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_digits_match_the_formatter() {
        for n in [0, 1, 9, 10, 99, 100, 16_000, 1_733_000_000_000, u64::MAX] {
            let mut out = BytesMut::new();
            put_decimal(&mut out, n);
            assert_eq!(&out[..], n.to_string().as_bytes());
        }
    }

    #[test]
    fn borrowed_and_owned_bodies_encode_identically() {
        let pcm = Bytes::from_static(&[1, 2, 3, 4]);
        let gap = Gap {
            first_seq: 3,
            last_seq: 9,
            samples: 2_240,
            reason: GapReason::MaxAge,
        };
        for (seq, owned, borrowed) in [
            (
                7,
                PacketBody::Frame { pcm: pcm.clone() },
                BodyRef::Frame(&pcm),
            ),
            (7, PacketBody::End, BodyRef::End),
            (9, PacketBody::Gap(gap), BodyRef::Gap(&gap)),
        ] {
            let packet = Packet::deployed(seq, owned)
                .with_session(Some("s\"1".into()))
                .with_captured_at_ms(Some(42));
            let a = packet.encode();
            let b = encode_packet_ref(seq, AudioFormat::DEPLOYED, Some("s\"1"), Some(42), borrowed);
            assert_eq!(a, b);
            let p = decode(&a.expect("encodes"), &DecodeOptions::default()).expect("decodes");
            assert_eq!((p.seq, p.captured_at_ms), (seq, Some(42)));
            assert_eq!(p.session_id.as_deref(), Some("s\"1"));
        }
    }

    #[test]
    fn packets_carved_from_an_arena_are_the_same_bytes_and_share_its_allocation() {
        let pcm = Bytes::from(vec![7u8; 640]);
        let session = Some("s\u{1}\"é");
        let mut arena = BytesMut::with_capacity(4096);
        let mut packets = Vec::new();
        for seq in 1..=20 {
            let alone = encode_packet_ref(
                seq,
                AudioFormat::DEPLOYED,
                session,
                Some(seq * 20),
                BodyRef::Frame(&pcm),
            )
            .expect("encodes");
            let carved = encode_packet_in(
                &mut arena,
                seq,
                AudioFormat::DEPLOYED,
                session,
                Some(seq * 20),
                BodyRef::Frame(&pcm),
            )
            .expect("encodes");
            assert_eq!(carved, alone, "seq {seq}");
            assert!(arena.is_empty(), "nothing left behind in the arena");
            packets.push(carved);
        }
        // 20 packets of ~740 bytes in 4 KiB arenas: a handful of allocations, each
        // packet inside the arena it was carved from (consecutive packets adjacent).
        let follows = |a: &Bytes, b: &Bytes| a.as_ptr().wrapping_add(a.len()) == b.as_ptr();
        let adjacent = packets.windows(2).filter(|w| follows(&w[0], &w[1])).count();
        assert!(
            adjacent >= 14,
            "only {adjacent} of 19 packets adjacent to the previous one"
        );
        // Once every packet is gone the arena is reused in place, not reallocated: the
        // next packet starts where the first packet of the current arena did.
        let mut first = packets.len() - 1;
        while first > 0 && follows(&packets[first - 1], &packets[first]) {
            first -= 1;
        }
        let base = packets[first].as_ptr();
        drop(packets);
        let again = encode_packet_in(
            &mut arena,
            1,
            AudioFormat::DEPLOYED,
            None,
            None,
            BodyRef::Frame(&pcm),
        )
        .expect("encodes");
        assert_eq!(again.as_ptr(), base);
        assert!(decode(&again, &DecodeOptions::default()).is_ok());
        // A failed encode leaves the arena as it was.
        assert_eq!(
            encode_packet_in(
                &mut arena,
                0,
                AudioFormat::DEPLOYED,
                None,
                None,
                BodyRef::End
            ),
            Err(EncodeError::SeqZero)
        );
        assert!(arena.is_empty());
    }
}
