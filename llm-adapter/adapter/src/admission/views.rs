//! Read-only reports of the admission core: the live limits view ([`LimitsView`] and
//! its parts, served on the limits subject and by the admin API) and what shutdown did
//! ([`ShutdownReport`]).
//!
//! Plain data: each value is built once (the limits view under the state lock) and
//! never updated after; reading one never touches the live state.

use serde::Serialize;

use super::TokenKeyView;

/// The live limits view: queue, busiest keys, busiest sessions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LimitsView {
    /// The global queue.
    pub queue: QueueView,
    /// Busiest per-key limit keys (in flight + waiting, then longest wait).
    pub keys: Vec<KeyView>,
    /// Sessions with the most pending requests.
    pub sessions: Vec<SessionView>,
    /// Token budgets: the tracked keys with the fewest tokens left (share of their
    /// budget).
    pub tokens: Vec<TokenKeyView>,
}

/// The global queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueueView {
    /// Admitted, not started.
    pub depth: usize,
    /// Capacity.
    pub capacity: usize,
    /// Backend calls in progress.
    pub running: usize,
    /// Workers.
    pub workers: usize,
    /// No longer admitting.
    pub shutting_down: bool,
}

/// One key of a per-key limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyView {
    /// The limit's name.
    pub rule: String,
    /// The key.
    pub key: String,
    /// The limit.
    pub limit: usize,
    /// Slots held.
    pub in_flight: usize,
    /// Requests waiting.
    pub waiting: usize,
    /// How long the head waiter has waited, ms.
    pub longest_wait_ms: f64,
}

/// One session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionView {
    /// The session id.
    pub session: String,
    /// Accepted-but-unsettled requests.
    pub pending: usize,
    /// The cap (`null` = unlimited).
    pub limit: Option<usize>,
    /// Requests waiting behind the session's active one.
    pub waiting: usize,
    /// How long the first of them has waited, ms.
    pub longest_wait_ms: f64,
}

/// What shutdown did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShutdownReport {
    /// Queued requests answered `shutting_down`.
    pub answered_queued: usize,
    /// Running requests still running at the end of the grace period, aborted and
    /// answered `shutting_down`.
    pub aborted_running: usize,
}
