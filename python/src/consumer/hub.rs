//! The hub: how the consumer core's per-stream handlers hand their events to Python.
//!
//! Each stream instance gets a [`PyHandler`] (the core's [`StreamHandler`]). On each
//! event it sends `(instance, event)` into the one bounded hub channel and then waits
//! until the Python side asks for that stream's *next* event (an ack from the Python
//! iterator's `__anext__`), so the core's per-stream queue bound, its lag (age of the
//! oldest event not yet taken) and its real-time-factor measurement are driven by the
//! Python handler's own progress, exactly as for a Rust handler. The first event of an
//! instance is preceded by an open notice carrying its [`StreamInfo`] and its [`Link`].
//!
//! Invariants:
//! - **Bounded.** At most one event per live stream is in flight (sent, not acked),
//!   plus at most one open notice per live stream and the `End`s of finished streams
//!   not yet taken: the channel's capacity ([`capacity_for`]) covers the first two, so
//!   a handler waits on a full channel only while the Python pump is behind on ends.
//! - **No GIL on the core.** Handlers only touch the channel and their link's ack
//!   counter (acks arrive from the consumer's acker task); Python objects are built
//!   where a batch is taken (the bridge thread or the pump's own call), with the GIL.
//! - **A dropped Python stream never blocks.** When the Python side releases a link
//!   (its `Stream` was garbage-collected, or the consumer closed), the handler stops
//!   waiting and stops sending, except the `End`, so that the pump can forget the
//!   stream. A link that is held but never acked blocks only its own stream, whose
//!   queue then overloads under its own bound, as with a slow Rust handler.
//! - `End` is never waited on: the handler returns at once, its `max_streams` slot is
//!   freed as soon as the core has handed the end over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Poll;

use futures::task::AtomicWaker;
use tokio::sync::{mpsc, watch};
use weir_audio_consumer::{StreamEvent, StreamHandler, StreamInfo};

/// Hub slack beyond two messages per stream (`End`s waiting to be taken).
const SLACK: usize = 1_024;

/// The hub channel's capacity for `max_streams`.
pub fn capacity_for(max_streams: usize) -> usize {
    max_streams.saturating_mul(2).saturating_add(SLACK)
}

/// One message to Python.
pub enum HubMsg {
    /// A new stream instance (sent just before its first event).
    Open(StreamInfo, Arc<Link>),
    /// An event of instance `.0`.
    Event(u64, StreamEvent),
    /// Instance `.0`'s handler ended without handing over an `End` (its task was
    /// aborted, or panicked): its Python iterator must not wait for ever.
    Gone(u64),
}

/// The Python side's handle on one handler's wait: a count of acks not yet taken and
/// a released flag, with one waker (lock-free: an ack costs an atomic add and a wake).
#[derive(Debug, Default)]
pub struct Link {
    acks: AtomicU64,
    released: AtomicBool,
    waker: AtomicWaker,
}

impl Link {
    fn new() -> Self {
        Self::default()
    }

    /// The Python iterator asks for the next event.
    pub fn ack(&self) {
        self.acks.fetch_add(1, Ordering::AcqRel);
        self.waker.wake();
    }

    /// The Python stream is gone: the handler stops waiting and sending (but the end).
    pub fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Takes one ack, if there is one.
    fn take_ack(&self) -> bool {
        self.acks
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Until an ack is taken or the link is released.
    async fn acked(&self) {
        std::future::poll_fn(|cx| {
            if self.take_ack() || self.released() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // Re-check after registering: an ack between the first check and the
            // registration woke no one.
            if self.take_ack() || self.released() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
    }
}

/// State shared by the hub's handlers and the Python consumer.
pub struct Hub {
    tx: mpsc::Sender<HubMsg>,
    /// The live handlers' links, to release them all when the consumer closes.
    links: Mutex<HashMap<u64, Weak<Link>>>,
    /// Set once the consumer is closed: a pending batch wait returns what is left.
    closed: watch::Sender<bool>,
}

impl Hub {
    /// A hub for `max_streams` and its receiving end.
    pub fn new(max_streams: usize) -> (Arc<Self>, mpsc::Receiver<HubMsg>) {
        let (tx, rx) = mpsc::channel(capacity_for(max_streams));
        let hub = Arc::new(Self {
            tx,
            links: Mutex::new(HashMap::new()),
            closed: watch::channel(false).0,
        });
        (hub, rx)
    }

    fn links(&self) -> MutexGuard<'_, HashMap<u64, Weak<Link>>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The core's handler factory: one [`PyHandler`] per stream instance.
    pub fn factory(self: &Arc<Self>) -> impl Fn(&StreamInfo) -> PyHandler + Send + Sync + 'static {
        let weak = Arc::downgrade(self);
        move |info: &StreamInfo| {
            let link = Arc::new(Link::new());
            let hub = weak.upgrade();
            match &hub {
                Some(h) => {
                    h.links().insert(info.instance, Arc::downgrade(&link));
                }
                // The Python consumer is gone: nothing will ever ack.
                None => link.release(),
            }
            PyHandler {
                open: Some(info.clone()),
                instance: info.instance,
                link,
                tx: hub.map(|h| h.tx.clone()),
                opened: false,
                ended: false,
                hub: weak.clone(),
            }
        }
    }

    /// Releases every live link and marks the hub closed (the consumer closed or
    /// aborted): no handler waits for Python any more.
    pub fn close(&self) {
        let links: Vec<_> = self.links().drain().collect();
        for (_, link) in links {
            if let Some(link) = link.upgrade() {
                link.release();
            }
        }
        self.closed.send_replace(true);
    }

    /// A receiver of the closed flag.
    pub fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// Whether the hub is closed.
    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
}

/// The core handler of one stream instance (see the module docs).
pub struct PyHandler {
    /// The open notice, sent with the first event.
    open: Option<StreamInfo>,
    instance: u64,
    link: Arc<Link>,
    /// `None` when the Python consumer was already gone at open.
    tx: Option<mpsc::Sender<HubMsg>>,
    /// The open notice was handed over.
    opened: bool,
    /// The `End` was handed over.
    ended: bool,
    hub: Weak<Hub>,
}

impl StreamHandler for PyHandler {
    async fn on_event(&mut self, event: StreamEvent) {
        let is_end = matches!(event, StreamEvent::End(_));
        let Some(tx) = &self.tx else { return };
        if self.link.released() && !is_end {
            // Nobody reads this stream any more: dropped here (counted delivered by
            // the core, as for a Rust handler that ignores events).
            return;
        }
        if let Some(info) = self.open.take() {
            if tx
                .send(HubMsg::Open(info, self.link.clone()))
                .await
                .is_err()
            {
                self.tx = None;
                return;
            }
            self.opened = true;
        }
        if tx.send(HubMsg::Event(self.instance, event)).await.is_err() {
            self.tx = None;
            return;
        }
        if is_end {
            self.ended = true;
            return;
        }
        // Until Python asks for the next event (or releases the link).
        self.link.acked().await;
    }
}

impl Drop for PyHandler {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.links().remove(&self.instance);
        }
        // Ended without an `End` (aborted or panicked): tell the Python side, without
        // waiting (a full hub means the pump is gone or far behind; the consumer's
        // close then ends the iterator).
        if self.opened
            && !self.ended
            && let Some(tx) = &self.tx
        {
            let _ = tx.try_send(HubMsg::Gone(self.instance));
        }
    }
}
