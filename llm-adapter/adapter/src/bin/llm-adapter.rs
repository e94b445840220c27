//! `llm-adapter serve [--config FILE] [--nats-url URL] [--admin ADDR] [--set KEY=VALUE]...`
//! (`--list-keys` prints every configuration key with its type, default and range;
//! `--list-keys --markdown` the tables of docs/llm-adapter.md)
//!
//! Configuration precedence: built-in defaults < the TOML file < `WEIR_LLM_*`
//! environment variables (`WEIR_LLM_QUEUE_CAPACITY=64`, `WEIR_LLM_SESSION__PENDING_CAP=5`;
//! `__` separates sections) < flags (`--set`, `--nats-url`, `--admin`), merged by
//! `weir_service::config` (`config::Config::load`). Every value is validated before
//! anything starts; an error names the key, where the value came from, and exits with
//! status 2.
//!
//! When ready, one line goes to stdout: `{"event":"ready","admin":"127.0.0.1:PORT"}`.
//! Logs go to stderr (`RUST_LOG`, default `info`; `--log-format json` for JSON lines).
//! SIGTERM or SIGINT starts a graceful shutdown (see `AdapterHandle::shutdown`).
//!
//! On glibc the binary re-executes itself once at start with
//! `MALLOC_MMAP_THRESHOLD_=131072` unless that variable is set (see
//! `fixed_mmap_threshold`): freed large buffers then leave RSS.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use weir_llm_adapter::admin::{self, AdminState};
use weir_llm_adapter::config::{self, Config, ConfigError, ConfigSources, ConfigWarning};
use weir_llm_adapter::{backend, metrics as m};
use weir_service::app::{self, Failure, RunFlags};
use weir_service::cli::ConfigFlags;

#[derive(Parser)]
#[command(
    name = "llm-adapter",
    version,
    about = "weir: a bounded NATS front for LLM backends"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the adapter.
    Serve(ServeArgs),
    /// Validate the configuration, print its warnings on stderr and the capabilities
    /// document on stdout.
    CheckConfig(ServeArgs),
}

#[derive(Args)]
#[command(mut_arg("set", |a| a.help("Any configuration key, e.g. `--set session.pending_cap=3` or `--set limits[0].limit=4` (repeatable; applied last, in order)")))]
#[command(mut_arg("markdown", |a| a.help("With --list-keys: print the Markdown tables of docs/llm-adapter.md")))]
#[command(mut_arg("threads", |a| a.env("WEIR_LLM_THREADS").help("Runtime worker threads (default: one per core; 1 = a single-threaded runtime, a good choice on small machines shared with nats-server)")))]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "WEIR_LLM_CONFIG")]
    config: Option<PathBuf>,
    /// NATS server URL(s), comma-separated (overrides `nats.url`).
    #[arg(long, env = "WEIR_LLM_NATS_URL")]
    nats_url: Option<String>,
    /// Admin HTTP address, e.g. 127.0.0.1:9091; port 0 picks a free port (overrides
    /// `admin.listen`).
    #[arg(long, env = "WEIR_LLM_ADMIN")]
    admin: Option<String>,
    #[command(flatten)]
    run: RunFlags,
    /// Log format on stderr, `text` or `json` (overrides `log.format`).
    #[arg(long, env = "WEIR_LLM_LOG_FORMAT", value_name = "FORMAT")]
    log_format: Option<String>,
    #[command(flatten)]
    keys: ConfigFlags,
}

fn load(args: &ServeArgs) -> Result<(Config, Vec<ConfigWarning>), ConfigError> {
    let overrides = weir_service::config::cli_overrides(
        &[
            ("nats.url", &args.nats_url),
            ("admin.listen", &args.admin),
            ("log.format", &args.log_format),
        ],
        &args.keys.set,
    )?;
    Config::load_checked(&ConfigSources {
        file: args.config.clone(),
        env: std::env::vars().collect(),
        overrides,
    })
}

async fn serve(config: Config) -> Result<(), Failure> {
    let (recorder, prometheus) = m::prometheus_recorder();
    app::install_recorder(
        recorder,
        m::DECLARED,
        "llm-adapter",
        env!("CARGO_PKG_VERSION"),
    );
    metrics::gauge!(m::MEMORY_BOUND_BYTES).set(m::memory_bound_bytes(&config) as f64);

    let events = weir_llm_adapter::AdapterEvents::new();
    let client = weir_llm_adapter::connect_with_events(&config.nats, &events)
        .await
        .map_err(|e| Failure::Start(e.to_string()))?;
    let built =
        backend::pool_from_config(&config, &client).map_err(|e| Failure::start("backend", e))?;
    let listener = tokio::net::TcpListener::bind(config.admin.listen)
        .await
        .map_err(|e| Failure::start(format_args!("admin.listen {}", config.admin.listen), e))?;
    let admin_addr = listener
        .local_addr()
        .map_err(|e| Failure::start("admin address", e))?;
    tracing::info!(
        nats = %config.nats.client.url_list(),
        subject = %config.service.subject,
        backend = config.backend.kind.name(),
        backends = config.backends.len().max(1),
        workers = config.admission.workers.get(),
        queue_capacity = config.admission.queue_capacity.get(),
        mode = %config.admission.mode,
        "starting"
    );
    let adapter = weir_llm_adapter::start_pool(client, events, config, built.backends)
        .await
        .map_err(|e| Failure::Start(e.to_string()))?;

    let stop_admin = weir_service::shutdown::CancellationToken::new();
    let admin_task = tokio::spawn(admin::serve(
        listener,
        AdminState {
            view: adapter.view(),
            prometheus: Some(prometheus),
        },
        stop_admin.clone().cancelled_owned(),
    ));

    let ready =
        weir_protocol::admin::ReadyLine::new(None, Some(admin_addr.to_string()), None).to_line();
    app::print_ready(&ready)?;

    weir_service::shutdown::signal().await;
    tracing::info!("shutting down: refusing new requests, draining");
    let report = adapter.shutdown().await;
    tracing::info!(
        answered_queued = report.answered_queued,
        aborted_running = report.aborted_running,
        "shutdown complete"
    );
    stop_admin.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(2), admin_task).await;
    Ok(())
}

/// glibc's malloc setting that [`fixed_mmap_threshold`] pins.
const MALLOC_MMAP_VAR: &str = "MALLOC_MMAP_THRESHOLD_";

/// Re-executes the binary (same pid, same arguments) with glibc's mmap threshold fixed
/// at 128 KiB, unless `MALLOC_MMAP_THRESHOLD_` is already set (any value: the
/// operator's choice wins). By default glibc raises the threshold each time a large
/// mapped block is freed, up to 32 MiB; from then on 1 MB request and reply buffers
/// come from the heap and stay in RSS after they are freed. Measured (300 × 1 MB
/// idempotent replies twice, docs/llm-adapter.md § Memory): +96 MB of RSS with the
/// dynamic threshold, +66 MB with it fixed, for a 64 MiB cache. Only on glibc; if the
/// re-exec fails the adapter runs as it is.
fn fixed_mmap_threshold() {
    if !cfg!(all(target_os = "linux", target_env = "gnu"))
        || std::env::var_os(MALLOC_MMAP_VAR).is_some()
    {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    // Returns only on failure.
    let err = cmd.args(args).env(MALLOC_MMAP_VAR, "131072").exec();
    eprintln!("llm-adapter: re-exec with {MALLOC_MMAP_VAR} failed ({err}); continuing");
}

fn main() -> ExitCode {
    fixed_mmap_threshold();
    let cli = Cli::parse();
    let (args, check_only) = match &cli.cmd {
        Cmd::Serve(a) => (a, false),
        Cmd::CheckConfig(a) => (a, true),
    };
    if args.keys.print_key_table(config::key_table) {
        return ExitCode::SUCCESS;
    }
    let (config, mut warnings) = match load(args) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("llm-adapter: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    warnings.extend(config.warnings());
    if check_only {
        for w in &warnings {
            eprintln!("llm-adapter: {w}");
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&config.capabilities()).unwrap_or_default()
        );
        return ExitCode::SUCCESS;
    }
    app::run("llm-adapter", args.run, config.log, || async move {
        for w in &warnings {
            tracing::warn!("{w}");
        }
        serve(config).await
    })
}
