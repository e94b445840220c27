//! llm-adapter's integration tests, one binary (a module per concern). Shared helpers:
//! `common` (a real nats-server, the adapter in-process or as the built binary) and
//! `tls_openai` (a local HTTPS backend). Python scripts stay in `tests/py/`. The
//! OpenTelemetry trace test is its own binary (`tests/otel_trace.rs`, feature `otel`).

mod backends;
mod barge_in;
mod binary;
mod cluster_node_loss;
mod common;
mod deploy_kit;
mod edge_hostile;
mod https_backend;
mod intake;
mod malformed;
mod nats_cancel;
mod nats_service;
mod pool;
mod priority;
mod python_client;
mod stream_measure;
mod streaming;
mod tls_openai;
mod token_budgets;
