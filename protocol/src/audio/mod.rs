//! Audio packets: the deployed codec ([`packet`]) and the versioned extensions
//! ([`extension`]); the producer doors' JSON messages ([`ws`]).

pub mod extension;
pub mod packet;
pub mod ws;

pub use packet::{
    AudioFormat, BodyRef, CHANNELS, DecodeError, DecodeErrorKind, DecodeOptions, EncodeError,
    FRAME_BYTES, FRAME_DURATION, FRAME_SAMPLES, Gap, GapReason, Packet, PacketBody, SAMPLE_RATE,
    SAMPLE_WIDTH, decode, encode_packet_in, encode_packet_ref,
};
