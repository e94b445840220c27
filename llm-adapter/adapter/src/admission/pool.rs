//! The backend pool: one or more backends, each with its own slots (worker tasks), its
//! own service-time estimator, its own ready queue and its own health.
//!
//! Invariants:
//! - every queued or running request is bound to exactly one member; a worker of
//!   member `b` only starts requests bound to `b`;
//! - each member's ready queue is keyed like the single ready queue was (the EDF order
//!   key fixed at admission), so a request rebound to another member keeps its place in
//!   the deadline order;
//! - a member with `slots` workers runs at most `slots` calls;
//! - a single `[backend]` is a pool of one with `workers` slots and health off: its
//!   behaviour is the one of the adapter before the pool.

use std::num::NonZeroUsize;
use std::time::Duration;

/// One backend's slots as the admission core sees them (`[[backends]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSlots {
    /// Its name.
    pub name: String,
    /// Concurrent calls (worker tasks).
    pub slots: NonZeroUsize,
    /// Its own per-call timeout.
    pub timeout: Duration,
    /// Cost of a call here (lower preferred among the backends in time).
    pub weight: u32,
}

/// Health of the pool's backends (`[pool]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Consecutive failed calls that eject a backend.
    pub eject_after_errors: u32,
    /// A running call without a reply byte for this many estimates is a stall.
    pub stall_factor: u32,
    /// Least time without a reply byte that counts as a stall.
    pub stall_floor: Duration,
    /// First ejection's length.
    pub backoff_base: Duration,
    /// Longest ejection.
    pub backoff_max: Duration,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            eject_after_errors: 5,
            stall_factor: 3,
            stall_floor: Duration::from_millis(250),
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
        }
    }
}
