//! The wire audit of `producer-flap`: every audio packet on NATS, per stream id, before
//! any consumer logic could refuse or hide it.
//!
//! A recogniser built on weir's consumer core would refuse a duplicate or an
//! out-of-order packet and start a new handler on a `seq` restart; the audit counts all
//! of that *as it is on the wire*, so none of it can hide behind a refusal. One
//! subscriber on `weir.audio.>` ([`WireAudit`]) feeds a pure per-stream state machine
//! ([`StreamAudit`]); [`verdict`] then holds each stream against what its producer
//! offered:
//!
//! - **published** = distinct frame seqs received; **declared lost** = distinct seqs
//!   covered by gap markers (any reason);
//! - **lost undeclared** = offered − published − declared lost (a frame neither
//!   received nor covered by a marker: silent loss, wherever it happened);
//! - **duplicates**: a packet whose seq the instance had already covered;
//!   **out of order**: a packet whose seq is a hole below the instance's highest seq
//!   (it arrived after a later one);
//! - **instances**: a stream instance starts at the first packet of an id, at a packet
//!   after that instance's `end` (unless it fills a hole of the ended instance: then it
//!   is a late packet of it), and at a `seq` 1 the instance already covered (a restart);
//! - **ends**: `end` packets and their `Weir-End-Reason`.
//!
//! A stream passes when it had exactly one instance, no duplicate, nothing out of
//! order, exactly one `end` (reason `producer`), and published + declared lost =
//! offered.
//!
//! Invariants: every packet is classified exactly once (frame, gap, end, or
//! undecodable); the per-instance hole set is bounded ([`MAX_HOLES`]: beyond it the
//! holes are only counted, they are lost frames either way); the subscriber's slow
//! consumer events are counted, so a loss in the audit itself is never read as a loss
//! of the system under test without a note.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use weir_protocol::audio::extension::headers;
use weir_protocol::audio::{DecodeOptions, PacketBody, decode};

use crate::counters::Count;
use crate::error::{Error, nats};

/// Most holes (missing seqs below the highest) one instance remembers.
pub const MAX_HOLES: usize = 100_000;
/// Messages the audit's subscription buffers before the NATS client drops (counted).
pub const SUBSCRIPTION_CAPACITY: usize = 262_144;
/// Failing streams kept as examples in the report.
pub const EXAMPLES: usize = 5;

/// One packet, as the audit sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A frame.
    Frame {
        /// Its seq.
        seq: u64,
    },
    /// A gap marker: `first_seq..=last_seq` declared lost.
    Gap {
        /// First seq declared.
        first_seq: u64,
        /// Last seq declared.
        last_seq: u64,
        /// The marker's reason (`resume`, `queue_full`, ...).
        reason: String,
    },
    /// The end of the instance.
    End {
        /// Its seq.
        seq: u64,
        /// `Weir-End-Reason` (`none` without the header).
        reason: String,
    },
}

/// The instance being followed.
#[derive(Debug, Default)]
struct Instance {
    /// Highest seq covered (frame or gap).
    max_seq: u64,
    /// Seqs below `max_seq` not covered yet (bounded by [`MAX_HOLES`]).
    holes: BTreeSet<u64>,
    /// The `end`'s seq, once it came.
    ended_at: Option<u64>,
}

/// How one seq related to the instance.
enum Cover {
    New,
    Late,
    Duplicate,
}

impl Instance {
    /// Remembers the seqs between the highest one and `seq` as holes (beyond
    /// [`MAX_HOLES`] only counted in `holes_overflow`); the highest is then `seq - 1`.
    fn holes_before(&mut self, seq: u64, holes_overflow: &mut u64) {
        if seq <= self.max_seq + 1 {
            return;
        }
        let missing = seq - self.max_seq - 1;
        if self.holes.len() as u64 + missing > MAX_HOLES as u64 {
            *holes_overflow += missing;
        } else {
            self.holes.extend(self.max_seq + 1..seq);
        }
        self.max_seq = seq - 1;
    }

    fn cover(&mut self, seq: u64, holes_overflow: &mut u64) -> Cover {
        if seq > self.max_seq {
            self.holes_before(seq, holes_overflow);
            self.max_seq = seq;
            Cover::New
        } else if self.holes.remove(&seq) {
            Cover::Late
        } else {
            Cover::Duplicate
        }
    }
}

/// One stream id's packets, across its instances (pure).
#[derive(Debug, Default)]
pub struct StreamAudit {
    current: Option<Instance>,
    /// Stream instances seen.
    pub instances: u64,
    /// Of those, instances started by a `seq` restart without an `end` before.
    pub restarts: u64,
    /// Distinct frames received (all instances).
    pub frames: u64,
    /// Distinct seqs covered by gap markers (all instances).
    pub declared: u64,
    /// Declared seqs by marker reason.
    pub declared_by_reason: BTreeMap<String, u64>,
    /// Packets whose seq was already covered.
    pub duplicates: u64,
    /// Packets that filled a hole (arrived after a later packet).
    pub out_of_order: u64,
    /// `end` packets, by `Weir-End-Reason`.
    pub ends_by_reason: BTreeMap<String, u64>,
    /// `end`s that arrived before some frame of their instance.
    pub ends_early: u64,
    /// Holes not remembered (over [`MAX_HOLES`]).
    pub holes_overflow: u64,
}

impl StreamAudit {
    /// Classifies one packet.
    pub fn observe(&mut self, seen: &Seen) {
        let first = match seen {
            Seen::Frame { seq } | Seen::End { seq, .. } => *seq,
            Seen::Gap { first_seq, .. } => *first_seq,
        };
        let new_instance = match &self.current {
            None => true,
            // After the end: a new instance, unless the packet fills a hole of the
            // ended one (it was overtaken by the end).
            Some(i) if i.ended_at.is_some() => !i.holes.contains(&first),
            // A seq 1 the instance already covered: the producer side started over.
            Some(i) => {
                let restart = first == 1 && i.max_seq >= 1 && !i.holes.contains(&1);
                if restart {
                    self.restarts += 1;
                }
                restart
            }
        };
        if new_instance {
            self.instances += 1;
            self.current = Some(Instance::default());
        }
        let Some(inst) = self.current.as_mut() else {
            return;
        };
        match seen {
            Seen::Frame { seq } => match inst.cover(*seq, &mut self.holes_overflow) {
                Cover::New => self.frames += 1,
                Cover::Late => {
                    self.frames += 1;
                    self.out_of_order += 1;
                }
                Cover::Duplicate => self.duplicates += 1,
            },
            Seen::Gap {
                first_seq,
                last_seq,
                reason,
            } => {
                let (mut new, mut late, mut dup) = (0u64, false, false);
                // Bounded by the marker's own range, itself bounded by what the
                // protocol decoder accepts (a seq range of one stream).
                for seq in *first_seq..=*last_seq {
                    match inst.cover(seq, &mut self.holes_overflow) {
                        Cover::New => new += 1,
                        Cover::Late => {
                            new += 1;
                            late = true;
                        }
                        Cover::Duplicate => dup = true,
                    }
                }
                self.declared += new;
                *self.declared_by_reason.entry(reason.clone()).or_default() += new;
                self.out_of_order += u64::from(late);
                self.duplicates += u64::from(dup);
            }
            Seen::End { seq, reason } => {
                *self.ends_by_reason.entry(reason.clone()).or_default() += 1;
                if *seq <= inst.max_seq || !inst.holes.is_empty() || *seq > inst.max_seq + 1 {
                    self.ends_early += 1;
                }
                // The end names the instance's last seq: the seqs below it not seen yet
                // are holes, so that a frame the end overtook is a late packet of this
                // instance, not a new one.
                inst.holes_before(*seq, &mut self.holes_overflow);
                inst.ended_at = Some(*seq);
            }
        }
    }

    /// `end` packets, all reasons.
    pub fn ends(&self) -> u64 {
        self.ends_by_reason.values().sum()
    }
}

/// One stream held against what its producer offered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StreamVerdict {
    /// The stream id.
    pub stream: String,
    /// Frames the producer offered (the seqs it numbered).
    pub offered: u64,
    /// Distinct frames on NATS.
    pub published: u64,
    /// Distinct seqs declared lost by gap markers.
    pub declared_lost: u64,
    /// `offered − published − declared_lost` (0 when the others exceed it).
    pub lost_undeclared: u64,
    /// `published + declared_lost − offered` when positive: seqs on NATS the producer
    /// did not offer (a numbering disagreement).
    pub excess: u64,
    /// Stream instances on NATS.
    pub instances: u64,
    /// Duplicate packets.
    pub duplicates: u64,
    /// Out-of-order packets.
    pub out_of_order: u64,
    /// `end` packets.
    pub ends: u64,
    /// Whether every check held.
    pub ok: bool,
}

/// Holds `audit` (`None`: nothing of the stream reached NATS) against `offered`.
pub fn verdict(stream: &str, offered: u64, audit: Option<&StreamAudit>) -> StreamVerdict {
    let empty = StreamAudit::default();
    let a = audit.unwrap_or(&empty);
    let covered = a.frames + a.declared;
    let clean_end = a.ends() == 1 && a.ends_by_reason.get("producer") == Some(&1);
    StreamVerdict {
        stream: stream.to_owned(),
        offered,
        published: a.frames,
        declared_lost: a.declared,
        lost_undeclared: offered.saturating_sub(covered),
        excess: covered.saturating_sub(offered),
        instances: a.instances,
        duplicates: a.duplicates,
        out_of_order: a.out_of_order,
        ends: a.ends(),
        ok: a.instances == 1
            && a.duplicates == 0
            && a.out_of_order == 0
            && clean_end
            && a.ends_early == 0
            && covered == offered,
    }
}

/// The audit's figures for one run (the report's `flap.audit`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditTotals {
    /// Streams (calls) the producers ran.
    pub streams: u64,
    /// Streams that passed every check.
    pub streams_ok: u64,
    /// Stream instances on NATS, all calls.
    pub instances: u64,
    /// Most instances of one call.
    pub instances_max: u64,
    /// Calls with more than one instance.
    pub streams_with_several_instances: u64,
    /// Instances started by a `seq` restart without an `end` before.
    pub seq_restarts: u64,
    /// Frames the producers offered.
    pub frames_offered: u64,
    /// Distinct frames on NATS.
    pub frames_published: u64,
    /// Distinct seqs covered by gap markers.
    pub frames_declared_lost: u64,
    /// Declared seqs by marker reason (`resume`, `queue_full`, ...).
    pub declared_by_reason: BTreeMap<String, u64>,
    /// Offered, neither published nor declared.
    pub frames_lost_undeclared: u64,
    /// Published + declared beyond offered (numbering disagreements).
    pub frames_excess: u64,
    /// Duplicate packets.
    pub duplicates: u64,
    /// Out-of-order packets.
    pub out_of_order: u64,
    /// `end` packets by `Weir-End-Reason`.
    pub ends_by_reason: BTreeMap<String, u64>,
    /// Calls without any `end`.
    pub streams_without_end: u64,
    /// Calls with more than one `end`.
    pub streams_with_several_ends: u64,
    /// Packets the audit could not decode.
    pub undecodable: u64,
    /// Slow-consumer events of the audit's own subscription (messages it lost; the
    /// figures above are then lower bounds).
    pub audit_slow_consumer_events: u64,
    /// Holes not remembered (over [`MAX_HOLES`] in one instance).
    pub holes_overflow: u64,
    /// The first failing calls, with their figures.
    pub failing_examples: Vec<StreamVerdict>,
}

/// Sums the verdicts of every call (`offered`: id → frames offered) over `audits`.
pub fn totals(
    offered: &[(String, u64)],
    audits: &HashMap<String, StreamAudit>,
    undecodable: u64,
    slow: u64,
) -> AuditTotals {
    let mut t = AuditTotals {
        undecodable,
        audit_slow_consumer_events: slow,
        ..AuditTotals::default()
    };
    for (id, n) in offered {
        let a = audits.get(id);
        let v = verdict(id, *n, a);
        t.streams += 1;
        t.streams_ok += u64::from(v.ok);
        t.instances += v.instances;
        t.instances_max = t.instances_max.max(v.instances);
        t.streams_with_several_instances += u64::from(v.instances > 1);
        t.frames_offered += v.offered;
        t.frames_published += v.published;
        t.frames_declared_lost += v.declared_lost;
        t.frames_lost_undeclared += v.lost_undeclared;
        t.frames_excess += v.excess;
        t.duplicates += v.duplicates;
        t.out_of_order += v.out_of_order;
        t.streams_without_end += u64::from(v.ends == 0);
        t.streams_with_several_ends += u64::from(v.ends > 1);
        if let Some(a) = a {
            t.seq_restarts += a.restarts;
            t.holes_overflow += a.holes_overflow;
            for (r, n) in &a.declared_by_reason {
                *t.declared_by_reason.entry(r.clone()).or_default() += n;
            }
            for (r, n) in &a.ends_by_reason {
                *t.ends_by_reason.entry(r.clone()).or_default() += n;
            }
        }
        if !v.ok && t.failing_examples.len() < EXAMPLES {
            t.failing_examples.push(v);
        }
    }
    t
}

/// Shared between the subscriber task and the run.
#[derive(Debug, Default)]
struct Shared {
    audits: Mutex<HashMap<String, StreamAudit>>,
    packets: AtomicU64,
    undecodable: AtomicU64,
    slow: AtomicU64,
}

/// The audit's subscriber: one NATS connection, one subscription on every audio
/// subject. Dropping it aborts the subscriber.
#[derive(Debug)]
pub struct WireAudit {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WireAudit {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a NATS message is, for the audit (`None`: undecodable): its stream id (the
/// subject's last token) and the packet.
fn seen_of(msg: &async_nats::Message) -> Option<(&str, Seen)> {
    let stream = msg.subject.as_str().rsplit('.').next()?;
    let packet = decode(&msg.payload, &DecodeOptions::default()).ok()?;
    let seen = match packet.body {
        PacketBody::Frame { .. } => Seen::Frame { seq: packet.seq },
        PacketBody::Gap(g) => Seen::Gap {
            first_seq: g.first_seq,
            last_seq: g.last_seq,
            reason: <&'static str>::from(g.reason).to_owned(),
        },
        PacketBody::End => Seen::End {
            seq: packet.seq,
            reason: msg
                .headers
                .as_ref()
                .and_then(|h| h.get(headers::END_REASON))
                .map_or_else(|| "none".to_owned(), |v| v.as_str().to_owned()),
        },
    };
    Some((stream, seen))
}

impl WireAudit {
    /// Subscribes to `subject` (e.g. `weir.audio.>`); returns once the server
    /// confirmed the subscription, so no packet published afterwards is missed.
    pub async fn start(nats_url: &str, subject: &str) -> Result<Self, Error> {
        let shared = Arc::new(Shared::default());
        let slow = shared.clone();
        let options = async_nats::ConnectOptions::new()
            .subscription_capacity(SUBSCRIPTION_CAPACITY)
            .event_callback(move |e| {
                let slow = slow.clone();
                async move {
                    if matches!(e, async_nats::Event::SlowConsumer(_)) {
                        slow.slow.inc();
                    }
                }
            });
        let failed = |what: &str, e: Box<dyn std::error::Error + Send + Sync>| {
            nats(format!("wire audit: cannot {what}"), e)
        };
        let client = options
            .connect(nats_url)
            .await
            .map_err(|e| failed("connect", e.into()))?;
        let mut sub = client
            .subscribe(subject.to_owned())
            .await
            .map_err(|e| failed("subscribe", e.into()))?;
        client
            .flush()
            .await
            .map_err(|e| failed("flush", e.into()))?;
        let s = shared.clone();
        let task = tokio::spawn(async move {
            // Keeps the connection for as long as the subscription reads.
            let _client = client;
            // Ends when the subscription ends or the audit is dropped (aborted).
            while let Some(msg) = futures::StreamExt::next(&mut sub).await {
                s.packets.inc();
                match seen_of(&msg) {
                    Some((stream, seen)) => {
                        if let Ok(mut m) = s.audits.lock() {
                            match m.get_mut(stream) {
                                Some(a) => a.observe(&seen),
                                None => m.entry(stream.to_owned()).or_default().observe(&seen),
                            }
                        }
                    }
                    None => {
                        s.undecodable.inc();
                    }
                }
            }
        });
        Ok(Self { shared, task })
    }

    /// Packets received so far.
    pub fn packets(&self) -> u64 {
        self.shared.packets.load(Ordering::Relaxed)
    }

    /// `end` packets received so far.
    pub fn ends(&self) -> u64 {
        self.shared
            .audits
            .lock()
            .map(|m| m.values().map(StreamAudit::ends).sum())
            .unwrap_or(0)
    }

    /// The figures, every call in `offered` (id → frames offered) held against the
    /// wire.
    pub fn totals(&self, offered: &[(String, u64)]) -> AuditTotals {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        match self.shared.audits.lock() {
            Ok(m) => totals(
                offered,
                &m,
                load(&self.shared.undecodable),
                load(&self.shared.slow),
            ),
            Err(_) => AuditTotals::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u64) -> Seen {
        Seen::Frame { seq }
    }

    fn gap(first_seq: u64, last_seq: u64, reason: &str) -> Seen {
        Seen::Gap {
            first_seq,
            last_seq,
            reason: reason.into(),
        }
    }

    fn end(seq: u64, reason: &str) -> Seen {
        Seen::End {
            seq,
            reason: reason.into(),
        }
    }

    fn run(packets: &[Seen]) -> StreamAudit {
        let mut a = StreamAudit::default();
        for p in packets {
            a.observe(p);
        }
        a
    }

    #[test]
    fn a_resumed_stream_is_one_instance_and_every_frame_is_accounted() {
        // 1..=5 taken, 6..=7 lost in the cut and declared, 8..=10 after the resume.
        let mut p: Vec<Seen> = (1..=5).map(frame).collect();
        p.push(gap(6, 7, "resume"));
        p.extend((8..=10).map(frame));
        p.push(end(11, "producer"));
        let a = run(&p);
        let v = verdict("s0", 10, Some(&a));
        assert!(v.ok, "{v:?}");
        assert_eq!((v.published, v.declared_lost, v.lost_undeclared), (8, 2, 0));
        assert_eq!(a.declared_by_reason.get("resume"), Some(&2));
    }

    #[test]
    fn undeclared_loss_and_numbering_disagreements_fail_the_stream() {
        let mut p: Vec<Seen> = (1..=5).map(frame).collect();
        p.extend((8..=10).map(frame));
        p.push(end(11, "producer"));
        let v = verdict("s0", 10, Some(&run(&p)));
        assert!(!v.ok);
        assert_eq!(v.lost_undeclared, 2, "the hole 6..=7 nobody declared");
        let v = verdict("s0", 7, Some(&run(&p)));
        assert_eq!((v.lost_undeclared, v.excess), (0, 1), "{v:?}");
        assert!(!v.ok);
        let v = verdict("s1", 10, None);
        assert_eq!((v.instances, v.lost_undeclared, v.ok), (0, 10, false));
    }

    #[test]
    fn a_reconnect_without_resume_is_a_second_instance_and_its_cut_is_silent() {
        // Instance 1: 1..=4 published, the producer offered 6 before the cut; the door
        // ends it (producer_gone). Instance 2 starts at seq 1 again.
        let mut p: Vec<Seen> = (1..=4).map(frame).collect();
        p.push(end(5, "producer_gone"));
        p.extend((1..=4).map(frame));
        p.push(end(5, "producer"));
        let a = run(&p);
        assert_eq!((a.instances, a.restarts, a.ends()), (2, 0, 2));
        let v = verdict("s0", 10, Some(&a));
        assert_eq!((v.published, v.lost_undeclared, v.ok), (8, 2, false));
    }

    #[test]
    fn a_seq_restart_without_end_is_a_new_instance() {
        // The naive ingress publishes nothing when a socket drops.
        let mut p: Vec<Seen> = (1..=4).map(frame).collect();
        p.extend((1..=3).map(frame));
        let a = run(&p);
        assert_eq!(
            (a.instances, a.restarts, a.frames, a.duplicates),
            (2, 1, 7, 0)
        );
        assert_eq!(verdict("s0", 7, Some(&a)).ends, 0);
    }

    #[test]
    fn duplicates_and_out_of_order_packets_are_counted_not_hidden() {
        let a = run(&[frame(1), frame(3), frame(2), frame(3), frame(4)]);
        assert_eq!((a.frames, a.out_of_order, a.duplicates), (4, 1, 1));
        // An end that overtook a frame: the frame still belongs to its instance.
        let a = run(&[frame(1), frame(3), end(4, "none"), frame(2)]);
        assert_eq!(
            (a.instances, a.frames, a.out_of_order, a.ends_early),
            (1, 3, 1, 1)
        );
        let v = verdict("s0", 3, Some(&a));
        assert!(!v.ok, "{v:?}");
        // An end that overtook frames above the highest seen: still the same instance.
        let a = run(&[frame(1), end(4, "none"), frame(3), frame(2)]);
        assert_eq!((a.instances, a.frames, a.out_of_order), (1, 3, 2));
    }

    #[test]
    fn totals_sum_the_calls_and_keep_failing_examples() {
        let mut audits = HashMap::new();
        let good: Vec<Seen> = (1..=3).map(frame).chain([end(4, "producer")]).collect();
        audits.insert("a".to_owned(), run(&good));
        audits.insert("b".to_owned(), run(&good[..2]));
        let offered = vec![
            ("a".to_owned(), 3),
            ("b".to_owned(), 3),
            ("c".to_owned(), 1),
        ];
        let t = totals(&offered, &audits, 1, 0);
        assert_eq!((t.streams, t.streams_ok, t.instances), (3, 1, 2));
        assert_eq!((t.frames_offered, t.frames_published), (7, 5));
        assert_eq!((t.frames_lost_undeclared, t.streams_without_end), (2, 2));
        assert_eq!(t.failing_examples.len(), 2);
        assert_eq!(t.ends_by_reason.get("producer"), Some(&1));
        assert_eq!(t.undecodable, 1);
    }
}
