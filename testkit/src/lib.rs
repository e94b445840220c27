//! Real `nats-server` processes for weir's tests and load test.
//!
//! Anything that crosses NATS is tested against a real server, not a mock: the
//! behaviours weir exists for (a paused server, a restart, a full client channel) are
//! properties of the real process. This crate starts one per test on a port the server
//! chooses itself, and can pause (SIGSTOP), resume (SIGCONT), kill (SIGKILL) and restart
//! it on the same port.
//!
//! ```no_run
//! use weir_testkit::{NatsServer, NatsServerOptions};
//! let server = NatsServer::start()?;          // free loopback port, ready to connect
//! let url = server.url();                     // "nats://127.0.0.1:PORT"
//! server.pause()?;                            // the server answers nothing ...
//! server.resume()?;                           // ... until now
//! server.restart()?;                          // new process, same port and options
//! # Ok::<(), weir_testkit::Error>(())
//! ```
//!
//! Invariants every user may rely on (details in [`server`]):
//! - a [`NatsServer`] never outlives its value: `Drop` kills and reaps the process, also
//!   while a failing test unwinds;
//! - `start*`/`restart` return only when the server answers on its port, and every wait
//!   is bounded;
//! - the URL and port never change during the value's life.
//!
//! The API is synchronous and every call is short, so it is used the same way from
//! `#[test]` and `#[tokio::test]`.
//!
//! The binary is found by [`nats_server_bin`]; when there is none, the error says to run
//! `scripts/ensure-nats-server`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "audio")]
pub mod audio;
pub mod binary;
pub mod cluster;
pub mod deploy;
mod error;
pub mod names;
pub mod process;
pub mod python;
pub mod raw;
pub mod server;

pub use binary::{NatsServerVersion, nats_server_bin, nats_server_version};
pub use cluster::{NatsCluster, NodePorts};
pub use error::{Error, ErrorKind};
pub use server::{Auth, NatsServer, NatsServerOptions};
