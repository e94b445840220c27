//! weir-testkit's integration tests, one binary: its promises checked against real
//! nats-server processes.

mod cluster;
mod partition_agreement;
mod server_lifecycle;
