//! Several simulated backends (`--llm-backends N`): weir's adapter serves them as a
//! pool (`[[backends]]`, one member per backend, each with `--llm-workers` slots);
//! the naive front spreads its calls over them in turn, the way a load balancer that
//! knows nothing of deadlines or health does ([`RoundRobin`]).
//!
//! `backend-stall` stalls one member (accepts calls, sends nothing) and [`StallWatch`]
//! records, from the sampler's reads every 100 ms, when weir's pool ejected it and how
//! many requests were answered in time between the ejection and the stall's end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use weir_llm_adapter::backend::sim::SimHandle;
use weir_llm_adapter::backend::{Backend, BackendRequest, Call};

/// The naive front's spread: each call to the next member, whatever its state.
pub struct RoundRobin {
    members: Vec<Arc<dyn Backend>>,
    next: AtomicUsize,
}

impl RoundRobin {
    /// Over `members` (at least one).
    pub fn new(members: Vec<Arc<dyn Backend>>) -> Self {
        Self {
            members,
            next: AtomicUsize::new(0),
        }
    }
}

impl Backend for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn call(&self, request: BackendRequest) -> Call {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.members.len().max(1);
        match self.members.get(i) {
            Some(member) => member.call(request),
            None => Box::pin(async {
                Err(weir_llm_adapter::backend::BackendError::new(
                    weir_llm_adapter::backend::BackendErrorKind::Unavailable,
                    "no backend",
                ))
            }),
        }
    }
}

/// The simulated backends' handles, in member order.
pub struct Sims(pub Vec<SimHandle>);

impl Sims {
    /// Pauses (`true`) or resumes member `member`, or every member (`None`).
    pub fn pause(&self, member: Option<usize>, paused: bool) {
        let chosen = self.0.iter().enumerate();
        for (_, h) in chosen.filter(|(i, _)| member.is_none_or(|m| m == *i)) {
            if paused { h.pause() } else { h.resume() }
        }
    }

    /// Calls started, and started after their deadline, over every member.
    pub fn started(&self) -> (u64, u64) {
        self.0
            .iter()
            .map(SimHandle::stats)
            .fold((0, 0), |(s, a), x| {
                (s + x.started, a + x.started_after_deadline)
            })
    }
}

/// What the run saw of a stalled member (`backend-stall`).
#[derive(Debug, Default)]
pub struct StallWatch {
    /// The member stalled.
    pub member: usize,
    stalled_at: Option<Instant>,
    ejected_at: Option<Instant>,
    ended_at: Option<Instant>,
    in_deadline_at_eject: u64,
    in_deadline_at_end: u64,
}

impl StallWatch {
    /// The stall of `member` starts now.
    pub fn start(&mut self, member: usize, now: Instant) {
        *self = Self {
            member,
            stalled_at: Some(now),
            ..Self::default()
        };
    }

    /// The stall ends now; `in_deadline` = requests answered in time so far.
    pub fn end(&mut self, now: Instant, in_deadline: u64) {
        if self.stalled_at.is_some() && self.ended_at.is_none() {
            self.ended_at = Some(now);
            self.in_deadline_at_end = in_deadline;
        }
    }

    /// Whether the stalled member's ejection is still to be seen.
    pub fn waiting_for_ejection(&self) -> bool {
        self.stalled_at.is_some() && self.ejected_at.is_none() && self.ended_at.is_none()
    }

    /// The member was seen ejected now.
    pub fn ejected(&mut self, now: Instant, in_deadline: u64) {
        if self.waiting_for_ejection() {
            self.ejected_at = Some(now);
            self.in_deadline_at_eject = in_deadline;
        }
    }

    /// The report, with `remaining_capacity_per_s` = what the other members can serve.
    pub fn report(&self, remaining_capacity_per_s: f64) -> Option<StallReport> {
        let stalled_at = self.stalled_at?;
        let ejected_after_ms = self
            .ejected_at
            .map(|t| t.saturating_duration_since(stalled_at).as_secs_f64() * 1e3);
        let goodput = match (self.ejected_at, self.ended_at) {
            (Some(e), Some(end)) if end > e + Duration::from_millis(500) => {
                let served = self
                    .in_deadline_at_end
                    .saturating_sub(self.in_deadline_at_eject);
                Some(served as f64 / (end - e).as_secs_f64())
            }
            _ => None,
        };
        Some(StallReport {
            member: self.member,
            ejected_after_ms,
            goodput_after_ejection_per_s: goodput,
            remaining_capacity_per_s,
            goodput_share: goodput.map(|g| g / remaining_capacity_per_s.max(1e-9)),
        })
    }
}

/// The stalled member's story in a report (`backend-stall`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StallReport {
    /// Which member stalled (0-based, configuration order).
    pub member: usize,
    /// Stall start → the pool seen ejecting it (sampled every 100 ms); `None`: never
    /// ejected (the naive front has no health).
    pub ejected_after_ms: Option<f64>,
    /// Requests answered in time per second between the ejection and the stall's end.
    pub goodput_after_ejection_per_s: Option<f64>,
    /// What the other members can complete per second (their slots / mean latency).
    pub remaining_capacity_per_s: f64,
    /// `goodput_after_ejection_per_s / remaining_capacity_per_s`.
    pub goodput_share: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_report_measures_from_the_stall_to_the_ejection() {
        let t0 = Instant::now();
        let mut w = StallWatch::default();
        assert!(w.report(10.0).is_none());
        w.start(1, t0);
        assert!(w.waiting_for_ejection());
        w.ejected(t0 + Duration::from_millis(400), 100);
        w.ejected(t0 + Duration::from_millis(900), 150); // seen once
        w.end(t0 + Duration::from_millis(5400), 600);
        let r = w.report(100.0).unwrap_or_default();
        assert_eq!(r.member, 1);
        assert!((r.ejected_after_ms.unwrap_or_default() - 400.0).abs() < 1e-6);
        // 500 answered in time over the 5 s after the ejection.
        assert!((r.goodput_after_ejection_per_s.unwrap_or_default() - 100.0).abs() < 1e-6);
        assert!((r.goodput_share.unwrap_or_default() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_stall_never_ejected_has_no_goodput_after_ejection() {
        let t0 = Instant::now();
        let mut w = StallWatch::default();
        w.start(0, t0);
        w.end(t0 + Duration::from_secs(10), 50);
        w.ejected(t0 + Duration::from_secs(11), 60); // after the stall: not an ejection
        let r = w.report(10.0).unwrap_or_default();
        assert_eq!(
            (r.ejected_after_ms, r.goodput_after_ejection_per_s),
            (None, None)
        );
    }
}
