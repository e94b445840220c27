//! Graceful shutdown pieces: a tracker of connection handlers so the service can wait
//! for their close frames (the signal itself is `weir_service::shutdown::signal`).
//!
//! Order (in [`crate::service`]): stop accepting connections → finish every stream
//! (`Ingress::shutdown`: drain within half the grace period, hand every `end` to NATS
//! within the whole of it) → wait for WebSocket handlers to send `closed` and close
//! 1001 → flush the NATS client → exit. Every step is bounded.
//!
//! The tracker follows mini-redis: each handler holds a clone of an mpsc sender; when
//! every clone is dropped, `recv` returns `None` — all handlers have finished. The
//! guard is released exactly once, by `Drop`.

use std::time::Duration;

use tokio::sync::mpsc;

/// Counts live connection handlers.
#[derive(Debug, Clone)]
pub struct TaskTracker {
    tx: mpsc::Sender<()>,
}

/// Held by one handler; dropping it marks the handler finished.
#[derive(Debug)]
pub struct TaskGuard {
    _tx: mpsc::Sender<()>,
}

/// Waits for every [`TaskGuard`] of a tracker to be dropped.
#[derive(Debug)]
pub struct TaskWaiter {
    rx: mpsc::Receiver<()>,
}

impl TaskTracker {
    /// A tracker and the waiter that resolves when all guards (and all tracker clones)
    /// are gone.
    pub fn new() -> (Self, TaskWaiter) {
        let (tx, rx) = mpsc::channel(1);
        (Self { tx }, TaskWaiter { rx })
    }

    /// A guard for one handler.
    pub fn guard(&self) -> TaskGuard {
        TaskGuard {
            _tx: self.tx.clone(),
        }
    }
}

impl TaskWaiter {
    /// Waits at most `bound` for every guard and tracker clone to be dropped; `true`
    /// when they were.
    pub async fn wait(mut self, bound: Duration) -> bool {
        // Nothing is ever sent: recv returns None once every sender is gone.
        tokio::time::timeout(bound, self.rx.recv()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn waiter_resolves_when_all_guards_are_dropped() {
        let (tracker, waiter) = TaskTracker::new();
        let g = tracker.guard();
        drop(tracker);
        let h = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(g);
        });
        assert!(waiter.wait(Duration::from_secs(1)).await);
        h.await.expect("task");
        let (tracker, waiter) = TaskTracker::new();
        let _g = tracker.guard();
        drop(tracker);
        assert!(!waiter.wait(Duration::from_millis(100)).await);
    }
}
