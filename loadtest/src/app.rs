//! The load test as a program: expand the selection into runs, run them one after the
//! other (never concurrently: they would share the 2 cores), then print the table and
//! write the JSON and the charts.
//!
//! Completed reports are pushed into a shared list as soon as each run ends, so that an
//! interrupted session (Ctrl-C) can still write what it measured.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use strum::VariantArray;

use crate::cli::{Cli, DesignArg};
use crate::error::{Error, ErrorKind, io, usage};
use crate::ingress::Design;
use crate::ingress::find_ingress_bin;
use crate::llm::{LlmSettings, StreamLoad};
use crate::plot::{Panel, Series, grid_svg};
use crate::producers::Transport;
use crate::report::RunReport;
use crate::scenario::run::{Env, RunOutput, run_one};
use crate::scenario::{self, Scenario, asr, ceiling, failover, flap};
use weir_protocol::WireName;

/// Showcase defaults (the demo must fit in 2 minutes of run time).
/// Steady runs: 5 s of audio.
const SHOWCASE_DURATION: Duration = Duration::from_secs(5);
/// NATS paused for 6 s: long enough to exceed what the NATS client and the socket
/// absorb before `publish` blocks (about 3 s at 50 streams), so that the naive
/// design's growth shows.
const SHOWCASE_PAUSE: Duration = Duration::from_secs(6);

/// Everything measured so far.
pub type Results = Arc<Mutex<Vec<RunOutput>>>;

/// Builds the run environment from the command line.
pub fn env_from(cli: &Cli) -> Result<Env, Error> {
    let self_exe = std::env::current_exe()
        .map_err(|e| Error::with_source(ErrorKind::Io, "cannot find my own executable", e))?;
    let ingress_bin = match &cli.ingress_bin {
        Some(p) if p.is_file() => Ok(p.clone()),
        Some(p) => Err(usage(format!(
            "--ingress-bin {} is not a file",
            p.display()
        ))),
        None => find_ingress_bin(Some(&self_exe)),
    };
    Ok(Env {
        nats_url: cli.nats_url.clone(),
        self_exe,
        ingress_bin,
        policy: cli.policy,
        frame_cost: Duration::from_micros(cli.frame_cost_us),
        fleet_workers: cli.workers.unwrap_or(2),
        partitions: cli.partitions.unwrap_or(8),
        reconnect: !cli.no_reconnect,
        quiet: cli.quiet,
        llm: LlmSettings {
            workers: cli.llm_workers as usize,
            backends: llm_backends(cli)?,
            sessions: cli.llm_sessions.map(|n| n as usize),
            latency: Duration::from_millis(cli.llm_latency_ms),
            shape: cli.llm_latency_shape,
            deadline: Duration::from_millis(cli.llm_deadline_ms),
            stream: cli.stream.then(|| StreamLoad {
                first_token: Duration::from_millis(cli.llm_first_token_ms),
                tokens: cli.llm_tokens,
                tokens_per_second: f64::from(cli.llm_tokens_per_second),
            }),
        },
        ingress_set: cli.ingress_set.clone(),
        naive_floor: cli.naive_floor,
        wait_quiet: cli.wait_quiet,
        transport: cli.transport,
    })
}

/// The failover scenarios' environment: 3 workers and 64 partitions by default.
fn failover_env_from(cli: &Cli, env: &Env) -> failover::FailoverEnv {
    failover::FailoverEnv {
        self_exe: env.self_exe.clone(),
        workers: cli.workers.unwrap_or(3),
        partitions: cli.partitions.unwrap_or(64),
        lease_ttl: Duration::from_millis(cli.lease_ttl_ms),
        fps: cli.fps,
        quiet: cli.quiet,
        keep_logs: cli.keep_logs.clone(),
    }
}

/// The designs to run: `--design`, else `default`; with `--transport whip` or `twilio`
/// the bounded one only (the naive ingress has no WHIP or telephony door).
fn designs_for(cli: &Cli, default: DesignArg) -> Result<Vec<Design>, Error> {
    match (cli.transport, cli.design) {
        (Transport::Whip, Some(DesignArg::Naive | DesignArg::Both)) => Err(usage(
            "--transport whip runs the bounded design only (the naive ingress has no WHIP door)",
        )),
        (Transport::Twilio, Some(DesignArg::Naive | DesignArg::Both)) => Err(usage(
            "--transport twilio runs the bounded design only (the naive ingress has no telephony door)",
        )),
        (Transport::Whip | Transport::Twilio, _) => Ok(vec![Design::Bounded]),
        (Transport::Ws, d) => Ok(d.unwrap_or(default).designs()),
    }
}

/// One scenario of the selection, its plan validated.
enum Job {
    Plan(scenario::Plan),
    Failover(failover::FailoverPlan),
    Asr(Scenario),
    Flap,
}

/// Runs the selection; returns the number of runs that failed.
pub async fn run(cli: &Cli, results: Results) -> Result<usize, Error> {
    let selection = cli
        .scenario
        .ok_or_else(|| usage("a scenario is required (see --help)"))?;
    let env = env_from(cli)?;
    let showcase = selection == Scenario::Showcase;
    // Validate every plan before starting anything.
    let mut jobs = Vec::new();
    for s in selection.expand() {
        jobs.push(match s {
            Scenario::ProducerFlap => Job::Flap,
            Scenario::AsrShortfall | Scenario::AsrChurn => Job::Asr(s),
            Scenario::WorkerFailover | Scenario::NodeFailover => {
                Job::Failover(failover::plan(s, cli.duration, cli.pause)?)
            }
            _ if showcase => {
                let duration = cli.duration.unwrap_or(match s {
                    Scenario::NatsPause => scenario::FAULT_AT + SHOWCASE_PAUSE + scenario::RECOVERY,
                    _ => SHOWCASE_DURATION,
                });
                let pause = cli.pause.unwrap_or(SHOWCASE_PAUSE);
                Job::Plan(scenario::plan(
                    s,
                    Some(duration),
                    Some(pause),
                    cli.llm_factor,
                )?)
            }
            _ => Job::Plan(scenario::plan(s, cli.duration, cli.pause, cli.llm_factor)?),
        });
    }
    let mut failures = 0;
    for job in jobs {
        failures += match job {
            Job::Plan(plan) => run_plan(cli, &env, &plan, &results).await?,
            Job::Failover(plan) => run_failover(cli, &env, &plan, &results).await,
            Job::Asr(s) => run_asr(cli, &env, s, showcase, &results).await,
            Job::Flap => run_flap(cli, &env, &results).await,
        };
    }
    Ok(failures)
}

/// Runs a failover scenario (200 streams by default); returns the number of runs that
/// failed.
async fn run_failover(
    cli: &Cli,
    env: &Env,
    plan: &failover::FailoverPlan,
    results: &Results,
) -> usize {
    let fenv = failover_env_from(cli, env);
    let mut failures = 0;
    for &n in cli.streams.as_deref().unwrap_or(&[200]) {
        let outcome = failover::run(&fenv, plan, n).await;
        failures += record(outcome, results, || {
            format!("{} {n}", plan.scenario.as_str())
        });
    }
    failures
}

/// Runs `producer-flap`; returns the number of runs that failed (a design whose
/// calls failed a check is reported, not counted as a failed run: the naive designs
/// are expected to).
async fn run_flap(cli: &Cli, env: &Env, results: &Results) -> usize {
    let settings = flap::FlapSettings {
        duration: cli.duration.unwrap_or(flap::DEFAULT_DURATION),
        flap_every: cli.flap_every.unwrap_or(flap::DEFAULT_FLAP_EVERY),
        partitions: cli.partitions.unwrap_or(8),
    };
    let mut failures = 0;
    for &n in cli.streams.as_deref().unwrap_or(&[flap::DEFAULT_STREAMS]) {
        for design in flap::FlapDesign::selected(cli.design) {
            let outcome = flap::run_design(env, &settings, n, design).await;
            failures += record(outcome, results, || format!("producer-flap {n}"));
        }
    }
    failures
}

/// Runs a recognition-capacity scenario; returns the number of runs that failed.
async fn run_asr(
    cli: &Cli,
    env: &Env,
    scenario: Scenario,
    showcase: bool,
    results: &Results,
) -> usize {
    let settings = asr::AsrSettings {
        workers: cli.asr_workers,
        model: crate::gpu::GpuModel {
            slots: cli.asr_slots,
            rtf: cli.asr_rtf,
        },
        partitions: cli.partitions.unwrap_or(8),
        duration: match (showcase, cli.duration) {
            (false, Some(d)) => d,
            _ => asr::DEFAULT_DURATION,
        },
    };
    if scenario == Scenario::AsrChurn {
        let outcome = asr::churn::run(env, &settings).await;
        return record(outcome, results, || "asr-churn".to_owned());
    }
    let streams = match (showcase, &cli.streams) {
        (false, Some(s)) => s.clone(),
        _ => vec![asr::DEFAULT_STREAMS],
    };
    let mut failures = 0;
    for &n in &streams {
        for &design in asr::AsrDesign::VARIANTS {
            let outcome = asr::shortfall::run_design(env, &settings, n, design).await;
            failures += record(outcome, results, || format!("asr-shortfall {n}"));
        }
    }
    failures
}

/// Runs one plan (a ceiling ramp, or every stream count × design); returns the
/// number of runs that failed.
async fn run_plan(
    cli: &Cli,
    env: &Env,
    plan: &scenario::Plan,
    results: &Results,
) -> Result<usize, Error> {
    let mut failures = 0;
    if plan.scenario == Scenario::Ceiling {
        let designs = designs_for(cli, DesignArg::Bounded)?;
        let steps = cli
            .streams
            .clone()
            .unwrap_or_else(|| ceiling::DEFAULT_STEPS.to_vec());
        let step_duration = cli.duration.unwrap_or(ceiling::DEFAULT_STEP_DURATION);
        for design in designs {
            match ceiling::run(env, &steps, step_duration, design).await {
                Ok(outs) => {
                    if let Some(o) = outs.last() {
                        eprintln!(
                            "ceiling ({design}): largest sustainable stream count {}",
                            o.report.max_streams.unwrap_or(0)
                        );
                    }
                    if let Ok(mut r) = results.lock() {
                        r.extend(outs);
                    }
                }
                Err(e) => {
                    failures += 1;
                    eprintln!("ceiling ({design}) failed: {e}");
                }
            }
        }
        return Ok(failures);
    }
    let designs = designs_for(cli, DesignArg::Both)?;
    let streams = cli.streams.clone().unwrap_or_else(|| vec![1, 10, 50]);
    for &n in &streams {
        for &design in &designs {
            let outcome = run_one(env, plan, n, design).await;
            failures += record(outcome, results, || {
                format!("{} {n} {design}", plan.scenario.as_str())
            });
        }
    }
    Ok(failures)
}

/// Prints a run's one-line summary and keeps its output, or prints why it failed
/// (`label` names the run); returns the number of failures (0 or 1).
fn record(
    outcome: Result<RunOutput, Error>,
    results: &Results,
    label: impl FnOnce() -> String,
) -> usize {
    match outcome {
        Ok(out) => {
            eprintln!("{}", one_line(&out.report));
            if let Ok(mut r) = results.lock() {
                r.push(out);
            }
            0
        }
        Err(e) => {
            eprintln!("[{}] failed: {e}", label());
            1
        }
    }
}

/// A one-line summary printed after each run.
pub fn one_line(r: &RunReport) -> String {
    if let Some(f) = &r.failover {
        return crate::report::failover_line(r, f);
    }
    if let Some(line) = asr::summary_line(r) {
        return line;
    }
    if let Some(line) = flap::summary_line(r) {
        return line;
    }
    format!(
        "[{} {} {}] rss peak {:.1} MiB, pending max {} B, queue wait p99 {:.1} ms, tasks max {}, \
         offered {} published {} received {} dropped {} unaccounted {}",
        r.scenario,
        r.streams,
        r.design,
        r.ingress.rss_peak_bytes as f64 / (1024.0 * 1024.0),
        r.ingress.pending_bytes_max,
        r.ingress.queue_wait_ms.p99,
        r.ingress.tasks_max,
        r.frames.offered,
        r.frames.published,
        r.frames.received,
        r.frames.dropped,
        r.frames.unaccounted
    )
}

/// Writes the JSON array.
pub fn write_json(path: &Path, reports: &[RunReport]) -> Result<(), Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    let json = serde_json::to_string_pretty(reports)
        .map_err(|e| Error::new(ErrorKind::Io, e.to_string()))?;
    std::fs::write(path, json + "\n").map_err(|e| io(path, e))
}

/// Writes one SVG per (scenario, streams): rows = metrics, columns = designs.
pub fn write_plots(dir: &Path, outputs: &[RunOutput]) -> Result<Vec<String>, Error> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut groups: BTreeMap<(String, usize), Vec<&RunOutput>> = BTreeMap::new();
    for o in outputs
        .iter()
        .filter(|o| o.report.scenario != "ceiling" && !o.samples.is_empty())
    {
        groups
            .entry((o.report.scenario.clone(), o.report.streams))
            .or_default()
            .push(o);
    }
    let mut written = Vec::new();
    for ((scenario, streams), mut runs) in groups {
        runs.sort_by_key(|o| (o.report.asr.as_ref().map(|a| a.design), o.report.design));
        let asr = runs.iter().any(|o| o.report.asr.is_some());
        let (designs, rows) = if asr {
            ("naive, weir-off and weir-on", asr_chart_rows(&runs))
        } else {
            (
                "bounded (weir) beside naive (task per frame)",
                chart_rows(&runs),
            )
        };
        let svg = grid_svg(
            &format!(
                "{scenario}, {streams} stream{} — {designs}",
                if streams == 1 { "" } else { "s" }
            ),
            &rows,
        );
        let name = format!("{scenario}-{streams}.svg");
        let path = dir.join(&name);
        std::fs::write(&path, svg).map_err(|e| io(&path, e))?;
        written.push(path.display().to_string());
    }
    Ok(written)
}

/// A sample's value, if it has one.
type Metric = fn(&crate::sample::Sample) -> Option<f64>;

/// One panel: `series` (label, metric) of `o` over time.
fn panel(o: &RunOutput, title: String, series: &[(String, Metric)]) -> Panel {
    let r = &o.report;
    Panel {
        title,
        series: series
            .iter()
            .map(|(label, f)| Series {
                label: label.clone(),
                points: o
                    .samples
                    .iter()
                    .filter_map(|s| f(s).map(|y| (s.t_s, y)))
                    .collect(),
            })
            .collect(),
        shade: r.fault.as_ref().map(|f| (f.at_s, f.at_s + f.duration_s)),
        reference: None,
    }
}

fn chart_rows(runs: &[&RunOutput]) -> Vec<Vec<Panel>> {
    let metrics: [(&str, Metric); 4] = [
        ("pending bytes (KiB)", |s| {
            s.ingress.as_ref().map(|i| i.pending_bytes as f64 / 1024.0)
        }),
        ("oldest pending frame (ms)", |s| {
            s.ingress.as_ref().map(|i| i.oldest_frame_age_ms)
        }),
        ("ingress RSS (MiB)", |s| {
            s.rss_bytes.map(|b| b as f64 / (1024.0 * 1024.0))
        }),
        ("tokio tasks alive", |s| {
            s.ingress.as_ref().map(|i| i.tasks_alive as f64)
        }),
    ];
    metrics
        .iter()
        .enumerate()
        .map(|(row, (title, f))| {
            runs.iter()
                .map(|o| {
                    let r = &o.report;
                    let split = o.samples.iter().any(|s| {
                        s.ingress
                            .as_ref()
                            .is_some_and(|i| i.oldest_live_ms.is_some())
                    });
                    // weir's oldest frame: what it holds for live streams apart from
                    // what the NATS client holds for ended instances (whose frames wait
                    // for the server, however long it is stopped).
                    let series: Vec<(String, Metric)> = match row {
                        1 if split => vec![
                            ("weir holds, live streams".to_owned(), |s| {
                                s.ingress.as_ref().and_then(|i| i.oldest_live_ms)
                            }),
                            ("NATS client holds, ended instances".to_owned(), |s| {
                                s.ingress.as_ref().and_then(|i| i.oldest_ended_ms)
                            }),
                        ],
                        _ => vec![(r.design.to_string(), *f)],
                    };
                    let mut p = panel(o, format!("{}: {title}", r.design), &series);
                    if let (0, Some(l)) = (row, r.ingress.pending_bytes_limit) {
                        p.reference = Some((l as f64 / 1024.0, "limit".to_owned()));
                    }
                    p
                })
                .collect()
        })
        .collect()
}

/// The asr-shortfall charts: lag of the frames the GPU started per 100 ms, and the
/// frames sent and started so far, one column per design.
fn asr_chart_rows(runs: &[&RunOutput]) -> Vec<Vec<Panel>> {
    let label = |o: &RunOutput| asr::column_label(&o.report);
    let lag: Metric = |s| (s.latency_window_ms.count > 0).then_some(s.latency_window_ms.p99);
    let sent: Metric = |s| Some(s.frames_sent as f64);
    let handed: Metric = |s| Some(s.frames_received as f64);
    vec![
        runs.iter()
            .map(|o| {
                let title = format!("{}: lag p99 per 100 ms (ms)", label(o));
                panel(o, title, &[(label(o), lag)])
            })
            .collect(),
        runs.iter()
            .map(|o| {
                let title = format!("{}: frames so far", label(o));
                let series = [
                    ("sent".to_owned(), sent),
                    ("started by GPU".to_owned(), handed),
                ];
                panel(o, title, &series)
            })
            .collect(),
    ]
}

/// `--llm-backends`: 1 by default, 3 for `backend-stall`, which needs 2 or more.
fn llm_backends(cli: &Cli) -> Result<usize, Error> {
    let stall = cli.scenario == Some(Scenario::BackendStall);
    match (cli.llm_backends, stall) {
        (Some(n), true) if n < 2 => Err(usage(format!(
            "--llm-backends {n} leaves backend-stall nothing to fail over to: use 2 or more"
        ))),
        (Some(n), _) => Ok(n as usize),
        (None, true) => Ok(3),
        (None, false) => Ok(1),
    }
}
