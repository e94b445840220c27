//! The one configuration error every weir component returns, and the warning tier
//! beside it.
//!
//! Invariants:
//! - a [`ConfigError`] names the key it refuses (the variable for a misspelled
//!   environment variable, the path for an unreadable file; empty only when no single
//!   value explains the refusal), and for a number the value and the allowed range
//!   ([`ConfigError::value`], [`ConfigError::allowed`]);
//! - its [`Origin`] says where a value that is not a default came from;
//! - a [`ConfigWarning`] never stops a start: it names every key it is about and the
//!   numbers that make it a warning.

use std::fmt;

use super::Origin;

/// Machine-readable kind of a [`ConfigError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigErrorKind {
    /// Not a configuration key.
    UnknownKey,
    /// The value has the wrong type (a string for an integer...).
    WrongType,
    /// The value is outside the allowed range.
    OutOfRange,
    /// The value is malformed (an address, a subject, a URL, an unknown variant...).
    Invalid,
    /// The value contradicts another key.
    Conflict,
    /// A key required by another is missing.
    Missing,
    /// The configuration file could not be read or is not TOML.
    File,
}

/// A configuration value was refused (boxed: a `Result` of it stays small).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(Box<Inner>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Inner {
    key: String,
    kind: ConfigErrorKind,
    message: String,
    origin: Origin,
    value: Option<String>,
    allowed: Option<String>,
}

impl ConfigError {
    /// A refusal of `key`.
    pub fn new(key: impl Into<String>, kind: ConfigErrorKind, message: impl Into<String>) -> Self {
        Self(Box::new(Inner {
            key: key.into(),
            kind,
            message: message.into(),
            origin: Origin::Default,
            value: None,
            allowed: None,
        }))
    }

    /// `value` of `key` is outside `allowed` (both shown with their unit).
    pub fn out_of_range(
        key: impl Into<String>,
        value: impl fmt::Display,
        allowed: impl fmt::Display,
    ) -> Self {
        let (value, allowed) = (value.to_string(), allowed.to_string());
        let mut e = Self::new(
            key,
            ConfigErrorKind::OutOfRange,
            format!("{value} is out of range; allowed {allowed}"),
        );
        e.0.value = Some(value);
        e.0.allowed = Some(allowed);
        e
    }

    /// The same refusal of a value that came from `origin` (kept when one is set).
    #[must_use]
    pub fn with_origin(mut self, origin: &Origin) -> Self {
        if self.0.origin == Origin::Default {
            self.0.origin = origin.clone();
        }
        self
    }

    /// The same refusal with the allowed values of the key (shown after the message).
    #[must_use]
    pub fn with_allowed(mut self, allowed: impl Into<String>) -> Self {
        let allowed = allowed.into();
        if !allowed.is_empty() {
            self.0.allowed = Some(allowed);
        }
        self
    }

    /// The same refusal under another name (a flag, a variable, a qualified key).
    #[must_use]
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.0.key = key.into();
        self
    }

    /// The same refusal with `text` after the message.
    #[must_use]
    pub fn with_hint(mut self, text: &str) -> Self {
        self.0.message.push_str(text);
        self
    }

    /// The refused key (dotted path), the variable, or the file; empty when no single
    /// value explains the refusal.
    pub fn key(&self) -> &str {
        &self.0.key
    }
    /// The kind.
    pub fn kind(&self) -> ConfigErrorKind {
        self.0.kind
    }
    /// The explanation, without the key and the origin.
    pub fn message(&self) -> &str {
        &self.0.message
    }
    /// Where the refused value came from.
    pub fn origin(&self) -> &Origin {
        &self.0.origin
    }
    /// The refused value, with its unit, when it is a number.
    pub fn value(&self) -> Option<&str> {
        self.0.value.as_deref()
    }
    /// The allowed values, when the key has a range.
    pub fn allowed(&self) -> Option<&str> {
        self.0.allowed.as_deref()
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.key.is_empty() {
            return write!(f, "configuration refused: {}", self.0.message);
        }
        write!(f, "config key `{}`", self.0.key)?;
        if self.0.origin != Origin::Default {
            write!(f, " (from {})", self.0.origin)?;
        }
        write!(f, ": {}", self.0.message)?;
        match &self.0.allowed {
            Some(allowed) if !self.0.message.contains(allowed.as_str()) => {
                write!(f, "; allowed: {allowed}")
            }
            _ => Ok(()),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A configuration that loads but is likely wrong: a renamed key, or a timeout chain
/// whose parts do not fit. Printed by `check-config` and logged at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    keys: Vec<String>,
    message: String,
}

impl ConfigWarning {
    /// A warning about `keys`; `message` names them and the numbers.
    pub fn new<K: Into<String>>(
        keys: impl IntoIterator<Item = K>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            keys: keys.into_iter().map(Into::into).collect(),
            message: message.into(),
        }
    }

    /// The keys it is about.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The explanation.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "warning: {}", self.message)
    }
}
