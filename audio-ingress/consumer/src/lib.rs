//! Consumer core: shard-affine, per-stream ordered, bounded delivery of audio streams to
//! recognition workers.
//!
//! # API in one screen
//!
//! ```no_run
//! use std::time::Duration;
//! use weir_audio_consumer::{Consumer, ConsumerConfig, StreamEvent, StreamHandler, StreamInfo};
//!
//! struct Worker; // e.g. a simulated recogniser with a cost per frame
//! impl StreamHandler for Worker {
//!     async fn on_event(&mut self, event: StreamEvent) {
//!         if let StreamEvent::Frame(_f) = event {
//!             tokio::time::sleep(Duration::from_millis(2)).await;
//!         }
//!     }
//! }
//!
//! # async fn run() -> Result<(), weir_audio_consumer::ConsumerError> {
//! let settings = ConsumerConfig::partitioned("audio.{partition}.{stream}", 8, [0, 1, 2, 3])
//!     .validate()?;
//! let consumer = Consumer::connect("nats://127.0.0.1:4222", settings, |_: &StreamInfo| Worker).await?;
//! let stats = consumer.stats();          // in-process snapshot, any time
//! println!("{} frames, {} lost", stats.totals.counters.frames, stats.totals.counters.lost_frames);
//! let final_stats = consumer.shutdown(Duration::from_secs(2)).await;
//! # let _ = final_stats; Ok(()) }
//! ```
//!
//! - [`ConsumerConfig`] → [`ConsumerConfig::validate`] → [`ConsumerSettings`]; every
//!   key, its default and range: docs/audio-ingress.md § Configuration.
//! - [`Consumer::connect`] / [`Consumer::connect_with`] (own async-nats options) return
//!   once the server has registered the subscriptions.
//! - The application implements [`StreamHandler`] (one per stream instance, created by a
//!   [`HandlerFactory`] — any `Fn(&StreamInfo) -> H`), or uses [`channel_factory`].
//! - Reading it: [`Consumer::stats`] / [`Consumer::totals`] (every frame accounted
//!   for: docs/audio-ingress.md § Stats), [`Consumer::events`], [`Consumer::leases`],
//!   [`Consumer::owned_now`], [`Consumer::capacity`].
//! - Stopping it: [`Consumer::shutdown`] (drain within a grace period, final stats) or
//!   [`Consumer::abort`] (a crash, for failover drills).
//!
//! # What it guarantees
//!
//! docs/audio-ingress.md § Consumer side says how each of these works, and
//! docs/scale-out.md how leases do.
//!
//! - **Affinity.** The worker subscribes only to its owned partitions (see
//!   [`ConsumerSettings::server_mapping_for`] for the deployed plain subject); a
//!   template without `{partition}` must own every partition. A message whose stream
//!   hashes elsewhere is still delivered and counted `misrouted`.
//! - **Order.** One demultiplexer task per subscription, one handler task per stream
//!   instance fed in subscription order: tasks never grow with the number of frames.
//! - **Bounds.** A stream's queue is bounded by bytes and by the age of its oldest event;
//!   over the bound the policy fires at once, never waiting ([`EndCause::Overload`] or a
//!   [`GapCause::Overload`] notice). At most `max_streams` instances live at once; a new
//!   stream beyond is refused explicitly ([`ConsumerEvent::StreamRefused`], counted).
//! - **Sequence.** Every seq from the first packet seen to the end is delivered or
//!   covered by a gap notice naming its cause ([`GapCause`]); earlier seqs are
//!   `leading_missing`; duplicates are refused and counted; seq 1 after progress is a
//!   restart (new instance).
//! - **Ends.** A stream instance ends exactly once for its handler ([`EndCause`]).
//! - **Sources and ownership.** The JetStream source ([`jetstream`]) and lease
//!   ownership ([`Ownership::Lease`]: a fenced partition hands its streams nothing more,
//!   they end [`EndCause::Handover`]) feed the same demultiplexer, so all of the above
//!   holds for them; capacity announcements and refusal notices are the `capacity`
//!   module's (docs/protocol.md §5.1).
//! - Nothing in this crate panics on network input; undecodable packets are counted by
//!   error kind.

mod capacity;
mod config;
mod demux;
mod event;
mod fence;
mod handler;
pub mod jetstream;
mod lease;
mod loss;
pub mod metrics;
mod ownership;
mod queue;
mod slots;
mod stats;
mod stop;
#[cfg(feature = "testing")]
pub mod testing;
/// Per-stream sequence tracking (loss, duplicates, restarts); also used by
/// `audio-ingress tap`.
pub mod tracker;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use weir_protocol::audio::DecodeOptions;
use weir_service::config::{ConfigError, ConfigErrorKind};
use weir_service::nats::{EventMetrics, NatsEvents};

pub use config::{
    CapacityConfig, CapacitySettings, ConsumerConfig, ConsumerPolicy, ConsumerSettings,
    ConsumerSource, DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LEASE_BUCKET, DEFAULT_LEASE_MARGIN, DEFAULT_LEASE_RENEW_INTERVAL, DEFAULT_LEASE_TTL,
    DEFAULT_MAX_FRAME_AGE, DEFAULT_MAX_PENDING_AGE, DEFAULT_MAX_PENDING_BYTES, DEFAULT_MAX_STREAMS,
    DEFAULT_RETAIN_FINISHED, DEFAULT_SUBSCRIPTION_CAPACITY, JetStreamStart, LeaseConfig,
    LeaseSettings, MAX_FRAME_AGE_RANGE_MS, Ownership, QueueLimits,
};
pub use event::{
    ConsumerEvent, End, EndCause, Frame, GapCause, GapNotice, LocalOverload, LossDeclaration,
    OverloadBound, RefuseReason, StreamEvent, StreamInfo,
};
pub use handler::{ChannelHandler, HandlerFactory, StreamEnded, StreamHandler, channel_factory};
pub use lease::LeaseInfo;
pub use stats::{ConsumerStats, Counters, StreamState, StreamStats, Totals};

use crate::metrics as m;
use demux::Demux;
use slots::StreamSlots;
use stats::Registry;

/// The names the consumer counts its NATS client's events under (the one event handler,
/// `weir_service::nats::NatsEvents`).
const EVENT_METRICS: EventMetrics = EventMetrics {
    events_total: m::CONSUMER_NATS_EVENTS_TOTAL,
    connected: m::CONSUMER_NATS_CONNECTED,
};

/// Capacity of the [`Consumer::events`] broadcast.
const EVENT_CAPACITY: usize = 1_024;
/// How long [`Consumer::connect`] waits for the subscriptions to be made and confirmed.
const SUBSCRIBE_CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the consumer could not start.
///
/// Two shapes, on purpose: an invalid config is a value (the key and what is wrong,
/// matched structurally by the validation code and by callers that show the key), so
/// it stays a data variant; an operation that failed (connect, subscribe, the lease
/// bucket) is weir's one error shape, [`weir_service::Error`], whose
/// [`source`](std::error::Error::source) is the async-nats or JetStream error itself.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// A config key is invalid: the one configuration error of every weir component
    /// (the key, the value and the allowed range).
    #[error("invalid consumer {0}")]
    Config(ConfigError),
    /// Connecting, subscribing or opening the lease bucket failed: its kind says
    /// which ([`ConsumerErrorKind::Connect`], [`ConsumerErrorKind::Subscribe`] or
    /// [`ConsumerErrorKind::Lease`]), its source is the client's error.
    #[error(transparent)]
    Operation(OperationError),
}

/// A failed operation of the consumer (see [`ConsumerError::Operation`]).
pub type OperationError = weir_service::Error<ConsumerErrorKind>;

/// Machine-readable kind of a [`ConsumerError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConsumerErrorKind {
    /// See [`ConsumerError::Config`].
    Config,
    /// The NATS connection failed (source: `async_nats::ConnectError`).
    Connect,
    /// A subscription (core, or a JetStream ordered consumer) could not be made or
    /// confirmed.
    Subscribe,
    /// Lease ownership: the KV bucket could not be created or opened.
    Lease,
}

/// A refused key. By hand, not `#[from]`: a config error is the value itself, not a
/// [`source`](std::error::Error::source).
impl From<ConfigError> for ConsumerError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

impl ConsumerError {
    pub(crate) fn config(key: &'static str, reason: String) -> Self {
        Self::Config(ConfigError::new(key, ConfigErrorKind::Invalid, reason))
    }

    /// An operation failed because of `source`.
    pub(crate) fn operation(
        kind: ConsumerErrorKind,
        message: impl Into<String>,
        source: impl Into<weir_service::error::Source>,
    ) -> Self {
        Self::Operation(OperationError::with_source(kind, message, source))
    }

    /// The kind, for callers that match on it.
    pub fn kind(&self) -> ConsumerErrorKind {
        match self {
            Self::Config(_) => ConsumerErrorKind::Config,
            Self::Operation(e) => e.kind(),
        }
    }

    /// The config key at fault, for [`ConsumerErrorKind::Config`].
    pub fn config_key(&self) -> Option<&str> {
        match self {
            Self::Config(e) => Some(e.key()),
            Self::Operation(_) => None,
        }
    }
}

/// Core subscriptions to `subjects`, confirmed by the server within `timeout`.
pub(crate) async fn subscribe(
    client: &async_nats::Client,
    subjects: Vec<String>,
    timeout: std::time::Duration,
) -> Result<Vec<(String, async_nats::Subscriber)>, ConsumerError> {
    weir_service::nats::subscribe_confirmed(client, subjects, timeout)
        .await
        .map_err(|e| {
            ConsumerError::operation(
                ConsumerErrorKind::Subscribe,
                format!("cannot subscribe to {:?}", e.subject),
                e,
            )
        })
}

/// Metric handles of the per-packet path, resolved once (under the recorder installed
/// when the consumer starts); the rare paths use the `metrics` macros directly.
pub(crate) struct Instruments {
    pub(crate) messages: ::metrics::Counter,
    pub(crate) frames: ::metrics::Counter,
    pub(crate) delivered: ::metrics::Counter,
    pub(crate) stale: ::metrics::Counter,
    pub(crate) streams_active: ::metrics::Gauge,
}

impl Instruments {
    fn new() -> Self {
        Self {
            messages: ::metrics::counter!(m::CONSUMER_MESSAGES_TOTAL),
            frames: ::metrics::counter!(m::CONSUMER_FRAMES_TOTAL),
            delivered: ::metrics::counter!(m::CONSUMER_FRAMES_DELIVERED_TOTAL),
            stale: ::metrics::counter!(crate::metrics::CONSUMER_FRAMES_STALE_TOTAL),
            streams_active: ::metrics::gauge!(m::CONSUMER_STREAMS_ACTIVE),
        }
    }
}

/// The consumer's wall clock, Unix milliseconds: what a frame's capture time is
/// compared with by the staleness guard. Injectable so that tests control it.
pub(crate) type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// State shared by the consumer handle, its demultiplexers and its handler tasks.
pub(crate) struct Shared {
    pub(crate) settings: ConsumerSettings,
    /// Read only for frames that carry a capture time while the guard is on.
    pub(crate) wall_clock: WallClock,
    pub(crate) decode: DecodeOptions,
    registry: Mutex<Registry>,
    /// NATS messages received (the registry's counter, counted without its lock).
    pub(crate) messages: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) events: broadcast::Sender<ConsumerEvent>,
    pub(crate) instruments: Instruments,
    /// `max_streams` slots, one per live stream instance (held by its entry and its
    /// handler task).
    pub(crate) stream_slots: Arc<StreamSlots>,
    /// `max_streams` slots for remembering refused stream ids.
    pub(crate) refused_slots: Arc<StreamSlots>,
    /// Capacity: the announcements' nonce and seq, the real-time factor, the refusal
    /// notes for the announcer.
    pub(crate) capacity: capacity::CapacityState,
}

impl Shared {
    fn new(settings: ConsumerSettings) -> Self {
        Self::with_clock(settings, Arc::new(weir_service::clock::unix_ms_now))
    }

    pub(crate) fn with_clock(settings: ConsumerSettings, wall_clock: WallClock) -> Self {
        let max_streams = settings.max_streams;
        let registry = Registry::new(settings.retain_finished.get());
        Self {
            capacity: capacity::CapacityState::new(&settings.capacity),
            settings,
            wall_clock,
            decode: DecodeOptions::default(),
            messages: registry.message_counter(),
            registry: Mutex::new(registry),
            events: broadcast::channel(EVENT_CAPACITY).0,
            instruments: Instruments::new(),
            stream_slots: StreamSlots::new(max_streams),
            refused_slots: StreamSlots::new(max_streams),
        }
    }

    /// The stats registry (plain counters: a poisoned lock is used as is).
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        weir_service::sync::locked(&self.registry)
    }

    /// A slow-consumer event (one message the client dropped), after the shared event
    /// handler counted it: into the stats, the consumer's own counter and its events.
    fn on_slow_consumer(&self, sid: u64) {
        self.registry().base.slow_consumer_events += 1;
        ::metrics::counter!(m::CONSUMER_SLOW_CONSUMER_TOTAL).increment(1);
        let _ = self.events.send(ConsumerEvent::SlowConsumer { sid });
    }
}

/// A running consumer. Dropping it without [`Consumer::shutdown`] stops its tasks
/// abruptly (handlers are aborted at their next await).
pub struct Consumer {
    shared: Arc<Shared>,
    client: async_nats::Client,
    stop: stop::StopSender,
    tasks: Vec<JoinHandle<()>>,
    /// Lease ownership: the table the driver keeps current.
    leases: Option<Arc<ownership::LeaseBoard>>,
    /// The capacity announcer (`None` with `capacity.announce = false`).
    announcer: Option<capacity::announcer::Announcer>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("subject", &self.shared.settings.subject)
            .field("owned", &self.shared.settings.owned)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// Connects to `url` with default async-nats options plus the consumer's
    /// `subscription_capacity` and event callback, then starts (see
    /// [`Self::connect_with`]).
    pub async fn connect<F: HandlerFactory>(
        url: &str,
        settings: ConsumerSettings,
        factory: F,
    ) -> Result<Self, ConsumerError> {
        Self::connect_with(async_nats::ConnectOptions::new(), url, settings, factory).await
    }

    /// Connects with `options` (auth, TLS, timeouts, reconnect policy — the caller's),
    /// on top of which the consumer sets `subscription_capacity` from the settings and
    /// an event callback that counts slow-consumer and connection events. Subscribes to
    /// the owned partitions and returns once the server has confirmed them (a round
    /// trip on the same connection, at most 5 s).
    ///
    /// `url` is one server URL or a comma-separated list of them (a cluster: tried in
    /// turn, as the `[nats] url` key of every weir binary).
    pub async fn connect_with<F: HandlerFactory>(
        options: async_nats::ConnectOptions,
        url: &str,
        settings: ConsumerSettings,
        factory: F,
    ) -> Result<Self, ConsumerError> {
        let shared = Arc::new(Shared::new(settings));
        let cb_shared = Arc::downgrade(&shared);
        let events = NatsEvents::new(EVENT_METRICS).on_slow_consumer(move |sid| {
            if let Some(shared) = cb_shared.upgrade() {
                shared.on_slow_consumer(sid);
            }
        });
        let connect_error = |why: &str, source: weir_service::error::Source| {
            let message = format!("cannot connect to NATS at {url}{why}");
            ConsumerError::operation(ConsumerErrorKind::Connect, message, source)
        };
        let addrs = url
            .split(',')
            .map(|u| u.trim().parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| connect_error(": invalid server URL", e.into()))?;
        let client = events
            .attach(options.subscription_capacity(shared.settings.subscription_capacity.get()))
            .connect(addrs)
            .await
            .map_err(|e| connect_error("", e.into()))?;
        Self::start_shared(client, shared, factory).await
    }

    /// Starts on an existing client. Its `subscription_capacity` is whatever the caller
    /// connected with, and its client events (slow consumer) are not observed by the
    /// consumer: prefer [`Self::connect_with`].
    pub async fn start<F: HandlerFactory>(
        client: async_nats::Client,
        settings: ConsumerSettings,
        factory: F,
    ) -> Result<Self, ConsumerError> {
        Self::start_shared(client, Arc::new(Shared::new(settings)), factory).await
    }

    async fn start_shared<F: HandlerFactory>(
        client: async_nats::Client,
        shared: Arc<Shared>,
        factory: F,
    ) -> Result<Self, ConsumerError> {
        // Every consumer metric in the worker's first scrape (no-op without a recorder).
        weir_service::metrics::register(crate::metrics::CONSUMER_DECLARED);
        let factory = Arc::new(factory);
        let (stop, stop_rx) = stop::channel();
        let (tasks, leases) = match &shared.settings.lease {
            Some(lease) => {
                let (task, board) = ownership::start(
                    client.clone(),
                    shared.clone(),
                    lease.clone(),
                    factory,
                    stop_rx,
                )
                .await?;
                tracing::info!(
                    subject = %shared.settings.subject,
                    partitions = shared.settings.partitions.get(),
                    worker = lease.worker_id.as_str(),
                    "consumer started with lease ownership"
                );
                (vec![task], Some(board))
            }
            None => (
                subscribe_all(&client, &shared, factory, stop_rx).await?,
                None,
            ),
        };
        let announcer = capacity::announcer::spawn(client.clone(), shared.clone(), leases.clone());
        Ok(Self {
            shared,
            client,
            stop,
            tasks,
            leases,
            announcer,
        })
    }
    /// Lease ownership: every partition's lease as this worker sees it (owner,
    /// revision, whether held here, time left). Empty with static ownership.
    pub fn leases(&self) -> Vec<LeaseInfo> {
        self.leases
            .as_ref()
            .map(|b| weir_service::sync::locked(b).clone())
            .unwrap_or_default()
    }

    /// The partitions this worker delivers now: the static `owned` list, or the
    /// leases it holds whose feed runs.
    pub fn owned_now(&self) -> Vec<u32> {
        capacity::announcer::delivering(&self.shared, self.leases.as_deref())
    }

    /// What this worker's next capacity announcement would say now (its `seq` is the
    /// next one; `sent_at_ms` is now): slots, live streams with their lag, the
    /// real-time factor's p95 and the partitions delivered now. Available with
    /// `capacity.announce = false` too (nothing is published then).
    pub fn capacity(&self) -> weir_protocol::capacity::Announcement {
        let seq = self.shared.capacity.peek_seq();
        capacity::announcer::announcement(&self.shared, self.leases.as_deref(), seq, Instant::now())
    }

    /// Stops every task at once: no drain, no end to the handlers, no lease released,
    /// no goodbye — what a crash (SIGKILL) of the worker looks like to the rest of the
    /// cluster, for failover drills and tests. Handlers are aborted at their next await.
    pub fn abort(self) {
        if let Some(announcer) = &self.announcer {
            announcer.abort();
        }
        for task in &self.tasks {
            task.abort();
        }
    }

    /// A snapshot of the stats (cheap: one lock, O(streams retained)).
    pub fn stats(&self) -> ConsumerStats {
        self.shared.registry().snapshot(Instant::now())
    }

    /// The aggregate stats only: cheaper than [`Self::stats`] (no per-stream copies),
    /// for frequent sampling.
    pub fn totals(&self) -> Totals {
        self.shared.registry().totals(Instant::now())
    }

    /// Subscribes to the consumer's events (reaped, overloaded, lost, restarted,
    /// refused, slow consumer). Bounded: a receiver that lags loses the oldest events.
    pub fn events(&self) -> broadcast::Receiver<ConsumerEvent> {
        self.shared.events.subscribe()
    }

    /// The NATS client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Stops: sends the last capacity announcement (no partition, no live stream),
    /// unsubscribes, ends every live stream with [`EndCause::Shutdown`], waits
    /// up to `grace` for the handlers to finish (aborting the rest) and returns the
    /// final stats.
    pub async fn shutdown(self, grace: Duration) -> ConsumerStats {
        let deadline = Instant::now() + grace;
        // First the last announcement (no partition, no live stream): the doors stop
        // sending new streams here while this worker drains.
        if let Some(announcer) = self.announcer {
            announcer.finish().await;
        }
        self.stop.send_replace(Some(deadline));
        // Each demultiplexer bounds its own wait by the deadline; the extra margin
        // covers scheduling, and with leases the releases after the drain.
        let margin = match self.leases {
            Some(_) => ownership::RELEASE_TIMEOUT + Duration::from_millis(100),
            None => Duration::from_millis(100),
        };
        for task in self.tasks {
            let _ = tokio::time::timeout_at(deadline + margin, task).await;
        }
        self.shared.registry().snapshot(Instant::now())
    }
}

/// Static ownership: one feed (a core subscription, or an ordered JetStream consumer)
/// and one demultiplexer task per owned partition.
async fn subscribe_all<F: HandlerFactory>(
    client: &async_nats::Client,
    shared: &Arc<Shared>,
    factory: Arc<F>,
    stop_rx: stop::StopSignal,
) -> Result<Vec<JoinHandle<()>>, ConsumerError> {
    let subjects = shared
        .settings
        .subscriptions()
        .into_iter()
        .map(|(_, subject)| subject)
        .collect();
    let feeds: Vec<(String, BoxStream<'static, jetstream::Inbound>)> = match &shared.settings.source
    {
        ConsumerSource::Core => subscribe(client, subjects, SUBSCRIBE_CONFIRM_TIMEOUT)
            .await?
            .into_iter()
            .map(|(subject, sub)| (subject, sub.map(Ok).boxed()))
            .collect(),
        ConsumerSource::JetStream { stream, start } => {
            jetstream::ordered_feeds(client, stream, *start, subjects, SUBSCRIBE_CONFIRM_TIMEOUT)
                .await?
        }
    };
    let mut tasks = Vec::with_capacity(feeds.len());
    for (subject, sub) in feeds {
        let demux = Demux::new(shared.clone(), factory.clone());
        tasks.push(tokio::spawn(run_subscription(
            subject,
            sub,
            demux,
            shared.settings.idle_timeout,
            stop_rx.clone(),
        )));
    }
    tracing::info!(
        subject = %shared.settings.subject,
        partitions = shared.settings.partitions.get(),
        owned = ?shared.settings.owned,
        source = ?shared.settings.source,
        "consumer subscribed"
    );
    Ok(tasks)
}

/// Pause after an error of the JetStream source, so that a source that keeps failing
/// cannot spin (each error already means its feed is interrupted).
const SOURCE_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Feeds one subscription (core) or ordered consumer (JetStream) into its
/// demultiplexer until shutdown.
pub(crate) async fn run_subscription<F: HandlerFactory>(
    subject: String,
    mut sub: BoxStream<'static, jetstream::Inbound>,
    mut demux: Demux<F>,
    idle_timeout: Duration,
    mut stop: stop::StopSignal,
) {
    let period = (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut subscribed = true;
    let deadline = loop {
        tokio::select! {
            msg = sub.next(), if subscribed => match msg {
                Some(Ok(msg)) => {
                    let headers = msg.headers.as_ref();
                    demux.on_message(
                        msg.subject.as_str(),
                        &msg.payload,
                        |name| headers.and_then(|h| h.get(name)).map(|v| v.as_str()),
                        Instant::now(),
                    );
                }
                Some(Err(error)) => {
                    ::metrics::counter!(crate::metrics::CONSUMER_JETSTREAM_ERRORS_TOTAL).increment(1);
                    static SOURCE_ERROR: weir_service::ratelimit::LogLimit =
                        weir_service::ratelimit::LogLimit::new(Duration::from_secs(10));
                    if let Some(suppressed) = SOURCE_ERROR.allow() {
                        tracing::warn!(subject, %error, suppressed, "JetStream source error; it recovers by itself");
                    }
                    tokio::time::sleep(SOURCE_ERROR_PAUSE).await;
                }
                None => {
                    tracing::warn!(subject, "subscription closed by the client");
                    subscribed = false;
                }
            },
            _ = tick.tick() => {
                demux.reap(Instant::now());
            }
            deadline = stop::stopped(&mut stop) => break deadline,
        }
    };
    // Dropping the subscriber unsubscribes without waiting on the client's channel.
    drop(sub);
    tracing::debug!(subject, streams = demux.active(), "subscription stopping");
    demux.shutdown(deadline).await;
}

#[cfg(test)]
mod error_tests {
    use super::*;

    fn settings(source: ConsumerSource) -> ConsumerSettings {
        let mut cfg = ConsumerConfig::partitioned("err.{partition}.{stream}", 1, [0]);
        cfg.source = source;
        cfg.validate().expect("valid config")
    }

    /// Walks the `source()` chain for an error of type `T`.
    fn find_cause<T: std::error::Error + 'static>(e: &ConsumerError) -> bool {
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            if c.downcast_ref::<T>().is_some() {
                return true;
            }
            cause = c.source();
        }
        false
    }

    #[tokio::test]
    async fn a_connect_failure_keeps_the_connect_error_as_source() {
        // A port that was free a moment ago: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("nats://127.0.0.1:{port}");
        let factory = |_: &StreamInfo| ignore_events();
        let Err(e) = Consumer::connect(&url, settings(ConsumerSource::Core), factory).await else {
            panic!("nothing listens on {url}");
        };
        assert_eq!(e.kind(), ConsumerErrorKind::Connect);
        assert_eq!(e.config_key(), None);
        assert!(
            e.to_string()
                .starts_with(&format!("cannot connect to NATS at {url}: "))
        );
        assert!(find_cause::<async_nats::ConnectError>(&e), "{e:?}");
    }

    #[tokio::test]
    async fn a_missing_jetstream_stream_keeps_the_jetstream_error_as_source() {
        // A server without JetStream: the ordered consumers cannot be made.
        let server = weir_testkit::NatsServer::start().expect("nats-server");
        let factory = |_: &StreamInfo| ignore_events();
        let Err(e) = Consumer::connect(
            server.url(),
            settings(ConsumerSource::jetstream("WEIR_AUDIO")),
            factory,
        )
        .await
        else {
            panic!("no JetStream on this server");
        };
        assert_eq!(e.kind(), ConsumerErrorKind::Subscribe);
        assert!(
            find_cause::<async_nats::jetstream::context::GetStreamError>(&e),
            "{e:?}"
        );
    }

    #[test]
    fn a_config_error_stays_a_value() {
        let mut cfg = ConsumerConfig::partitioned("err.{partition}.{stream}", 1, [0]);
        cfg.max_streams = 0;
        let e = cfg.validate().expect_err("invalid");
        assert_eq!(e.kind(), ConsumerErrorKind::Config);
        assert_eq!(e.config_key(), Some("max_streams"));
        assert!(std::error::Error::source(&e).is_none());
    }

    /// A handler that drops every event.
    fn ignore_events() -> impl StreamHandler {
        struct Ignore;
        impl StreamHandler for Ignore {
            async fn on_event(&mut self, _: StreamEvent) {}
        }
        Ignore
    }
}
