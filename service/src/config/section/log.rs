//! `[log]`: how both binaries write their log lines, once.

use crate::config::{ConfigError, ConfigErrorKind, Range};
use crate::logging::LogFormat;

crate::config_section! {
    /// The `[log]` keys as read, before validation.
    #[derive(Debug, PartialEq, Eq)]
    pub struct LogSection, LOG_KEYS = "log.";
    {
        format: String = "text".to_owned(), Range::text("`text`, `json`"),
            "log lines on stderr: human-readable text or one JSON object per line \
            (`--log-format` too); `RUST_LOG` filters them (default `info`)";
    }
}

impl LogSection {
    /// The log format; a refusal names `log.format`.
    pub fn validate(&self) -> Result<LogFormat, ConfigError> {
        self.format
            .parse()
            .map_err(|e: String| ConfigError::new("log.format", ConfigErrorKind::Invalid, e))
    }
}
