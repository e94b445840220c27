//! Graceful shutdown pieces: the tracker of connection handlers the service waits for
//! (their close frames), tokio-util's, as `weir_service::shutdown` re-exports it with
//! the signal and the cancellation token.
//!
//! Order (in [`crate::service`]): stop accepting connections → finish every stream
//! (`Ingress::shutdown`: drain within half the grace period, hand every `end` to NATS
//! within the whole of it) → wait for WebSocket handlers to send `closed` and close
//! 1001 → flush the NATS client → exit. Every step is bounded.
//!
//! Each handler holds a [`TaskTrackerToken`] ([`TaskTracker::token`]), released exactly
//! once by `Drop`; at shutdown the service closes the tracker and waits (bounded) until
//! every token is gone.

pub use weir_service::shutdown::{TaskTracker, TaskTrackerToken};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_wait_ends_when_every_handler_token_is_dropped() {
        let tracker = TaskTracker::new();
        let token = tracker.token();
        let h = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(token);
        });
        tracker.close();
        assert!(
            tokio::time::timeout(Duration::from_secs(1), tracker.wait())
                .await
                .is_ok()
        );
        h.await.expect("task");
        let tracker = TaskTracker::new();
        let _token = tracker.token();
        tracker.close();
        assert!(
            tokio::time::timeout(Duration::from_millis(100), tracker.wait())
                .await
                .is_err(),
            "a live handler keeps the wait open"
        );
    }
}
