//! weir producer core: bounded per-stream publishing of 16 kHz s16le mono audio to
//! NATS. What a producer links (the `audio-ingress serve` front door, a Rust producer
//! of its own, the Python package's `weir.Producer`) without the front door's HTTP,
//! WebRTC and CLI stack.
//!
//! In data-flow order:
//! - [`config`]: the validated budget and policy ([`StreamConfig`]);
//! - [`queue`]: the pure per-stream queue bounded by bytes and age;
//! - [`rate`]: the per-stream rate bound in audio time (a token bucket in samples);
//! - [`stream`]: [`Ingress`] (opens streams, one publisher task each) and
//!   [`StreamHandle`] (`try_push`, `push`, `finish`), [`StreamView`] (an observer of a stream);
//! - [`publisher`]: the per-stream task that hands packets to NATS under a timeout;
//! - [`confirm`]: the server-confirmed window (the budget holds up to the server);
//! - [`jetstream`]: the sinks, plain NATS and lossless JetStream;
//! - [`nats`]: the connection (auth, TLS) with its events counted as metrics;
//! - [`stats`], [`metrics`]: accounting and metric names; [`error`]: why a stream was
//!   not opened or a frame not admitted.
//!
//! Invariants: the number of tasks depends on the number of streams, never on the
//! number of frames; pending memory per stream is bounded by its byte budget; a frame
//! offered is published, refused/dropped and counted with a reason, or covered by a gap
//! marker — never lost silently.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod confirm;
pub mod error;
pub mod jetstream;
pub mod metrics;
pub mod nats;
pub mod publisher;
pub mod queue;
pub mod rate;
#[cfg(test)]
mod rate_tests;
pub mod stats;
pub mod stream;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod stream_window_tests;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{Delivery, Policy, StreamConfig};
pub use error::{OpenError, PushError};
pub use queue::Lost;
pub use stream::{Ingress, StreamHandle, StreamView};
