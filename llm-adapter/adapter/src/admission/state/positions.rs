//! Queue positions: where a queued request stands among the queued ones (in the order
//! workers take them), for the `queued` events of streamed requests and for
//! `llm.status`. A streamed request is told its position when it has to wait, and again
//! when it changes, at most every [`POSITION_EVERY`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Effects, Entry, Stage, State};
use crate::admission::RequestStatus;
use crate::admission::StreamOut;
use crate::admission::gates::deadline::{ReadyKey, global_start, running_left};

/// A `queued` event for a streaming caller: its position and predicted start.
pub(crate) struct Notice {
    pub(crate) out: Arc<dyn StreamOut>,
    pub(crate) position: usize,
    pub(crate) predicted_start: Option<Duration>,
}

/// Least time between two `queued` events of one request.
pub(crate) const POSITION_EVERY: Duration = Duration::from_secs(1);

impl<W> State<W> {
    /// The order key a queued entry has among all queued ones: its EDF key, or its
    /// admission id under FIFO.
    fn position_key(&self, e: &Entry<W>) -> ReadyKey {
        e.order.unwrap_or((self.epoch, e.id))
    }

    /// The queued (not running) entries.
    fn queued_entries(&self) -> impl Iterator<Item = &Entry<W>> {
        self.entries.values().filter(|e| e.stage != Stage::Running)
    }

    /// The ids of the queued entries, ascending.
    pub(super) fn queued_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.queued_entries().map(|e| e.id).collect();
        ids.sort_unstable();
        ids
    }

    /// Every queued entry's order key, sorted.
    fn queued_keys(&self) -> Vec<ReadyKey> {
        let mut keys: Vec<ReadyKey> = self
            .queued_entries()
            .map(|e| self.position_key(e))
            .collect();
        keys.sort_unstable();
        keys
    }

    /// Predicted wait before queued entry `e` starts (the global term of the deadline
    /// prediction on its member: the requests bound there ahead of it); `None` without
    /// an estimate.
    fn predicted_start(&self, e: &Entry<W>, now: Instant) -> Option<Duration> {
        let m = self.pool.members.get(e.member)?;
        let est = m.estimator.estimate()?.as_secs_f64();
        let key = self.position_key(e);
        let ahead = (self.queued_entries())
            .filter(|x| x.member == e.member && self.position_key(x) < key)
            .count();
        let left = running_left(&m.running_since, est, now);
        let start = global_start(m.backend.slots.get(), m.running(), ahead, est, left);
        Duration::try_from_secs_f64(start).ok()
    }

    /// 1-based position of queued entry `id` and its predicted start.
    fn position(
        &self,
        keys: &[ReadyKey],
        id: u64,
        now: Instant,
    ) -> Option<(usize, Option<Duration>)> {
        let e = self
            .entries
            .get(&id)
            .filter(|e| e.stage != Stage::Running)?;
        let ahead = keys.partition_point(|k| *k < self.position_key(e));
        Some((ahead + 1, self.predicted_start(e, now)))
    }

    /// A streamed request was queued: when it has to wait (not ready, or more ready
    /// requests than free workers), its caller is told its position now, and again
    /// while it waits.
    pub(super) fn note_stream_queued(&mut self, id: u64, now: Instant, fx: &mut Effects<W>) {
        let Some(e) = self.entries.get(&id) else {
            return;
        };
        if e.stream.is_none() {
            return;
        }
        if self.stream_queued.is_empty() {
            self.next_position_pass = Some(now + POSITION_EVERY);
            fx.timers_changed = true;
        }
        self.stream_queued.insert(id);
        let m = &self.pool.members[e.member];
        let starts_now = matches!(e.stage, Stage::Ready(_))
            && m.running() + m.ready.len() <= m.backend.slots.get();
        if !starts_now {
            let keys = self.queued_keys();
            self.notify_position(&keys, id, now, fx);
        }
    }

    /// Sends entry `id` its position if it changed since the last `queued` event and
    /// that event is at least [`POSITION_EVERY`] old.
    fn notify_position(&mut self, keys: &[ReadyKey], id: u64, now: Instant, fx: &mut Effects<W>) {
        let Some((position, predicted_start)) = self.position(keys, id, now) else {
            return;
        };
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let due = match e.notified {
            None => true,
            Some((p, at)) => p != position && now >= at + POSITION_EVERY,
        };
        if let (true, Some(out)) = (due, &e.stream) {
            e.notified = Some((position, now));
            fx.notices.push(Notice {
                out: out.clone(),
                position,
                predicted_start,
            });
        }
    }

    /// The periodic pass over streamed requests still queued.
    pub(super) fn position_pass(&mut self, now: Instant, fx: &mut Effects<W>) {
        if self.stream_queued.is_empty() {
            self.next_position_pass = None;
            return;
        }
        if self.next_position_pass.is_some_and(|at| now < at) {
            return;
        }
        let keys = self.queued_keys();
        let ids: Vec<u64> = self.stream_queued.iter().copied().collect();
        for id in ids {
            self.notify_position(&keys, id, now, fx);
        }
        self.next_position_pass = Some(now + POSITION_EVERY);
    }

    /// Where the request with `request_id` is: queued (position, predicted start),
    /// running (since when), done (its reply is in the completion cache) or not found.
    pub(crate) fn status(&self, request_id: &str, now: Instant) -> RequestStatus {
        if let Some(e) = self
            .by_request_id
            .get(request_id)
            .and_then(|id| self.entries.get(id))
        {
            if e.stage == Stage::Running {
                return RequestStatus::Running {
                    elapsed: e
                        .started_at
                        .map_or(Duration::ZERO, |s| now.saturating_duration_since(s)),
                };
            }
            let keys = self.queued_keys();
            if let Some((position, predicted_start)) = self.position(&keys, e.id, now) {
                return RequestStatus::Queued {
                    position,
                    predicted_start,
                    waited: now.saturating_duration_since(e.received_at),
                };
            }
        }
        if self.cache.get(request_id).is_some() {
            return RequestStatus::Done;
        }
        RequestStatus::NotFound
    }
}
