//! The one error type of the load test: weir's error shape ([`weir_service::Error`])
//! with the load test's [`ErrorKind`] to match on.
//!
//! Messages are written for the person at the terminal: they name the flag, file,
//! address or child process involved and what happened to it; the cause (an I/O error,
//! a NATS error, an ingress that did not start) stays reachable as
//! [`source`](std::error::Error::source) and is printed after `: `.

/// What went wrong, for callers that match on it; `Display` is the snake_case name.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The command line or the selection is invalid: a value out of range, a missing
    /// scenario, flags that do not go together. Nothing was started.
    Usage,
    /// A connection to NATS, or a NATS-backed component (fleet, LLM front, consumer),
    /// could not be set up.
    Nats,
    /// A child process (ingress, nats-server, lease worker) could not be found, started
    /// or stopped, or did not become ready.
    Process,
    /// A file, directory or socket could not be created, written, read or bound.
    Io,
    /// A run could not finish: a stage timed out or a task failed.
    Run,
}

/// An error from the load test: a [`kind`](weir_service::Error::kind), a message for
/// the terminal and, where there is one, the cause as
/// [`source`](std::error::Error::source). `Display` is the message, then `: ` and the
/// cause.
pub type Error = weir_service::Error<ErrorKind>;

/// An [`ErrorKind::Usage`] error with `message`.
pub(crate) fn usage(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::Usage, message)
}

/// An [`ErrorKind::Io`] error on `path`, caused by `source`.
pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Error {
    Error::with_source(ErrorKind::Io, path.display().to_string(), source)
}

/// An [`ErrorKind::Nats`] error with `message`, caused by `source`.
pub(crate) fn nats(
    message: impl Into<String>,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::with_source(ErrorKind::Nats, message, source)
}

/// An [`ErrorKind::Process`] error with `message`, caused by `source`.
pub(crate) fn process(
    message: impl Into<String>,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::with_source(ErrorKind::Process, message, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_message_then_cause() {
        let e = io(
            std::path::Path::new("/nowhere/x.json"),
            std::io::Error::new(std::io::ErrorKind::NotFound, "No such file"),
        );
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.to_string(), "/nowhere/x.json: No such file");
        let e = usage("--duration must be at least 1 second");
        assert_eq!(e.kind(), ErrorKind::Usage);
        assert_eq!(e.to_string(), "--duration must be at least 1 second");
    }
}
