//! Read-only views of the state: the busiest keys and sessions (`/v1/limits`), and the
//! invariant check the tests run after every step.

use std::collections::HashMap;

use tokio::time::Instant;

#[cfg(test)]
use super::Stage;
use super::State;
use crate::admission::{KeyView, LimitsView, QueueView, SessionView};
#[cfg(test)]
use crate::config::{Mode, QueueOrder};
use crate::trace::ms;

impl<W> State<W> {
    /// The busiest keys and sessions.
    pub(crate) fn limits_view(&self, top: usize, now: Instant) -> LimitsView {
        // How long the head of a waiter queue has waited, ms.
        let longest = |q: Option<&u64>| {
            (q.and_then(|id| self.entries.get(id)))
                .map_or(0.0, |e| ms(now.saturating_duration_since(e.stage_since)))
        };
        let mut keys = Vec::new();
        for (limit, gate) in self.keys.gates() {
            let mut per_key: HashMap<String, (usize, usize, f64)> = HashMap::new();
            for (k, n) in gate.slots.snapshot() {
                per_key.entry(k).or_default().0 = n;
            }
            for (k, q) in &gate.waiters {
                let v = per_key.entry(k.clone()).or_default();
                (v.1, v.2) = (q.len(), longest(q.front()));
            }
            keys.extend(
                per_key
                    .into_iter()
                    .map(|(key, (in_flight, waiting, longest))| KeyView {
                        rule: limit.name.clone(),
                        key,
                        limit: limit.limit.get(),
                        in_flight,
                        waiting,
                        longest_wait_ms: longest,
                    }),
            );
        }
        keys.sort_by(|a, b| {
            (b.in_flight + b.waiting, b.longest_wait_ms)
                .partial_cmp(&(a.in_flight + a.waiting, a.longest_wait_ms))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.key.cmp(&b.key))
        });
        keys.truncate(top);

        let view = |session: &String, pending| SessionView {
            session: session.clone(),
            pending,
            limit: self.cfg.session.pending_cap.map(|c| c.get()),
            waiting: 0,
            longest_wait_ms: 0.0,
        };
        let mut sessions: HashMap<String, SessionView> = self
            .session_cap
            .slots()
            .snapshot()
            .into_iter()
            .map(|(s, pending)| (s.clone(), view(&s, pending)))
            .collect();
        for (s, order) in self.session_order.sessions() {
            let v = sessions
                .entry(s.clone())
                .or_insert_with(|| view(s, usize::from(order.active.is_some()) + order.fifo.len()));
            v.waiting = order.fifo.len();
            v.longest_wait_ms = longest(order.fifo.front());
        }
        let mut sessions: Vec<SessionView> = sessions.into_values().collect();
        sessions.sort_by(|a, b| {
            b.pending
                .cmp(&a.pending)
                .then_with(|| a.session.cmp(&b.session))
        });
        sessions.truncate(top);

        LimitsView {
            queue: QueueView {
                depth: self.queued(),
                capacity: self.cfg.queue_capacity.get(),
                running: self.running(),
                workers: self.cfg.workers.get(),
                shutting_down: self.shutting_down,
            },
            keys,
            sessions,
            tokens: self.token_keys(top, now),
        }
    }

    /// Checks the module invariants (tests).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let running = self
            .entries
            .values()
            .filter(|e| e.stage == Stage::Running)
            .count();
        assert_eq!(running, self.running(), "running count");
        assert_eq!(self.entries.len() - running, self.queued(), "queued count");
        // A failover puts a running call back in the queue: with a pool, the bound is
        // on entries.
        let bound = self.cfg.queue_capacity.get() + self.cfg.workers.get();
        assert!(self.entries.len() <= bound, "queue bound");
        if !self.pool.health_on {
            assert!(
                self.queued() <= self.cfg.queue_capacity.get(),
                "queue bound"
            );
        }
        assert!(self.running() <= self.cfg.workers.get(), "worker bound");
        for id in &self.stream_queued {
            let e = &self.entries[id];
            assert!(
                e.stream.is_some() && e.stage != Stage::Running,
                "stream_queued holds queued streamed requests only"
            );
        }
        for (b, m) in self.pool.members.iter().enumerate() {
            for (k, id) in &m.ready {
                assert_eq!(self.entries[id].stage, Stage::Ready(*k));
                assert_eq!(self.entries[id].member, b, "ready where it is bound");
            }
            let bound = |running| {
                (self.entries.values())
                    .filter(|e| e.member == b && (e.stage == Stage::Running) == running)
                    .count()
            };
            assert_eq!(m.queued, bound(false), "queued on member {b}");
            assert_eq!(m.running(), bound(true), "running on member {b}");
            assert!(m.running() <= m.backend.slots.get(), "slots of member {b}");
        }
        if self.cfg.queue_order == QueueOrder::Edf {
            let edf = self.deadline.places();
            assert_eq!(
                edf.len(),
                self.queued(),
                "every queued request in EDF order"
            );
            for e in self.entries.values() {
                match e.stage {
                    Stage::Running => assert_eq!(e.order, None),
                    Stage::Ready(k) => assert_eq!(e.order, Some(k), "ready in EDF order"),
                    _ => {}
                }
                if let Some(k) = e.order {
                    assert_eq!(edf.get(&k), Some(&(e.answer_by, e.member)));
                }
            }
        } else {
            assert!(self.deadline.places().is_empty());
        }
        for (gi, (limit, g)) in self.keys.gates().enumerate() {
            for (k, q) in &g.waiters {
                assert!(!q.is_empty(), "empty waiter queue kept");
                if self.cfg.mode == Mode::Enforce {
                    assert!(
                        g.slots.in_use(k) >= limit.limit.get(),
                        "waiter behind a free slot"
                    );
                }
                for id in q {
                    assert_eq!(self.entries[id].stage, Stage::Gate(gi));
                }
            }
        }
        for (_, order) in self.session_order.sessions() {
            assert!(
                order.active.is_some() || order.fifo.is_empty(),
                "fifo without active"
            );
            for id in &order.fifo {
                assert_eq!(self.entries[id].stage, Stage::Session);
            }
        }
        let session_slots: usize = (self.session_cap.slots().snapshot().iter())
            .map(|(_, n)| n)
            .sum();
        let held = self
            .entries
            .values()
            .filter(|e| e.session_slot.is_some())
            .count();
        assert_eq!(session_slots, held, "session slots match entries");
        self.check_token_invariants();
        self.check_priority_invariants();
    }
}
