//! The durable intake (`intake = "jetstream"`): requests wait in a JetStream
//! work-queue stream instead of one replica's memory, and every replica pulls them
//! through one durable consumer.
//!
//! Wire contract (docs/llm-adapter.md, "Durable intake"): a request is a message on
//! `jetstream.subject` with the usual `Weir-*` headers, `Weir-Reply-To` = the subject
//! the answer goes to (JetStream keeps no reply subject) and `Nats-Msg-Id` = the
//! request id (the stream drops a second copy within `jetstream.duplicate_window_ms`).
//! With `jetstream.forward` (the default) a core request on `service.subject` is put
//! into the stream by the replica that receives it, so callers stay unchanged.
//!
//! Invariants a reader must not break:
//! - a replica pulls only as many requests as it has free intake permits (`workers`):
//!   what waits, waits in the stream, where any replica can take it; the consumer's
//!   `max_ack_pending` bounds what all replicas hold together;
//! - a pulled request holds its permit inside its [`Ticket`], which rides in the
//!   waiter; the permit (and the cluster session slot) is released exactly once, when
//!   the ticket is dropped after the answer was published;
//! - every pulled request is settled exactly once: `+ACK` after its answer was
//!   published (and kept, see below), `+TERM` when it is refused before admission
//!   (expired deadline, malformed headers, no reply subject, cluster session cap),
//!   `-NAK` when this replica stops (`shutting_down`: another replica answers it; the
//!   caller sees nothing of it) or a store it needs fails (except on its last delivery:
//!   then it is refused and terminated); a replica that dies settles nothing and the
//!   server redelivers after `ack_wait`;
//! - while a request is held, the keeper task sends `+WPI` (progress) every
//!   `progress_interval`, so a long inference is not redelivered while its replica lives;
//! - a request whose deadline passed in the stream is never started: answered
//!   `deadline_exceeded` and terminated;
//! - nothing from the network panics: bad headers are `invalid_request` + `+TERM`,
//!   counted in `weir_llm_intake_terminated_total{reason}`; a pull error (a missed
//!   heartbeat, a server restart) is counted and the loop goes on.
//!
//! The session cap and every `[[limits]]` rule are cluster-wide, as KV slot leases that
//! expire after `ack_wait` with a dead replica ([`ClusterSlots`]). Answers are kept in
//! the reply bucket for the duplicate window (docs/llm-adapter.md, "Durable intake"):
//! - a unary answer with a request id, a refusal too, is kept *before* its `+ACK`
//!   (`+TERM`), for at most `ack_wait` ([`Ticket::settle`]); shutdown waits for these
//!   settlements;
//! - a redelivered request whose answer is kept is answered from it, not run again; an
//!   unreadable bucket hands it back for later, except on its last delivery, which runs
//!   ([`replay_kept`]); a forwarded duplicate gets the original's answer
//!   ([`wait_kept_reply`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer, kv, stream};
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use weir_protocol::llm::headers as h;

mod cluster;
mod keeper;
mod kept;
mod pull;
mod ticket;

#[cfg(test)]
use self::cluster::slot_key;
use self::cluster::{ClusterSlots, open_bucket, reply_key};
pub(crate) use self::cluster::{SlotRefusal, open_reply_bucket};
use self::keeper::keeper;
pub(crate) use self::kept::{KeptReply, conflict, fingerprint, wait_kept_reply};
use self::pull::{PullCtx, pull_loop};
use self::ticket::Hub;
pub(crate) use self::ticket::{Settle, Ticket};
use crate::config::{Config, JetStreamIntake, Mode};
use crate::metrics as m;
use crate::service::Edge;
use weir_service::config::whole_ms;

/// How long one pull request waits on the server for messages.
const PULL_EXPIRES: Duration = Duration::from_millis(1000);
/// Pause after a failed pull request (server gone, consumer deleted) before the next.
const PULL_RETRY: Duration = Duration::from_millis(250);
/// A NAK after a session-store error asks for redelivery after this long (not at once:
/// a KV outage must not burn `max_deliver` in a tight loop).
const STORE_ERROR_DELAY: Duration = Duration::from_secs(1);
/// Pause between two attempts to keep an answer in the reply bucket.
const KEEP_RETRY: Duration = Duration::from_millis(250);

/// Why the durable intake could not be set up, or a store it uses failed: the cause
/// (a JetStream or KV error) kept as `source()`.
pub(crate) type IntakeError = weir_service::Error<IntakeErrorKind>;

/// Machine-readable kind of an [`IntakeError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntakeErrorKind {
    /// `intake` is not `jetstream`.
    NotConfigured,
    /// The work-queue stream could not be created or opened.
    Stream,
    /// The durable consumer could not be created or opened.
    Consumer,
    /// A KV bucket (session slots, replies) could not be created or opened.
    Bucket,
    /// A cluster slot could not be read or written.
    Slot,
}

/// Why a pulled request was terminated without admission (`reason` label).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TermReason {
    /// Its deadline had passed before it was pulled.
    Expired,
    /// A malformed header (answered `invalid_request`).
    Invalid,
    /// No valid `Weir-Reply-To`: nothing can be answered.
    NoReply,
    /// No readable header block (none, or one the NATS client could not decode and
    /// delivered without headers, e.g. a value that is not UTF-8): nothing can be
    /// answered.
    NoHeaders,
    /// Its request id has an answer kept for another body or session (answered
    /// `request_id_conflict`; that answer is not sent, nor replaced).
    RequestIdConflict,
    /// The cluster-wide session cap was reached (answered `session_queue_full`).
    SessionCap,
    /// A cluster-wide limit was full: a reject-limit at once, a wait-limit after its
    /// `max_wait` or with `max_waiters` already waiting here (answered
    /// `concurrency_limit_exceeded`).
    KeyLimit,
    /// Its deadline passed while it waited for a cluster-wide wait-limit slot
    /// (answered `deadline_exceeded`).
    WaitExpired,
    /// The cluster slot store failed on its last delivery (`max_deliver`): answered
    /// `queue_full` rather than left unanswered in the stream.
    SlotStore,
}

/// Publishes one acknowledgement to a JetStream message's ack subject, bounded.
async fn send_ack(client: &async_nats::Client, ack: &Subject, kind: AckKind, limit: Duration) {
    let label = match kind {
        AckKind::Ack => "ack",
        AckKind::Nak(_) => "nak",
        AckKind::Progress => "progress",
        AckKind::Term => "term",
        AckKind::Next => "next",
    };
    let sent = tokio::time::timeout(limit, client.publish(ack.clone(), Bytes::from(kind))).await;
    if matches!(sent, Ok(Ok(()))) {
        metrics::counter!(m::INTAKE_ACKS_TOTAL, "kind" => label).increment(1);
    } else {
        metrics::counter!(m::INTAKE_ACK_FAILED_TOTAL).increment(1);
    }
}

/// Creates (or opens) the work-queue stream, the durable consumer and, with a session
/// cap, the session bucket.
async fn open(
    js: &jetstream::Context,
    cfg: &Config,
    j: &JetStreamIntake,
) -> Result<(consumer::PullConsumer, Option<ClusterSlots>), IntakeError> {
    let max_age = cfg.admission.deadline.max.max(j.duplicate_window);
    let stream = js
        .get_or_create_stream(stream::Config {
            name: j.stream.clone(),
            subjects: vec![j.subject.clone()],
            retention: stream::RetentionPolicy::WorkQueue,
            max_messages: i64::try_from(j.max_messages.get()).unwrap_or(i64::MAX),
            max_bytes: i64::try_from(j.max_bytes.get()).unwrap_or(i64::MAX),
            max_age,
            discard: stream::DiscardPolicy::New,
            duplicate_window: j.duplicate_window,
            storage: if j.file_storage {
                stream::StorageType::File
            } else {
                stream::StorageType::Memory
            },
            num_replicas: j.replicas.get(),
            ..Default::default()
        })
        .await
        .map_err(|e| {
            let what = format!("jetstream.stream {}", j.stream);
            IntakeError::with_source(IntakeErrorKind::Stream, what, e)
        })?;
    let consumer = stream
        .get_or_create_consumer(
            &j.consumer,
            consumer::pull::Config {
                durable_name: Some(j.consumer.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: j.ack_wait,
                max_ack_pending: i64::try_from(j.max_ack_pending.get()).unwrap_or(i64::MAX),
                max_deliver: i64::try_from(j.max_deliver.get()).unwrap_or(i64::MAX),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| {
            let what = format!("jetstream.consumer {}", j.consumer);
            IntakeError::with_source(IntakeErrorKind::Consumer, what, e)
        })?;
    let session_cap = cfg.admission.session.pending_cap.map(|c| c.get());
    let wanted = session_cap.is_some() || !cfg.admission.limits.is_empty();
    let slots = if wanted && cfg.admission.mode == Mode::Enforce {
        let kv = open_bucket(
            js,
            "jetstream.session_bucket",
            &j.session_bucket,
            j.ack_wait,
            j.replicas.get(),
        )
        .await?;
        Some(ClusterSlots {
            kv,
            replica: js_replica_name(),
            session_cap,
            limits: cfg.admission.limits.clone(),
            waiting: Mutex::default(),
        })
    } else {
        None
    };
    Ok((consumer, slots))
}

/// A name for this replica in slot values: process id and a random token.
fn js_replica_name() -> String {
    format!("pid {} {:016x}", std::process::id(), rand::random::<u64>())
}

/// One pulled message, prepared for the edge: its reply subject, the headers with the
/// deadline made absolute, and its ticket.
pub(crate) struct Pulled {
    /// The message as the core edge decodes it (headers rewritten, see [`absolute_deadline`]).
    pub(crate) message: async_nats::Message,
    /// `Weir-Reply-To`.
    pub(crate) reply: Subject,
    /// The hold on the stream message.
    pub(crate) ticket: Ticket,
}

/// The running intake: the pull loop and the keeper.
pub(crate) struct IntakeEdge {
    /// Stops the pull loop (cancelled by [`IntakeEdge::stop_pulling`], or on drop).
    stop: CancellationToken,
    pull: Option<JoinHandle<()>>,
    keeper: Option<JoinHandle<()>>,
    /// The intake permits (`workers`): all free again = every ticket settled.
    permits: Arc<Semaphore>,
    workers: u32,
    /// The longest a ticket can take to settle once answered: its answer's keep
    /// (`keep_limit`), then the `+ACK` (`publish_timeout`).
    settle_limit: Duration,
}

/// The effective absolute deadline (unix ms) of a request published at `published_ms`:
/// the earlier of `Weir-Deadline-Ms` and `published_ms + Weir-Timeout-Ms` (a relative
/// budget counts from the moment the stream stored the request, so time spent waiting
/// in the stream, and on a replica that died, counts); without either,
/// `published_ms + deadline.default_ms` when a default is configured. `Err` = a
/// malformed header (the edge's decoder answers it, naming the header).
pub(crate) fn absolute_deadline(
    deadline: Option<&str>,
    timeout: Option<&str>,
    published_ms: u64,
    default: Option<Duration>,
) -> Result<Option<u64>, ()> {
    let parse = |name, v: Option<&str>| v.map(|v| h::parse_ms(name, v)).transpose();
    let d = parse(h::DEADLINE_MS, deadline).map_err(|_| ())?;
    let t = parse(h::TIMEOUT_MS, timeout).map_err(|_| ())?;
    let from_timeout = t.map(|t| published_ms.saturating_add(t));
    Ok(match (d, from_timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (None, None) => default.map(|d| published_ms.saturating_add(whole_ms(d))),
        (a, b) => a.or(b),
    })
}

/// Whether `s` can be published to: non-empty dot-separated tokens of visible ASCII,
/// no wildcards.
pub(crate) fn valid_reply_subject(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 1024
        && s.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && t.bytes().all(|b| (b'!'..=b'~').contains(&b))
        })
}

/// Rewrites the deadline headers of `headers` to one absolute `Weir-Deadline-Ms`
/// (`deadline_ms`), removing `Weir-Timeout-Ms`.
pub(crate) fn set_deadline(headers: &HeaderMap, deadline_ms: Option<u64>) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, values) in headers.iter() {
        let n: &str = name.as_ref();
        if n.eq_ignore_ascii_case(h::TIMEOUT_MS) || n.eq_ignore_ascii_case(h::DEADLINE_MS) {
            continue;
        }
        for v in values {
            out.append(name.clone(), v.clone());
        }
    }
    if let Some(d) = deadline_ms {
        crate::service::put_static(&mut out, h::DEADLINE_MS, &d.to_string());
    }
    out
}

impl IntakeEdge {
    /// Opens the stream, the consumer and the session bucket, then starts pulling.
    pub(crate) async fn start(
        client: &async_nats::Client,
        config: Arc<Config>,
        edge: Arc<Edge>,
        replies: Option<kv::Store>,
    ) -> Result<Self, IntakeError> {
        let Some(j) = config.intake.jetstream().cloned() else {
            let kind = IntakeErrorKind::NotConfigured;
            return Err(IntakeError::new(kind, "intake is not jetstream"));
        };
        let js = jetstream::new(client.clone());
        let (consumer, slots) = open(&js, &config, &j).await?;
        let (keeper_tx, keeper_rx) = mpsc::unbounded_channel();
        let hub = Arc::new(Hub {
            client: client.clone(),
            publish_timeout: config.nats.publish_timeout,
            held: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            keeper: keeper_tx,
            replies,
            keep_limit: j.ack_wait,
            slots: slots.map(Arc::new),
        });
        let stop = CancellationToken::new();
        let keeper = tokio::spawn(keeper(hub.clone(), j.progress_interval, keeper_rx));
        let workers = config.admission.workers.get();
        let settle_limit = j.ack_wait + config.nats.publish_timeout;
        let permits = Arc::new(Semaphore::new(workers));
        let pull = tokio::spawn(pull_loop(PullCtx {
            consumer,
            hub,
            edge,
            permits: permits.clone(),
            config,
            stop: stop.clone(),
        }));
        Ok(Self {
            stop,
            pull: Some(pull),
            keeper: Some(keeper),
            permits,
            workers: u32::try_from(workers).unwrap_or(u32::MAX),
            settle_limit,
        })
    }

    /// Stops pulling (requests still in the last pull are handed over with `-NAK`).
    /// Bounded by `wait`.
    pub(crate) async fn stop_pulling(&mut self, wait: Duration) {
        self.stop.cancel();
        if let Some(p) = self.pull.take()
            && tokio::time::timeout(wait, p).await.is_err()
        {
            tracing::warn!("intake pull loop did not end in time");
        }
    }

    /// Stops the keeper once every held request was settled (their answers kept and
    /// acknowledged), or after the longest a settlement can take (AckWait +
    /// `publish_timeout`; milliseconds unless the reply bucket is failing): no more
    /// progress. Stopping it earlier would let the runtime drop an answer's keep with
    /// its `+ACK`, and the request would be redelivered and run again.
    pub(crate) async fn stop_keeper(&mut self) {
        // Permits in use are held by tickets (the pull loop has stopped).
        let settled =
            tokio::time::timeout(self.settle_limit, self.permits.acquire_many(self.workers)).await;
        if settled.is_err() {
            tracing::warn!(
                "intake requests still unsettled at shutdown; the server redelivers them"
            );
        }
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
    }
}

/// A dropped intake stops pulling (its tasks hold no handle to it).
impl Drop for IntakeEdge {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::header;

    #[test]
    fn a_relative_budget_counts_from_the_stream_timestamp() {
        let published = 1_000_000;
        assert_eq!(
            absolute_deadline(None, Some("500"), published, None),
            Ok(Some(1_000_500))
        );
        assert_eq!(
            absolute_deadline(Some("1000200"), Some("500"), published, None),
            Ok(Some(1_000_200)),
            "the earlier wins"
        );
        assert_eq!(
            absolute_deadline(None, None, published, Some(Duration::from_secs(2))),
            Ok(Some(1_002_000)),
            "the configured default counts from the stream timestamp too"
        );
        assert_eq!(absolute_deadline(None, None, published, None), Ok(None));
        assert_eq!(
            absolute_deadline(None, Some("soon"), published, None),
            Err(())
        );
        assert_eq!(
            absolute_deadline(Some("-1"), None, published, None),
            Err(())
        );
    }

    #[test]
    fn reply_subjects_are_checked_before_publishing() {
        assert!(valid_reply_subject("_INBOX.abc.def"));
        for bad in ["", "a..b", "a.*", "a.>", "a b", ".a", "a.", "é"] {
            assert!(!valid_reply_subject(bad), "{bad:?}");
        }
    }

    #[test]
    fn slot_keys_are_valid_kv_keys_for_any_session_id() {
        let k = slot_key("call 42/ü.*>", 3);
        assert!(k.starts_with("s.") && k.ends_with(".3"), "{k}");
        assert!(
            k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_'),
            "{k}"
        );
        assert_ne!(slot_key("a", 0), slot_key("a", 1));
        assert_ne!(slot_key("ab", 0), slot_key("a", 0));
        assert_eq!(reply_key("a."), "r.612e");
    }

    #[test]
    fn deadline_headers_are_rewritten_to_one_absolute_value() {
        let mut hm = HeaderMap::new();
        hm.insert("Weir-Timeout-Ms", "500");
        hm.insert("weir-deadline-ms", "99");
        hm.insert("Weir-Session-Id", "s");
        let out = set_deadline(&hm, Some(1234));
        assert_eq!(header(Some(&out), h::TIMEOUT_MS), None);
        assert_eq!(header(Some(&out), h::DEADLINE_MS), Some("1234"));
        assert_eq!(header(Some(&out), h::SESSION_ID), Some("s"));
        let none = set_deadline(&hm, None);
        assert_eq!(header(Some(&none), h::DEADLINE_MS), None);
    }
}
