//! `loadtest`: see `loadtest --help` and docs/loadtest.md.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Parser;
use weir_loadtest::app;
use weir_loadtest::cli::{Cli, Internal};
use weir_loadtest::report;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,weir_audio_consumer=error")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.internal {
        Some(Internal::NaiveIngress(args)) => exit(
            "naive-ingress",
            runtime.block_on(weir_loadtest::naive::audio::serve(args)),
        ),
        Some(Internal::LeaseWorker(args)) => exit(
            "lease-worker",
            runtime.block_on(weir_loadtest::lease_worker::run(args)),
        ),
        Some(Internal::AsrWorker(args)) => exit(
            "asr-worker",
            runtime.block_on(weir_loadtest::asr_worker::run(args)),
        ),
        None => runtime.block_on(session(cli)),
    }
}

/// The exit code of the hidden subcommand `name`, its error printed.
fn exit(name: &str, result: Result<(), impl std::fmt::Display>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn session(cli: Cli) -> ExitCode {
    let results: app::Results = Arc::new(Mutex::new(Vec::new()));
    let interrupted = tokio::select! {
        r = app::run(&cli, results.clone()) => match r {
            Ok(failures) => Some(failures),
            Err(e) => {
                eprintln!("loadtest: {e}");
                return ExitCode::from(2);
            }
        },
        _ = tokio::signal::ctrl_c() => None,
    };
    // The run future is dropped here on Ctrl-C: its children are killed on drop.
    if interrupted.is_none() {
        eprintln!("\ninterrupted: child processes stopped; writing what was measured");
    }
    let outputs = results.lock().map(|r| r.clone()).unwrap_or_default();
    let reports: Vec<_> = outputs.iter().map(|o| o.report.clone()).collect();
    println!("{}", report::table(&reports));
    let mut ok = true;
    if let Some(path) = &cli.json {
        match app::write_json(path, &reports) {
            Ok(()) => eprintln!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("cannot write the JSON report: {e}");
                ok = false;
            }
        }
    }
    if let Some(path) = &cli.markdown {
        match std::fs::write(path, report::markdown(&reports)) {
            Ok(()) => eprintln!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("cannot write {}: {e}", path.display());
                ok = false;
            }
        }
    }
    if let Some(dir) = &cli.plot {
        match app::write_plots(dir, &outputs) {
            Ok(files) => eprintln!("wrote {} chart(s) in {}", files.len(), dir.display()),
            Err(e) => {
                eprintln!("cannot write the charts: {e}");
                ok = false;
            }
        }
    }
    match interrupted {
        None => ExitCode::from(130),
        Some(0) if ok => ExitCode::SUCCESS,
        Some(_) => ExitCode::FAILURE,
    }
}
