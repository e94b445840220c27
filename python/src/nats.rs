//! NATS connection options from Python: the `[nats]` keys every weir binary reads
//! (`weir_service::config::section::NatsSection`), with the same names, defaults, ranges
//! and validation, passed as keyword arguments (`servers=[...]`, `user=`, `password=`,
//! `token=`, `nkey=`, `creds_file=`, `tls_required=`, `tls_ca_file=`, `tls_cert_file=`,
//! `tls_key_file=`, `inbox_prefix=`, `connection_timeout_ms=`, `ping_interval_ms=`,
//! `client_capacity=`, `retry_initial_connect=`, `name=`).
//!
//! Invariant: an unknown key or an invalid value is a `ConfigError` naming the key,
//! raised before any connection is attempted.

use weir_service::config::section::NatsSection;
use weir_service::nats::NatsConfig;

use crate::errors::WeirErr;

/// The client name the server shows when none is given.
pub const DEFAULT_CLIENT_NAME: &str = "weir-python";

/// Validates the keys given as a JSON object (the Python layer serialises its keyword
/// arguments; `servers` may be a list, joined into the comma-separated `url`).
pub fn config_from_json(json: &str) -> Result<NatsConfig, WeirErr> {
    let mut value: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| WeirErr::config("invalid_config", format!("nats options: {e}")))?;
    if let Some(obj) = value.as_object_mut()
        && let Some(servers) = obj.remove("servers")
    {
        let url = server_list(&servers).ok_or_else(|| {
            WeirErr::config(
                "invalid_config",
                "nats.servers: a URL string or a non-empty list of URL strings",
            )
            .with("key", "servers")
        })?;
        obj.insert("url".into(), url.into());
    }
    let section: NatsSection = serde_json::from_value(value)
        .map_err(|e| WeirErr::config("invalid_config", format!("nats options: {e}")))?;
    section
        .validate(NatsConfig::named(DEFAULT_CLIENT_NAME))
        .map_err(|e| WeirErr::config("invalid_config", e.to_string()))
}

/// `servers` as the comma-separated `url` key: a non-empty string, or a non-empty list of
/// non-empty strings. `None` otherwise — an empty `url` would mean "unset" to the
/// section, and so the default server, which the caller did not name.
fn server_list(servers: &serde_json::Value) -> Option<String> {
    let list: Vec<&str> = match servers {
        serde_json::Value::String(s) => vec![s.as_str()],
        serde_json::Value::Array(items) => items
            .iter()
            .map(serde_json::Value::as_str)
            .collect::<Option<_>>()?,
        _ => return None,
    };
    let nonempty = !list.is_empty() && list.iter().all(|s| !s.trim().is_empty());
    nonempty.then(|| list.join(","))
}
