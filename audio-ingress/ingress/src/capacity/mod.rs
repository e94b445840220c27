//! Admission by recognition capacity: the door listens to the recognition workers'
//! announcements (`<prefix>.announce.*`, `weir_protocol::capacity`) and refuses a new
//! stream (`503 no_capacity` + `Retry-After`) when the worker that would serve its
//! partition is gone, full or lagging; it tells admitted producers when their worker
//! falls behind (`degraded`, `recovered`) and ends a stream its worker refused
//! (`<prefix>.refused.<stream>`: `closed` with reason `no_capacity`).
//!
//! - [`fleet`]: the in-memory view and the decision (pure, clock as a parameter);
//! - [`listen`]: the NATS side: the two subscriptions, decoding, counting;
//! - [`lease`]: the read-only watch of the lease bucket the announcements name;
//! - [`Ticket`]: an admitted stream's hold on its slot and its notices.
//!
//! Invariants:
//! - the decision is in memory: [`Capacity::admit`] takes one mutex, never waits on
//!   NATS;
//! - with nothing heard it admits: recognisers that announce nothing are unaffected;
//! - `shadow` decides and counts exactly as `enforce`, and admits; `off` decides
//!   nothing, but still listens: a worker's refusal and lag reach the producer in
//!   every mode;
//! - an admitted stream is held from [`Capacity::admit`] until its [`Ticket`] drops
//!   (the door drops it once the stream finished): released exactly once, by `Drop`;
//!   its notices reach the ticket once [`Ticket::bind`] ran (after the registry
//!   opened the stream, so a duplicate id the registry refuses never takes over the
//!   notices of the stream that holds the id);
//! - every message ignored is counted by kind (`weir_ingress_capacity_ignored_total`).

pub mod fleet;
pub mod lease;
pub mod listen;

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use weir_protocol::StreamId;
use weir_service::sync::locked;

use crate::config::{CapacityConfig, CapacityMode};
use crate::metrics as m;
pub use fleet::{Decision, Fleet, FleetSettings, NoCapacity, Notice, RefuseReason};

/// Notices queued per held stream; more are dropped (`degraded` repeats with the next
/// announcement).
const NOTICES_PER_STREAM: usize = 8;

/// What [`Capacity`] and its tasks share.
pub(crate) struct Shared {
    mode: CapacityMode,
    fleet: Mutex<Fleet>,
}

impl Shared {
    fn fleet(&self) -> MutexGuard<'_, Fleet> {
        locked(&self.fleet)
    }
}

/// The door's capacity check (`capacity.mode` = `shadow` or `enforce`); its tasks stop
/// when it drops.
pub struct Capacity {
    shared: Arc<Shared>,
    _task: AbortOnDropHandle<()>,
}

impl Capacity {
    /// Starts listening on `client` for the door's subject template `subject` and
    /// `partitions`. Every mode listens: with `capacity.mode = off` nothing is decided
    /// at admission, but a worker's refusal still ends its stream for the producer,
    /// and its lag still reaches it.
    pub fn start(
        client: async_nats::Client,
        config: &CapacityConfig,
        subject: &str,
        partitions: NonZeroU32,
    ) -> Arc<Self> {
        let shared = Arc::new(Shared {
            mode: config.mode,
            fleet: Mutex::new(Fleet::new(FleetSettings {
                subject: subject.to_owned(),
                partitions,
                max_lag: config.max_lag,
            })),
        });
        let task = tokio::spawn(listen::run(
            client,
            Arc::clone(&shared),
            config.prefix.clone(),
        ));
        let _task = AbortOnDropHandle::new(task);
        Arc::new(Self { shared, _task })
    }

    /// The admission of stream `id`: a [`Ticket`] holding its slot, or the refusal
    /// (`enforce` only; `shadow` counts it and admits; `off` decides nothing and
    /// holds the stream only to route its notices). Counted.
    pub fn admit(&self, id: &StreamId) -> Result<Ticket, NoCapacity> {
        let mut fleet = self.shared.fleet();
        let decision = match self.shared.mode {
            CapacityMode::Off => Decision::Admit(None),
            CapacityMode::Shadow | CapacityMode::Enforce => fleet.decide(id, Instant::now()),
        };
        let worker = match decision {
            Decision::Admit(w) => w,
            Decision::Refuse(refused) => {
                let label: &'static str = refused.reason.into();
                if self.shared.mode == CapacityMode::Enforce {
                    drop(fleet);
                    metrics::counter!(m::CAPACITY_REFUSED_TOTAL, m::LABEL_REASON => label)
                        .increment(1);
                    return Err(refused);
                }
                metrics::counter!(m::CAPACITY_SHADOW_WOULD_REJECT_TOTAL, m::LABEL_REASON => label)
                    .increment(1);
                refused.worker
            }
        };
        let token = fleet.reserve(worker);
        let (tx, rx) = mpsc::channel(NOTICES_PER_STREAM);
        Ok(Ticket {
            held: Some(HeldTicket {
                shared: Arc::clone(&self.shared),
                id: id.clone(),
                token,
                rx,
                tx: Some(tx),
            }),
        })
    }

    /// Streams held (admitted, not finished).
    pub fn held(&self) -> usize {
        self.shared.fleet().held_count()
    }

    /// Whether `worker` is in the view and live.
    pub fn is_live(&self, worker: &str) -> bool {
        self.shared.fleet().is_live(worker, Instant::now())
    }

    /// Whether the lease bucket's view is complete (`None`: no lease-mode worker heard).
    pub fn lease_synced(&self) -> Option<bool> {
        self.shared.fleet().lease_synced()
    }

    /// The totals of the gauges now.
    pub fn totals(&self) -> fleet::FleetTotals {
        self.shared.fleet().totals(Instant::now())
    }
}

struct HeldTicket {
    shared: Arc<Shared>,
    id: StreamId,
    token: u64,
    rx: mpsc::Receiver<Notice>,
    /// Handed to the fleet by [`Ticket::bind`].
    tx: Option<mpsc::Sender<Notice>>,
}

/// An admitted stream's hold on its worker's slot, and the notices for its producer.
/// The slot is released when it drops: the door keeps it until the stream finished.
pub struct Ticket {
    held: Option<HeldTicket>,
}

impl Ticket {
    /// A ticket that holds nothing and never has a notice (no capacity check: a
    /// service started without one).
    pub fn none() -> Self {
        Self { held: None }
    }

    /// Whether it holds a slot.
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// The registry opened the stream: from now on its notices (a worker's refusal,
    /// `degraded`) reach this ticket. Called once, after the open; a ticket never
    /// bound still holds its slot until it drops.
    pub fn bind(&mut self) {
        if let Some(h) = &mut self.held
            && let Some(tx) = h.tx.take()
        {
            h.shared.fleet().bind(&h.id, h.token, tx);
        }
    }

    /// The next notice (cancel-safe; never resolves for a ticket that holds nothing).
    pub async fn next(&mut self) -> Notice {
        if let Some(h) = &mut self.held
            && let Some(n) = h.rx.recv().await
        {
            return n;
        }
        std::future::pending().await
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            h.shared.fleet().release(h.id.as_str(), h.token);
        }
    }
}

/// The producer event of a notice (`None` for a refusal: the stream ends instead).
pub fn notice_event(notice: &Notice) -> Option<serde_json::Value> {
    match notice {
        Notice::Lag(event) => serde_json::to_value(event).ok(),
        Notice::Refused => None,
    }
}
