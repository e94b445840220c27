//! Logging for both binaries: `tracing` to stderr, text or one JSON object per line,
//! filtered by `RUST_LOG` (default `info`). With the feature `otel` and an OTLP endpoint
//! in the environment, spans are also exported ([`crate::otel`]); the [`Telemetry`]
//! guard [`init`] returns flushes them when `main` drops it.

use std::str::FromStr;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (for log shippers).
    Json,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!("log format {other:?}: expected text or json")),
        }
    }
}

/// What [`init`] set up beyond the log lines; keep it until `main` returns (dropping it
/// flushes the exported spans).
#[must_use = "dropping it at once would shut the span exporter down"]
#[derive(Default)]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    _otel: Option<crate::otel::OtelGuard>,
}

/// Installs the global subscriber (once; a second call changes nothing). A span
/// exporter that cannot be built is reported on stderr and left out: logging still
/// starts.
pub fn init(format: LogFormat) -> Telemetry {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
    };
    let registry = tracing_subscriber::registry().with(fmt);
    #[cfg(feature = "otel")]
    {
        let (otel, guard) = match crate::otel::layer_from_env() {
            Ok(Some((layer, guard))) => (Some(layer), Some(guard)),
            Ok(None) => (None, None),
            Err(e) => {
                eprintln!("opentelemetry: export off: {e}");
                (None, None)
            }
        };
        if registry.with(otel).try_init().is_err() {
            return Telemetry::default();
        }
        Telemetry { _otel: guard }
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = registry.try_init();
        Telemetry::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_others_are_refused_by_name() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!("text".parse(), Ok(LogFormat::Text));
        let e = "yaml".parse::<LogFormat>().expect_err("refused");
        assert!(e.contains("yaml") && e.contains("text or json"), "{e}");
    }
}
