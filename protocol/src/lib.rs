//! weir's wire contracts: bytes and names only — no tokio, no NATS.
//!
//! - [`audio`]: the deployed `frame`/`end` packet codec and the versioned extensions
//!   (headers and opt-in packet types) that an old consumer never trips over.
//! - [`stream_id`]: stream ids as safe NATS subject tokens.
//! - [`partition`]: the FNV-1a shard key (identical to nats-server `partition()`) and
//!   subject templates.
//! - [`llm`]: the LLM adapter's header names, the deployed JSON envelope and the error
//!   catalog.
//! - [`admin`]: the services' ready line and the ingress's `/v1/stats` snapshot, written
//!   by the services and read by the load test;
//! - [`error`]: the one error shape of weir's operations (`Error<Kind>`, the cause kept).
//!
//! Everything that decodes network input returns a typed error with a `kind()`; nothing
//! here panics on input.

pub mod admin;
pub mod audio;
pub mod error;
pub mod llm;
pub mod partition;
pub mod stream_id;

pub use error::Error;
pub use partition::{SubjectTemplate, fnv1a_32, partition_of};
pub use stream_id::{StreamId, StreamIdError};
