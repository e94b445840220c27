//! The warning tier of `check-config`: a configuration that loads but whose timeout
//! chains do not fit. Each warning names the keys and the numbers; none stops a start.
//!
//! - `backend.timeout_ms` against `deadline.max_ms`: every call is bounded first by its
//!   caller's deadline, at most `deadline.max_ms`; a backend timeout above it never
//!   applies.
//! - `jetstream.ack_wait_ms` against `backend.timeout_ms` (durable intake): a request
//!   held by a replica that dies is handed to another only after `ack_wait_ms`; at or
//!   beyond the backend timeout, the retry starts after the time one call may take at
//!   all.

use super::{Config, ConfigWarning, Intake};

impl Config {
    /// The warnings of this configuration.
    pub fn warnings(&self) -> Vec<ConfigWarning> {
        let mut out = Vec::new();
        let backend = self.admission.backend_timeout;
        let max = self.admission.deadline.max;
        if backend > max {
            out.push(ConfigWarning::new(
                ["backend.timeout_ms", "deadline.max_ms"],
                format!(
                    "backend.timeout_ms = {} is above deadline.max_ms = {}: every call is \
                     bounded first by its deadline, so the backend timeout never applies",
                    backend.as_millis(),
                    max.as_millis()
                ),
            ));
        }
        if let Intake::JetStream(js) = &self.intake
            && js.ack_wait >= backend
        {
            out.push(ConfigWarning::new(
                ["jetstream.ack_wait_ms", "backend.timeout_ms"],
                format!(
                    "jetstream.ack_wait_ms = {} is not below backend.timeout_ms = {}: a \
                     request held by a replica that dies is retried only after a whole \
                     backend call could have run",
                    js.ack_wait.as_millis(),
                    backend.as_millis()
                ),
            ));
        }
        out
    }
}
