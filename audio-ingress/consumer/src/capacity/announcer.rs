//! The announcer task: a consumer's capacity on `<prefix>.announce.<worker>` every
//! interval, and a notice on `<prefix>.refused.<stream>` for a refused stream — at
//! once, then at most once per interval while its packets keep arriving. See the
//! [module docs](super) for the invariants.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use weir_protocol::StreamId;
use weir_protocol::capacity::{
    self as proto, Announcement, MAX_LAG_MS, MAX_LISTED_STREAMS, MAX_PAYLOAD_BYTES, MAX_RTF,
    OwnershipKind, Refusal, RefusalReason, StreamLoad,
};
use weir_service::config::whole_ms as ms;
use weir_service::ratelimit::LogLimit;

use super::RefusedNote;
use crate::Shared;
use crate::metrics as m;
use crate::ownership::LeaseBoard;

/// Refused ids remembered as notified lately while they keep sending (only those the
/// demultiplexer could not remember itself: more refused at once than `max_streams`).
pub(crate) const NOTIFIED_CAPACITY: usize = 4_096;
/// How long the last announcement and its flush may take at shutdown.
const LAST_TIMEOUT: Duration = Duration::from_millis(500);

/// Publish failures are logged at most once per this long (all are counted).
static PUBLISH_FAILED: LogLimit = LogLimit::new(Duration::from_secs(10));

/// The running announcer of one consumer.
pub(crate) struct Announcer {
    task: JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

/// The partitions delivered now: the static `owned` list, or the leases held whose feed
/// runs.
pub(crate) fn delivering(shared: &Shared, leases: Option<&LeaseBoard>) -> Vec<u32> {
    match leases {
        None => shared.settings.owned.iter().copied().collect(),
        Some(b) => weir_service::sync::locked(b)
            .iter()
            .filter(|l| l.delivering)
            .map(|l| l.partition)
            .collect(),
    }
}

/// What an announcement with `seq` says now.
pub(crate) fn announcement(
    shared: &Shared,
    leases: Option<&LeaseBoard>,
    seq: u64,
    now: Instant,
) -> Announcement {
    let settings = &shared.settings;
    let cap = &settings.capacity;
    let max_streams = settings.max_streams.get() as u64;
    let loads = shared.registry().loads(now, MAX_LISTED_STREAMS);
    let live_streams = loads.live.min(max_streams);
    let lag_ms = ms(loads.max_lag).min(MAX_LAG_MS);
    let listed: Vec<StreamLoad> = loads
        .listed
        .into_iter()
        .filter(|(id, _)| StreamId::parse(id).is_ok())
        .take(live_streams as usize)
        .map(|(id, lag)| StreamLoad {
            id,
            lag_ms: ms(lag).min(lag_ms),
        })
        .collect();
    let mut partitions = delivering(shared, leases);
    partitions.sort_unstable();
    partitions.dedup();
    shared.capacity.rtf.decay_to(now);
    let rtf_p95 = shared.capacity.rtf.p95().clamp(0.0, MAX_RTF);
    let mut a = Announcement {
        v: proto::VERSION,
        worker: cap.worker_id.clone(),
        instance: shared.capacity.instance.clone(),
        seq,
        sent_at_ms: weir_service::clock::unix_ms_now(),
        interval_ms: ms(cap.interval),
        subject: settings.subject.as_str().to_owned(),
        partitions_total: settings.partitions.get(),
        ownership: match &settings.lease {
            None => OwnershipKind::Static,
            Some(_) => OwnershipKind::Lease,
        },
        lease_bucket: settings.lease.as_ref().map(|l| l.bucket.clone()),
        partitions,
        max_streams,
        live_streams,
        lag_ms,
        rtf_p95,
        streams: Vec::new(),
        streams_truncated: false,
    };
    fit_streams(&mut a, listed);
    a
}

/// Room kept free below [`MAX_PAYLOAD_BYTES`] by the announcements.
pub(crate) const PAYLOAD_MARGIN_BYTES: usize = 1_024;
/// Encoded bytes of one listed stream besides its id, at most:
/// `{"id":"","lag_ms":3600000},` (a stream id's alphabet needs no JSON escape).
const STREAM_ENTRY_BYTES: usize = 27;

/// Lists `streams` (most lagging first) in `a` while the encoded announcement stays
/// within [`MAX_PAYLOAD_BYTES`] − [`PAYLOAD_MARGIN_BYTES`] (the reader ignores a
/// longer one as `too_large`, and with it every partition of the worker); the rest is
/// only counted in `live_streams`, with `streams_truncated`. Budgeted by bytes (id
/// length + a fixed entry overhead, after the encoded rest: partitions, ids, subject),
/// then checked by one encoding.
pub(crate) fn fit_streams(a: &mut Announcement, streams: Vec<StreamLoad>) {
    let limit = MAX_PAYLOAD_BYTES - PAYLOAD_MARGIN_BYTES;
    a.streams.clear();
    // `false` encodes one byte longer than `true`: the base is the larger of the two.
    a.streams_truncated = false;
    let mut budget = limit.saturating_sub(a.encode().len());
    for s in streams {
        let cost = s.id.len() + STREAM_ENTRY_BYTES;
        if cost > budget {
            break;
        }
        budget -= cost;
        a.streams.push(s);
    }
    while a.encode().len() > limit && a.streams.pop().is_some() {}
    a.streams_truncated = (a.streams.len() as u64) < a.live_streams;
}

/// Starts the announcer (`None` with `announce = false`). The first announcement goes
/// out at once.
pub(crate) fn spawn(
    client: async_nats::Client,
    shared: Arc<Shared>,
    leases: Option<Arc<LeaseBoard>>,
) -> Option<Announcer> {
    // No refusal channel with `announce = false`.
    let refused = shared.capacity.take_refused()?;
    let (stop, stop_rx) = oneshot::channel();
    let task = Task {
        client,
        notified: Notified::new(
            shared.settings.idle_timeout,
            shared.settings.capacity.interval,
        ),
        shared,
        leases,
    };
    Some(Announcer {
        task: tokio::spawn(task.run(refused, stop_rx)),
        stop,
    })
}

impl Announcer {
    /// Sends the last announcement (no partition, no live stream) and stops.
    pub(crate) async fn finish(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(LAST_TIMEOUT * 2, self.task).await;
    }

    /// Stops at once, sending nothing (a crash drill).
    pub(crate) fn abort(&self) {
        self.task.abort();
    }
}

struct Task {
    client: async_nats::Client,
    shared: Arc<Shared>,
    leases: Option<Arc<LeaseBoard>>,
    notified: Notified,
}

impl Task {
    async fn run(
        mut self,
        mut refused: mpsc::Receiver<RefusedNote>,
        mut stop: oneshot::Receiver<()>,
    ) {
        let mut tick = tokio::time::interval(self.shared.settings.capacity.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                stopped = &mut stop => {
                    // Dropped without `finish` (the consumer was dropped): quietly.
                    if stopped.is_ok() {
                        self.last().await;
                    }
                    return;
                }
                _ = tick.tick() => {
                    let seq = self.shared.capacity.take_seq();
                    let a = announcement(&self.shared, self.leases.as_deref(), seq, Instant::now());
                    set_gauges(&a);
                    self.publish_announcement(&a).await;
                }
                Some(note) = refused.recv() => self.on_refused(note).await,
            }
        }
    }

    /// The last announcement: no partition, no live stream (the door stops sending
    /// new streams here at once instead of after 2.5 intervals), flushed.
    async fn last(&self) {
        let seq = self.shared.capacity.take_seq();
        let mut a = announcement(&self.shared, None, seq, Instant::now());
        a.partitions.clear();
        a.live_streams = 0;
        a.lag_ms = 0;
        a.streams.clear();
        a.streams_truncated = false;
        set_gauges(&a);
        self.publish_announcement(&a).await;
        let _ = tokio::time::timeout(LAST_TIMEOUT, self.client.flush()).await;
    }

    async fn publish_announcement(&self, a: &Announcement) {
        let subject = self.shared.settings.capacity.announce_subject();
        match self.publish(subject, a.encode()).await {
            Ok(()) => ::metrics::counter!(m::CONSUMER_CAPACITY_ANNOUNCEMENTS_TOTAL).increment(1),
            Err(error) => {
                ::metrics::counter!(m::CONSUMER_CAPACITY_ANNOUNCE_FAILURES_TOTAL).increment(1);
                if let Some(suppressed) = PUBLISH_FAILED.allow() {
                    tracing::warn!(%error, suppressed, "capacity announcement not sent");
                }
            }
        }
    }

    /// Publishes within one interval.
    async fn publish(&self, subject: String, payload: Vec<u8>) -> Result<(), String> {
        let bound = self.shared.settings.capacity.interval;
        match tokio::time::timeout(bound, self.client.publish(subject, payload.into())).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("not queued within {bound:?}")),
        }
    }

    async fn on_refused(&mut self, note: RefusedNote) {
        let unsent = |reason: &'static str| {
            ::metrics::counter!(m::CONSUMER_CAPACITY_REFUSALS_UNSENT_TOTAL, m::LABEL_REASON => reason)
                .increment(1);
        };
        let Ok(stream) = StreamId::parse(&note.stream) else {
            // The door cannot hold a producer of a stream id that is not safe.
            return unsent("invalid_stream_id");
        };
        match self.notified.admit(&note, Instant::now()) {
            Admit::Send => {}
            Admit::AlreadySent => return,
            Admit::MemoryFull => return unsent("memory_full"),
        }
        let max_streams = self.shared.settings.max_streams.get() as u64;
        let refusal = Refusal {
            v: proto::VERSION,
            worker: self.shared.settings.capacity.worker_id.clone(),
            stream: note.stream,
            reason: RefusalReason::MaxStreams,
            max_streams,
            live_streams: note.live_streams.min(max_streams),
            sent_at_ms: weir_service::clock::unix_ms_now(),
        };
        let subject = proto::refused_subject(&self.shared.settings.capacity.prefix, &stream);
        match self.publish(subject, refusal.encode()).await {
            Ok(()) => ::metrics::counter!(m::CONSUMER_CAPACITY_REFUSALS_TOTAL).increment(1),
            Err(error) => {
                unsent("publish_failed");
                if let Some(suppressed) = PUBLISH_FAILED.allow() {
                    tracing::warn!(%error, suppressed, "refusal notice not sent");
                }
            }
        }
    }
}

fn set_gauges(a: &Announcement) {
    ::metrics::gauge!(m::CONSUMER_CAPACITY_SLOTS).set(a.max_streams as f64);
    ::metrics::gauge!(m::CONSUMER_CAPACITY_LIVE_STREAMS).set(a.live_streams as f64);
    ::metrics::gauge!(m::CONSUMER_CAPACITY_MAX_LAG_SECONDS).set(a.lag_ms as f64 / 1_000.0);
    ::metrics::gauge!(m::CONSUMER_CAPACITY_RTF_P95).set(a.rtf_p95);
}

/// Whether a refusal note is sent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    Send,
    AlreadySent,
    MemoryFull,
}

/// The refused ids notified lately that the demultiplexer does not remember (bounded).
#[derive(Debug)]
pub(crate) struct Notified {
    /// Per id: its last note (a packet of the refused stream) and its last notice sent.
    seen: HashMap<String, Seen>,
    /// Forgotten after this long without a note (the consumer's idle timeout, after
    /// which a silent refused stream is a new one).
    ttl: Duration,
    /// A stream that keeps sending is notified again after this long (the
    /// announcement interval): the last notice may have been lost.
    resend: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    note: Instant,
    sent: Instant,
}

impl Notified {
    pub(crate) fn new(ttl: Duration, resend: Duration) -> Self {
        Self {
            seen: HashMap::new(),
            ttl,
            resend,
        }
    }

    /// A note remembered by the demultiplexer is sent (the demultiplexer already
    /// spaced its notes by the interval). Another is sent when its id is new, silent
    /// for the TTL, or last notified at least the resend interval ago — at most one
    /// notice per interval while it keeps sending — and only while the memory has room.
    pub(crate) fn admit(&mut self, note: &RefusedNote, now: Instant) -> Admit {
        if note.remembered {
            self.seen.remove(&note.stream);
            return Admit::Send;
        }
        if let Some(seen) = self.seen.get_mut(&note.stream) {
            let silent = now.saturating_duration_since(seen.note) >= self.ttl;
            seen.note = now;
            if silent || now.saturating_duration_since(seen.sent) >= self.resend {
                seen.sent = now;
                return Admit::Send;
            }
            return Admit::AlreadySent;
        }
        if self.seen.len() >= NOTIFIED_CAPACITY {
            let ttl = self.ttl;
            self.seen
                .retain(|_, s| now.saturating_duration_since(s.note) < ttl);
            if self.seen.len() >= NOTIFIED_CAPACITY {
                return Admit::MemoryFull;
            }
        }
        self.seen.insert(
            note.stream.clone(),
            Seen {
                note: now,
                sent: now,
            },
        );
        Admit::Send
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(stream: &str, remembered: bool) -> RefusedNote {
        RefusedNote {
            stream: stream.into(),
            live_streams: 1,
            remembered,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_unremembered_refused_stream_is_notified_once_per_interval_while_it_keeps_sending() {
        let mut n = Notified::new(Duration::from_secs(5), Duration::from_secs(1));
        let start = Instant::now();
        assert_eq!(n.admit(&note("s1", false), start), Admit::Send);
        // A packet every 250 ms for 3 s: a notice at 1, 2 and 3 s, none in between.
        let mut sent = vec![start];
        for _ in 0..12 {
            tokio::time::advance(Duration::from_millis(250)).await;
            if n.admit(&note("s1", false), Instant::now()) == Admit::Send {
                sent.push(Instant::now());
            }
        }
        let offsets: Vec<u128> = sent.iter().map(|t| (*t - start).as_millis()).collect();
        assert_eq!(offsets, vec![0, 1_000, 2_000, 3_000]);
        // Silent for the TTL: a new instance, notified at once.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(n.admit(&note("s1", false), Instant::now()), Admit::Send);
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(
            n.admit(&note("s1", false), Instant::now()),
            Admit::AlreadySent
        );
        // Remembered by the demultiplexer: its one note is always sent.
        assert_eq!(n.admit(&note("s2", true), Instant::now()), Admit::Send);
        assert_eq!(n.admit(&note("s2", true), Instant::now()), Admit::Send);
    }

    #[tokio::test(start_paused = true)]
    async fn the_memory_is_bounded_and_frees_what_went_silent() {
        let mut n = Notified::new(Duration::from_secs(5), Duration::from_secs(1));
        let now = Instant::now();
        for i in 0..NOTIFIED_CAPACITY {
            assert_eq!(n.admit(&note(&format!("s{i}"), false), now), Admit::Send);
        }
        assert_eq!(n.admit(&note("extra", false), now), Admit::MemoryFull);
        assert_eq!(n.seen.len(), NOTIFIED_CAPACITY);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(n.admit(&note("extra", false), Instant::now()), Admit::Send);
        assert_eq!(n.seen.len(), 1);
    }
}
