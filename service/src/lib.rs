//! Plumbing that both weir services (`audio-ingress`, `llm-adapter`) share, written once.
//!
//! - [`metrics`]: every metric a service declares exists from the start, with a zero
//!   value, so that alerting rules and dashboards see a series before the first event
//!   (a rule on a series that does not exist yet is silently never true);
//! - [`process`]: the process's own figures (resident memory) for `/metrics`.
//!
//! This crate depends on the `metrics` facade only; it never installs a recorder.

pub mod metrics;
pub mod process;
