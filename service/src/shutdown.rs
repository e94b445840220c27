//! Shutdown, the same in both services: the one signal they stop on ([`signal`]), a
//! [`CancellationToken`] per thing to stop (a listener, a loop), and a [`TaskTracker`]
//! whose tokens the connection handlers hold, so that a service waits (bounded) for
//! them to say goodbye. Both come from tokio-util.

pub use tokio_util::sync::CancellationToken;
pub use tokio_util::task::TaskTracker;
pub use tokio_util::task::task_tracker::TaskTrackerToken;

/// Resolves on SIGTERM or SIGINT (Ctrl-C), logging which.
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the service");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
