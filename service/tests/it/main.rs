//! weir-service's integration tests, one binary: the shared NATS section against real
//! nats-server processes.

mod nats_auth;
