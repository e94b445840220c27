//! The admission core's tasks: the workers (each serves one member of the pool and
//! runs the jobs it takes, `job.rs`) and the sweeper (the one timer task: expiries and
//! stalled calls).
//!
//! Invariants: a worker holds its wake-up registration only while idle (see
//! `next_job`); a worker exits only once shutdown has begun and nothing is left for it
//! to start; the sweeper makes one more pass after the stop, then exits.

use std::sync::Arc;

use tokio::time::Instant;

use super::job::Job;
use super::state::Effects;
use super::{Inner, Sink};

pub(super) async fn worker<S: Sink>(inner: Arc<Inner<S>>, member: usize) {
    loop {
        let Some(job) = next_job(&inner, member).await else {
            return;
        };
        // The request's span (opened at receipt): the backend call's log lines
        // carry its ids.
        let span = job.span.clone();
        span.record("queue_ms", job.queue_time.as_millis() as u64);
        tracing::Instrument::instrument(inner.run_job(job), span).await;
    }
}

/// Waits for the next job; `None` when the worker should exit (shutting down and
/// nothing left to start).
///
/// The wake-up registration lives only while the worker is idle. A worker that held it
/// through a job would be a waiter that cannot act: `notify_one` hands a newly ready
/// request's wake-up to the longest-registered waiter, which can be that busy worker,
/// and the request would then wait for its call to end while other workers sleep.
/// Dropping the registration before the job forwards a wake-up it already received to
/// another waiter (tokio's `Notified` does so on drop).
async fn next_job<S: Sink>(inner: &Inner<S>, member: usize) -> Option<Job> {
    let work = inner.work.get(member)?;
    loop {
        // Register before looking, so a request made ready in between is not missed.
        let notified = work.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let (job, exit) = inner.take_job(member).await;
        if job.is_some() {
            return job;
        }
        if exit {
            return None;
        }
        notified.await;
    }
}

impl<S: Sink> Inner<S> {
    /// The next job, if any, and whether the worker should exit (shutting down and
    /// nothing left to start).
    async fn take_job(&self, member: usize) -> (Option<Job>, bool) {
        let mut fx = Effects::default();
        let (job, exit) = {
            let mut st = self.lock();
            // Reading the clock costs; an idle worker that finds nothing skips it.
            let job = if st.has_ready(member) {
                st.start_next(member, Instant::now(), &mut fx)
            } else {
                None
            };
            let exit = job.is_none() && st.is_shutting_down();
            (job, exit)
        };
        self.apply(fx).await;
        (job, exit)
    }
}

pub(super) async fn sweeper<S: Sink>(inner: Arc<Inner<S>>) {
    loop {
        let notified = inner.timers.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = inner
            .step(|st, now, fx| {
                st.expire(now, fx);
                st.next_wake()
            })
            .await;
        if inner.stop.is_cancelled() {
            return;
        }
        // Woken by the first timer, an earlier one, or the stop: one more pass, then
        // the stop is seen above.
        let first = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = first => {}
            _ = &mut notified => {}
            _ = inner.stop.cancelled() => {}
        }
    }
}
