//! weir audio ingress: the `serve` front door (WebSocket and WHIP doors, admin HTTP)
//! on the producer core (`weir_audio_producer`: the bounded per-stream queue and
//! publisher), and `tap`, the operator's packet viewer.
//!
//! In data-flow order, the producer core's side being `weir_audio_producer`:
//! - [`config`]: the validated configuration of `serve` (the producer core's
//!   `StreamConfig`, listeners, NATS options) loaded from file, environment and command
//!   line;
//! - [`ws`], [`whip`], [`telephony`], [`admin`], [`shutdown`], [`service`]: the `serve`
//!   service (the WebSocket, WHIP and telephony doors share their admission through
//!   [`door`]); each door opens
//!   streams on one `weir_audio_producer::Ingress` and pushes frames to their handles;
//! - [`listener`]: the open-file limit the listeners need (their accept loop, timeouts
//!   and connection caps are `weir_service::http`); [`auth`]: producer tokens checked
//!   before the upgrade;
//! - [`capacity`]: admission by recognition capacity (the workers' announcements, the
//!   lease bucket, worker refusals), asked by [`door`] before the registry;
//! - [`metrics`]: the service's metric names (the producer core's are
//!   `weir_audio_producer::metrics`); [`error`]: what `serve` fails with at start-up;
//! - [`tap`]: subscribes to the audio subjects and shows every packet.
//!
//! Invariants: every frame a door reads goes to its stream's handle, so the producer
//! core's bounds are the service's (the number of tasks depends on the number of
//! streams, never on the number of frames; pending memory per stream is bounded by its
//! byte budget; a frame offered is published, refused/dropped and counted with a
//! reason, or covered by a gap marker — never lost silently).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod auth;
pub mod capacity;
pub mod config;
pub mod door;
pub mod error;
pub mod listener;
pub mod metrics;
pub mod publish;
pub mod resume;
pub mod service;
pub mod shutdown;
pub mod tap;
pub mod telephony;
pub mod whip;
pub mod ws;
pub mod ws_query;

pub use config::Config;
