//! Command line: `loadtest <scenario> [flags]`, plus the hidden `naive-ingress`
//! subcommand that serves the naive design as a separate process and the hidden
//! `lease-worker` subcommand that runs one lease-owning recognition worker (the
//! failover scenarios' worker processes), and the hidden `asr-worker` subcommand that
//! runs one recognition worker with a GPU model (`asr-churn`'s worker processes).
//!
//! Every value is validated before anything starts, with a message that names the flag.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::error::{Error, usage};
use crate::ingress::Design;
use crate::naive::audio::Floor;
use crate::scenario::Scenario;
use crate::scenario::run::PolicyArg;

/// Which designs to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DesignArg {
    /// weir's bounded ingress (`audio-ingress`) and LLM adapter.
    Bounded,
    /// The deployed task-per-frame / task-per-message shape.
    Naive,
    /// Both, side by side.
    Both,
}

impl DesignArg {
    /// The designs selected.
    pub fn designs(self) -> Vec<Design> {
        match self {
            Self::Bounded => vec![Design::Bounded],
            Self::Naive => vec![Design::Naive],
            Self::Both => vec![Design::Bounded, Design::Naive],
        }
    }
}

/// weir load test: drives the audio ingress (and the LLM adapter) with synthetic
/// producers at the real 20 ms cadence, injects faults, and compares weir's bounded
/// design with the naive task-per-frame design.
#[derive(Debug, Parser)]
#[command(
    name = "loadtest",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// Internal subcommands.
    #[command(subcommand)]
    pub internal: Option<Internal>,

    /// What to run: steady | nats-pause | backend-pause | nats-restart | no-end |
    /// llm-overload | backend-stall | ceiling | worker-failover | node-failover | asr-shortfall |
    /// asr-churn | producer-flap | all (every scenario but ceiling, the two failovers, the two
    /// asr ones and producer-flap) | showcase (the demo: steady and nats-pause with short runs, and
    /// asr-shortfall).
    #[arg(value_enum, required = true)]
    pub scenario: Option<Scenario>,

    /// Stream counts to run, comma-separated (e.g. 1,10,50). For `ceiling`, the ramp
    /// (default 50,100,200,400,600,800,1000,1200,1400,1600,2000,2400); for
    /// `producer-flap` the calls (default 1000).
    #[arg(long, value_delimiter = ',', value_parser = parse_streams)]
    pub streams: Option<Vec<usize>>,

    /// Which design(s): bounded, naive or both side by side. Default: both (ceiling:
    /// bounded).
    #[arg(long, value_enum)]
    pub design: Option<DesignArg>,

    /// Seconds of audio each producer sends per run. Default: 10 for steady, no-end
    /// and llm-overload; for fault scenarios 2 s + --pause + 2 s of recovery; 5 per
    /// ceiling step; showcase 5 (steady) and 10 (nats-pause); worker-failover and
    /// node-failover 3 s + --pause + 12 s; producer-flap 30.
    #[arg(long, value_parser = parse_seconds)]
    pub duration: Option<Duration>,

    /// producer-flap: every call's TCP connection is cut (RST) this often, seconds;
    /// the calls' cuts are spread evenly over one period.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub flap_every: Option<Duration>,

    /// Length of the fault in seconds: NATS stopped (nats-pause), backend stalled
    /// (backend-pause), server down before restart (nats-restart), worker process down
    /// before restart (worker-failover), NATS node down before restart
    /// (node-failover), one LLM backend stalled (backend-stall). Default 5 (2 for
    /// nats-restart, 6 for showcase and the failovers, 10 for backend-stall). The fault
    /// starts 2 s into the run (3 s for the failovers, 10 s for backend-stall).
    #[arg(long, value_parser = parse_seconds)]
    pub pause: Option<Duration>,

    /// Write the reports as a JSON array (one object per scenario × streams × design).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Also write the comparison as Markdown tables (what docs/loadtest.md embeds).
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,

    /// Write SVG charts (pending bytes, queue wait, RSS, tasks over time; bounded beside
    /// naive) into this directory, one file per scenario and stream count.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,

    /// Use this NATS server (loopback only) instead of starting one per run. The
    /// nats-pause and nats-restart scenarios need the server they start themselves.
    #[arg(long, value_name = "URL", value_parser = parse_nats_url)]
    pub nats_url: Option<String>,

    /// Full-queue policy of the bounded ingress: close (end the stream with an overload
    /// signal), gap (drop oldest, send a gap marker) or shadow (measure only).
    #[arg(long, value_enum, default_value = "close")]
    pub policy: PolicyArg,

    /// CPU each simulated recogniser spends per frame, microseconds (busy wait on the
    /// load test's own cores).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=20_000))]
    pub frame_cost_us: u64,

    /// Recognition workers (NATS consumers) sharing the partitions. Default 2 (3 for
    /// worker-failover and node-failover, which need at least 2).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub workers: Option<u32>,

    /// Partitions of the audio subject (`weir.audio.{partition}.{stream}`). Default 8
    /// (64 for worker-failover and node-failover).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub partitions: Option<u32>,

    /// worker-failover / node-failover: lease length of the workers, ms (default: the
    /// consumer core's 15,000); they renew every 3 s as by default (TTL / 3 if shorter).
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(3_000..=600_000))]
    pub lease_ttl_ms: u64,

    /// worker-failover / node-failover: copy the workers' raw logs (frames handed,
    /// gaps, leases held) into this directory.
    #[arg(long, value_name = "DIR")]
    pub keep_logs: Option<PathBuf>,

    /// worker-failover / node-failover: frames per second per stream, published
    /// straight to NATS (50 is the real 20 ms cadence; 10 keeps 200 streams, 3 nodes
    /// and the workers well inside 2 shared cores).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub fps: u32,

    /// llm-overload: offered request rate as a multiple of the backend's capacity.
    #[arg(long, default_value_t = 3.0)]
    pub llm_factor: f64,

    /// Simulated LLM backends: weir's adapter serves them as a pool (`[[backends]]`,
    /// each with --llm-workers slots), the naive front in turn. Default 1 (3 for
    /// backend-stall, which needs at least 2).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub llm_backends: Option<u32>,

    /// Distinct LLM sessions the requests go round (each request carries
    /// `Weir-Session-Id`); 0 = requests carry no session. Default: the stream count, at
    /// least 10.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub llm_sessions: Option<u32>,

    /// LLM backend concurrency (simulated GPU slots) of each backend; capacity = this /
    /// latency (× --llm-backends).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub llm_workers: u32,

    /// Shape of the simulated inference time: uniform in 0.5–1.5 × --llm-latency-ms,
    /// fixed, or log-normal (median --llm-latency-ms, p99 3 × that).
    #[arg(long, value_enum, default_value = "uniform")]
    pub llm_latency_shape: crate::llm::LatencyShape,

    /// Mean simulated inference time (the median for log-normal), milliseconds.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub llm_latency_ms: u64,

    /// Deadline given to every LLM request, milliseconds.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub llm_deadline_ms: u64,

    /// llm-overload: callers ask for streamed replies (`Weir-Stream: 1`) and the report
    /// shows the time to the first token (TTFT) next to goodput. The simulated backend
    /// streams --llm-tokens tokens, the first after --llm-first-token-ms, then
    /// --llm-tokens-per-second (capacity = workers / that duration; the inference time
    /// flags are then unused). The naive front cannot stream: its callers get the whole
    /// reply, and its TTFT is the time to that reply.
    #[arg(long)]
    pub stream: bool,

    /// --stream: delay before the first token, milliseconds.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub llm_first_token_ms: u64,

    /// --stream: tokens per reply.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub llm_tokens: u32,

    /// --stream: tokens per second after the first.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub llm_tokens_per_second: u32,

    /// How producers reach the ingress: ws (a WebSocket per stream, PCM frames), whip
    /// (a WHIP session per stream, Opus over WebRTC on loopback UDP) or twilio (a Twilio
    /// Media Streams WebSocket per stream, 8 kHz µ-law chunks on
    /// /v1/telephony/twilio); whip and twilio run the bounded design only: the naive
    /// ingress has neither door.
    #[arg(long, value_enum, default_value = "ws")]
    pub transport: crate::producers::Transport,

    /// Producers do not reconnect after the server ended or refused their stream.
    #[arg(long)]
    pub no_reconnect: bool,

    /// The audio-ingress binary. Default: $WEIR_INGRESS_BIN, else next to this
    /// executable (scripts/demo builds both).
    #[arg(long, value_name = "PATH")]
    pub ingress_bin: Option<PathBuf>,

    /// Extra `key=value` setting for the bounded ingress (repeatable), passed as
    /// `--set key=value`.
    #[arg(long = "ingress-set", value_name = "KEY=VALUE")]
    pub ingress_set: Vec<String>,

    /// Before each run, wait up to this many seconds for the machine to be quiet (other
    /// processes using less than 0.3 cores); 0 = do not wait. Each report records
    /// what other processes used anyway (`cpu.other_s`).
    #[arg(long, value_name = "SECONDS", default_value = "0", value_parser = parse_wait)]
    pub wait_quiet: Duration,

    /// Measurement only: the naive ingress runs in floor mode instead of the naive
    /// design. `discard` reads each WebSocket message and drops it; `publish` also
    /// encodes the deployed `frame` packet and publishes it inline, with no header,
    /// queue or task. The report's "ingress CPU
    /// µs/frame" is then the least any ingress on this stack pays per frame.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub naive_floor: Option<Floor>,

    /// asr-shortfall / asr-churn: recognition workers, each a GPU with --asr-slots
    /// slots at --asr-rtf.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub asr_workers: u32,

    /// asr-shortfall / asr-churn: slots per worker (streams its GPU batches; weir-on
    /// workers run with max_streams = this).
    #[arg(long, default_value_t = crate::gpu::DEFAULT_SLOTS, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub asr_slots: u32,

    /// asr-shortfall / asr-churn: real-time factor of one slot: a 20 ms frame costs
    /// rtf × 20 ms / slots of the worker's GPU time, so a worker keeps up with
    /// slots / rtf streams.
    #[arg(long, default_value_t = crate::gpu::DEFAULT_RTF, value_parser = parse_rtf)]
    pub asr_rtf: f64,

    /// No progress line.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `s` as a `T` within `range`; `what` names the value in the error (`a stream count`),
/// `unit` follows the number (` streams`).
fn ranged<T>(s: &str, what: &str, unit: &str, range: RangeInclusive<T>) -> Result<T, Error>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + std::fmt::Debug,
{
    let v: T = (s.trim().parse()).map_err(|_| usage(format!("{s:?} is not {what}")))?;
    if !range.contains(&v) {
        return Err(usage(format!(
            "{v}{unit} is out of range; allowed {range:?}"
        )));
    }
    Ok(v)
}

fn parse_rtf(s: &str) -> Result<f64, Error> {
    ranged(s, "a real-time factor", "", crate::gpu::RTF_RANGE)
}

fn parse_wait(s: &str) -> Result<Duration, Error> {
    ranged(s, "a whole number of seconds", " s", 0..=3600).map(Duration::from_secs)
}

/// Hidden subcommands used by the load test itself.
#[derive(Debug, Subcommand)]
pub enum Internal {
    /// Serve the naive ingress (used by the load test; same interface as
    /// `audio-ingress serve`).
    #[command(hide = true)]
    NaiveIngress(NaiveArgs),
    /// Run one recognition worker with lease ownership that logs what it was handed
    /// (used by worker-failover and node-failover; see `lease_worker`).
    #[command(hide = true)]
    LeaseWorker(LeaseWorkerArgs),
    /// Run one recognition worker with a GPU model (used by asr-churn; see
    /// `asr_worker`).
    #[command(hide = true)]
    AsrWorker(AsrWorkerArgs),
}

/// Arguments of `asr-worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct AsrWorkerArgs {
    /// NATS URL (loopback only).
    #[arg(long, value_parser = parse_nats_url)]
    pub nats_url: String,
    /// Audio subject template.
    #[arg(long, default_value = "weir.audio.{partition}.{stream}")]
    pub subject: String,
    /// Partitions of the template.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub partitions: u32,
    /// The partitions this worker owns, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub owned: Vec<u32>,
    /// Slots (`max_streams`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub slots: u32,
    /// Real-time factor of one slot.
    #[arg(long, value_parser = parse_rtf)]
    pub rtf: f64,
    /// The process ends by itself after this many seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=7200))]
    pub max_lifetime_s: u64,
}

/// Arguments of `lease-worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseWorkerArgs {
    /// Worker id (unique among live workers).
    #[arg(long)]
    pub id: String,
    /// NATS URLs (loopback only), comma-separated, tried in this order.
    #[arg(long, value_delimiter = ',', required = true, value_parser = parse_nats_url)]
    pub nats_urls: Vec<String>,
    /// Frames log (`F <stream> <seq>`, `G <cause> <stream> <first> <last>`).
    #[arg(long)]
    pub frames_log: PathBuf,
    /// Leases log (`S <unix_ms>`, `L <unix_ms> <partition> <held> <revision>`).
    #[arg(long)]
    pub leases_log: PathBuf,
    /// Audio subject template.
    #[arg(long, default_value = "weir.audio.{partition}.{stream}")]
    pub subject: String,
    /// Partitions of the template.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub partitions: u32,
    /// KV bucket of the leases.
    #[arg(long, default_value = "weir_leases")]
    pub bucket: String,
    /// Replicas of the bucket's stream.
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
    /// Lease length, ms (renewal every 3 s, or TTL / 3 if shorter).
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(3_000..=600_000))]
    pub ttl_ms: u64,
    /// The process ends by itself after this many seconds.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=7200))]
    pub max_lifetime_s: u64,
}

/// Arguments of `naive-ingress`.
#[derive(Debug, clap::Args)]
pub struct NaiveArgs {
    /// NATS server URL.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// WebSocket listen address (loopback).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Admin listen address (loopback).
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub admin: SocketAddr,
    /// Audio subject template.
    #[arg(long, default_value = "weir.audio.{partition}.{stream}")]
    pub subject: String,
    /// Partitions of the template.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub partitions: u32,
    /// Publishes in flight per stream (3 as deployed).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub in_flight: u64,
    /// Floor mode, measurement only: see `loadtest --naive-floor`.
    #[arg(long, value_enum)]
    pub floor: Option<Floor>,
}

fn parse_streams(s: &str) -> Result<usize, Error> {
    ranged(s, "a stream count", " streams", 1..=20_000)
}

fn parse_seconds(s: &str) -> Result<Duration, Error> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| usage(format!("{s:?} is not a number of seconds")))?;
    if !(v.is_finite() && v > 0.0 && v <= 3600.0) {
        return Err(usage(format!("{v} s is out of range; allowed (0, 3600]")));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Accepts only `nats://` URLs on a loopback host.
pub fn parse_nats_url(s: &str) -> Result<String, Error> {
    let rest = s
        .strip_prefix("nats://")
        .ok_or_else(|| usage(format!("{s:?} must start with nats://")))?;
    let hostport = rest.rsplit('@').next().unwrap_or(rest);
    let host = if let Some(h) = hostport.strip_prefix('[') {
        h.split(']').next().unwrap_or("")
    } else {
        hostport.split(':').next().unwrap_or("")
    };
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !loopback {
        return Err(usage(format!(
            "{s:?}: the load test only targets loopback addresses"
        )));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_nats_urls() {
        assert!(parse_nats_url("nats://127.0.0.1:4222").is_ok());
        assert!(parse_nats_url("nats://localhost:4222").is_ok());
        assert!(parse_nats_url("nats://[::1]:4222").is_ok());
        assert!(parse_nats_url("nats://u:p@127.0.0.2:4222").is_ok());
        assert!(parse_nats_url("nats://10.0.0.1:4222").is_err());
        assert!(parse_nats_url("nats://example.com:4222").is_err());
        assert!(parse_nats_url("127.0.0.1:4222").is_err());
    }

    #[test]
    fn parses_the_documented_command_line() {
        let cli = Cli::try_parse_from([
            "loadtest",
            "nats-pause",
            "--streams",
            "1,10,50",
            "--design",
            "both",
            "--duration",
            "14",
            "--pause",
            "10",
            "--json",
            "out.json",
            "--plot",
            "plots",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.scenario, Some(Scenario::NatsPause));
        assert_eq!(cli.streams, Some(vec![1, 10, 50]));
        assert_eq!(cli.duration, Some(Duration::from_secs(14)));
        assert!(cli.internal.is_none());
        let cli = Cli::try_parse_from(["loadtest", "naive-ingress", "--listen", "127.0.0.1:0"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(cli.internal, Some(Internal::NaiveIngress(_))));
        let floor = |v: &str| Cli::try_parse_from(["loadtest", "steady", "--naive-floor", v]);
        let cli = floor("publish").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.naive_floor, Some(Floor::Publish));
        assert!(floor("nothing").is_err(), "only discard or publish");
        assert!(
            Cli::try_parse_from(["loadtest"]).is_err(),
            "a scenario is required"
        );
        assert!(Cli::try_parse_from(["loadtest", "steady", "--streams", "0"]).is_err());
        let cli = Cli::try_parse_from([
            "loadtest",
            "worker-failover",
            "--workers",
            "4",
            "--lease-ttl-ms",
            "15000",
            "--fps",
            "50",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.scenario, Some(Scenario::WorkerFailover));
        assert_eq!((cli.workers, cli.partitions), (Some(4), None));
        assert!(Cli::try_parse_from(["loadtest", "node-failover", "--fps", "51"]).is_err());
        let worker = |url: &str| {
            Cli::try_parse_from([
                "loadtest",
                "lease-worker",
                "--id",
                "w0",
                "--nats-urls",
                url,
                "--frames-log",
                "f",
                "--leases-log",
                "l",
            ])
        };
        let cli = worker("nats://127.0.0.1:1,nats://127.0.0.1:2").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(cli.internal, Some(Internal::LeaseWorker(ref a)) if a.nats_urls.len() == 2)
        );
        assert!(worker("nats://10.0.0.1:4222").is_err(), "loopback only");
        assert!(Cli::try_parse_from(["loadtest", "steady", "--duration", "-1"]).is_err());
        let cli = Cli::try_parse_from(["loadtest", "producer-flap", "--flap-every", "2"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.scenario, Some(Scenario::ProducerFlap));
        assert_eq!(cli.flap_every, Some(Duration::from_secs(2)));
        assert!(Cli::try_parse_from(["loadtest", "producer-flap", "--flap-every", "0"]).is_err());
    }
}
