//! The audio consumer's integration tests, one binary: the consumer core and its
//! leases against real nats-server processes (helpers in `weir_audio_consumer::testing`).

mod capacity_nats;
mod consumer_freshness;
mod consumer_nats;
mod lease_cluster;
mod lease_nats;
mod lease_process;
