//! The slot-weighted balance: several planners against one simulated bucket, on a
//! paused clock.

use super::*;

const T: Timing = Timing {
    ttl: Duration::from_secs(10),
    renew_interval: Duration::from_secs(3),
    margin: Duration::from_secs(1),
    heartbeat_timeout: Duration::from_millis(1_500),
};

/// Every planner of a cluster and one KV bucket: each action is applied at once and
/// every watcher sees each write.
struct Cluster {
    workers: Vec<(Planner, Option<u64>)>,
    keys: Vec<Option<(String, u64)>>,
    revision: u64,
    /// Releases applied, per tick.
    releases: Vec<usize>,
}

impl Cluster {
    fn new(partitions: u32) -> Self {
        Self {
            workers: Vec::new(),
            keys: vec![None; partitions as usize],
            revision: 0,
            releases: Vec::new(),
        }
    }

    /// A worker with `slots`, sent in its heartbeats when `announced`; one that does
    /// not announce is of an older version, which neither sends slots nor reads them.
    fn join(&mut self, name: &str, slots: u64, announced: bool) {
        let partitions = self.keys.len() as u32;
        let planner = Planner::new(name.into(), partitions, T, Instant::now()).with_slots(slots);
        self.workers.push((planner, announced.then_some(slots)));
    }

    fn write(&mut self, partition: u32, owner: Option<&str>) -> u64 {
        self.revision += 1;
        let value = owner.map(|o| (o.to_owned(), self.revision));
        self.keys[partition as usize] = value.clone();
        for (w, _) in &mut self.workers {
            w.observe(partition, value.clone(), Instant::now());
        }
        self.revision
    }

    /// One heartbeat round and one planning tick of every worker.
    fn tick(&mut self) {
        let now = Instant::now();
        let beats: Vec<(String, Option<u64>)> = self
            .workers
            .iter()
            .map(|(w, s)| (w.me().to_owned(), *s))
            .collect();
        let mut released = 0;
        for i in 0..self.workers.len() {
            let reads_slots = self.workers[i].1.is_some();
            for (name, slots) in &beats {
                let slots = slots.filter(|_| reads_slots);
                self.workers[i].0.heard_with_slots(name, slots, now);
            }
            self.workers[i].0.echoed(now);
            let actions = self.workers[i].0.plan(now);
            for action in actions {
                released += usize::from(matches!(action, Action::Release { .. }));
                self.apply(i, action);
            }
        }
        self.releases.push(released);
    }

    fn apply(&mut self, i: usize, action: Action) {
        let me = self.workers[i].0.me().to_owned();
        let now = Instant::now();
        match action {
            Action::Fence(_) => {}
            Action::Claim(p) => match self.keys[p as usize] {
                None => {
                    let rev = self.write(p, Some(&me));
                    self.workers[i].0.acquired(p, rev, now);
                }
                Some(_) => self.workers[i].0.settled(p),
            },
            Action::TakeOver {
                partition,
                revision,
                ..
            } => match &self.keys[partition as usize] {
                Some((_, r)) if *r == revision => {
                    let rev = self.write(partition, Some(&me));
                    self.workers[i].0.acquired(partition, rev, now);
                }
                _ => self.workers[i].0.settled(partition),
            },
            Action::Renew {
                partition,
                revision,
            } => match &self.keys[partition as usize] {
                Some((_, r)) if *r == revision => {
                    let rev = self.write(partition, Some(&me));
                    self.workers[i].0.renewed(partition, rev, now);
                }
                _ => {
                    self.workers[i].0.renew_refused(partition);
                }
            },
            Action::Release { partition, .. } => {
                self.write(partition, None);
                self.workers[i].0.settled(partition);
            }
        }
    }

    /// Ticks every 250 ms for `ms`.
    async fn run(&mut self, ms: u64) {
        for _ in 0..ms / 250 {
            tokio::time::advance(Duration::from_millis(250)).await;
            self.tick();
        }
    }

    fn held(&self) -> Vec<usize> {
        self.workers.iter().map(|(w, _)| w.held().count()).collect()
    }
}

#[test]
fn the_share_is_proportional_to_slots_and_whole_when_equal() {
    assert_eq!(weighted_share(20, 4, 20), 4);
    assert_eq!(weighted_share(20, 16, 20), 16);
    assert_eq!(weighted_share(8, 1, 2), 4, "equal slots: ⌈P / n⌉");
    assert_eq!(
        weighted_share(7, 5, 15),
        3,
        "⌈7/3⌉ whatever the equal slots"
    );
    assert_eq!(weighted_share(10, 1, 3), 4);
    assert_eq!(weighted_share(4, 1_000_000, 1_000_001), 4, "never above P");
    assert_eq!(weighted_share(4, 1, 0), 4, "no division by zero");
}

#[tokio::test(start_paused = true)]
async fn a_4_slot_and_a_16_slot_worker_end_at_4_and_16_partitions() {
    let mut c = Cluster::new(20);
    c.join("small", 4, true);
    c.join("big", 16, true);
    c.run(30_000).await;
    assert_eq!(c.held(), vec![4, 16]);
    let releases: usize = c.releases[c.releases.len() - 20..].iter().sum();
    assert_eq!(releases, 0, "settled: nothing moves any more");
}

#[tokio::test(start_paused = true)]
async fn equal_slots_or_no_slots_announced_share_equally_as_before() {
    for announced in [true, false] {
        let mut c = Cluster::new(20);
        c.join("a", 6, announced);
        c.join("b", 6, announced);
        c.join("d", 6, announced);
        c.run(30_000).await;
        let mut held = c.held();
        held.sort_unstable();
        assert_eq!(held, vec![6, 7, 7], "⌈20/3⌉ = 7 (announced: {announced})");
    }
}

#[tokio::test(start_paused = true)]
async fn a_worker_of_an_older_version_counts_as_equal() {
    // "old" sends no slots: each of the others counts it as its own slots.
    let mut c = Cluster::new(8);
    c.join("new", 6, true);
    c.join("old", 6, false);
    c.run(20_000).await;
    assert_eq!(c.held(), vec![4, 4]);
}

#[tokio::test(start_paused = true)]
async fn a_joining_bigger_worker_takes_partitions_gradually() {
    let mut c = Cluster::new(20);
    c.join("small", 4, true);
    c.run(5_000).await;
    assert_eq!(c.held(), vec![20], "alone, it holds everything");
    c.releases.clear();
    c.join("big", 16, true);
    let mut seen = Vec::new();
    for _ in 0..160 {
        c.run(250).await;
        seen.push(c.held());
    }
    assert!(
        c.releases.iter().all(|&r| r <= 1),
        "at most one release per tick: {:?}",
        c.releases
    );
    // Gradually: the big worker's count rises in steps of one.
    let big: Vec<usize> = seen.iter().map(|h| h[1]).collect();
    assert!(big.windows(2).all(|w| w[1] <= w[0] + 1), "{big:?}");
    assert_eq!(c.held(), vec![4, 16], "{big:?}");
}

#[tokio::test(start_paused = true)]
async fn a_leaving_big_worker_leaves_everything_to_the_small_one() {
    let mut c = Cluster::new(20);
    c.join("small", 4, true);
    c.join("big", 16, true);
    c.run(30_000).await;
    assert_eq!(c.held(), vec![4, 16]);
    // big dies: small alone is live, its share is everything, taken over by CAS.
    c.workers.pop();
    c.run(5_000).await;
    assert_eq!(c.held(), vec![20]);
}

#[tokio::test(start_paused = true)]
async fn a_mixed_version_fleet_shares_equally_and_claims_every_partition() {
    // An old worker and two new ones with 4 and 16 slots: weighted shares against an
    // old worker's ⌈18/3⌉ = 6 would sum to 3 + 8 + 6 = 17. Not every live worker
    // announces slots, so everyone shares equally.
    let mut c = Cluster::new(18);
    c.join("old", 6, false);
    c.join("a", 4, true);
    c.join("b", 16, true);
    c.run(30_000).await;
    assert!(
        c.keys.iter().all(Option::is_some),
        "every partition claimed: {:?}",
        c.held()
    );
    assert_eq!(c.held(), vec![6, 6, 6]);
    let releases: usize = c.releases[c.releases.len() - 20..].iter().sum();
    assert_eq!(releases, 0, "settled: nothing moves any more");
}

#[tokio::test(start_paused = true)]
async fn the_old_worker_leaving_turns_the_weights_back_on() {
    let mut c = Cluster::new(20);
    c.join("a", 4, true);
    c.join("b", 16, true);
    c.join("old", 6, false);
    c.run(20_000).await;
    let mut held = c.held();
    held.sort_unstable();
    assert_eq!(held, vec![6, 7, 7], "⌈20/3⌉ = 7 each, all 20 held");
    // The old worker stops: its partitions are taken over, then the new ones settle
    // at their weighted shares.
    c.workers.pop();
    c.run(30_000).await;
    assert_eq!(c.held(), vec![4, 16]);
}
