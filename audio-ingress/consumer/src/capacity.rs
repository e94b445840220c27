//! What a recognition worker tells the door about its capacity (docs/protocol.md §5.1,
//! [`weir_protocol::capacity`]): its slots, its load and its real-time factor,
//! announced on core NATS, and a notice for each stream it refuses for want of a slot.
//!
//! Invariants a reader must not break:
//! - **Slots are `max_streams`.** Live streams are the instances whose handler task
//!   runs (each holds one of the `max_streams` slots), so `live_streams ≤ max_streams`.
//! - **Lag** of a stream is the age of the oldest event in its queue that its handler
//!   has not taken (the age its queue already keeps for `max_pending_age_ms`), 0 when
//!   none waits; the worker's lag is the largest. Read once per announcement, never on
//!   the per-frame path.
//! - **The real-time factor** costs the per-frame path two clock reads and integer
//!   additions in the handler task's own variables; once a stream has handed its
//!   handler [`rtf::WINDOW`] of audio, one ratio (busy time / audio time) goes into a
//!   lock-free histogram ([`rtf::RtfHistogram`]) whose counts halve every
//!   [`rtf::HALF_LIFE`]: no lock and no allocation per frame.
//! - **An announcement always decodes**: it lists live streams (most lagging first, at
//!   most `MAX_LISTED_STREAMS`) only while its encoding stays within
//!   `MAX_PAYLOAD_BYTES` less a margin ([`announcer::fit_streams`]); the others are
//!   counted in `live_streams` with `streams_truncated`. A reader ignores a longer
//!   one, and with it the worker's partitions.
//! - **Announcements** ([`announcer`]): one task per consumer, the first right after the
//!   subscriptions (or the lease driver) are set up, then every `interval_ms`; `seq`
//!   counts from 1 per consumer, `instance` is a random nonce per consumer. A failed
//!   publish is counted (and logged at most once per 10 s), never fatal. `shutdown`
//!   sends one last announcement with no partition and no live stream before it
//!   unsubscribes; `abort` (a crash) sends nothing. `announce = false`: no task, no
//!   announcement, no refusal notice.
//! - **Refusals**: a [`Refusal`](weir_protocol::capacity::Refusal) for a stream
//!   instance refused for `max_streams` at its first packet, then again at most once
//!   per `interval_ms` while its packets keep arriving (a notice on core NATS can be
//!   lost — a door reconnecting, a slow consumer — and a producer whose `end` was lost
//!   may retry the same id while it is still remembered as refused); a refused stream
//!   that stops sending gets no more. The memory of refused ids is bounded (the
//!   demultiplexer's `max_streams` set, then [`announcer::NOTIFIED_CAPACITY`]), and a
//!   notice that does not fit is counted, never queued without bound.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use weir_protocol::capacity::{self as proto, DEFAULT_INTERVAL_MS, INTERVAL_RANGE_MS};
use weir_service::config::Range;

use crate::ConsumerError;

pub(crate) mod announcer;
pub(crate) mod rtf;

/// Raw capacity settings (the `capacity` key; every key optional).
///
/// ```toml
/// [capacity]
/// announce = true              # false: no announcement, no refusal notice
/// prefix = "weir.capacity"     # <prefix>.announce.<worker>, <prefix>.refused.<stream>
/// interval_ms = 1000           # 100..=60000
/// worker_id = "gpu-a"          # static ownership: default w<pid>-<random>;
///                              # lease ownership: the lease's worker_id
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CapacityConfig {
    /// Whether the worker announces its capacity and notifies refusals (default true).
    pub announce: bool,
    /// Subject prefix (default `weir.capacity`): dot-separated tokens, no wildcard.
    pub prefix: String,
    /// Announcement interval, ms (100..=60,000; default 1,000). A door takes a worker
    /// for gone after 2.5 intervals without one.
    pub interval_ms: u64,
    /// The worker id in announcements (1..=64 of `A-Z a-z 0-9 _ -`). Static ownership:
    /// default `w<pid>-<random>`. Lease ownership: the lease's `worker_id` is used, and
    /// a different one here is refused.
    pub worker_id: Option<String>,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        Self {
            announce: true,
            prefix: proto::DEFAULT_PREFIX.to_owned(),
            interval_ms: DEFAULT_INTERVAL_MS,
            worker_id: None,
        }
    }
}

/// Validated capacity settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacitySettings {
    pub(crate) announce: bool,
    pub(crate) prefix: String,
    pub(crate) interval: Duration,
    pub(crate) worker_id: String,
}

impl CapacitySettings {
    /// The subject of this worker's announcements.
    pub fn announce_subject(&self) -> String {
        proto::announce_subject(&self.prefix, &self.worker_id)
    }
}

impl CapacityConfig {
    /// Validates every key; `lease_worker` is the lease's worker id with lease
    /// ownership (which the announcements must use).
    pub fn validate(&self, lease_worker: Option<&str>) -> Result<CapacitySettings, ConsumerError> {
        if !proto::is_valid_prefix(&self.prefix) {
            return Err(ConsumerError::config(
                "capacity.prefix",
                format!(
                    "{:?}: 1..=128 bytes of dot-separated non-empty tokens, no wildcard or whitespace",
                    self.prefix
                ),
            ));
        }
        let (lo, hi) = INTERVAL_RANGE_MS;
        let interval = Range::ms(lo, hi).check("capacity.interval_ms", self.interval_ms)?;
        if let Some(id) = &self.worker_id {
            crate::config::check_name("capacity.worker_id", "", id)?;
        }
        let worker_id = match (lease_worker, &self.worker_id) {
            (Some(lease), Some(id)) if id != lease => {
                return Err(ConsumerError::config(
                    "capacity.worker_id",
                    format!(
                        "{id:?} differs from the lease's worker_id {lease:?}: with lease \
                         ownership the announcements use the lease's id (leave it out)"
                    ),
                ));
            }
            (Some(lease), _) => lease.to_owned(),
            (None, Some(id)) => id.clone(),
            (None, None) => crate::config::default_worker_id(),
        };
        Ok(CapacitySettings {
            announce: self.announce,
            prefix: self.prefix.clone(),
            interval: Duration::from_millis(interval),
            worker_id,
        })
    }
}

/// A random nonce: 16 hex digits (std's per-process random hash keys, a fresh key per
/// call).
pub(crate) fn random_nonce() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(weir_service::clock::unix_ms_now());
    format!("{:016x}", h.finish())
}

/// A stream refused for `max_streams`, for the announcer to notify.
#[derive(Debug)]
pub(crate) struct RefusedNote {
    pub(crate) stream: String,
    pub(crate) live_streams: u64,
    /// Whether the demultiplexer remembers it (then the demultiplexer spaces its notes
    /// by the interval; otherwise one comes with each of the stream's packets and the
    /// announcer spaces them).
    pub(crate) remembered: bool,
}

/// Notes buffered for the announcer; beyond, a note is counted and dropped.
pub(crate) const REFUSED_CHANNEL: usize = 1_024;

/// The capacity state shared by the consumer's tasks.
#[derive(Debug)]
pub(crate) struct CapacityState {
    pub(crate) instance: String,
    /// The seq of the next announcement.
    pub(crate) next_seq: AtomicU64,
    pub(crate) rtf: rtf::RtfHistogram,
    refused: Option<mpsc::Sender<RefusedNote>>,
    refused_rx: std::sync::Mutex<Option<mpsc::Receiver<RefusedNote>>>,
}

impl CapacityState {
    pub(crate) fn new(settings: &CapacitySettings) -> Self {
        let (tx, rx) = settings
            .announce
            .then(|| mpsc::channel(REFUSED_CHANNEL))
            .unzip();
        Self {
            instance: random_nonce(),
            next_seq: AtomicU64::new(1),
            rtf: rtf::RtfHistogram::new(tokio::time::Instant::now()),
            refused: tx,
            refused_rx: std::sync::Mutex::new(rx),
        }
    }

    /// A stream was refused for `max_streams`: hands the note to the announcer (never
    /// waits; a full buffer counts it as unsent).
    pub(crate) fn refused(&self, stream: &str, live_streams: u64, remembered: bool) {
        let Some(tx) = &self.refused else {
            return;
        };
        let note = RefusedNote {
            stream: stream.to_owned(),
            live_streams,
            remembered,
        };
        let reason = match tx.try_send(note) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(_)) => "buffer_full",
            // The announcer has stopped (shutdown).
            Err(mpsc::error::TrySendError::Closed(_)) => "stopped",
        };
        ::metrics::counter!(
            crate::metrics::CONSUMER_CAPACITY_REFUSALS_UNSENT_TOTAL,
            crate::metrics::LABEL_REASON => reason
        )
        .increment(1);
    }

    /// The announcer's end of the refusal notes (taken once).
    pub(crate) fn take_refused(&self) -> Option<mpsc::Receiver<RefusedNote>> {
        weir_service::sync::locked(&self.refused_rx).take()
    }

    /// The seq the next announcement gets (without taking it).
    pub(crate) fn peek_seq(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    /// Takes the next seq.
    pub(crate) fn take_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
