//! The load test's integration tests, one binary: short runs of the built `loadtest`
//! binary against real nats-server processes.

mod asr;
mod end_to_end;
mod failover;
mod flap;
mod support;
