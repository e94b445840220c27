//! The stop signal of a consumer's tasks (every subscription, the lease driver, each
//! leased partition's feed), carrying the drain deadline.
//!
//! Invariants:
//! - A task waiting in [`StopSignal::stopped`] returns once [`StopSender::stop`] was
//!   called or the [`StopSender`] was dropped (the consumer or the feed is gone):
//!   nothing is left running because its owner forgot to stop it.
//! - The deadline a stopped task gets is the latest one sent, or the moment it looked
//!   when the sender was dropped without one.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;
use weir_service::shutdown::CancellationToken;

/// The waiting side (cloned into each task).
#[derive(Debug, Clone)]
pub(crate) struct StopSignal {
    token: CancellationToken,
    deadline: Arc<Mutex<Option<Instant>>>,
}

/// The stopping side; dropping it stops the tasks at once.
#[derive(Debug)]
pub(crate) struct StopSender {
    signal: StopSignal,
}

impl Drop for StopSender {
    fn drop(&mut self) {
        self.signal.token.cancel();
    }
}

/// A new signal.
pub(crate) fn channel() -> (StopSender, StopSignal) {
    let signal = StopSignal {
        token: CancellationToken::new(),
        deadline: Arc::new(Mutex::new(None)),
    };
    let sender = StopSender {
        signal: signal.clone(),
    };
    (sender, signal)
}

impl StopSender {
    /// Stops the tasks, which drain until `deadline`.
    pub(crate) fn stop(&self, deadline: Instant) {
        *self
            .signal
            .deadline
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(deadline);
        self.signal.token.cancel();
    }
}

impl StopSignal {
    /// Waits for the stop: the drain deadline sent, or now when the sender was dropped.
    pub(crate) async fn stopped(&self) -> Instant {
        self.token.cancelled().await;
        let deadline = *self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        deadline.unwrap_or_else(Instant::now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn stop_carries_the_latest_deadline_and_a_drop_stops_now() {
        let (tx, rx) = channel();
        let d1 = Instant::now() + Duration::from_secs(1);
        let d2 = Instant::now() + Duration::from_secs(2);
        tx.stop(d1);
        tx.stop(d2);
        assert_eq!(rx.clone().stopped().await, d2);

        let (tx, rx) = channel();
        let waiting = tokio::spawn(async move { rx.stopped().await });
        tokio::task::yield_now().await;
        let before = Instant::now();
        drop(tx);
        assert_eq!(waiting.await.expect("joined"), before);
    }
}
