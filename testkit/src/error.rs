//! The one error type of the testkit, with a [`kind()`](Error::kind) to match on.
//!
//! Messages are written for a person reading a failed test: they say what was tried,
//! what happened, and — when the binary is missing — how to install it.

use std::fmt;

/// What went wrong, for callers that match on it.
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

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::BinaryNotFound => "binary_not_found",
            Self::Version => "version",
            Self::Spawn => "spawn",
            Self::Exited => "exited",
            Self::StartTimeout => "start_timeout",
            Self::NotRunning => "not_running",
            Self::Signal => "signal",
            Self::Io => "io",
        };
        f.write_str(name)
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from the testkit: a [`kind`](Error::kind), a human message and, where there
/// is one, the underlying error as [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(source.into()),
        }
    }
}
