//! One error shape for weir's operations: a kind to match on, a message for humans and,
//! where one exists, the cause kept as [`std::error::Error::source`] rather than
//! flattened into the text (the shape of async-nats's `Error<Kind>`).
//!
//! `Display` is the message, then `: ` and the cause when there is one, so a log line
//! reads whole; a caller that wants the chain walks `source()`.

use std::fmt;

/// The boxed cause of an [`Error`].
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error of kind `K` (a `Copy` enum the caller matches on).
#[derive(Debug)]
pub struct Error<K> {
    kind: K,
    message: String,
    source: Option<Source>,
}

impl<K: Copy> Error<K> {
    /// An error with no underlying cause.
    pub fn new(kind: K, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An error caused by `source`, which stays reachable through `source()`.
    pub fn with_source(kind: K, message: impl Into<String>, source: impl Into<Source>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The kind, for callers that match on it.
    pub fn kind(&self) -> K {
        self.kind
    }

    /// What failed, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error under another kind (a layer that reports its own kinds).
    pub fn map_kind<L: Copy>(self, kind: L) -> Error<L> {
        Error {
            kind,
            message: self.message,
            source: self.source,
        }
    }
}

impl<K> fmt::Display for Error<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl<K: fmt::Debug> std::error::Error for Error<K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Io,
        Other,
    }

    #[test]
    fn keeps_kind_message_and_source() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = Error::with_source(Kind::Io, "reading creds.creds", io);
        assert_eq!(e.kind(), Kind::Io);
        assert_eq!(e.message(), "reading creds.creds");
        assert_eq!(e.to_string(), "reading creds.creds: no such file");
        let cause = std::error::Error::source(&e).expect("source kept");
        assert_eq!(cause.to_string(), "no such file");
        let e = e.map_kind(Kind::Other);
        assert_eq!(e.kind(), Kind::Other);
        assert!(std::error::Error::source(&e).is_some());
        let plain = Error::new(Kind::Other, "refused");
        assert_eq!(plain.to_string(), "refused");
        assert!(std::error::Error::source(&plain).is_none());
    }
}
