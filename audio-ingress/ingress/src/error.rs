//! The `serve` service's error types (the producer core's, a stream that could not be
//! opened or a frame that was not admitted, are `weir_audio_producer::error`). Each has
//! a `kind()` that callers match on; the `Display` text is for humans and names the
//! offending key, limit or value.
//!
//! - [`ConfigError`]: a configuration value was refused (names the key and the range).
//! - [`Error`]: what the `serve` service can fail with at start-up.

/// A configuration value was refused: the one configuration error of every weir
/// component (names the key, the value and the allowed range).
pub use weir_service::config::{ConfigError, ConfigErrorKind};

/// Machine-readable kind of an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Configuration refused.
    Config,
    /// NATS connection options could not be built (credentials file, certificates).
    Nats,
    /// A listener could not be bound, or another I/O failure.
    Io,
}

/// What the `serve` service can fail with: the one error shape
/// (`weir_service::Error`), the cause (the I/O or NATS error) kept as `source()`.
pub type Error = weir_service::Error<ErrorKind>;

/// A refused configuration value as a start-up failure.
pub fn config(e: ConfigError) -> Error {
    Error::with_source(ErrorKind::Config, "configuration refused", e)
}

/// An I/O error (binding a listener, ...) with what was being done.
pub fn io(context: impl Into<String>, source: std::io::Error) -> Error {
    Error::with_source(ErrorKind::Io, context, source)
}
