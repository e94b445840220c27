//! The LLM adapter's wire contract: header names, the deployed JSON envelope and the
//! error catalog.
//!
//! The deployed LLM services validate JSON bodies with "extra fields forbidden", so
//! everything the adapter adds — request id, session, deadline, admission policy, client
//! key, timings — travels in NATS headers ([`headers`]). The request body is passed to
//! the backend byte for byte.
//!
//! Refusals are machine-readable: an [`ErrorCode`] (snake_case string), a human message
//! and [`ErrorDetails`] with the numbers that explain the refusal. On NATS they are sent
//! with the service-API headers `Nats-Service-Error` / `Nats-Service-Error-Code` plus
//! `Weir-Error-Code`, and a JSON body: either a plain [`ErrorBody`], or — when the
//! request body was the deployed envelope — a [`envelope::ResponseEnvelope`] with
//! `ok: false`.
//!
//! Nothing here panics on input: header values and bodies that do not parse give a typed
//! error or `None`.

pub mod capabilities;
pub mod envelope;
pub mod error;
pub mod headers;
pub mod stream;

mod cancel;
pub use cancel::{CancelReply, SessionCancelReply};
pub use capabilities::Capabilities;

pub use envelope::{EnvelopeMeta, ResponseEnvelope};
pub use error::{ErrorBody, ErrorCode, ErrorDetails, UnknownErrorCode};
pub use headers::{
    AdmissionPolicy, HeaderError, HeaderErrorKind, Priority, Supersede, TraceContext, TraceParent,
};
pub use stream::StreamEvent;
