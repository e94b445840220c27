//! Telephony media streams for weir's audio ingress: what a carrier's WebSocket speaks
//! and how its audio becomes weir's 20 ms, 16 kHz frames (and back). Pure logic: no
//! runtime, no sockets, no NATS; the ingress's telephony door drives it.
//!
//! - [`dialect`]: Twilio Media Streams and Telnyx media streaming events, parsed
//!   strictly from the carrier's JSON (inbound) and written for it (outbound);
//! - [`codec`]: G.711 µ-law / A-law and L16, with a half-band 8 kHz ↔ 16 kHz
//!   resampler;
//! - [`reorder`]: the reorder window over the carrier's chunk numbers (late chunks
//!   become declared gaps, never out-of-order frames);
//! - [`outbound`]: the bot-audio queue towards the carrier, bounded by bytes and age,
//!   paced at real time, with marks and `clear`.

pub mod codec;
pub mod dialect;
pub mod outbound;
pub mod reorder;
