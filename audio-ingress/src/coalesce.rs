//! One writer per NATS connection in front of async-nats: the publishes handed over
//! within one scheduler tick reach the client together, so that its connection task
//! writes them with one socket write instead of one write per frame.
//!
//! Why: async-nats wakes its connection task for every message sent into its command
//! channel, and that task writes what it holds at once. With one task per producer
//! connection (and the direct path, [`crate::stream`]), one frame arrives per task
//! wake-up, so the client wrote about one message per `writev`: at 1,000 streams, 0.47
//! writes per frame, each a loopback TCP send (and, on loopback, the server side's
//! receive) in the ingress's CPU.
//!
//! How: [`Coalescer::publish`] appends the message to a FIFO and wakes the writer task.
//! The writer first yields once — tokio runs every task already woken in this tick, and
//! they append theirs — then hands the whole FIFO to the client, in order. No timer: a
//! message waits for the rest of the current tick at most (tens of µs), never for a
//! period.
//!
//! Invariants:
//! - Order: messages reach the client in the order `publish` accepted them. The
//!   confirmation markers ([`crate::confirm::NatsConfirmer::through`]) go through the
//!   same FIFO, so a marker's return still proves that the server received every
//!   message accepted before it.
//! - Accepted means handed over: `publish` refuses at once what async-nats would refuse
//!   (an invalid subject, a message over the server's `max_payload`), so the writer's
//!   hand-over can fail only once the client is closed — counted and logged, never
//!   silent.
//! - Bounded: the FIFO and the batch being handed over hold at most [`MAX_BYTES`] of
//!   payload (one message more when empty). A publish that finds it full waits
//!   (cancel-safe: cancelled = not accepted); the direct path then leaves the frame in
//!   weir's queue.
//! - One task per connection. It ends once every handle is dropped, after handing over
//!   what the FIFO holds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;
use tokio::sync::Notify;

use crate::confirm::{Confirmer, NatsConfirmer};
use crate::publisher::{Sink, SinkError, SinkErrorKind};

/// Payload bytes the FIFO (with the batch being handed over) holds at most: ~30 ms of
/// 1,000 real-time streams, ~1,500 frames — less than the client's own command channel
/// (2,048 messages). With the window on (the default) the window's limit bounds it
/// too: everything here is unconfirmed.
pub const MAX_BYTES: usize = 1024 * 1024;

/// A [`Sink`] on one async-nats client that coalesces each tick's publishes. Cheap to
/// clone; the writer task ends when the last clone is dropped.
#[derive(Clone)]
pub struct Coalescer {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Coalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer")
            .field("queued_bytes", &self.shared().lock().bytes)
            .finish_non_exhaustive()
    }
}

/// Closes the writer when the last [`Coalescer`] goes.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.work.notify_one();
    }
}

struct Shared {
    client: Client,
    fifo: Mutex<Fifo>,
    /// Wakes the writer (the FIFO got its first message, or closed).
    work: Notify,
    /// Wakes publishers waiting for room, and `flush` waiting for an empty FIFO.
    room: Notify,
    closed: AtomicBool,
    /// Messages the writer could not hand over (the client was closed).
    failed: AtomicU64,
}

#[derive(Default)]
struct Fifo {
    msgs: Vec<Outbound>,
    /// Payload bytes in `msgs` and in the batch being handed over.
    bytes: usize,
}

struct Outbound {
    subject: Subject,
    headers: HeaderMap,
    payload: Bytes,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Fifo> {
        self.fifo.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Coalescer {
    /// A coalescer on `client`; spawns its writer task (call within a tokio runtime).
    pub fn new(client: Client) -> Self {
        let shared = Arc::new(Shared {
            client,
            fifo: Mutex::new(Fifo::default()),
            work: Notify::new(),
            room: Notify::new(),
            closed: AtomicBool::new(false),
            failed: AtomicU64::new(0),
        });
        tokio::spawn(write(Arc::clone(&shared)));
        Self {
            handle: Arc::new(Handle { shared }),
        }
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// The client behind it (subscriptions and statistics go to it directly).
    pub fn client(&self) -> &Client {
        &self.shared().client
    }

    /// Messages accepted and not handed over because the client was closed.
    pub fn failed(&self) -> u64 {
        self.shared().failed.load(Ordering::Relaxed)
    }

    /// Refuses what async-nats would refuse, before the message is accepted.
    fn check(
        &self,
        subject: &Subject,
        headers: &HeaderMap,
        payload: usize,
    ) -> Result<(), SinkError> {
        if !valid_publish_subject(subject) {
            return Err(SinkError::new(
                SinkErrorKind::Publish,
                format!("invalid publish subject {subject:?}"),
            ));
        }
        let size = payload + header_wire_len(headers);
        // The server's limit once connected (async-nats's 1 MiB default before): one
        // atomic load, the same value the client checks against.
        let max = self.client().max_payload();
        if size > max {
            return Err(SinkError::new(
                SinkErrorKind::Publish,
                format!("message of {size} bytes exceeds the server's max_payload {max}"),
            ));
        }
        Ok(())
    }
}

/// async-nats's own rule for a publish subject: not empty, no whitespace that would
/// break the protocol's framing.
fn valid_publish_subject(subject: &str) -> bool {
    !subject.is_empty()
        && !subject
            .bytes()
            .any(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// The serialized length of a header block (`NATS/1.0\r\n`, each `key: value\r\n`,
/// `\r\n`), 0 without headers, as async-nats counts it against `max_payload`.
fn header_wire_len(headers: &HeaderMap) -> usize {
    if headers.is_empty() {
        return 0;
    }
    let fields: usize = headers
        .iter()
        .map(|(k, vs)| {
            vs.iter()
                .map(|v| AsRef::<str>::as_ref(k).len() + 2 + v.as_str().len() + 2)
                .sum::<usize>()
        })
        .sum();
    b"NATS/1.0\r\n\r\n".len() + fields
}

impl Sink for Coalescer {
    async fn publish(
        &self,
        subject: Subject,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<(), SinkError> {
        self.check(&subject, &headers, payload.len())?;
        let shared = self.shared();
        let len = payload.len();
        let mut msg = Some(Outbound {
            subject,
            headers,
            payload,
        });
        loop {
            let room = shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut fifo = shared.lock();
                if fifo.bytes == 0 || fifo.bytes + len <= MAX_BYTES {
                    let wake = fifo.msgs.is_empty();
                    if let Some(m) = msg.take() {
                        fifo.msgs.push(m);
                    }
                    fifo.bytes += len;
                    drop(fifo);
                    if wake {
                        shared.work.notify_one();
                    }
                    return Ok(());
                }
            }
            room.await;
        }
    }

    fn is_connected(&self) -> bool {
        Sink::is_connected(self.client())
    }

    async fn flush(&self) -> Result<(), SinkError> {
        let shared = self.shared();
        loop {
            let room = shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if shared.lock().bytes == 0 {
                break;
            }
            room.await;
        }
        Sink::flush(self.client()).await
    }

    fn confirmer(&self) -> Option<Arc<dyn Confirmer>> {
        Some(Arc::new(NatsConfirmer::through(self.clone())))
    }
}

/// The writer task: one per coalescer.
async fn write(shared: Arc<Shared>) {
    let mut batch: Vec<Outbound> = Vec::new();
    loop {
        if shared.lock().msgs.is_empty() {
            if shared.closed.load(Ordering::Acquire) {
                return;
            }
            shared.work.notified().await;
            continue;
        }
        // Let every task woken in this tick append its message first.
        tokio::task::yield_now().await;
        std::mem::swap(&mut shared.lock().msgs, &mut batch);
        let mut bytes = 0;
        for m in batch.drain(..) {
            bytes += m.payload.len();
            if let Err(e) = shared
                .client
                .publish_with_headers(m.subject, m.headers, m.payload)
                .await
            {
                // Checked at `publish`: only a closed client gets here.
                if shared.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(error = %e, "NATS client closed: accepted messages not handed over");
                }
            }
        }
        shared.lock().bytes -= bytes;
        shared.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use futures::StreamExt;
    use weir_testkit::NatsServer;

    use super::*;

    async fn connect(server: &NatsServer) -> Client {
        async_nats::connect(server.url()).await.expect("connect")
    }

    /// Every message reaches a plain subscriber, in the order accepted, with the
    /// confirmation marker behind them: its return means all of them arrived.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn messages_arrive_in_order_and_the_marker_confirms_them() {
        let server = NatsServer::start().expect("nats-server");
        let observer = connect(&server).await;
        let mut sub = observer.subscribe("coalesce.>").await.expect("subscribe");
        observer.flush().await.expect("flush");
        let c = Coalescer::new(connect(&server).await);
        let confirmer = c.confirmer().expect("confirmer");
        for i in 0..2_000u32 {
            let subject = Subject::from(format!("coalesce.{}", i % 7));
            c.publish(subject, HeaderMap::new(), Bytes::from(i.to_string()))
                .await
                .expect("accepted");
        }
        tokio::time::timeout(std::time::Duration::from_secs(10), confirmer.round())
            .await
            .expect("marker back in time")
            .expect("round");
        // The marker came back on the coalescer's connection after all 2,000: the
        // server has them, so the observer gets them without waiting on the writer.
        let mut got = Vec::new();
        while got.len() < 2_000 {
            let m = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next())
                .await
                .expect("message in time")
                .expect("subscription open");
            got.push(
                std::str::from_utf8(&m.payload)
                    .ok()
                    .and_then(|t| t.parse::<u32>().ok())
                    .expect("a number"),
            );
        }
        assert_eq!(got, (0..2_000).collect::<Vec<_>>());
        c.flush().await.expect("flush");
        assert_eq!(c.failed(), 0);
    }

    /// What async-nats would refuse is refused at once, with the client's reasons,
    /// and nothing is queued.
    #[tokio::test]
    async fn refuses_what_the_client_would_refuse() {
        let server = NatsServer::start().expect("nats-server");
        let c = Coalescer::new(connect(&server).await);
        let e = c
            .publish(
                Subject::from("a b"),
                HeaderMap::new(),
                Bytes::from_static(b"x"),
            )
            .await
            .expect_err("invalid subject");
        assert_eq!(e.kind(), SinkErrorKind::Publish);
        let max = c.client().max_payload();
        let e = c
            .publish(
                Subject::from("ok"),
                HeaderMap::new(),
                Bytes::from(vec![0u8; max + 1]),
            )
            .await
            .expect_err("over max_payload");
        assert!(e.to_string().contains("max_payload"), "{e}");
        assert_eq!(c.shared().lock().bytes, 0);
    }

    /// The FIFO is bounded: while the writer has not run, a publish that would take it
    /// over [`MAX_BYTES`] is not accepted (pending, cancel-safe), and once the writer
    /// ran it is.
    #[tokio::test]
    async fn the_fifo_is_bounded_in_bytes() {
        let server = NatsServer::start().expect("nats-server");
        let c = Coalescer::new(connect(&server).await);
        let frame = Bytes::from(vec![0u8; 16 * 1024]);
        let mut cx = Context::from_waker(Waker::noop());
        let mut accepted = 0;
        loop {
            let fut = c.publish(Subject::from("bound"), HeaderMap::new(), frame.clone());
            match pin!(fut).poll(&mut cx) {
                Poll::Ready(r) => {
                    r.expect("accepted");
                    accepted += 1;
                }
                Poll::Pending => break,
            }
            assert!(accepted <= MAX_BYTES / frame.len(), "over the bound");
        }
        assert_eq!(accepted, MAX_BYTES / frame.len());
        assert_eq!(c.shared().lock().bytes, MAX_BYTES);
        // The writer runs (this test's runtime is single-threaded): room again.
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            c.publish(Subject::from("bound"), HeaderMap::new(), frame.clone()),
        )
        .await
        .expect("room in time")
        .expect("accepted");
        c.flush().await.expect("flush");
        assert_eq!(c.shared().lock().bytes, 0);
    }

    #[test]
    fn subjects_are_checked_as_async_nats_does() {
        assert!(valid_publish_subject("weir.audio.3.call-1"));
        assert!(!valid_publish_subject(""));
        assert!(!valid_publish_subject("a b"));
        assert!(!valid_publish_subject("a\r\nPUB x 1"));
        assert!(!valid_publish_subject("a\tb"));
    }

    #[test]
    fn header_length_matches_the_wire_format() {
        assert_eq!(header_wire_len(&HeaderMap::new()), 0);
        let mut h = HeaderMap::new();
        h.insert("Weir-Gap", "3-5");
        // "NATS/1.0\r\n" + "Weir-Gap: 3-5\r\n" + "\r\n"
        assert_eq!(header_wire_len(&h), 10 + 15 + 2);
    }
}
