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
        // Each backend's timeout, by its key (`[[backends]]` or the single `[backend]`).
        let timeouts: Vec<(String, std::time::Duration)> = if self.backends.is_empty() {
            vec![("backend.timeout_ms".to_owned(), backend)]
        } else {
            (self.backends.iter().enumerate())
                .map(|(i, m)| (format!("backends[{i}].timeout_ms"), m.backend.timeout))
                .collect()
        };
        for (key, timeout) in timeouts.into_iter().filter(|(_, t)| *t > max) {
            out.push(ConfigWarning::new(
                [key.as_str(), "deadline.max_ms"],
                format!(
                    "{key} = {} is above deadline.max_ms = {}: every call is \
                     bounded first by its deadline, so the backend timeout never applies",
                    timeout.as_millis(),
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
