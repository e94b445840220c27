//! The global queue bound (`queue_capacity`): at most that many admitted requests wait
//! to start; one more is refused `queue_full`. Enforced in shadow mode too: it is the
//! memory bound.

use std::num::NonZeroUsize;

use weir_protocol::llm::{ErrorCode, ErrorDetails};

use super::{Ask, Gate, RULE_QUEUE, Refusal, refusal, retry_after};

/// The queue bound.
pub(crate) struct QueueBound {
    capacity: NonZeroUsize,
    workers: NonZeroUsize,
}

impl QueueBound {
    pub(crate) fn new(capacity: NonZeroUsize, workers: NonZeroUsize) -> Self {
        Self { capacity, workers }
    }
}

impl Gate for QueueBound {
    /// The request, and how many requests are queued now.
    type Input<'a> = (&'a Ask<'a>, usize);
    type Pass = ();

    fn check(&self, (ask, queued): (&Ask<'_>, usize)) -> Result<(), Refusal> {
        if queued < self.capacity.get() {
            return Ok(());
        }
        let body = refusal(
            ErrorCode::QueueFull,
            format!("queue holds {queued} requests (capacity)"),
            ErrorDetails {
                limit: Some(self.capacity.get() as u64),
                pending: Some(queued as u64),
                retry_after_ms: retry_after(ask.hint, queued as f64 / self.workers.get() as f64),
                ..Default::default()
            },
        );
        Err(Refusal::always(RULE_QUEUE, body))
    }
}
