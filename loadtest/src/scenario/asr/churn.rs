//! `asr-churn`: the door's fleet view when a worker dies and when one is added
//! (docs/loadtest.md, "asr-churn"). weir-on in front of `--asr-workers` worker processes
//! (the hidden `asr-worker` subcommand), [`CALLS_PER_WORKER`] calls on each; worker `w0`
//! is SIGKILLed at [`KILL_AT`] plus a random 0–1 s while the door's [`SLOTS_GAUGE`] is
//! polled and a probe call on `w0`'s partitions is made every 100 ms; [`ADD_AFTER`]
//! later a new worker takes `w0`'s partitions, probed until admitted (at most
//! [`RESUME_MAX`]).
//!
//! Invariants: every wait is bounded; the worker processes are killed on every exit
//! path (`kill_on_drop`) and end by themselves after their maximum lifetime.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use super::{AsrDesign, AsrSettings, ChurnReport, ids_of_worker};
use crate::error::{Error, process};
use crate::ingress::{Design, IngressProcess, samples};
use crate::producers::{self, ProducerCounters};
use crate::report::{ProducerReport, RunReport};
use crate::scenario::asr::shortfall;
use crate::scenario::run::{Env, RunNats, RunOutput, SUBJECT_TEMPLATE, spawn_ingress};

/// The door's gauge of slots in its fleet view (summed over its series).
pub const SLOTS_GAUGE: &str = "weir_ingress_capacity_slots";
/// Calls kept on each worker during the run.
pub const CALLS_PER_WORKER: usize = 3;
/// When the victim is killed, after the calls started (plus a random 0–1 s).
pub const KILL_AT: Duration = Duration::from_secs(3);
/// When the new worker is started, after the kill.
pub const ADD_AFTER: Duration = Duration::from_secs(5);
/// Longest wait for admissions to resume after the new worker started.
pub const RESUME_MAX: Duration = Duration::from_secs(10);
/// Probe and poll period.
const POLL: Duration = Duration::from_millis(100);

/// The sum of every series of gauge `name` in a Prometheus text (`None`: absent).
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    let values = samples(text).filter(|(metric, ..)| *metric == name);
    values.map(|(.., v)| v).reduce(|a, b| a + b)
}

/// The slots in the door's fleet view now.
pub async fn door_slots(ingress: &IngressProcess) -> Option<f64> {
    gauge(&ingress.metrics().await.ok()?, SLOTS_GAUGE)
}

/// Before the calls: polls the door's slots every 100 ms until they reach the fleet's
/// `slots` or `max` passed; returns the last value read, and notes when the door did not
/// show them all.
pub async fn wait_for_fleet(
    ingress: &IngressProcess,
    slots: f64,
    max: Duration,
    notes: &mut Vec<String>,
) -> Option<f64> {
    let deadline = Instant::now() + max;
    let mut last = None;
    while Instant::now() < deadline {
        last = door_slots(ingress).await.or(last);
        if last.is_some_and(|s| s >= slots) {
            return last;
        }
        tokio::time::sleep(POLL).await;
    }
    notes.push(format!(
        "the door did not show the fleet's {slots} slots within {} s before the calls \
         started ({SLOTS_GAUGE} read {last:?})",
        max.as_secs()
    ));
    last
}

/// How a probe call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Admitted,
    NoCapacity,
    Other,
}

/// One probe: connect; admitted → `end` at once; refused → its code.
async fn probe(ws: std::net::SocketAddr, id: &str) -> Probe {
    let url = format!("ws://{ws}/v1/streams/{id}");
    let r = tokio::time::timeout(
        Duration::from_secs(2),
        tokio_tungstenite::connect_async(&url),
    );
    match r.await {
        Ok(Ok((mut ws, _))) => {
            let end = Message::Text(r#"{"type":"end"}"#.into());
            let _ = tokio::time::timeout(Duration::from_secs(1), ws.send(end)).await;
            let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
            Probe::Admitted
        }
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp)))
            if producers::refusal_code(&resp) == "no_capacity" =>
        {
            Probe::NoCapacity
        }
        _ => Probe::Other,
    }
}

/// Starts worker `w` (owning `p mod workers == w`) as a process.
fn spawn_worker(env: &Env, settings: &AsrSettings, nats_url: &str, w: u32) -> Result<Child, Error> {
    let owned: Vec<String> = (0..settings.partitions)
        .filter(|p| p % settings.workers == w)
        .map(|p| p.to_string())
        .collect();
    Command::new(&env.self_exe)
        .args([
            "asr-worker",
            "--nats-url",
            nats_url,
            "--subject",
            SUBJECT_TEMPLATE,
            "--partitions",
            &settings.partitions.to_string(),
            "--owned",
            &owned.join(","),
            "--slots",
            &settings.model.slots.to_string(),
            "--rtf",
            &settings.model.rtf.to_string(),
            "--max-lifetime-s",
            "300",
        ])
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| process("cannot start an asr-worker", e))
}

/// Phase 1 after the kill (until [`ADD_AFTER`]): polls the door's slots until the
/// victim's (`remaining` left) are gone, and probes the victim's partitions every
/// [`POLL`].
async fn watch_after_kill<'a>(
    ingress: &IngressProcess,
    probe_ids: &mut impl Iterator<Item = &'a String>,
    killed: Instant,
    remaining: f64,
    report: &mut ChurnReport,
) {
    while killed.elapsed() < ADD_AFTER {
        let tick = Instant::now();
        if report.slots_left_view_ms.is_none()
            && door_slots(ingress).await.is_some_and(|s| s <= remaining)
        {
            report.slots_left_view_ms = Some(ms(killed.elapsed()));
        }
        if let Some(id) = probe_ids.next() {
            let outcome = probe(ingress.ws_addr(), id).await;
            let at = Some(ms(killed.elapsed()));
            match outcome {
                Probe::Admitted => report.last_admitted_ms = at,
                Probe::NoCapacity => {
                    report.first_refused_ms = report.first_refused_ms.or(at);
                }
                Probe::Other => {}
            }
            match outcome {
                Probe::Admitted if report.slots_left_view_ms.is_none() => {
                    report.probes_admitted_before_left += 1;
                }
                Probe::Admitted => report.probes_admitted_after_left += 1,
                Probe::NoCapacity => report.probes_refused_no_capacity += 1,
                Probe::Other => report.probes_refused_other += 1,
            }
        }
        tokio::time::sleep_until(tick + POLL).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs `asr-churn` once.
pub async fn run(env: &Env, settings: &AsrSettings) -> Result<RunOutput, Error> {
    let nats = RunNats::start(env).await?;
    let fleet_slots = f64::from(settings.workers * settings.model.slots);
    let mut workers = Vec::new();
    for w in 0..settings.workers {
        workers.push(spawn_worker(env, settings, &nats.url, w)?);
    }
    let weir_on = shortfall::ingress_of(AsrDesign::WeirOn);
    let (ingress, dir) = spawn_ingress(env, weir_on, &nats.url, settings.partitions).await?;
    let mut notes = Vec::new();
    let mut report = ChurnReport {
        workers: settings.workers,
        slots: settings.model.slots,
        ..ChurnReport::default()
    };
    let wait = Duration::from_secs(10);
    report.slots_before = wait_for_fleet(&ingress, fleet_slots, wait, &mut notes).await;
    let calls = CALLS_PER_WORKER * settings.workers as usize;
    let duration = KILL_AT + ADD_AFTER + RESUME_MAX;
    let counters = Arc::new(ProducerCounters::default());
    let start = Instant::now();
    let mut producer_set = producers::start(
        shortfall::calls(
            &ingress,
            settings,
            ("c", calls),
            duration,
            Duration::from_millis(100),
        ),
        calls as u64,
        counters.clone(),
    );
    let probes = ids_of_worker("p", 400, settings.partitions, settings.workers, 0);
    let mut probe_ids = probes.iter();

    // 1. The kill, then probes and polls until the victim's slots left the view.
    // A random phase against the workers' announcements and the door's gauge tick, as
    // a real crash has.
    let jitter = Duration::from_millis(rand::Rng::random_range(&mut rand::rng(), 0..1_000));
    tokio::time::sleep_until(start + KILL_AT + jitter).await;
    let mut victim = workers.remove(0);
    let _ = victim.start_kill();
    let killed = Instant::now();
    report.killed_at_s = (killed - start).as_secs_f64();
    let remaining = fleet_slots - f64::from(settings.model.slots);
    watch_after_kill(&ingress, &mut probe_ids, killed, remaining, &mut report).await;
    report.slots_after_kill = door_slots(&ingress).await;
    let _ = victim.wait().await;

    // 2. A new worker on the victim's partitions; probes until one is admitted.
    let added = Instant::now();
    report.added_at_s = (added - start).as_secs_f64();
    workers.push(spawn_worker(env, settings, &nats.url, 0)?);
    while added.elapsed() < RESUME_MAX {
        let tick = Instant::now();
        if report.slots_back_ms.is_none()
            && door_slots(&ingress).await.is_some_and(|s| s >= fleet_slots)
        {
            report.slots_back_ms = Some(ms(added.elapsed()));
        }
        if report.admissions_resumed_ms.is_none()
            && let Some(id) = probe_ids.next()
            && probe(ingress.ws_addr(), id).await == Probe::Admitted
        {
            report.admissions_resumed_ms = Some(ms(added.elapsed()));
        }
        if report.admissions_resumed_ms.is_some() && report.slots_back_ms.is_some() {
            break;
        }
        tokio::time::sleep_until(tick + POLL).await;
    }
    report.slots_end = door_slots(&ingress).await;
    producer_set.abort_all();
    while producer_set.join_next().await.is_some() {}
    let wall = start.elapsed();
    for mut w in workers {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }
    ingress.stop().await;
    nats.stop().await;
    drop(dir);
    let report = RunReport {
        scenario: "asr-churn".into(),
        streams: calls,
        design: Design::Bounded,
        duration_s: wall.as_secs_f64(),
        wall_s: wall.as_secs_f64(),
        producers: ProducerReport {
            nominal_frames: 0,
            counters: counters.snapshot(),
        },
        llm: crate::llm::not_run(),
        churn: Some(report),
        notes,
        ..RunReport::default()
    };
    Ok(RunOutput {
        report,
        samples: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_summed_over_their_series() {
        let text = "# HELP x\n# TYPE x gauge\n\
                    weir_ingress_capacity_slots{worker=\"a\"} 6\n\
                    weir_ingress_capacity_slots{worker=\"b\"} 6\n\
                    weir_ingress_capacity_slots_free 3\n";
        assert_eq!(gauge(text, SLOTS_GAUGE), Some(12.0));
        assert_eq!(gauge(text, "weir_ingress_capacity_slots_free"), Some(3.0));
        assert_eq!(gauge(text, "absent"), None);
    }
}
