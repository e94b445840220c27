//! The one error type of the testkit: weir's one error shape
//! ([`weir_service::Error`]) with the testkit's [`ErrorKind`] to match on.
//!
//! Messages are written for a person reading a failed test: they say what was tried,
//! what happened, and — when the binary is missing — how to install it.

/// What went wrong, for callers that match on it; `Display` is the snake_case name.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No usable `nats-server` binary was found (or `NATS_SERVER_BIN` points nowhere).
    BinaryNotFound,
    /// `nats-server --version` printed something that is not a version.
    Version,
    /// The process could not be spawned.
    Spawn,
    /// The process exited before it was ready (bad config, port in use, ...). The
    /// message carries the end of the server's log.
    Exited,
    /// The server did not become ready within the startup timeout.
    StartTimeout,
    /// The operation needs a running server, but it was killed (call `restart()`).
    NotRunning,
    /// Sending a signal (SIGSTOP, SIGCONT, SIGKILL) or waiting for the process failed.
    Signal,
    /// A file in the server's temporary directory could not be written or read.
    Io,
}

/// An error from the testkit: a [`kind`](weir_service::Error::kind), a human message
/// and, where there is one, the underlying error (I/O, a signal, a spawn failure) as
/// [`source`](std::error::Error::source). `Display` is the message, then `: ` and the
/// cause.
pub type Error = weir_service::Error<ErrorKind>;

#[cfg(test)]
mod tests {
    use super::*;
    use weir_protocol::WireName;

    #[test]
    fn kind_names_are_unchanged() {
        let names: Vec<_> = ErrorKind::ALL.iter().map(|k| k.to_string()).collect();
        let want = [
            "binary_not_found",
            "version",
            "spawn",
            "exited",
            "start_timeout",
            "not_running",
            "signal",
            "io",
        ];
        assert_eq!(names, want);
        assert!(ErrorKind::ALL.iter().all(|k| k.as_str() == k.to_string()));
    }

    #[test]
    fn keeps_the_cause_as_source() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied");
        let e = Error::with_source(ErrorKind::Spawn, "could not start nats-server", io);
        assert_eq!(e.kind(), ErrorKind::Spawn);
        assert_eq!(e.to_string(), "could not start nats-server: denied");
        let cause = std::error::Error::source(&e).expect("source kept");
        let io = cause
            .downcast_ref::<std::io::Error>()
            .expect("an io::Error");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
    }
}
