//! audio-ingress's integration tests, one binary (a module per concern). Shared helpers:
//! `support` (the real `audio-ingress serve` binary), `producer_support` (the producer
//! over a real nats-server), `whip_support` (an in-process WHIP publisher), and
//! `weir_audio_consumer::testing` (the consumer side). Python scripts stay in `tests/python/`.

mod cluster_node_loss;
mod config_cli;
mod consumer_python;
mod deploy_kit;
mod edge_auth;
mod edge_bodies;
mod edge_connections;
mod edge_rate;
mod edge_readiness;
mod edge_ws;
mod lossless_jetstream;
mod producer_nats_stall;
mod producer_nats_tasks;
mod producer_support;
mod stall_bound_e2e;
mod support;
mod tap_cli;
mod whip_aiortc;
mod whip_rust;
mod whip_support;
mod ws_e2e;
