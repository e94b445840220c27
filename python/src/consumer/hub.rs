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
//!   not yet taken: the channel's capacity (two per stream + [`SLACK`]) covers the
//!   first two, so a handler waits on a full channel only while the Python pump is
//!   behind on ends.
//! - **No GIL on the core.** Handlers only touch the channel and their link's ack
//!   counter (acks arrive from the consumer's acker task); Python objects are built
//!   where a batch is taken (the bridge thread or the pump's own call), with the GIL.
//! - **A dropped Python stream never blocks.** When the Python side releases a link
//!   (its `Stream` was garbage-collected, or the consumer closed), the handler stops
//!   waiting and stops sending, except the `End`, so that the pump can forget the
//!   stream. A link that is held but never acked blocks only its own stream, whose
//!   queue then overloads under its own bound, as with a slow Rust handler.
//! - **An ended stream does not wait for a reader that is gone quiet.** Once the core
//!   has ended a stream for its handler ([`StreamEnded`]: its `End` is queued —
//!   producer end, idle, overload under `close`, a fence), and unless the consumer is
//!   closing (then `close()`'s grace applies), the handler waits for each ack
//!   at most `patience` (the stream's own age bound, `max_pending_age_ms`); a reader
//!   that lets that pass gets the rest of the queue and the `End` handed straight to
//!   its iterator, where they wait: bounded by the stream's own queue bound (nothing is
//!   queued after the end), and the instance's `max_streams` slot is freed even if the
//!   Python `Stream` is held and never read. A reader that keeps asking is always
//!   waited for (its lag and real-time factor stay its own).
//! - `End` is never waited on: the handler returns at once, its `max_streams` slot is
//!   freed as soon as the core has handed the end over.
//! - **Every opened stream's Python iterator ends.** A handler dropped before it handed
//!   over its `End` sends one last message instead (without waiting): while the hub is
//!   open (no `close()`/`abort()` under way) and the drop is not a panic's unwinding,
//!   the only way the core drops a handler is a lease fence (rebalance, expiry, stall:
//!   the core aborts the fenced partition's handlers, which are nearly always parked on
//!   the Python ack), so it sends a synthesized `End(cause=handover)` with the last seq
//!   this handler handed over — an `End` carries no audio, so single ownership holds.
//!   Otherwise (closing, or a panic) it sends [`HubMsg::Gone`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::sync::{mpsc, watch};
use weir_audio_consumer::{
    End, EndCause, HandlerFactory, StreamEnded, StreamEvent, StreamHandler, StreamInfo,
};
use weir_service::sync::locked;

/// Hub slack beyond two messages per stream (`End`s waiting to be taken).
const SLACK: usize = 1_024;

/// One message to Python.
pub enum HubMsg {
    /// A new stream instance (sent just before its first event).
    Open(StreamInfo, Arc<Link>),
    /// An event of instance `.0`.
    Event(u64, StreamEvent),
    /// Instance `.0`'s handler ended without handing over an `End` while the consumer
    /// was closing, or by a panic: its Python iterator must not wait for ever.
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
        let ready = || self.take_ack() || self.released();
        std::future::poll_fn(|cx| {
            if ready() {
                return Poll::Ready(());
            }
            self.waker.register(cx.waker());
            // Re-check after registering: an ack between the first check and the
            // registration woke no one.
            if ready() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
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
    /// Set when `close()` or `abort()` starts (before the core's shutdown): a handler
    /// dropped from then on is the shutdown's, not a fence's.
    closing: AtomicBool,
    /// How long the handler of an ended stream waits for each ack.
    patience: Duration,
}

impl Hub {
    /// A hub for `max_streams` and its receiving end; `patience`: how long the handler
    /// of an ended stream waits for each ack (see the module docs).
    pub fn new(max_streams: usize, patience: Duration) -> (Arc<Self>, mpsc::Receiver<HubMsg>) {
        let (tx, rx) = mpsc::channel(max_streams.saturating_mul(2).saturating_add(SLACK));
        let hub = Arc::new(Self {
            tx,
            links: Mutex::new(HashMap::new()),
            closed: watch::channel(false).0,
            closing: AtomicBool::new(false),
            patience,
        });
        (hub, rx)
    }

    /// The core's handler factory: one [`PyHandler`] per stream instance.
    pub fn factory(self: &Arc<Self>) -> HubFactory {
        HubFactory {
            hub: Arc::downgrade(self),
        }
    }

    /// The consumer starts closing (or aborting): handlers dropped from now on are not
    /// fenced ones.
    pub fn begin_close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Releases every live link and marks the hub closed (the consumer closed or
    /// aborted): no handler waits for Python any more.
    pub fn close(&self) {
        self.begin_close();
        let links: Vec<_> = locked(&self.links).drain().collect();
        for link in links.into_iter().filter_map(|(_, l)| l.upgrade()) {
            link.release();
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

/// The core's handler factory (see [`Hub::factory`]).
pub struct HubFactory {
    hub: Weak<Hub>,
}

impl HubFactory {
    fn make(&self, info: &StreamInfo, ended: Option<StreamEnded>) -> PyHandler {
        let link = Arc::new(Link::default());
        let hub = self.hub.upgrade();
        match &hub {
            Some(h) => {
                locked(&h.links).insert(info.instance, Arc::downgrade(&link));
            }
            // The Python consumer is gone: nothing will ever ack.
            None => link.release(),
        }
        PyHandler {
            open: Some(info.clone()),
            instance: info.instance,
            link,
            tx: hub.map(|h| h.tx.clone()),
            ended: false,
            last_seq: None,
            stream_ended: ended,
            draining: false,
            hub: self.hub.clone(),
        }
    }
}

impl HandlerFactory for HubFactory {
    type Handler = PyHandler;

    fn open(&self, info: &StreamInfo) -> PyHandler {
        self.make(info, None)
    }

    fn open_with(&self, info: &StreamInfo, ended: StreamEnded) -> PyHandler {
        self.make(info, Some(ended))
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
    /// The `End` was handed over.
    ended: bool,
    /// The last seq handed over (a frame's, a gap's last), for a synthesized `End`.
    last_seq: Option<u64>,
    /// The core's signal that this stream was ended for its handler.
    stream_ended: Option<StreamEnded>,
    /// The stream was ended (and the consumer is not closing): events go straight to
    /// Python, without waiting for acks.
    draining: bool,
    hub: Weak<Hub>,
}

impl PyHandler {
    /// Until Python acks the last event or the link is released; once the core ended
    /// the stream (and unless closing), at most the hub's patience.
    async fn wait_for_ack(&mut self) {
        if self.draining {
            return;
        }
        let Some(ended) = self.stream_ended.clone() else {
            self.link.acked().await;
            return;
        };
        tokio::select! {
            biased;
            () = self.link.acked() => {}
            () = ended.ended() => {
                match self.hub.upgrade().map(|h| (h.patience, h.is_closing())) {
                    // close()'s grace applies: wait for the reader.
                    Some((_, true)) => self.link.acked().await,
                    Some((p, false)) => {
                        if tokio::time::timeout(p, self.link.acked()).await.is_err() {
                            self.draining = true;
                        }
                    }
                    None => self.draining = true,
                }
            }
        }
    }
}

impl StreamHandler for PyHandler {
    async fn on_event(&mut self, event: StreamEvent) {
        let is_end = matches!(event, StreamEvent::End(_));
        match &event {
            StreamEvent::Frame(f) => self.last_seq = Some(f.seq),
            StreamEvent::Gap(g) => self.last_seq = Some(g.last_seq),
            _ => {}
        }
        let Some(tx) = &self.tx else { return };
        if self.link.released() && !is_end {
            // Nobody reads this stream any more: dropped here (counted delivered by
            // the core, as for a Rust handler that ignores events).
            return;
        }
        if let Some(info) = self.open.take()
            && tx
                .send(HubMsg::Open(info, self.link.clone()))
                .await
                .is_err()
        {
            self.tx = None;
            return;
        }
        if tx.send(HubMsg::Event(self.instance, event)).await.is_err() {
            self.tx = None;
            return;
        }
        if is_end {
            self.ended = true;
            return;
        }
        // Until Python asks for the next event (or releases the link, or the stream
        // was ended: see the module docs).
        self.wait_for_ack().await;
    }
}

impl Drop for PyHandler {
    fn drop(&mut self) {
        let hub = self.hub.upgrade();
        if let Some(hub) = &hub {
            locked(&hub.links).remove(&self.instance);
        }
        // Never opened (or the open notice could not be sent: then `tx` is gone too).
        if self.open.is_some() || self.ended {
            return;
        }
        let Some(tx) = self.tx.take() else { return };
        // Dropped before its `End` (see the module docs): a fence's abort gets a
        // synthesized `End(handover)`, a shutdown's or a panic's a `Gone`.
        let fenced = hub.as_ref().is_some_and(|h| !h.is_closing()) && !std::thread::panicking();
        let msg = if fenced {
            HubMsg::Event(
                self.instance,
                StreamEvent::End(End {
                    seq: None,
                    last_seq: self.last_seq,
                    cause: EndCause::Handover,
                }),
            )
        } else {
            HubMsg::Gone(self.instance)
        };
        // Without waiting here; a full hub (the pump far behind) gets it from a task.
        if let Err(mpsc::error::TrySendError::Full(msg)) = tx.try_send(msg)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let _ = tx.send(msg).await;
            });
        }
    }
}
