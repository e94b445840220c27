//! The sections every binary composes, each declared once: its serde struct (keys and
//! defaults), its key documentation with typed ranges, and its validation into the
//! settings type the code uses.
//!
//! - [`NatsSection`] — `[nats]`: servers, every authentication method
//!   [`NatsAuth`](crate::nats::NatsAuth) offers, TLS, inbox prefix, timeouts and the
//!   client's buffer; validated into a [`NatsConfig`](crate::nats::NatsConfig).
//! - [`AdminSection`] (feature `http`) — `[admin]`: the admin HTTP listener's address,
//!   connection cap and per-request limits.
//! - [`LogSection`] (feature `logging`) — `[log]`: the log format.
//!
//! A binary embeds a section as a field of its raw struct (`nats: NatsSection`), or
//! flattens it into its own section to add keys of its own (`#[serde(flatten)]`; the
//! loader then refuses unknown keys from the schema, since serde cannot with a
//! flattened field), and lists the section's `KEYS` in its key table. Per-binary
//! defaults (the client name, the admin port) come from the constructor.

mod nats;
pub use nats::{NATS_KEYS, NatsSection};

#[cfg(feature = "http")]
mod admin;
#[cfg(feature = "http")]
pub use admin::{ADMIN_KEYS, AdminSection, AdminSettings};

#[cfg(feature = "logging")]
mod log;
#[cfg(feature = "logging")]
pub use log::{LOG_KEYS, LogSection};
