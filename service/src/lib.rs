//! Plumbing that both weir services (`audio-ingress`, `llm-adapter`) share, written once.
//!
//! - [`admin`] (feature `http`): the admin router skeleton (`/metrics`, `/healthz`,
//!   `/readyz`, JSON refusals, request timeout and concurrency limit);
//! - [`app`] (feature `app`): the one start-up path of every binary (logging, runtime
//!   and `--threads`, recorder, ready line, exit status);
//! - [`cli`] (feature `cli`): the `serve` flags `--set`, `--list-keys`, `--markdown`;
//! - [`clock`]: the wall clock in Unix milliseconds, as timestamps on the wire carry it;
//! - [`config`]: the one configuration error and typed ranges; with the feature
//!   `config`, configuration layered defaults < TOML file < environment < command line
//!   into the service's serde struct, refusing unknown keys from every layer, the key
//!   table (`--list-keys`, docs) from the same defaults, and the shared sections;
//! - [`metrics`]: every metric a service declares exists from the start, with a zero
//!   value, so that alerting rules and dashboards see a series before the first event
//!   (a rule on a series that does not exist yet is silently never true), and the one
//!   latency primitive ([`metrics::LatencyHistogram`]) behind both the JSON percentiles
//!   and the Prometheus histograms;
//! - [`process`] (feature `process`, part of `http`): the process's own figures (memory, CPU, open files) and build info
//!   for `/metrics`;
//! - [`error`]: the one error shape of weir's operations ([`Error`]`<Kind>`, the cause
//!   kept as `source()`);
//! - [`bounded`]: the FIFO bounded by bytes and age under both per-stream queues (the
//!   ingress's frames, the consumer's events), generic over its item;
//! - [`ratelimit`]: warnings in per-packet and retry loops, once per interval;
//! - [`nats`]: connection-event labels, subscribing with the server's confirmation;
//! - [`logging`] (feature `logging`): text or JSON logs on stderr;
//! - [`otel`] (feature `otel`): spans exported over OTLP/HTTP;
//! - [`trace_context`] (feature `trace-context`, part of `otel`): the W3C trace context
//!   between NATS headers and OpenTelemetry spans;
//! - [`http`] (feature `http`): the HTTP accept loop with connection caps and timeouts;
//! - [`shutdown`]: the signal both services stop on;
//! - [`sync`]: locking that survives a poisoned mutex.
//!
//! It never installs a metrics recorder (the binaries do).

#[cfg(feature = "http")]
pub mod admin;
#[cfg(feature = "app")]
pub mod app;
pub mod bounded;
#[cfg(feature = "cli")]
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "logging")]
pub mod logging;
pub mod metrics;
pub mod nats;
#[cfg(feature = "otel")]
pub mod otel;
#[cfg(feature = "process")]
pub mod process;
pub mod ratelimit;
pub mod shutdown;
pub mod sync;
#[cfg(feature = "trace-context")]
pub mod trace_context;

pub use error::Error;
