//! Scenarios: what each one injects and for how long — pure plans, no I/O.
//!
//! What each scenario does is in docs/loadtest.md ("Scenarios"); [`ceiling`],
//! [`failover`], [`asr`] and [`flap`] have runners of their own.
//!
//! Faults start [`FAULT_AT`] after the producers ([`BACKEND_STALL_AT`] for
//! `backend-stall`), and the run keeps sending for at least
//! [`RECOVERY`] after the fault ends, so that recovery is measured too. A plan is
//! validated before anything starts: a `--duration` too short for the fault is refused
//! with a message naming the flags.

pub mod asr;
pub mod ceiling;
pub mod failover;
mod figures;
pub mod flap;
pub mod run;

use std::io::IsTerminal;
use std::time::Duration;

use clap::ValueEnum;
use tokio::task::{JoinError, JoinSet};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::error::{Error, usage};
use serde::Serialize;
use weir_protocol::WireName;

/// Prints a progress line on stderr: rewritten in place on a terminal, one line each
/// otherwise.
pub(crate) fn progress(line: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r{line:<130}");
    } else {
        eprintln!("{line}");
    }
}

/// Clears the progress line (on a terminal, unless `quiet`: then none was printed).
pub(crate) fn clear_progress(quiet: bool) {
    if !quiet && std::io::stderr().is_terminal() {
        eprint!("\r{:<130}\r", "");
    }
}

/// An interval of `period` that skips missed ticks instead of bursting to catch up.
pub(crate) fn ticker(period: Duration) -> Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    tick
}

/// Polls every `period` until `deadline`; `poll` returns a count and whether everything
/// else has settled. Settled (`true`) once the count stayed the same for `polls` polls
/// in a row while everything else had settled.
pub(crate) async fn until_stable(
    deadline: Instant,
    period: Duration,
    polls: u32,
    mut poll: impl AsyncFnMut() -> (u64, bool),
) -> bool {
    let (mut last, mut same) = (u64::MAX, 0);
    while Instant::now() < deadline {
        tokio::time::sleep(period).await;
        let (count, settled) = poll().await;
        same = if count == last { same + 1 } else { 0 };
        last = count;
        if same >= polls && settled {
            return true;
        }
    }
    false
}

/// Joins every task of `set`, calling `on_tick` on each tick meanwhile; at `deadline`
/// the rest are aborted. Returns the results of the tasks that ended, and whether some
/// were aborted.
pub(crate) async fn join_ticking<T: 'static>(
    mut set: JoinSet<T>,
    deadline: Instant,
    tick: &mut Interval,
    mut on_tick: impl FnMut(),
) -> (Vec<Result<T, JoinError>>, bool) {
    let mut ended = Vec::with_capacity(set.len());
    loop {
        tokio::select! {
            next = set.join_next() => match next {
                Some(r) => ended.push(r),
                None => return (ended, false),
            },
            _ = tick.tick() => on_tick(),
            _ = tokio::time::sleep_until(deadline) => {
                set.abort_all();
                return (ended, true);
            }
        }
    }
}

/// When a fault starts, after the producers started.
pub const FAULT_AT: Duration = Duration::from_secs(2);
/// Minimum sending time after a fault ended.
pub const RECOVERY: Duration = Duration::from_secs(2);
/// Default audio per run for scenarios without a fault.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Default fault length.
pub const DEFAULT_PAUSE: Duration = Duration::from_secs(5);
/// Default fault length for `nats-restart` (server down time).
pub const DEFAULT_RESTART_DOWN: Duration = Duration::from_secs(2);
/// Share of producers that vanish in `no-end`.
pub const NO_END_SHARE: f64 = 0.5;

/// A scenario (the first argument).
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "kebab-case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// N streams at the real cadence, nothing injected.
    Steady,
    /// nats-server stopped (SIGSTOP) for --pause seconds mid-run.
    NatsPause,
    /// Recognisers and the LLM backend stall for --pause seconds.
    BackendPause,
    /// nats-server killed and restarted on the same port after --pause seconds.
    NatsRestart,
    /// Half the producers vanish without `end`.
    NoEnd,
    /// LLM requests offered at k × the backend's capacity, with deadlines.
    LlmOverload,
    /// One of --llm-backends (default 3) simulated LLM backends stalls (accepts calls,
    /// answers none) at t = 10 s for --pause seconds (default 10), at 1.5 × the pool's
    /// capacity.
    BackendStall,
    /// Ramp streams until p99 queue wait exceeds one frame or overloads appear.
    Ceiling,
    /// Lease workers on a 3-node cluster; one worker process SIGKILLed, restarted.
    WorkerFailover,
    /// Lease workers on a 3-node cluster; the KV leader node SIGKILLed, restarted.
    NodeFailover,
    /// Calls against GPU recognisers with fewer slots: naive, weir-off, weir-on.
    AsrShortfall,
    /// weir-on with worker processes: one SIGKILLed, then one added.
    AsrChurn,
    /// Every producer's TCP connection cut every --flap-every, reconnecting at once:
    /// naive, weir without resume, weir with resume.
    ProducerFlap,
    /// Every scenario above except ceiling, the two failovers, the two asr ones and
    /// producer-flap.
    All,
    /// The demo: steady and nats-pause, short runs, both designs; asr-shortfall.
    Showcase,
}

impl Scenario {
    /// The concrete scenarios a selection stands for.
    pub fn expand(self) -> Vec<Scenario> {
        match self {
            Self::All => vec![
                Self::Steady,
                Self::NatsPause,
                Self::BackendPause,
                Self::NatsRestart,
                Self::NoEnd,
                Self::LlmOverload,
            ],
            Self::Showcase => vec![Self::Steady, Self::NatsPause, Self::AsrShortfall],
            s => vec![s],
        }
    }
}

/// What a fault does.
#[derive(strum::IntoStaticStr, strum::Display, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGSTOP then SIGCONT the nats-server.
    NatsPause,
    /// SIGKILL the nats-server, start it again on the same port.
    NatsRestart,
    /// Pause the recognisers and the LLM backend.
    BackendPause,
    /// Stall one LLM backend of several (the first).
    BackendStall,
}

impl FaultKind {
    /// Whether the fault needs control of the nats-server process.
    pub fn needs_embedded_server(self) -> bool {
        matches!(self, Self::NatsPause | Self::NatsRestart)
    }
}

/// A fault in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What.
    pub kind: FaultKind,
    /// When, after the producers started.
    pub at: Duration,
    /// How long.
    pub length: Duration,
}

/// When `backend-stall`'s stall starts: late enough that every backend has a service-time
/// estimate and the run is in its steady state.
pub const BACKEND_STALL_AT: Duration = Duration::from_secs(10);
/// `backend-stall`'s default stall length.
pub const BACKEND_STALL_LENGTH: Duration = Duration::from_secs(10);
/// `backend-stall`'s offered LLM load, a multiple of the whole pool's capacity.
pub const BACKEND_STALL_FACTOR: f64 = 1.5;

/// The resolved plan of one scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The scenario.
    pub scenario: Scenario,
    /// How long producers send.
    pub duration: Duration,
    /// The fault, if any.
    pub fault: Option<Fault>,
    /// Share of producers that vanish without `end`.
    pub vanish_share: f64,
    /// The offered LLM rate as a multiple of the backend's capacity, if the scenario
    /// drives the LLM side.
    pub llm_factor: Option<f64>,
}

/// Resolves the plan of a concrete scenario from the flags (pure).
///
/// `duration` and `pause` are the `--duration` / `--pause` flags when given;
/// `llm_factor` is `--llm-factor`.
pub fn plan(
    scenario: Scenario,
    duration: Option<Duration>,
    pause: Option<Duration>,
    llm_factor: f64,
) -> Result<Plan, Error> {
    let faulted = |kind: FaultKind, at: Duration, default_len: Duration| -> Result<Plan, Error> {
        let length = pause.unwrap_or(default_len);
        if length.is_zero() {
            return Err(usage(format!(
                "--pause must be above 0 for {}",
                scenario.as_str()
            )));
        }
        let needed = at + length + RECOVERY;
        let duration = duration.unwrap_or(needed);
        if duration < needed {
            return Err(usage(format!(
                "--duration {:.1} s is too short for {}: the fault starts at {} s and lasts \
                 --pause {:.1} s, and {} s of recovery follow; use --duration {:.0} or more",
                duration.as_secs_f64(),
                scenario.as_str(),
                at.as_secs(),
                length.as_secs_f64(),
                RECOVERY.as_secs(),
                needed.as_secs_f64().ceil()
            )));
        }
        Ok(Plan {
            scenario,
            duration,
            fault: Some(Fault { kind, at, length }),
            vanish_share: 0.0,
            llm_factor: match kind {
                FaultKind::BackendPause => Some(0.5),
                FaultKind::BackendStall => Some(BACKEND_STALL_FACTOR),
                FaultKind::NatsPause | FaultKind::NatsRestart => None,
            },
        })
    };
    let plain = |vanish_share: f64, llm_factor: Option<f64>| -> Result<Plan, Error> {
        let duration = duration.unwrap_or(DEFAULT_DURATION);
        if duration < Duration::from_secs(1) {
            return Err(usage("--duration must be at least 1 second"));
        }
        Ok(Plan {
            scenario,
            duration,
            fault: None,
            vanish_share,
            llm_factor,
        })
    };
    if !(llm_factor.is_finite() && llm_factor > 0.0 && llm_factor <= 100.0) {
        return Err(usage(format!(
            "--llm-factor {llm_factor} is out of range; allowed (0, 100]"
        )));
    }
    match scenario {
        Scenario::Steady | Scenario::Ceiling => plain(0.0, None),
        Scenario::NatsPause => faulted(FaultKind::NatsPause, FAULT_AT, DEFAULT_PAUSE),
        Scenario::BackendPause => faulted(FaultKind::BackendPause, FAULT_AT, DEFAULT_PAUSE),
        Scenario::BackendStall => faulted(
            FaultKind::BackendStall,
            BACKEND_STALL_AT,
            BACKEND_STALL_LENGTH,
        ),
        Scenario::NatsRestart => faulted(FaultKind::NatsRestart, FAULT_AT, DEFAULT_RESTART_DOWN),
        Scenario::NoEnd => plain(NO_END_SHARE, None),
        Scenario::LlmOverload => plain(0.0, Some(llm_factor)),
        Scenario::All | Scenario::Showcase => Err(usage(format!(
            "{} is a selection, not a scenario",
            scenario.as_str()
        ))),
        // Planned by `failover::plan`, run by `asr` and `flap`.
        Scenario::WorkerFailover
        | Scenario::NodeFailover
        | Scenario::AsrShortfall
        | Scenario::AsrChurn
        | Scenario::ProducerFlap => Err(usage(format!(
            "{} has a runner of its own",
            scenario.as_str()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use weir_testkit::names::assert_serde_names;

    #[test]
    fn wire_names_are_the_serde_and_clap_names() {
        assert_serde_names::<Scenario>();
        assert_serde_names::<FaultKind>();
        assert_serde_names::<crate::ingress::Design>();
        assert_serde_names::<crate::producers::Transport>();
        for &s in Scenario::ALL {
            let clap = s.to_possible_value().map(|v| v.get_name().to_owned());
            assert_eq!(clap.as_deref(), Some(s.as_str()));
        }
    }

    #[test]
    fn fault_scenarios_get_room_for_the_fault_and_recovery() {
        let p = plan(
            Scenario::NatsPause,
            None,
            Some(Duration::from_secs(10)),
            3.0,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.duration, Duration::from_secs(14));
        let f = p.fault.unwrap_or_else(|| panic!("a fault"));
        assert_eq!(
            (f.kind, f.at, f.length),
            (FaultKind::NatsPause, FAULT_AT, Duration::from_secs(10))
        );
    }

    #[test]
    fn too_short_duration_is_refused_naming_the_flags() {
        let e = plan(
            Scenario::NatsPause,
            Some(Duration::from_secs(5)),
            Some(Duration::from_secs(4)),
            3.0,
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Usage);
        let e = e.to_string();
        assert!(
            e.contains("--duration") && e.contains("--pause") && e.contains("8"),
            "{e}"
        );
    }

    #[test]
    fn backend_stall_stalls_at_ten_seconds_under_one_and_a_half_times_the_pool() {
        let p = plan(Scenario::BackendStall, None, None, 3.0).unwrap_or_else(|e| panic!("{e}"));
        let f = p.fault.unwrap_or_else(|| panic!("a fault"));
        assert_eq!(
            (f.kind, f.at, f.length),
            (
                FaultKind::BackendStall,
                BACKEND_STALL_AT,
                BACKEND_STALL_LENGTH
            )
        );
        assert_eq!(
            p.duration,
            BACKEND_STALL_AT + BACKEND_STALL_LENGTH + RECOVERY
        );
        assert_eq!(p.llm_factor, Some(BACKEND_STALL_FACTOR));
    }

    #[test]
    fn plain_scenarios() {
        let p = plan(Scenario::NoEnd, None, None, 3.0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.vanish_share, NO_END_SHARE);
        assert!(p.fault.is_none());
        let p = plan(
            Scenario::LlmOverload,
            Some(Duration::from_secs(3)),
            None,
            4.0,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(p.llm_factor, Some(4.0));
        assert!(plan(Scenario::Steady, None, None, 0.0).is_err());
        assert!(plan(Scenario::All, None, None, 1.0).is_err());
    }

    #[test]
    fn selections_expand() {
        assert_eq!(
            Scenario::Showcase.expand(),
            vec![
                Scenario::Steady,
                Scenario::NatsPause,
                Scenario::AsrShortfall
            ]
        );
        assert_eq!(Scenario::All.expand().len(), 6);
        assert!(!Scenario::All.expand().contains(&Scenario::Ceiling));
    }
}
