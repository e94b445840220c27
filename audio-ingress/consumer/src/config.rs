//! Consumer configuration: a raw, serde-friendly [`ConsumerConfig`] validated once into
//! a [`ConsumerSettings`] that cannot be invalid.
//!
//! Every refusal names the key and the allowed range. Durations are configured in
//! milliseconds (`*_ms` keys) and carried as [`Duration`] inside the code.

use std::collections::BTreeSet;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use weir_protocol::SubjectTemplate;
use weir_protocol::partition::{DEFAULT_STREAM_TEMPLATE, MAX_PARTITIONS};

use weir_service::config::{Range, whole_ms as ms};

use super::ConsumerError;
pub use crate::capacity::{CapacityConfig, CapacitySettings};

/// Default per-stream byte bound: 0.5 s of 16 kHz s16le mono.
pub const DEFAULT_MAX_PENDING_BYTES: usize = 16_000;
/// Default per-stream age bound.
pub const DEFAULT_MAX_PENDING_AGE: Duration = Duration::from_millis(500);
/// Default silence after which a stream without `end` is reaped.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default async-nats `subscription_capacity` (messages buffered per subscription
/// before the client drops and reports a slow consumer): ~5 MB of 640-byte frames,
/// 160 stream-seconds of audio.
pub const DEFAULT_SUBSCRIPTION_CAPACITY: usize = 8_192;
/// Default number of finished streams whose stats stay in the snapshot.
pub const DEFAULT_RETAIN_FINISHED: usize = 10_000;
/// Default cap on live stream instances per consumer (`max_streams`).
pub const DEFAULT_MAX_STREAMS: usize = 10_000;
/// Default staleness guard (`max_frame_age_ms`): a frame captured more than 1 s before
/// it reaches the consumer is dropped before the handler and declared as a
/// [`GapCause::Stale`](super::GapCause::Stale) gap.
///
/// Why 1 s: the ingress promises that no frame older than its budget (`max_age`,
/// 500 ms by default) plus one confirmation round reaches NATS unsignalled, so a frame
/// older than ~1 s at the consumer means that promise was broken somewhere (a stalled
/// server, an old producer, a backlog in this process's client buffer); and audio that
/// late is useless to a real-time recogniser, whose reply would arrive after the
/// caller moved on. 1 s also leaves a few hundred milliseconds for clock skew between
/// producer and consumer hosts (the age is the consumer's wall clock minus the
/// producer's capture time; NTP keeps hosts within milliseconds). Frames without a
/// capture time (the deployed Python producers) are never judged.
pub const DEFAULT_MAX_FRAME_AGE: Duration = Duration::from_millis(1_000);

/// Allowed range of `max_frame_age_ms` when not `0` (off): at least 50 ms (below that
/// ordinary scheduling would make every frame stale), at most 10 minutes.
pub const MAX_FRAME_AGE_RANGE_MS: Range =
    Range::ms(50, 600_000).note(", or 0 to turn the staleness guard off");

/// What a stream's queue does when its handler falls behind its bytes/age bound (the
/// type both queues share).
pub use weir_service::bounded::WhenFull as ConsumerPolicy;

/// Where the consumer reads the audio packets from.
///
/// ```toml
/// source = "core"                                       # the default
/// source = { jetstream = { stream = "WEIR_AUDIO" } }    # lossless mode
/// source = { jetstream = { stream = "WEIR_AUDIO", start = "all" } }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumerSource {
    /// Core NATS: one subscription per owned partition subject (at-most-once; a hole
    /// is counted as lost or, when the producer declared it, possibly lost).
    #[default]
    Core,
    /// JetStream (the ingress's `delivery = "jetstream"`): one **ordered** push
    /// consumer per owned partition subject on `stream`, which delivers the stream's
    /// messages in stream order with no ack and recreates itself (from the last
    /// delivered stream sequence) after a reconnect, a server restart or a sequence
    /// mismatch. See [`crate`] § JetStream source.
    #[serde(rename = "jetstream")]
    JetStream {
        /// The JetStream stream the ingress publishes into (`jetstream_stream`,
        /// default `WEIR_AUDIO`). 1..=64 characters of `A-Z a-z 0-9 _ -`.
        stream: String,
        /// Where a freshly started consumer begins. Default [`JetStreamStart::New`].
        #[serde(default)]
        start: JetStreamStart,
    },
}

impl ConsumerSource {
    /// The JetStream source on `stream`, starting at new messages.
    pub fn jetstream(stream: impl Into<String>) -> Self {
        Self::JetStream {
            stream: stream.into(),
            start: JetStreamStart::New,
        }
    }
}

/// Where a JetStream-sourced consumer starts when it starts (its later recreations
/// always resume after the last stream sequence it delivered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JetStreamStart {
    /// Only messages stored after the consumer started (the default). A restarting
    /// recognition worker lost its in-RAM per-stream state anyway; calls in progress
    /// are picked up mid-stream (their earlier seqs count as `leading_missing`), and
    /// it does not replay minutes of retained audio that is useless in real time (and
    /// that the staleness guard would drop as stale anyway).
    #[default]
    New,
    /// Every message the stream still retains (`jetstream_max_age_s`): for batch
    /// re-processing or audits. With the staleness guard on, replayed frames older
    /// than `max_frame_age_ms` are dropped as stale: turn it off (`0`) for a replay.
    All,
}

/// Who decides which partitions this worker reads.
///
/// ```toml
/// ownership = "static"                         # the default: the `owned` list
/// ownership = { lease = {} }                   # leases with every default
/// ownership = { lease = { bucket = "weir_leases", ttl_ms = 15000, renew_interval_ms = 3000,
///                         margin_ms = 1000, heartbeat_interval_ms = 500,
///                         heartbeat_timeout_ms = 1500, replicas = 3 } }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ownership {
    /// The configured `owned` partitions, for the consumer's life (exactly as before
    /// leases existed).
    #[default]
    Static,
    /// Lease-based ownership through a JetStream KV bucket, with failover, fencing and
    /// balancing (see docs/scale-out.md). `owned` is not used.
    Lease(LeaseConfig),
}

/// Default lease length (`ttl_ms`): long enough to ride out the write stall of a KV
/// leader election on a 3-node cluster — ~5 s typically, up to ~9 s measured on
/// nats-server 2.9.10 — even when the leader dies just before a renewal was due
/// (validity left then: TTL − margin − renewal interval = 11 s). The issue's 10 s left
/// 6 s, and 8 of 23 leader kills fenced partitions (docs/scale-out.md).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
/// Default renewal interval.
pub const DEFAULT_LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(3);
/// Default safety margin subtracted from the local validity (covers clock-rate drift
/// between this host and the KV leader, and scheduling delays).
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_secs(1);
/// Default core-NATS heartbeat interval.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// Default heartbeat timeout after which a worker is taken for dead.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(1_500);
/// Default KV bucket name.
pub const DEFAULT_LEASE_BUCKET: &str = "weir_leases";

/// Raw lease settings (every key optional).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseConfig {
    /// KV bucket (the stream `KV_<bucket>` is created if absent). 1..=64 of
    /// `A-Z a-z 0-9 _ -`.
    pub bucket: String,
    /// Lease length, ms (1,000..=600,000): the bucket's `max_age`.
    pub ttl_ms: u64,
    /// Renewal interval, ms: at least 100, at most (TTL − margin) / 2 so that a
    /// renewal that times out is retried before the lease runs out.
    pub renew_interval_ms: u64,
    /// Safety margin, ms: the local validity is last renewal send time + TTL − margin.
    /// At least 1, below TTL / 2.
    pub margin_ms: u64,
    /// Core-NATS heartbeat interval, ms (50..=60,000).
    pub heartbeat_interval_ms: u64,
    /// A worker not heard for this long is dead and its partitions are taken over, ms:
    /// at least 2 × the interval, below the TTL.
    pub heartbeat_timeout_ms: u64,
    /// Replicas of the bucket's stream (1..=5; 3 on a 3-node cluster).
    pub replicas: usize,
    /// This worker's id (1..=64 of `A-Z a-z 0-9 _ -`); default `w<pid>-<random>`.
    /// Must be unique among live workers.
    pub worker_id: Option<String>,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            bucket: DEFAULT_LEASE_BUCKET.to_owned(),
            ttl_ms: ms(DEFAULT_LEASE_TTL),
            renew_interval_ms: ms(DEFAULT_LEASE_RENEW_INTERVAL),
            margin_ms: ms(DEFAULT_LEASE_MARGIN),
            heartbeat_interval_ms: ms(DEFAULT_HEARTBEAT_INTERVAL),
            heartbeat_timeout_ms: ms(DEFAULT_HEARTBEAT_TIMEOUT),
            replicas: 1,
            worker_id: None,
        }
    }
}

/// Validated lease settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub(crate) bucket: String,
    /// TTL, renewal interval, margin and heartbeat timeout, as the planner uses them.
    pub(crate) timing: crate::lease::Timing,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) replicas: usize,
    pub(crate) worker_id: String,
}

impl LeaseSettings {
    /// The core-NATS subject the workers heartbeat on.
    pub fn heartbeat_subject(&self) -> String {
        format!("weir.lease.{}.heartbeat", self.bucket)
    }
}

/// A bucket, stream or worker name: 1..=64 characters of `A-Z a-z 0-9 _ -`; the error
/// names `key` and starts its reason with `what`.
pub(crate) fn check_name(key: &'static str, what: &str, name: &str) -> Result<(), ConsumerError> {
    match weir_protocol::capacity::is_valid_id(name) {
        true => Ok(()),
        false => Err(ConsumerError::config(
            key,
            format!("{what}{name:?}: 1..=64 characters of A-Z a-z 0-9 _ -"),
        )),
    }
}

impl LeaseConfig {
    /// Validates every key; the error names the first bad key.
    pub fn validate(&self) -> Result<LeaseSettings, ConsumerError> {
        check_name("ownership.lease.bucket", "", &self.bucket)?;
        let key = |name: &str| format!("ownership.lease.{name}");
        let ttl = Range::ms(1_000, 600_000).check(&key("ttl_ms"), self.ttl_ms)?;
        let margin = Range::ms(1, ttl / 2 - 1)
            .note(" (below TTL / 2)")
            .check(&key("margin_ms"), self.margin_ms)?;
        let renew = Range::ms(100, (ttl - margin) / 2)
            .note(" (at most (TTL − margin) / 2)")
            .check(&key("renew_interval_ms"), self.renew_interval_ms)?;
        let hb = Range::ms(50, 60_000)
            .check(&key("heartbeat_interval_ms"), self.heartbeat_interval_ms)?;
        let hb_timeout = Range::ms(hb.saturating_mul(2), ttl - 1)
            .note(" (2 × heartbeat_interval_ms up to below the TTL)")
            .check(&key("heartbeat_timeout_ms"), self.heartbeat_timeout_ms)?;
        let replicas = Range::int(1, 5).size(&key("replicas"), self.replicas as u64)?;
        let worker_id = match &self.worker_id {
            Some(id) => check_name("ownership.lease.worker_id", "", id).map(|()| id.clone())?,
            None => default_worker_id(),
        };
        Ok(LeaseSettings {
            bucket: self.bucket.clone(),
            timing: crate::lease::Timing {
                ttl: Duration::from_millis(ttl),
                renew_interval: Duration::from_millis(renew),
                margin: Duration::from_millis(margin),
                heartbeat_timeout: Duration::from_millis(hb_timeout),
            },
            heartbeat_interval: Duration::from_millis(hb),
            replicas,
            worker_id,
        })
    }
}

/// `w<pid>-<nanoseconds of the start time, hex>`: unique per process on a host, and
/// across hosts with overwhelming probability.
pub(crate) fn default_worker_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ (d.as_secs() as u32));
    format!("w{}-{nanos:08x}", std::process::id())
}

/// Raw consumer configuration, as read from a file or built in code.
///
/// ```toml
/// subject = "audio.{partition}.{stream}"
/// partitions = 8
/// owned = [0, 1, 2, 3]
/// max_pending_bytes = 16000
/// max_pending_age_ms = 500
/// policy = "close"
/// idle_timeout_ms = 5000
/// subscription_capacity = 8192
/// max_streams = 10000
/// max_frame_age_ms = 1000   # 0 = staleness guard off
/// source = "core"           # or { jetstream = { stream = "WEIR_AUDIO" } }
/// ownership = "static"      # or { lease = { ... } }, see [`Ownership`]
/// capacity = { announce = true, prefix = "weir.capacity", interval_ms = 1000 }
///                           # see [`CapacityConfig`]
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Subject template with `{stream}` and, for partitioned deployments,
    /// `{partition}`. Default: the deployed `inference.whisper.stream.{stream}`.
    pub subject: String,
    /// Total number of partitions N (`partition = FNV-1a-32(stream) mod N`). 1..=4096.
    pub partitions: u32,
    /// The partitions this worker owns (each `< partitions`, at least one, no
    /// duplicates). A template without `{partition}` must own all of them.
    pub owned: Vec<u32>,
    /// Per-stream bound on queued PCM bytes (3,200..=1,920,000).
    pub max_pending_bytes: usize,
    /// Per-stream bound on the age of the oldest queued frame, ms (20..=60,000).
    pub max_pending_age_ms: u64,
    /// What happens when a stream's handler is over its bound.
    pub policy: ConsumerPolicy,
    /// Silence after which a stream that never sent `end` is reaped, ms
    /// (50..=3,600,000); must be above `max_pending_age_ms`.
    pub idle_timeout_ms: u64,
    /// async-nats `subscription_capacity`: messages buffered per subscription (one per
    /// owned partition) before the client drops them and reports a slow consumer
    /// (64..=1,048,576).
    pub subscription_capacity: usize,
    /// How many finished streams keep their stats in the snapshot (1..); their counts
    /// always stay in the totals.
    pub retain_finished_streams: usize,
    /// Live stream instances this consumer follows at once, over all its
    /// subscriptions (1..=1,000,000). A new stream beyond it is refused: no handler,
    /// its frames counted as `frames_refused`, a [`ConsumerEvent::StreamRefused`](super::ConsumerEvent::StreamRefused)
    /// and a capacity refusal notice (repeated at most once per announcement interval
    /// while its packets keep arriving). These are the worker's slots: announced to the
    /// doors, and its weight in the lease balance.
    pub max_streams: usize,
    /// Staleness guard, ms: a frame whose capture time (meta `captured_at_ms`, else
    /// the `Weir-Captured-At-Ms` header) is older than this on the consumer's wall
    /// clock is dropped before the handler, declared to it as a
    /// [`GapCause::Stale`](super::GapCause::Stale) gap and counted as `stale_frames`.
    /// `0` turns the guard off; otherwise 50..=600,000. Default 1,000 (see
    /// [`DEFAULT_MAX_FRAME_AGE`]). Frames without a capture time are never judged.
    pub max_frame_age_ms: u64,
    /// Where packets come from: core NATS subscriptions (default) or ordered
    /// JetStream consumers on the ingress's stream (lossless mode).
    pub source: ConsumerSource,
    /// Who decides the owned partitions: the static `owned` list (default) or leases
    /// in a JetStream KV bucket ([`Ownership::Lease`], which needs a `{partition}`
    /// subject and ignores `owned`).
    pub ownership: Ownership,
    /// Capacity announcements and refusal notices ([`CapacityConfig`]: `announce`,
    /// `prefix`, `interval_ms`, `worker_id`): the worker's slots (`max_streams`), live
    /// streams with their lag, and real-time factor on `<prefix>.announce.<worker>`
    /// every interval, and a notice on `<prefix>.refused.<stream>` per stream refused
    /// for `max_streams`. On by default.
    pub capacity: CapacityConfig,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            subject: DEFAULT_STREAM_TEMPLATE.to_owned(),
            partitions: 1,
            owned: vec![0],
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            max_pending_age_ms: ms(DEFAULT_MAX_PENDING_AGE),
            policy: ConsumerPolicy::Close,
            idle_timeout_ms: ms(DEFAULT_IDLE_TIMEOUT),
            subscription_capacity: DEFAULT_SUBSCRIPTION_CAPACITY,
            retain_finished_streams: DEFAULT_RETAIN_FINISHED,
            max_streams: DEFAULT_MAX_STREAMS,
            max_frame_age_ms: ms(DEFAULT_MAX_FRAME_AGE),
            source: ConsumerSource::Core,
            ownership: Ownership::Static,
            capacity: CapacityConfig::default(),
        }
    }
}

/// Validated consumer settings. Build with [`ConsumerConfig::validate`].
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub(crate) subject: SubjectTemplate,
    pub(crate) partitions: NonZeroU32,
    pub(crate) owned: BTreeSet<u32>,
    pub(crate) limits: QueueLimits,
    pub(crate) idle_timeout: Duration,
    pub(crate) subscription_capacity: NonZeroUsize,
    pub(crate) retain_finished: NonZeroUsize,
    pub(crate) max_streams: NonZeroUsize,
    pub(crate) max_frame_age: Option<Duration>,
    pub(crate) source: ConsumerSource,
    pub(crate) lease: Option<LeaseSettings>,
    pub(crate) capacity: CapacitySettings,
}

/// The bound of one stream's queue (the type both queues share).
pub use weir_service::bounded::QueueLimits;

impl ConsumerConfig {
    /// A config for a partitioned subject: N partitions, owning `owned`.
    pub fn partitioned(
        subject: &str,
        partitions: u32,
        owned: impl IntoIterator<Item = u32>,
    ) -> Self {
        Self {
            subject: subject.to_owned(),
            partitions,
            owned: owned.into_iter().collect(),
            ..Self::default()
        }
    }

    /// A config for a partitioned subject with N partitions owned by lease.
    pub fn leased(subject: &str, partitions: u32, lease: LeaseConfig) -> Self {
        Self {
            subject: subject.to_owned(),
            partitions,
            ownership: Ownership::Lease(lease),
            ..Self::default()
        }
    }

    /// Validates every key; the error names the first bad key and its allowed range.
    pub fn validate(&self) -> Result<ConsumerSettings, ConsumerError> {
        let subject = SubjectTemplate::parse(&self.subject)
            .map_err(|e| ConsumerError::config("subject", e.to_string()))?;
        let partitions = Range::int(1, u64::from(MAX_PARTITIONS))
            .check("partitions", u64::from(self.partitions))?;
        let partitions = NonZeroU32::new(partitions as u32).unwrap_or(NonZeroU32::MIN);
        let lease = match &self.ownership {
            Ownership::Static => None,
            Ownership::Lease(l) => {
                if !subject.is_partitioned() {
                    return Err(ConsumerError::config(
                        "ownership",
                        format!(
                            "lease ownership needs a subject with a {{partition}} token; {:?} has none",
                            subject.as_str()
                        ),
                    ));
                }
                if self.source != ConsumerSource::Core {
                    return Err(ConsumerError::config(
                        "ownership",
                        "lease ownership works with source = \"core\" only (not yet with the JetStream source)".into(),
                    ));
                }
                Some(l.validate()?)
            }
        };
        let owned = self.owned_partitions(&subject, partitions, lease.is_some())?;
        // At least one 100 ms frame, at most 60 s of audio per stream.
        let max_bytes = Range::bytes(3_200, 1_920_000)
            .size("max_pending_bytes", self.max_pending_bytes as u64)?;
        let max_age_ms =
            Range::ms(20, 60_000).check("max_pending_age_ms", self.max_pending_age_ms)?;
        let idle_ms = Range::ms(50, 3_600_000).check("idle_timeout_ms", self.idle_timeout_ms)?;
        if idle_ms <= max_age_ms {
            return Err(ConsumerError::config(
                "idle_timeout_ms",
                format!("{idle_ms} ms must be above max_pending_age_ms ({max_age_ms} ms)"),
            ));
        }
        let subscription_capacity = Range::int(64, 1_048_576)
            .count("subscription_capacity", self.subscription_capacity as u64)?;
        let retain_finished = NonZeroUsize::new(self.retain_finished_streams).ok_or_else(|| {
            ConsumerError::config("retain_finished_streams", "must be at least 1".into())
        })?;
        let max_streams = Range::int(1, 1_000_000).count("max_streams", self.max_streams as u64)?;
        let max_frame_age = match self.max_frame_age_ms {
            0 => None,
            v => Some(MAX_FRAME_AGE_RANGE_MS.millis("max_frame_age_ms", v)?),
        };
        if let ConsumerSource::JetStream { stream, .. } = &self.source {
            check_name("source", "JetStream stream name ", stream)?;
        }
        let capacity_settings = self
            .capacity
            .validate(lease.as_ref().map(|l| l.worker_id.as_str()))?;
        Ok(ConsumerSettings {
            subject,
            partitions,
            owned,
            limits: QueueLimits {
                max_bytes,
                max_age: Duration::from_millis(max_age_ms),
                policy: self.policy,
            },
            idle_timeout: Duration::from_millis(idle_ms),
            subscription_capacity,
            retain_finished,
            max_streams,
            max_frame_age,
            source: self.source.clone(),
            lease,
            capacity: capacity_settings,
        })
    }

    /// The owned partitions (`owned`): each below `partitions`, none twice, all of them
    /// for a template without `{partition}`; empty under leases (decided at run time).
    fn owned_partitions(
        &self,
        subject: &SubjectTemplate,
        partitions: NonZeroU32,
        leased: bool,
    ) -> Result<BTreeSet<u32>, ConsumerError> {
        if leased {
            return Ok(BTreeSet::new());
        }
        if self.owned.is_empty() {
            return Err(ConsumerError::config(
                "owned",
                "must list at least one partition".into(),
            ));
        }
        let mut owned = BTreeSet::new();
        for &p in &self.owned {
            if p >= partitions.get() {
                return Err(ConsumerError::config(
                    "owned",
                    format!(
                        "partition {p} is out of range; allowed 0..={}",
                        partitions.get() - 1
                    ),
                ));
            }
            if !owned.insert(p) {
                return Err(ConsumerError::config(
                    "owned",
                    format!("partition {p} is listed twice"),
                ));
            }
        }
        if !subject.is_partitioned() && owned.len() != partitions.get() as usize {
            return Err(ConsumerError::config(
                "owned",
                format!(
                    "subject {:?} has no {{partition}} token, so every worker would receive \
                     every stream; own all {} partitions, or use a partitioned subject \
                     (producer-computed or a nats-server mapping, see docs/audio-ingress.md)",
                    subject.as_str(),
                    partitions.get()
                ),
            ));
        }
        Ok(owned)
    }
}

impl ConsumerSettings {
    /// The staleness guard (`max_frame_age_ms`); `None` when off.
    pub fn max_frame_age(&self) -> Option<Duration> {
        self.max_frame_age
    }

    /// The subjects this worker subscribes to: one per owned partition, or the single
    /// wildcard of a template without `{partition}`.
    pub fn subscriptions(&self) -> Vec<(Option<u32>, String)> {
        if self.subject.is_partitioned() {
            self.owned
                .iter()
                .map(|&p| (Some(p), self.subject.pattern_for_partition(p)))
                .collect()
        } else {
            vec![(None, self.subject.wildcard())]
        }
    }

    /// The nats-server `mappings` entry that routes the plain subject `plain` (a
    /// template without `{partition}`, e.g. the deployed
    /// `inference.whisper.stream.{stream}`) onto this partitioned subject, for
    /// deployments whose producers do not compute the partition themselves.
    ///
    /// `None` when this subject has no `{partition}` token, when `plain` has one, or
    /// when the tokens cannot be mapped (the stream must be the only wildcard).
    pub fn server_mapping_for(&self, plain: &SubjectTemplate) -> Option<String> {
        if !self.subject.is_partitioned() || plain.is_partitioned() {
            return None;
        }
        // nats-server numbers the *wildcards* of the source subject, not its tokens;
        // a template without `{partition}` has exactly one: the stream.
        let k = 1;
        let dest = self
            .subject
            .as_str()
            .replace(
                "{partition}",
                &format!("{{{{partition({},{k})}}}}", self.partitions),
            )
            .replace("{stream}", &format!("{{{{wildcard({k})}}}}"));
        Some(format!("\"{}\": \"{}\"", plain.wildcard(), dest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ConsumerErrorKind;

    fn key_of(cfg: &ConsumerConfig) -> String {
        match cfg.validate() {
            Ok(_) => "ok".into(),
            Err(e) => {
                assert_eq!(e.kind(), ConsumerErrorKind::Config);
                e.config_key().unwrap_or_default().to_owned()
            }
        }
    }

    fn leased(f: impl FnOnce(&mut LeaseConfig)) -> ConsumerConfig {
        let mut lease = LeaseConfig::default();
        f(&mut lease);
        ConsumerConfig::leased("audio.{partition}.{stream}", 64, lease)
    }

    #[test]
    fn static_ownership_is_the_default_and_unchanged() {
        let cfg = ConsumerConfig::default();
        assert_eq!(cfg.ownership, Ownership::Static);
        let settings = cfg.validate().expect("valid");
        assert!(settings.lease.is_none());
        assert_eq!(settings.owned.iter().copied().collect::<Vec<_>>(), vec![0]);
        let parsed: ConsumerConfig = toml::from_str("partitions = 1").expect("toml");
        assert_eq!(parsed.ownership, Ownership::Static);
    }

    #[test]
    fn lease_defaults_and_toml() {
        let settings = leased(|_| {}).validate().expect("valid");
        let lease = settings.lease.as_ref().expect("lease");
        assert_eq!(lease.timing.ttl, DEFAULT_LEASE_TTL);
        assert_eq!(lease.timing.renew_interval, DEFAULT_LEASE_RENEW_INTERVAL);
        assert_eq!(lease.timing.heartbeat_timeout, DEFAULT_HEARTBEAT_TIMEOUT);
        assert_eq!(settings.owned.len(), 0, "owned is decided by the leases");
        assert!(lease.worker_id.starts_with('w'));
        let parsed: ConsumerConfig = toml::from_str(
            "subject = \"a.{partition}.{stream}\"\npartitions = 8\n\
             ownership = { lease = { bucket = \"b1\", ttl_ms = 6000, renew_interval_ms = 2000, replicas = 3, worker_id = \"x\" } }",
        )
        .expect("toml");
        let s = parsed.validate().expect("valid");
        let l = s.lease.as_ref().expect("lease");
        assert_eq!(
            (l.bucket.as_str(), l.timing.ttl, l.replicas),
            ("b1", Duration::from_secs(6), 3)
        );
        assert_eq!(l.worker_id, "x");
    }

    #[test]
    fn lease_keys_are_validated_by_name() {
        // Against a 10 s TTL, whatever the default.
        let leased = |f: fn(&mut LeaseConfig)| {
            leased(move |l| {
                l.ttl_ms = 10_000;
                f(l);
            })
        };
        assert_eq!(
            key_of(&leased(|l| l.bucket = "a.b".into())),
            "ownership.lease.bucket"
        );
        assert_eq!(
            key_of(&leased(|l| l.ttl_ms = 999)),
            "ownership.lease.ttl_ms"
        );
        assert_eq!(
            key_of(&leased(|l| l.margin_ms = 0)),
            "ownership.lease.margin_ms"
        );
        assert_eq!(
            key_of(&leased(|l| l.margin_ms = 5_000)),
            "ownership.lease.margin_ms"
        );
        // (10 s − 1 s) / 2 = 4.5 s at most.
        assert_eq!(
            key_of(&leased(|l| l.renew_interval_ms = 4_600)),
            "ownership.lease.renew_interval_ms"
        );
        assert_eq!(key_of(&leased(|l| l.renew_interval_ms = 4_500)), "ok");
        assert_eq!(
            key_of(&leased(|l| l.heartbeat_interval_ms = 10)),
            "ownership.lease.heartbeat_interval_ms"
        );
        assert_eq!(
            key_of(&leased(|l| l.heartbeat_timeout_ms = 900)),
            "ownership.lease.heartbeat_timeout_ms"
        );
        assert_eq!(
            key_of(&leased(|l| l.heartbeat_timeout_ms = 10_000)),
            "ownership.lease.heartbeat_timeout_ms"
        );
        assert_eq!(
            key_of(&leased(|l| l.replicas = 0)),
            "ownership.lease.replicas"
        );
        assert_eq!(
            key_of(&leased(|l| l.worker_id = Some("a b".into()))),
            "ownership.lease.worker_id"
        );
        let mut plain = leased(|_| {});
        plain.subject = "inference.whisper.stream.{stream}".into();
        assert_eq!(key_of(&plain), "ownership");
        let mut js = leased(|_| {});
        js.source = ConsumerSource::jetstream("WEIR_AUDIO");
        assert_eq!(key_of(&js), "ownership");
    }

    #[test]
    fn defaults_are_valid_and_deployed() {
        let s = ConsumerConfig::default()
            .validate()
            .expect("defaults valid");
        assert_eq!(
            s.subscriptions(),
            vec![(None, "inference.whisper.stream.*".to_owned())]
        );
        assert_eq!(s.limits.max_bytes, 16_000);
        assert_eq!(s.limits.max_age, Duration::from_millis(500));
        assert_eq!(s.max_streams.get(), 10_000);
        assert_eq!(s.max_frame_age(), Some(Duration::from_millis(1_000)));
    }

    #[test]
    fn max_frame_age_zero_is_off_and_out_of_range_names_the_key() {
        let off = ConsumerConfig {
            max_frame_age_ms: 0,
            ..ConsumerConfig::default()
        };
        assert_eq!(off.validate().expect("valid").max_frame_age(), None);
        for bad in [1, 49, 600_001, u64::MAX] {
            let err = ConsumerConfig {
                max_frame_age_ms: bad,
                ..ConsumerConfig::default()
            }
            .validate()
            .expect_err("out of range");
            assert_eq!(err.config_key(), Some("max_frame_age_ms"));
            let msg = err.to_string();
            assert!(
                msg.contains("50..=600000 ms") && msg.contains("0 to turn"),
                "{msg}"
            );
        }
        let cfg: ConsumerConfig = toml::from_str("max_frame_age_ms = 250\n").expect("toml");
        assert_eq!(
            cfg.validate().expect("valid").max_frame_age(),
            Some(Duration::from_millis(250))
        );
        // Absent: the default.
        let cfg: ConsumerConfig = toml::from_str("max_streams = 5\n").expect("toml");
        assert_eq!(cfg.max_frame_age_ms, 1_000);
    }

    #[test]
    fn partitioned_subscribes_only_owned() {
        let s = ConsumerConfig::partitioned("audio.{partition}.{stream}", 8, [5, 1])
            .validate()
            .expect("valid");
        assert_eq!(
            s.subscriptions(),
            vec![
                (Some(1), "audio.1.*".to_owned()),
                (Some(5), "audio.5.*".to_owned())
            ]
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let base = ConsumerConfig::partitioned("audio.{partition}.{stream}", 4, [0]);
        let cases: Vec<(ConsumerConfig, &str)> = vec![
            (
                ConsumerConfig {
                    subject: "audio.*".into(),
                    ..base.clone()
                },
                "subject",
            ),
            (
                ConsumerConfig {
                    partitions: 0,
                    ..base.clone()
                },
                "partitions",
            ),
            (
                ConsumerConfig {
                    owned: vec![],
                    ..base.clone()
                },
                "owned",
            ),
            (
                ConsumerConfig {
                    owned: vec![4],
                    ..base.clone()
                },
                "owned",
            ),
            (
                ConsumerConfig {
                    owned: vec![1, 1],
                    ..base.clone()
                },
                "owned",
            ),
            (
                ConsumerConfig {
                    max_pending_bytes: 0,
                    ..base.clone()
                },
                "max_pending_bytes",
            ),
            (
                ConsumerConfig {
                    max_pending_age_ms: 0,
                    ..base.clone()
                },
                "max_pending_age_ms",
            ),
            (
                ConsumerConfig {
                    idle_timeout_ms: 400,
                    ..base.clone()
                },
                "idle_timeout_ms",
            ),
            (
                ConsumerConfig {
                    subscription_capacity: 1,
                    ..base.clone()
                },
                "subscription_capacity",
            ),
            (
                ConsumerConfig {
                    retain_finished_streams: 0,
                    ..base.clone()
                },
                "retain_finished_streams",
            ),
            (
                ConsumerConfig {
                    max_streams: 0,
                    ..base.clone()
                },
                "max_streams",
            ),
            (
                ConsumerConfig {
                    max_streams: 1_000_001,
                    ..base.clone()
                },
                "max_streams",
            ),
            (
                ConsumerConfig {
                    subject: "inference.whisper.stream.{stream}".into(),
                    ..base.clone()
                },
                "owned",
            ),
        ];
        for (cfg, key) in cases {
            assert_eq!(key_of(&cfg), key, "{cfg:?}");
        }
        assert_eq!(key_of(&base), "ok");
    }

    #[test]
    fn config_parses_from_toml_and_refuses_unknown_keys() {
        let cfg: ConsumerConfig = toml::from_str(
            "subject = \"audio.{partition}.{stream}\"\npartitions = 8\nowned = [2]\npolicy = \"gap\"\n",
        )
        .expect("toml");
        assert_eq!(cfg.policy, ConsumerPolicy::Gap);
        assert_eq!(cfg.owned, vec![2]);
        assert!(toml::from_str::<ConsumerConfig>("partitons = 8\n").is_err());
    }

    #[test]
    fn source_parses_from_toml_and_validates_the_stream_name() {
        let cfg: ConsumerConfig = toml::from_str("max_streams = 5\n").expect("toml");
        assert_eq!(cfg.source, ConsumerSource::Core);
        let cfg: ConsumerConfig = toml::from_str("source = \"core\"\n").expect("toml");
        assert_eq!(cfg.source, ConsumerSource::Core);
        let cfg: ConsumerConfig =
            toml::from_str("source = { jetstream = { stream = \"WEIR_AUDIO\" } }\n").expect("toml");
        assert_eq!(cfg.source, ConsumerSource::jetstream("WEIR_AUDIO"));
        let s = cfg.validate().expect("valid");
        assert_eq!(&s.source, &ConsumerSource::jetstream("WEIR_AUDIO"));
        let cfg: ConsumerConfig =
            toml::from_str("[source.jetstream]\nstream = \"A-1\"\nstart = \"all\"\n")
                .expect("toml");
        assert_eq!(
            cfg.source,
            ConsumerSource::JetStream {
                stream: "A-1".into(),
                start: JetStreamStart::All
            }
        );
        assert!(toml::from_str::<ConsumerConfig>("source = \"jetstream\"\n").is_err());
        for bad in ["", "a.b", "a*", "a b", &"x".repeat(65)] {
            let cfg = ConsumerConfig {
                source: ConsumerSource::jetstream(bad),
                ..ConsumerConfig::default()
            };
            assert_eq!(key_of(&cfg), "source", "{bad:?}");
        }
    }

    #[test]
    fn server_mapping_matches_documented_form() {
        let s = ConsumerConfig::partitioned("audio.{partition}.{stream}", 8, [0])
            .validate()
            .expect("valid");
        let plain = SubjectTemplate::parse("inference.whisper.stream.{stream}").expect("valid");
        assert_eq!(
            s.server_mapping_for(&plain).as_deref(),
            Some("\"inference.whisper.stream.*\": \"audio.{{partition(8,1)}}.{{wildcard(1)}}\"")
        );
    }
}
