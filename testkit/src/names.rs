//! The check every crate's names test runs over its [`WireName`] enums.

use weir_protocol::WireName;

/// Asserts that `as_str` and `Display` of every variant are its serde name (the metric
/// labels and JSON strings cannot drift apart).
pub fn assert_serde_names<T: WireName + std::fmt::Display + serde::Serialize>() {
    for &v in T::ALL {
        assert_eq!(serde_json::to_value(v).ok(), Some(v.as_str().into()), "{v}");
        assert_eq!(v.to_string(), v.as_str());
    }
}
