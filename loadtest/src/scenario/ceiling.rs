//! `ceiling`: ramp the stream count until the ingress can no longer keep up. What makes
//! a step sustainable ([`judge`]), the re-run of a step that failed on a busy machine and
//! the probe between the last good and the first failing count ([`next_probe`]) are in
//! docs/loadtest.md ("The ceiling").
//!
//! Invariants: each step is a fresh `steady` run (fresh nats-server and ingress); a
//! shared machine must not decide the verdict; no step starts after [`MAX_TOTAL`].

use std::time::Duration;

use tokio::time::Instant;

use crate::error::Error;
use crate::ingress::Design;
use crate::report::{CeilingReport, CeilingStep, RunReport};
use crate::scenario::run::{Env, RunOutput, run_one, wait_quiet};
use crate::scenario::{Plan, Scenario};

/// Default ramp.
pub const DEFAULT_STEPS: &[usize] = &[
    50, 100, 200, 400, 600, 800, 1000, 1200, 1400, 1600, 2000, 2400,
];
/// Default seconds of audio per step.
pub const DEFAULT_STEP_DURATION: Duration = Duration::from_secs(5);
/// No step starts after this much time.
pub const MAX_TOTAL: Duration = Duration::from_secs(240);
/// One frame: the queue-wait bound.
pub const FRAME_MS: f64 = 20.0;

/// Other processes using more than this many cores make a failed step be run again.
pub const BUSY_CORES: f64 = 0.25;

/// Why a step is not sustainable (empty = sustainable). Pure.
pub fn judge(r: &RunReport) -> Vec<String> {
    let mut why = Vec::new();
    let p99 = r.ingress.queue_wait_ms.p99;
    if p99 > FRAME_MS {
        why.push(format!("queue wait p99 {p99:.1} ms > {FRAME_MS} ms"));
    }
    if r.ingress.overloads > 0 {
        why.push(format!("{} overloads", r.ingress.overloads));
    }
    if r.ingress.admission_rejects > 0 {
        why.push(format!(
            "{} admission refusals",
            r.ingress.admission_rejects
        ));
    }
    let nominal = r.producers.nominal_frames.max(1);
    let share = r.producers.counters.frames_sent as f64 / nominal as f64;
    if share < 0.97 {
        why.push(format!(
            "the load generator sent only {:.1} % of the nominal frames",
            share * 100.0
        ));
    }
    if r.frames.explained.lost_after_publish > 0 {
        why.push(format!(
            "{} published frames not received (NATS/client loss)",
            r.frames.explained.lost_after_publish
        ));
    }
    if !why.is_empty() {
        why.push(cpu_line(r));
    }
    why
}

/// Average cores used by each process during a run, for the verdict.
pub fn cpu_line(r: &RunReport) -> String {
    let w = r.cpu.wall_s.max(0.001);
    format!(
        "CPU in cores: ingress {:.2}, load test {:.2}, nats-server {:.2}, other processes {:.2} (of 2)",
        r.cpu.ingress_s / w,
        r.cpu.loadtest_s / w,
        r.cpu.nats_server_s.unwrap_or(0.0) / w,
        r.cpu.other_s / w
    )
}

/// The count to probe between a good and a failing step, if they are far enough apart.
pub fn next_probe(good: usize, bad: usize) -> Option<usize> {
    if bad <= good || (bad - good) * 10 <= good.max(1) {
        return None;
    }
    let mid = good + (bad - good) / 2;
    // Round to a multiple of 50 (or 10 for small counts) for readable tables.
    let unit = if mid >= 200 { 50 } else { 10 };
    let mid = (mid / unit).max(1) * unit;
    (mid > good && mid < bad).then_some(mid)
}

/// Runs the ramp for one design; returns every step's output, each report carrying the
/// verdict (`max_streams`, `ceiling`).
pub async fn run(
    env: &Env,
    steps: &[usize],
    step_duration: Duration,
    design: Design,
) -> Result<Vec<RunOutput>, Error> {
    let started = Instant::now();
    let plan = Plan {
        scenario: Scenario::Ceiling,
        duration: step_duration,
        fault: None,
        vanish_share: 0.0,
        llm_factor: None,
    };
    let mut outputs: Vec<RunOutput> = Vec::new();
    let mut verdict = CeilingReport::default();
    let mut best: Option<usize> = None;
    let mut failed: Option<(usize, Vec<String>)> = None;
    for &n in steps {
        if started.elapsed() > MAX_TOTAL {
            verdict
                .limited_by
                .push(format!("time budget of {} s used up", MAX_TOTAL.as_secs()));
            break;
        }
        let mut out = run_one(env, &plan, n, design).await?;
        let mut why = judge(&out.report);
        if !why.is_empty() && out.report.cpu.other_cores() > BUSY_CORES {
            // Other processes took the CPU: the step measured the machine, not the rig.
            // Wait (bounded) for a quieter moment and run it once more.
            wait_quiet(Duration::from_secs(60)).await;
            out = run_one(env, &plan, n, design).await?;
            why = judge(&out.report);
        }
        verdict.steps.push(CeilingStep::new(n, why.clone()));
        outputs.push(out);
        if why.is_empty() {
            best = Some(best.map_or(n, |b| b.max(n)));
        } else {
            failed = Some((n, why));
            break;
        }
    }
    if let (Some(good), Some((bad, _))) = (best, &failed)
        && let Some(mid) = next_probe(good, *bad)
        && started.elapsed() <= MAX_TOTAL
    {
        let out = run_one(env, &plan, mid, design).await?;
        let why = judge(&out.report);
        if why.is_empty() {
            best = Some(good.max(mid));
        }
        verdict.steps.push(CeilingStep::new(mid, why));
        outputs.push(out);
    }
    match &failed {
        Some((n, why)) => verdict
            .limited_by
            .push(format!("at {n} streams: {}", why.join("; "))),
        None if verdict.limited_by.is_empty() => verdict
            .limited_by
            .push("not reached: every step of the ramp was sustainable".into()),
        None => {}
    }
    let max = best.unwrap_or(0);
    for o in &mut outputs {
        o.report.max_streams = Some(max);
        o.report.ceiling = Some(verdict.clone());
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(p99: f64, overloads: u64, sent: u64, other_s: f64) -> RunReport {
        let mut r = crate::report::tests::example();
        r.ingress.queue_wait_ms.p99 = p99;
        r.ingress.overloads = overloads;
        r.producers.nominal_frames = 1000;
        r.producers.counters.frames_sent = sent;
        r.cpu.wall_s = 5.0;
        r.cpu.other_s = other_s;
        r
    }

    #[test]
    fn judges_a_step() {
        assert!(judge(&step(0.1, 0, 1000, 0.0)).is_empty());
        let why = judge(&step(35.0, 0, 1000, 0.0));
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why[0].contains("p99 35.0 ms > 20 ms"));
        assert!(why[1].contains("CPU in cores"));
        assert!(judge(&step(1.0, 3, 1000, 0.0))[0].contains("3 overloads"));
        assert!(judge(&step(1.0, 0, 900, 0.0))[0].contains("90.0 %"));
        assert!(step(1.0, 0, 900, 2.5).cpu.other_cores() > BUSY_CORES);
    }

    #[test]
    fn probes_between_good_and_bad() {
        assert_eq!(next_probe(1000, 1200), Some(1100));
        assert_eq!(next_probe(1000, 1050), None, "within 10 %");
        assert_eq!(next_probe(400, 600), Some(500));
        assert_eq!(next_probe(50, 100), Some(70));
        assert_eq!(next_probe(100, 50), None);
    }
}
