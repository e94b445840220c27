//! weir audio ingress: bounded per-stream publishing of 16 kHz s16le mono audio to NATS
//! (the producer core and the `serve` front door), and the shard-affine consumer core.
//!
//! Producer side, in data-flow order:
//! - [`config`]: validated budget, policy, listeners, NATS options;
//! - [`queue`]: the pure per-stream queue bounded by bytes and age;
//! - [`rate`]: the per-stream rate bound in audio time (a token bucket in samples);
//! - [`stream`]: [`Ingress`] (opens streams, one publisher task each) and
//!   [`StreamHandle`] (`try_push`, `push`, `finish`);
//! - [`publisher`]: the per-stream task that hands packets to NATS under a timeout;
//! - [`confirm`]: the server-confirmed window (the budget holds up to the server);
//! - [`nats`]: connection options (auth, TLS) and connection events;
//! - [`ws`], [`whip`], [`admin`], [`shutdown`], [`service`]: the `serve` service (the
//!   WebSocket and WHIP doors share their admission through [`door`]);
//! - [`listener`]: the open-file limit the listeners need (their accept loop, timeouts
//!   and connection caps are `weir_service::http`); [`auth`]: producer tokens checked
//!   before the upgrade;
//! - [`stats`], [`metrics`]: accounting and metric names.
//!
//! Invariants: the number of tasks depends on the number of streams, never on the
//! number of frames; pending memory per stream is bounded by its byte budget; a frame
//! offered is published, refused/dropped and counted with a reason, or covered by a gap
//! marker — never lost silently.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod auth;
pub mod config;
pub mod confirm;
pub mod door;
pub mod error;
pub mod jetstream;
pub mod listener;
pub mod metrics;
pub mod nats;
pub mod publisher;
pub mod queue;
pub mod rate;
#[cfg(test)]
mod rate_tests;
pub mod service;
pub mod shutdown;
pub mod stats;
pub mod stream;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod stream_window_tests;
pub mod tap;
pub mod whip;
pub mod ws;
pub mod ws_query;

pub use config::{Config, Delivery, Policy, StreamConfig};
pub use error::{OpenError, PushError};
pub use stream::{Ingress, StreamHandle};
