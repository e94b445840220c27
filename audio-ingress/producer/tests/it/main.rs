//! The producer core's integration tests, one binary (a module per concern), each over
//! a real nats-server (weir-testkit). Shared helpers: `weir_audio_producer::testing`
//! (the producer's client, the packet collector) and `weir_audio_consumer` (the consumer
//! side of the lossless test).

mod lossless_jetstream;
mod producer_nats_stall;
mod producer_nats_tasks;
