//! The read bound of a request body: a request whose body is not complete within
//! [`BodyLimits::timeout`] of its head, or that arrives slower than
//! [`BodyLimits::min_rate`] bytes per second (measured from [`BODY_RATE_GRACE`] after
//! the head on), fails with a [`BodyTimeout`] error where the handler reads it.
//!
//! [`super::serve`] wraps every request's body in a [`DeadlineBody`]. A handler that
//! reads the body gets the error, answers, and hyper closes the connection (the body
//! was not read to its end); a handler that never reads it answers at once and the
//! connection is closed the same way. The header timeout covers the head and the idle
//! timeout a connection moving no byte; this covers a body that trickles.
//!
//! Invariants: the bound is checked only while the body is polled and has no data
//! ready (a timer armed on the first wait, none for a body that is complete or empty);
//! once failed, the body keeps failing; at most one timer per request, none per frame.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};

/// How long after the head the minimum rate starts to count (a client may pause
/// between its head and its body, e.g. on a new TCP window).
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(1);

/// How often the minimum rate is checked while the body is awaited.
const RATE_CHECK: Duration = Duration::from_millis(250);

/// The body bounds of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// The whole body must arrive within this of the request head.
    pub timeout: Duration,
    /// After [`BODY_RATE_GRACE`], at least this many bytes per second on average since
    /// the head (`0`: no rate bound).
    pub min_rate: u64,
}

impl BodyLimits {
    /// 10 s: a 64 KiB WHIP offer at 8 KiB/s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
    /// 1,024 bytes/s.
    pub const DEFAULT_MIN_RATE: u64 = 1024;
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self {
            timeout: Self::DEFAULT_TIMEOUT,
            min_rate: Self::DEFAULT_MIN_RATE,
        }
    }
}

/// Why a body was cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyTimeout {
    /// Not complete within the total deadline.
    #[error("the request body was not complete within {0} ms")]
    Deadline(u64),
    /// Slower than the minimum rate.
    #[error("the request body arrived slower than {0} bytes/s")]
    TooSlow(u64),
}

impl BodyTimeout {
    /// The metric label (`reason`).
    pub fn as_label(self) -> &'static str {
        match self {
            Self::Deadline(_) => "body",
            Self::TooSlow(_) => "body_rate",
        }
    }

    /// The [`BodyTimeout`] in a body error's chain, if it is one.
    pub fn find(error: &(dyn std::error::Error + 'static)) -> Option<Self> {
        std::iter::successors(Some(error), |e| e.source())
            .find_map(|e| e.downcast_ref::<Self>().copied())
    }
}

/// What a failed body reports to: the listener's timed-out counter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Report {
    pub(crate) listener: &'static str,
    pub(crate) counter: &'static str,
}

/// A request body under [`BodyLimits`].
pub struct DeadlineBody {
    inner: Incoming,
    limits: BodyLimits,
    start: Instant,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
    failed: Option<BodyTimeout>,
    report: Report,
}

impl DeadlineBody {
    /// Bounds `inner`, whose head arrived now.
    pub(crate) fn new(inner: Incoming, limits: BodyLimits, report: Report) -> Self {
        Self {
            inner,
            limits,
            start: Instant::now(),
            received: 0,
            timer: None,
            failed: None,
            report,
        }
    }

    /// The verdict at `now`: a failure, or the next time to look.
    fn check(&self, now: Instant) -> Result<Instant, BodyTimeout> {
        let deadline = self.start + self.limits.timeout;
        if now >= deadline {
            return Err(BodyTimeout::Deadline(self.limits.timeout.as_millis() as u64));
        }
        let counted = now.saturating_duration_since(self.start + BODY_RATE_GRACE);
        if self.limits.min_rate > 0 && !counted.is_zero() {
            let needed = (counted.as_millis() as u64).saturating_mul(self.limits.min_rate) / 1000;
            if self.received < needed {
                return Err(BodyTimeout::TooSlow(self.limits.min_rate));
            }
        }
        let next = if self.limits.min_rate > 0 {
            (now + RATE_CHECK).max(self.start + BODY_RATE_GRACE + RATE_CHECK)
        } else {
            deadline
        };
        Ok(next.min(deadline))
    }

    fn fail(&mut self, why: BodyTimeout) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        if self.failed.is_none() {
            self.failed = Some(why);
            let Report { listener, counter } = self.report;
            metrics::counter!(counter,
                super::LABEL_LISTENER => listener, super::LABEL_REASON => why.as_label())
            .increment(1);
        }
        Poll::Ready(Some(Err(Box::new(why))))
    }
}

impl Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(why) = self.failed {
            return self.fail(why);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received = self.received.saturating_add(data.len() as u64);
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        loop {
            let now = Instant::now();
            let next = match self.check(now) {
                Ok(next) => next,
                Err(why) => return self.fail(why),
            };
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
            if timer.deadline() != next {
                timer.as_mut().reset(next);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_found_in_an_error_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] BodyTimeout);
        let e = Outer(BodyTimeout::TooSlow(5));
        assert_eq!(BodyTimeout::find(&e), Some(BodyTimeout::TooSlow(5)));
        assert_eq!(BodyTimeout::TooSlow(5).as_label(), "body_rate");
        assert_eq!(BodyTimeout::Deadline(9).as_label(), "body");
    }
}
