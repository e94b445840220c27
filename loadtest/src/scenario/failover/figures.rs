//! From what a failover run measured to its report: the `failover` section (spreads,
//! takeover or renewals, the frame audit, CPU shares) and the run report around it.
//!
//! Pure but for the CPU reading in [`PhaseCpu::measure`]: nothing is re-measured and
//! nothing is invented.

use std::time::Duration;

use super::workers::WorkerProc;
use super::{FailoverEnv, FailoverPlan, FaultLog, NODES, Phase, Victim};
use crate::ingress::{cpu_since, cpu_time_of, machine_busy_since};
use crate::lease_audit::{self, FrameAudit, Instance};
use crate::producers::ProducerSnapshot;
use crate::report::{
    CpuReport, FailoverCpu, FailoverReport, FaultReport, ProducerReport, RunReport,
};
use weir_protocol::WireName;

/// CPU seconds over the sending phase.
#[derive(Debug, Clone, Copy)]
pub(super) struct PhaseCpu {
    pub(super) machine: f64,
    pub(super) own: f64,
    pub(super) workers: f64,
    pub(super) nats: f64,
}

impl PhaseCpu {
    pub(super) fn measure(
        machine0: Duration,
        self0: Duration,
        workers: &[WorkerProc],
        p: &Phase<'_>,
        f: &FaultLog,
    ) -> Self {
        let machine = machine_busy_since(machine0).as_secs_f64();
        let own = cpu_since(std::process::id(), self0).as_secs_f64();
        let workers = workers
            .iter()
            .filter_map(WorkerProc::cpu_now)
            .map(|d| d.as_secs_f64())
            .sum();
        let nats = (0..NODES)
            .map(|i| {
                if Some(i) == f.killed_node {
                    // Its first life until the kill, plus its restarted process.
                    f.nats_cpu_dead + cpu_time_of(Some(p.cluster.node(i).pid())).unwrap_or_default()
                } else {
                    cpu_since(p.cluster.node(i).pid(), p.nats0[i])
                }
            })
            .map(|d| d.as_secs_f64())
            .sum();
        Self {
            machine,
            own,
            workers,
            nats,
        }
    }

    /// Seconds used by other processes.
    pub(super) fn other(&self) -> f64 {
        self.machine - self.own - self.workers - self.nats
    }
}

/// Everything a failover run measured, at its end.
pub(super) struct Measured {
    /// The workers' lease histories.
    pub(super) inst: Vec<Instance>,
    pub(super) fault: FaultLog,
    pub(super) frames: FrameAudit,
    pub(super) cpu: PhaseCpu,
    pub(super) wall_s: f64,
    pub(super) start_ms: u64,
    pub(super) end_ms: u64,
    /// The balanced share per worker, `lo..=hi`.
    pub(super) share: (usize, usize),
    /// Frames the producers sent.
    pub(super) sent: u64,
}

/// The run's report around its `failover` section (spreads, takeover or renewals,
/// frames, CPU shares); `notes` are the run's own, in order, before the notes on the
/// figures (a busy machine, double deliveries).
pub(super) fn run_report(
    env: &FailoverEnv,
    plan: &FailoverPlan,
    streams: usize,
    m: Measured,
    mut notes: Vec<String>,
) -> RunReport {
    let (inst, f, wall_s, (lo, hi)) = (&m.inst, &m.fault, m.wall_s, m.share);
    let (kill_ms, restart_ms, end_ms) = (f.kill_ms, f.restart_ms, m.end_ms);
    let mut report = FailoverReport {
        victim: f.victim_name.clone(),
        victim_led_kv: f.victim_led_kv,
        nodes: NODES,
        workers: env.workers,
        partitions: env.partitions,
        fps: env.fps,
        lease_ttl_ms: env.lease_ttl.as_millis() as u64,
        killed_at_s: kill_ms.saturating_sub(m.start_ms) as f64 / 1000.0,
        restarted_at_s: restart_ms.saturating_sub(m.start_ms) as f64 / 1000.0,
        spread_before: lease_audit::spread_at(inst, kill_ms.saturating_sub(1)),
        spread_before_restart: lease_audit::spread_at(inst, restart_ms.saturating_sub(1)),
        spread_end: lease_audit::spread_at(inst, end_ms),
        frames: m.frames,
        cpu: FailoverCpu {
            machine_cores: m.cpu.machine / wall_s,
            loadtest_cores: m.cpu.own / wall_s,
            workers_cores: m.cpu.workers / wall_s,
            nats_cores: m.cpu.nats / wall_s,
            other_cores: (m.cpu.other() / wall_s).max(0.0),
            loadavg_1m_at_kill: f.loadavg_at_kill,
        },
        ..FailoverReport::default()
    };
    match plan.victim {
        Victim::Worker => {
            report.takeover = Some(lease_audit::takeover(inst, 0, f.restarted_idx, kill_ms));
            if let Some(r) = f.restarted_idx {
                let started = inst[r].started_ms.unwrap_or(restart_ms);
                report.rejoin_share_ms = inst[r]
                    .events
                    .iter()
                    .map(|e| e.at_ms)
                    .find(|&t| inst[r].held_at(t).len() >= lo)
                    .map(|t| t.saturating_sub(restart_ms) as f64);
                report.rejoin_balanced_ms =
                    lease_audit::first_balanced(inst, started, end_ms, env.partitions, lo, hi)
                        .map(|t| t.saturating_sub(restart_ms) as f64);
            }
        }
        Victim::Node => {
            report.renewals = Some(lease_audit::renewals(inst, kill_ms, end_ms));
        }
    }
    if report.cpu.other_cores > 0.25 {
        notes.push(format!(
            "other processes used {:.2} cores on average during this run: the machine was not quiet",
            report.cpu.other_cores
        ));
    }
    if report.frames.double_deliveries > 0 {
        notes.push(format!(
            "{} frames were handed to two workers ({:?}; e.g. {:?}) — machine {:.2} cores busy, \
             load average {:?} at the kill",
            report.frames.double_deliveries,
            report.frames.double_by_instances,
            report.frames.double_examples,
            report.cpu.machine_cores,
            report.cpu.loadavg_1m_at_kill
        ));
    }
    notes.push(
        "no ingress in this scenario: producers publish straight to NATS; the ingress, \
         frames and llm sections are empty, the figures are under failover"
            .into(),
    );
    RunReport {
        scenario: plan.scenario.as_str().to_owned(),
        streams,
        duration_s: plan.duration.as_secs_f64(),
        wall_s,
        fault: Some(FaultReport {
            kind: match plan.victim {
                Victim::Worker => "worker_kill".into(),
                Victim::Node => "node_kill".into(),
            },
            at_s: report.killed_at_s,
            duration_s: plan.down.as_secs_f64(),
        }),
        producers: ProducerReport {
            nominal_frames: streams as u64 * u64::from(env.fps) * plan.duration.as_secs(),
            counters: ProducerSnapshot {
                frames_sent: m.sent,
                ..Default::default()
            },
        },
        llm: crate::llm::not_run(),
        cpu: CpuReport {
            loadtest_s: m.cpu.own,
            nats_server_s: Some(m.cpu.nats),
            other_s: m.cpu.other().max(0.0),
            wall_s,
            ..CpuReport::default()
        },
        failover: Some(report),
        notes,
        ..RunReport::default()
    }
}
