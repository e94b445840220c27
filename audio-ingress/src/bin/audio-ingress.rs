//! `audio-ingress`: `serve` (WebSocket front door + admin HTTP, publishing to NATS) and
//! `tap` (print decoded packets of a subject pattern).
//!
//! `serve` prints exactly one line on stdout when ready:
//! `{"event":"ready","ws":"127.0.0.1:PORT","admin":"127.0.0.1:PORT"}`; logs go to
//! stderr (`RUST_LOG` filters, default `info`). Exit codes: 0 after a graceful
//! shutdown, 2 for a configuration error, 1 for any other start-up failure.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use weir_audio_ingress::config::{Config, ConfigSources, KEYS};
use weir_audio_ingress::error::ErrorKind;
use weir_audio_ingress::{metrics as m, service, shutdown, tap};

#[derive(Parser)]
#[command(
    name = "audio-ingress",
    version,
    about = "weir audio ingress: bounded per-stream publishing of audio to NATS"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the WebSocket front door and the admin HTTP endpoint.
    Serve(ServeArgs),
    /// Subscribe to a subject pattern and print decoded packets.
    Tap(tap::TapArgs),
}

/// Every configuration key can also be set by `WEIR_INGRESS_<KEY>` or `--set key=value`.
#[derive(Args)]
struct ServeArgs {
    /// TOML configuration file (flat `key = value` lines).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// NATS server URL(s), comma-separated (key `nats_url`).
    #[arg(long, value_name = "URL")]
    nats_url: Option<String>,
    /// WebSocket listen address (key `listen`); port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Admin HTTP listen address (key `admin`); port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Any configuration key, e.g. `--set max_bytes=32000` (repeatable; applied last).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Print every configuration key with its default and range, then exit.
    #[arg(long)]
    list_keys: bool,
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn sources(args: &ServeArgs) -> Result<ConfigSources, String> {
    let mut overrides = Vec::new();
    for (key, value) in [
        ("nats_url", &args.nats_url),
        ("listen", &args.listen),
        ("admin", &args.admin),
    ] {
        if let Some(v) = value {
            overrides.push((key.to_owned(), v.clone()));
        }
    }
    for kv in &args.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--set {kv:?}: expected KEY=VALUE"))?;
        overrides.push((k.trim().to_owned(), v.to_owned()));
    }
    Ok(ConfigSources {
        file: args.config.clone(),
        env: std::env::vars().collect(),
        overrides,
    })
}

async fn serve(args: ServeArgs) -> ExitCode {
    if args.list_keys {
        for k in KEYS {
            println!(
                "{:<28} default {:<36} {}  ({})",
                k.name, k.default, k.help, k.range
            );
        }
        return ExitCode::SUCCESS;
    }
    let config = match sources(&args).and_then(|s| Config::load(&s).map_err(|e| e.to_string())) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("audio-ingress: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    // The recorder is installed once per process, before any metric handle exists.
    let recorder = m::prometheus_recorder();
    let prometheus = recorder.handle();
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!("a metrics recorder was already installed; /metrics may be incomplete");
    }
    let running = match service::start(config, Some(prometheus)).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("audio-ingress: {e}");
            return if e.kind() == ErrorKind::Config {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            };
        }
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", running.ready_line());
        let _ = out.flush();
    }
    shutdown::os_signal().await;
    let report = running.shutdown().await;
    if report.unfinished > 0 {
        tracing::warn!(
            unfinished = report.unfinished,
            "streams still open at the end of the grace period"
        );
    }
    ExitCode::SUCCESS
}

async fn run_tap(args: tap::TapArgs) -> ExitCode {
    match tap::run(args).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("audio-ingress tap: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("audio-ingress: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve(args).await,
            Command::Tap(args) => run_tap(args).await,
        }
    })
}
