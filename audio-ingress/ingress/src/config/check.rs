//! The warning tier of `check-config`: a configuration that loads but whose timeout
//! chains do not fit. Each warning names the keys and the numbers; none stops a start.
//!
//! - `publish_timeout_ms` against `max_age_ms`: a publish that times out must leave
//!   the stream at least half its age budget to recover in (`publish_timeout_ms` above
//!   `max_age_ms` is refused outright).
//! - The consumers' idle reap against the ingress's hang detection: while a NATS node
//!   hangs, frames stop for up to 3 × `nats.ping_interval_ms` (the pings that declare
//!   it dead) + `nats.connection_timeout_ms` (a reconnect that tries it first); a
//!   consumer whose `idle_timeout_ms` is not above that reaps streams the ingress then
//!   resumes.

use std::time::Duration;

use super::{Config, ConfigWarning};

impl Config {
    /// The warnings of this configuration. `consumer_idle_timeout` is the consumers'
    /// `idle_timeout_ms` when the caller knows it (`check-config
    /// --consumer-idle-timeout-ms`); without it that chain is not checked.
    pub fn warnings(&self, consumer_idle_timeout: Option<Duration>) -> Vec<ConfigWarning> {
        let mut out = Vec::new();
        let (publish, max_age) = (self.stream.publish_timeout(), self.stream.max_age());
        if publish * 2 > max_age {
            out.push(ConfigWarning::new(
                ["publish_timeout_ms", "max_age_ms"],
                format!(
                    "publish_timeout_ms = {} is more than half of max_age_ms = {}: a publish \
                     that times out leaves the stream less than half its age budget",
                    publish.as_millis(),
                    max_age.as_millis()
                ),
            ));
        }
        if let Some(idle) = consumer_idle_timeout {
            let (ping, connect) = (self.nats.ping_interval, self.nats.connection_timeout);
            let hang = ping * 3 + connect;
            if idle <= hang {
                out.push(ConfigWarning::new(
                    [
                        "idle_timeout_ms (consumer)",
                        "nats.ping_interval_ms",
                        "nats.connection_timeout_ms",
                    ],
                    format!(
                        "the consumers' idle_timeout_ms = {} is not above the ingress's hang \
                         detection, 3 × nats.ping_interval_ms ({}) + nats.connection_timeout_ms \
                         ({}) = {} ms: while a NATS node hangs, consumers reap streams the \
                         ingress resumes after its reconnect",
                        idle.as_millis(),
                        ping.as_millis(),
                        connect.as_millis(),
                        hang.as_millis()
                    ),
                ));
            }
        }
        out
    }
}
