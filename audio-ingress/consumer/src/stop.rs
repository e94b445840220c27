//! The stop signal of a consumer's tasks (every subscription, the lease driver, each
//! leased partition's feed), carrying the drain deadline: a watch of it.
//!
//! Invariants:
//! - A task waiting in [`stopped`] returns once a deadline was sent or the
//!   [`StopSender`] was dropped (the consumer or the feed is gone): nothing is left
//!   running because its owner forgot to stop it.
//! - The deadline a stopped task gets is the latest one sent, or the moment it looked
//!   when the sender was dropped without one.

use tokio::sync::watch;
use tokio::time::Instant;

/// The stopping side: `send_replace(Some(deadline))` stops the tasks, which drain
/// until `deadline`; dropping it stops them at once.
pub(crate) type StopSender = watch::Sender<Option<Instant>>;

/// The waiting side (cloned into each task), for [`stopped`].
pub(crate) type StopSignal = watch::Receiver<Option<Instant>>;

/// A new signal.
pub(crate) fn channel() -> (StopSender, StopSignal) {
    watch::channel(None)
}

/// Waits for the stop: the drain deadline sent, or now when the sender was dropped.
pub(crate) async fn stopped(signal: &mut StopSignal) -> Instant {
    let deadline = signal.wait_for(Option::is_some).await.ok().and_then(|d| *d);
    deadline.unwrap_or_else(Instant::now)
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
        tx.send_replace(Some(d1));
        tx.send_replace(Some(d2));
        assert_eq!(stopped(&mut rx.clone()).await, d2);

        let (tx, mut rx) = channel();
        let waiting = tokio::spawn(async move { stopped(&mut rx).await });
        tokio::task::yield_now().await;
        let before = Instant::now();
        drop(tx);
        assert_eq!(waiting.await.expect("joined"), before);
    }
}
