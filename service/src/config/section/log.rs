//! `[log]`: how both binaries write their log lines, once.

use serde::{Deserialize, Serialize};

use crate::config::keys::KeyDoc;
use crate::config::{ConfigError, ConfigErrorKind, Range};
use crate::logging::LogFormat;

/// The `[log]` keys as read, before validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `log.format`: `text` or `json`.
    pub format: String,
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            format: "text".to_owned(),
        }
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

/// Range and meaning of every `[log]` key.
pub const LOG_KEYS: &[KeyDoc] = &[KeyDoc::new(
    "log.format",
    Range::text("`text`, `json`"),
    "log lines on stderr: human-readable text or one JSON object per line (`--log-format` \
     too); `RUST_LOG` filters them (default `info`)",
)];
