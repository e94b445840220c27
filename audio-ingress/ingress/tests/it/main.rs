//! audio-ingress's integration tests, one binary (a module per concern). Shared helpers:
//! `support` (the real `audio-ingress serve` binary), `whip_support` (an in-process WHIP
//! publisher), `weir_audio_producer::testing` (the packet collector) and
//! `weir_audio_consumer::testing` (the consumer side). The producer core's own tests
//! over NATS are in `audio-ingress/producer/tests/it`. Python scripts stay in `tests/python/`.

mod capacity;
mod capacity_worker;
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
mod publish_page;
mod resume_ws;
mod stall_bound_e2e;
mod support;
mod tap_cli;
mod telephony_conformance;
mod telephony_door;
mod whip_aiortc;
mod whip_rust;
mod whip_support;
mod ws_e2e;
