//! The failover scenarios' audit: pure functions over the logs the `lease-worker`
//! processes wrote ([`crate::lease_worker`]) — no I/O, no clock.
//!
//! - **Frames.** Every worker *instance* (a process life: a restarted worker is a new
//!   instance) logged each (stream, seq) handed to its handler and each gap notice.
//!   A (stream, seq) handed to two instances is a **double delivery**. A seq of
//!   1..=last that no instance was handed is lost: *in the handover* when a
//!   `handover` gap covers it, *detected* when another gap covers it (a `lost` hole the
//!   consumer saw and declared to its handler), **undeclared** otherwise — at the
//!   *tail* when no frame of the stream was handed to anyone after it.
//! - **Ownership.** Each instance logged, every 50 ms, the partitions it holds and
//!   their revisions. An instance holds nothing once it ended (SIGKILL), whatever its
//!   last line said. Times are Unix ms of this host, shared by every process.
//!
//! Invariant: every figure comes from the logs; nothing is estimated. A partition that
//! never got a new owner within the run is listed, not given a time.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

/// One line of a leases log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseEvent {
    /// When the worker saw it (Unix ms).
    pub at_ms: u64,
    /// The partition.
    pub partition: u32,
    /// Whether the worker holds it from then on.
    pub held: bool,
    /// The lease's revision (the fencing token); 0 when none.
    pub revision: u64,
}

/// One worker instance's ownership timeline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Instance {
    /// `w<i>#<life>`.
    pub name: String,
    /// When it started (the `S` line), Unix ms.
    pub started_ms: Option<u64>,
    /// When it was killed or stopped, Unix ms (`None`: alive at the end of the run).
    pub ended_ms: Option<u64>,
    /// Its lease events, in time order.
    pub events: Vec<LeaseEvent>,
}

/// Parses a leases log; malformed lines are skipped (a SIGKILL may cut the last one).
pub fn parse_leases(name: &str, text: &str) -> Instance {
    let mut i = Instance {
        name: name.to_owned(),
        ..Instance::default()
    };
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        match parts.as_slice() {
            ["S", at] => i.started_ms = at.parse().ok(),
            ["L", at, p, held, rev] => {
                if let (Ok(at_ms), Ok(partition), Ok(revision)) =
                    (at.parse(), p.parse(), rev.parse())
                {
                    i.events.push(LeaseEvent {
                        at_ms,
                        partition,
                        held: *held == "1",
                        revision,
                    });
                }
            }
            _ => {}
        }
    }
    i
}

impl Instance {
    /// Whether the instance ran at `t`.
    pub fn alive_at(&self, t: u64) -> bool {
        self.started_ms.is_some_and(|s| s <= t) && self.ended_ms.is_none_or(|e| t < e)
    }

    /// The partitions it held at `t` (empty once ended).
    pub fn held_at(&self, t: u64) -> BTreeSet<u32> {
        let mut held = BTreeSet::new();
        if self.ended_ms.is_some_and(|e| t >= e) {
            return held;
        }
        for e in self.events.iter().take_while(|e| e.at_ms <= t) {
            if e.held {
                held.insert(e.partition);
            } else {
                held.remove(&e.partition);
            }
        }
        held
    }

    /// The first time at or after `from` it was seen holding `partition`.
    fn first_held_since(&self, partition: u32, from: u64) -> Option<u64> {
        self.events
            .iter()
            .find(|e| e.partition == partition && e.held && e.at_ms >= from)
            .map(|e| e.at_ms)
    }
}

/// Held partitions per live instance at `t` (instances that did not run are left out).
pub fn spread_at(instances: &[Instance], t: u64) -> Vec<usize> {
    instances
        .iter()
        .filter(|i| i.alive_at(t))
        .map(|i| i.held_at(t).len())
        .collect()
}

/// Whether the live instances at `t` hold each of `partitions` exactly once, each
/// holding between `lo` and `hi`.
pub fn balanced_at(instances: &[Instance], t: u64, partitions: u32, lo: usize, hi: usize) -> bool {
    let mut all = BTreeSet::new();
    let mut total = 0;
    for i in instances.iter().filter(|i| i.alive_at(t)) {
        let held = i.held_at(t);
        if !(lo..=hi).contains(&held.len()) {
            return false;
        }
        total += held.len();
        all.extend(held);
    }
    total == partitions as usize && all.len() == partitions as usize
}

/// The first event time in `from..=until` at which [`balanced_at`] holds.
pub fn first_balanced(
    instances: &[Instance],
    from: u64,
    until: u64,
    partitions: u32,
    lo: usize,
    hi: usize,
) -> Option<u64> {
    let mut times: Vec<u64> = instances
        .iter()
        .flat_map(|i| i.events.iter().map(|e| e.at_ms))
        .chain(instances.iter().filter_map(|i| i.ended_ms))
        .chain(std::iter::once(from))
        .filter(|t| (from..=until).contains(t))
        .collect();
    times.sort_unstable();
    times.dedup();
    times
        .into_iter()
        .find(|&t| balanced_at(instances, t, partitions, lo, hi))
}

/// ⌈P / workers⌉ − 1 ..= ⌈P / workers⌉ + 1: the balance the lease protocol aims at.
pub fn share_bounds(partitions: u32, workers: usize) -> (usize, usize) {
    let share = (partitions as usize).div_ceil(workers.max(1));
    (share.saturating_sub(1), share + 1)
}

/// What became of the partitions a killed instance held.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Takeover {
    /// Partitions the victim held when it was killed.
    pub orphaned: usize,
    /// Of those, how many another instance was seen holding within the run.
    pub reowned: usize,
    /// Kill → first seen held by another instance, ms, per re-owned partition:
    /// median and largest (`null` when none was re-owned).
    pub reowned_ms_median: Option<f64>,
    /// See `reowned_ms_median`.
    pub reowned_ms_max: Option<f64>,
    /// Of the re-owned, how many the restarted victim took (not a survivor).
    pub reowned_by_restarted: usize,
    /// Partitions never re-owned within the run.
    pub not_reowned: Vec<u32>,
}

/// Times until each partition `victim` held at `kill_ms` is held by another instance.
/// `restarted` is the index of the victim's next life, if any.
pub fn takeover(
    instances: &[Instance],
    victim: usize,
    restarted: Option<usize>,
    kill_ms: u64,
) -> Takeover {
    let orphans = instances[victim].held_at(kill_ms.saturating_sub(1));
    let mut t = Takeover {
        orphaned: orphans.len(),
        ..Takeover::default()
    };
    let mut times = Vec::new();
    for &p in &orphans {
        let first = instances
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != victim)
            .filter_map(|(j, i)| i.first_held_since(p, kill_ms).map(|at| (at, j)))
            .min();
        match first {
            Some((at, j)) => {
                times.push((at - kill_ms) as f64);
                if Some(j) == restarted {
                    t.reowned_by_restarted += 1;
                }
            }
            None => t.not_reowned.push(p),
        }
    }
    times.sort_by(f64::total_cmp);
    t.reowned = times.len();
    t.reowned_ms_median = median(&times);
    t.reowned_ms_max = times.last().copied();
    t
}

/// The median of ascending values (`None` when empty).
pub fn median(sorted: &[f64]) -> Option<f64> {
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// What a NATS node's death did to the leases.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Renewals {
    /// Partitions another instance was seen holding after the kill: should be 0.
    pub owner_changes: usize,
    /// Partitions their holder stopped holding for a while after the kill (fenced at
    /// its local validity or by a refused renewal; it may take them back by CAS):
    /// their audio is not delivered meanwhile. Should be 0.
    pub fenced: usize,
    /// Partitions whose holder's revision changed twice after the kill (the first
    /// change may be a renewal sent before it): renewals resumed.
    pub resumed: usize,
    /// Kill → second revision change, ms: median and largest over resumed partitions.
    pub resumed_ms_median: Option<f64>,
    /// See `resumed_ms_median`.
    pub resumed_ms_max: Option<f64>,
    /// Longest time any partition went without a revision change (renewal) across
    /// the kill, ms: the renewal stall as the holders saw it (50 ms resolution).
    pub longest_renewal_gap_ms: Option<f64>,
}

/// Lease renewals and owner changes around `kill_ms`, until `end_ms`.
pub fn renewals(instances: &[Instance], kill_ms: u64, end_ms: u64) -> Renewals {
    let mut r = Renewals::default();
    let mut holder: BTreeMap<u32, usize> = BTreeMap::new();
    for (j, i) in instances.iter().enumerate() {
        for p in i.held_at(kill_ms) {
            holder.insert(p, j);
        }
    }
    let mut resumed = Vec::new();
    let mut longest: Option<u64> = None;
    for (&p, &j) in &holder {
        let mut changed = false;
        let mut fenced = false;
        for (k, i) in instances.iter().enumerate() {
            for e in i
                .events
                .iter()
                .filter(|e| e.partition == p && e.at_ms > kill_ms)
            {
                if k != j && e.held {
                    changed = true;
                }
                if k == j && !e.held {
                    fenced = true;
                }
            }
        }
        r.owner_changes += usize::from(changed);
        r.fenced += usize::from(fenced);
        // The holder's renewals: every held event of p (a revision change), in order.
        let times: Vec<u64> = instances[j]
            .events
            .iter()
            .filter(|e| e.partition == p && e.held)
            .map(|e| e.at_ms)
            .collect();
        let after: Vec<u64> = times.iter().copied().filter(|t| *t > kill_ms).collect();
        if let Some(second) = after.get(1) {
            resumed.push((second - kill_ms) as f64);
        }
        let last_before = times.iter().copied().filter(|t| *t <= kill_ms).max();
        let mut prev = last_before;
        for t in after.iter().copied().chain(std::iter::once(end_ms)) {
            if let Some(before) = prev {
                let gap = t.saturating_sub(before);
                longest = Some(longest.map_or(gap, |l| l.max(gap)));
            }
            prev = Some(t);
            if t == end_ms {
                break;
            }
        }
    }
    resumed.sort_by(f64::total_cmp);
    r.resumed = resumed.len();
    r.resumed_ms_median = median(&resumed);
    r.resumed_ms_max = resumed.last().copied();
    r.longest_renewal_gap_ms = longest.map(|l| l as f64);
    r
}

/// The frames audit.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FrameAudit {
    /// Frames the producers published (1..=last seq of every stream).
    pub published: u64,
    /// Frames handed to a handler, counting every instance (a double delivery counts
    /// twice).
    pub handed: u64,
    /// (stream, seq) pairs handed to two or more instances: must be 0.
    pub double_deliveries: u64,
    /// Double deliveries by the pair of instances involved (`w0#0+w1#0`).
    pub double_by_instances: BTreeMap<String, u64>,
    /// Up to 5 examples (`stream seq: instances`).
    pub double_examples: Vec<String>,
    /// (stream, seq) handed twice to the same instance.
    pub repeated_in_one_instance: u64,
    /// Frames declared by `handover` gap notices (each notice covers everything before
    /// the new owner's first frame, including what the old owner handled).
    pub handover_declared: u64,
    /// Published, handed to nobody, inside a `handover` gap: what the handovers lost.
    pub lost_in_handover: u64,
    /// Published, handed to nobody, inside another gap (a hole the consumer detected,
    /// e.g. core NATS loss while a worker reconnected).
    pub lost_detected: u64,
    /// Published, handed to nobody, inside no gap: silent losses; must be 0.
    pub undeclared: u64,
    /// Published after a stream's last frame handed to anyone, inside no gap: no
    /// packet after them reached a worker following the stream, so nobody could detect
    /// them (the stream's next frame or its `end` at its follower would; an `end`
    /// reaching a new owner that never saw the stream declares nothing). Not in
    /// `undeclared`, which counts holes a later frame of the stream was handed after.
    pub undeclared_tail: u64,
}

/// Accumulates the frames logs, one instance at a time.
#[derive(Debug, Default)]
pub struct FrameAuditor {
    handed: HashMap<(String, u64), Vec<u16>>,
    gaps: HashMap<String, Vec<(bool, u64, u64)>>,
    names: Vec<String>,
}

impl FrameAuditor {
    /// Adds instance `name`'s frames log (malformed lines skipped).
    pub fn add(&mut self, name: &str, text: &str) {
        let idx = self.names.len() as u16;
        self.names.push(name.to_owned());
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["F", stream, seq] => {
                    if let Ok(seq) = seq.parse() {
                        self.handed
                            .entry(((*stream).to_owned(), seq))
                            .or_default()
                            .push(idx);
                    }
                }
                ["G", cause, stream, first, last] => {
                    if let (Ok(f), Ok(l)) = (first.parse(), last.parse()) {
                        self.gaps.entry((*stream).to_owned()).or_default().push((
                            *cause == "handover",
                            f,
                            l,
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    /// Frames handed so far (every instance).
    pub fn handed(&self) -> u64 {
        self.handed.values().map(|v| v.len() as u64).sum()
    }

    /// The audit against the last seq the producers published per stream.
    pub fn audit(&self, last_seq: &BTreeMap<String, u64>) -> FrameAudit {
        let mut a = FrameAudit {
            handed: self.handed(),
            ..FrameAudit::default()
        };
        let mut doubles: Vec<(&(String, u64), &Vec<u16>)> = Vec::new();
        for (key, who) in &self.handed {
            let distinct: BTreeSet<u16> = who.iter().copied().collect();
            a.repeated_in_one_instance += (who.len() - distinct.len()) as u64;
            if distinct.len() > 1 {
                a.double_deliveries += 1;
                let pair = distinct
                    .iter()
                    .map(|i| self.names[*i as usize].as_str())
                    .collect::<Vec<_>>()
                    .join("+");
                *a.double_by_instances.entry(pair).or_insert(0) += 1;
                doubles.push((key, who));
            }
        }
        doubles.sort();
        a.double_examples = doubles
            .iter()
            .take(5)
            .map(|((stream, seq), who)| {
                let names: Vec<&str> = who
                    .iter()
                    .map(|i| self.names[*i as usize].as_str())
                    .collect();
                format!("{stream} {seq}: {}", names.join(","))
            })
            .collect();
        for gaps in self.gaps.values() {
            for (handover, f, l) in gaps {
                if *handover {
                    a.handover_declared += l.saturating_sub(*f) + 1;
                }
            }
        }
        let mut last_handed: HashMap<&str, u64> = HashMap::new();
        for (stream, seq) in self.handed.keys() {
            let l = last_handed.entry(stream.as_str()).or_insert(0);
            *l = (*l).max(*seq);
        }
        for (stream, &last) in last_seq {
            a.published += last;
            let gaps = self.gaps.get(stream);
            let tail_from = last_handed.get(stream.as_str()).copied().unwrap_or(0) + 1;
            for seq in 1..=last {
                if self.handed.contains_key(&(stream.clone(), seq)) {
                    continue;
                }
                let covered = |handover: bool| {
                    gaps.is_some_and(|g| {
                        g.iter()
                            .any(|(h, f, l)| *h == handover && (*f..=*l).contains(&seq))
                    })
                };
                if covered(true) {
                    a.lost_in_handover += 1;
                } else if covered(false) {
                    a.lost_detected += 1;
                } else if seq >= tail_from {
                    a.undeclared_tail += 1;
                } else {
                    a.undeclared += 1;
                }
            }
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str, started: u64, ended: Option<u64>, log: &str) -> Instance {
        let mut i = parse_leases(name, &format!("S {started}\n{log}"));
        i.ended_ms = ended;
        i
    }

    #[test]
    fn takeover_times_come_from_the_new_owners_logs() {
        let victim = inst(
            "w0#0",
            0,
            Some(1000),
            "L 10 0 1 5\nL 10 1 1 6\nL 500 0 1 9\n",
        );
        let survivor = inst(
            "w1#0",
            0,
            None,
            "L 10 2 1 7\nL 1800 0 1 12\nL 2600 1 1 13\n",
        );
        let t = takeover(&[victim, survivor], 0, None, 1000);
        assert_eq!((t.orphaned, t.reowned), (2, 2));
        assert_eq!(t.reowned_ms_max, Some(1600.0));
        assert_eq!(t.reowned_ms_median, Some(1200.0));
        assert!(t.not_reowned.is_empty());
    }

    #[test]
    fn a_partition_never_reowned_is_listed() {
        let victim = inst("w0#0", 0, Some(1000), "L 10 3 1 5\n");
        let t = takeover(&[victim, inst("w1#0", 0, None, "")], 0, None, 1000);
        assert_eq!(t.not_reowned, vec![3]);
        assert_eq!(t.reowned_ms_max, None);
    }

    #[test]
    fn a_dead_instance_holds_nothing_and_balance_is_checked() {
        let a = inst("w0#0", 0, Some(1000), "L 10 0 1 5\n");
        let b = inst("w1#0", 0, None, "L 10 1 1 6\nL 1200 0 1 8\n");
        assert_eq!(spread_at(&[a.clone(), b.clone()], 500), vec![1, 1]);
        assert_eq!(spread_at(&[a.clone(), b.clone()], 1100), vec![1]);
        assert!(balanced_at(&[a.clone(), b.clone()], 500, 2, 1, 1));
        assert!(!balanced_at(&[a.clone(), b.clone()], 1100, 2, 1, 2));
        assert_eq!(first_balanced(&[a, b], 1000, 5000, 2, 1, 2), Some(1200));
        assert_eq!(share_bounds(64, 3), (21, 23));
    }

    #[test]
    fn renewals_resume_after_the_second_revision_change() {
        let a = inst(
            "w0#0",
            0,
            None,
            "L 10 0 1 5\nL 3010 0 1 8\nL 4000 0 1 11\nL 9000 0 1 14\nL 12000 0 1 17\n",
        );
        let r = renewals(&[a], 3000, 13000);
        assert_eq!((r.owner_changes, r.fenced, r.resumed), (0, 0, 1));
        assert_eq!(r.resumed_ms_max, Some(1000.0));
        assert_eq!(r.longest_renewal_gap_ms, Some(5000.0));
        let fenced = inst("w0#0", 0, None, "L 10 0 1 5\nL 5000 0 0 5\n");
        let taker = inst("w1#0", 0, None, "L 6000 0 1 9\n");
        let r = renewals(&[fenced.clone(), taker], 3000, 13000);
        assert_eq!((r.owner_changes, r.fenced, r.resumed), (1, 1, 0));
        let r = renewals(&[fenced], 3000, 13000);
        assert_eq!(
            (r.owner_changes, r.fenced),
            (0, 1),
            "fenced, nobody else took it"
        );
    }

    #[test]
    fn frames_audit_tells_doubles_handover_losses_and_silent_holes_apart() {
        let mut a = FrameAuditor::default();
        a.add("w0#0", "F s1 1\nF s1 2\nF s1 3\nF s2 1\n");
        // w1 took s1 over at seq 5 (handover 1..4), and also got seq 3: a double.
        a.add(
            "w1#0",
            "G handover s1 1 4\nF s1 3\nF s1 5\nG lost s2 2 2\nF s2 4\n",
        );
        let last = BTreeMap::from([("s1".to_owned(), 5), ("s2".to_owned(), 4)]);
        let r = a.audit(&last);
        assert_eq!(r.published, 9);
        assert_eq!(r.handed, 7);
        assert_eq!(r.double_deliveries, 1);
        assert_eq!(r.double_by_instances.get("w0#0+w1#0"), Some(&1));
        assert_eq!(r.double_examples, vec!["s1 3: w0#0,w1#0".to_owned()]);
        assert_eq!(r.handover_declared, 4);
        assert_eq!(r.lost_in_handover, 1, "s1 4");
        assert_eq!(r.lost_detected, 1, "s2 2");
        assert_eq!(r.undeclared, 1, "s2 3");
        // 3 more seqs of s1 published that nobody was handed, nothing after them.
        let last = BTreeMap::from([("s1".to_owned(), 8), ("s2".to_owned(), 4)]);
        let r = a.audit(&last);
        assert_eq!((r.undeclared_tail, r.undeclared), (3, 1));
    }
}
