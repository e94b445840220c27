//! The memory of one refused stream id (see the [parent module](super)): its later
//! packets are refused too, until its `end` or the idle timeout, and while they keep
//! arriving its refusal is notified again at most once per announcement interval — a
//! notice lost on the way (a door reconnecting, a slow consumer) must not leave its
//! producer streaming into nothing for the rest of the call.

use std::time::Duration;

use tokio::time::Instant;

use crate::event::RefuseReason;
use crate::slots::StreamSlot;

/// A stream refused at its first packet.
pub(super) struct Refused {
    pub(super) reason: RefuseReason,
    pub(super) last_packet: Instant,
    /// When its refusal was last handed to the announcer.
    notified: Instant,
    /// A slot of the bounded set of remembered refused ids.
    _slot: StreamSlot,
}

impl Refused {
    /// Refused (and notified) at `now`.
    pub(super) fn new(reason: RefuseReason, now: Instant, slot: StreamSlot) -> Self {
        Self {
            reason,
            last_packet: now,
            notified: now,
            _slot: slot,
        }
    }

    /// A later packet arrived at `now`: whether its refusal is notified again (the
    /// last notice is at least `every` old). One clock comparison, no allocation.
    pub(super) fn packet(&mut self, now: Instant, every: Duration) -> bool {
        self.last_packet = now;
        let due = now.saturating_duration_since(self.notified) >= every;
        if due {
            self.notified = now;
        }
        due
    }
}
