//! One start-up path for every weir binary (feature `app`): a `main` parses its
//! arguments, then hands [`run`] its flags and its async body, which composes the
//! service's sections.
//!
//! The order, the same in every binary:
//! 1. logging on stderr, text or JSON, and OpenTelemetry export when built with it
//!    ([`crate::logging::init`]);
//! 2. the tokio runtime: `--threads N` workers ([`RunFlags`]) (1 = a current-thread runtime), one per
//!    core by default;
//! 3. the body: configuration, then [`install_recorder`] (the recorder, every declared
//!    metric at zero, the build-info series) before any metric handle exists, the
//!    listeners and NATS, then [`print_ready`] (one JSON line on stdout);
//! 4. [`crate::shutdown::signal`] (SIGTERM or SIGINT), then the body's ordered, bounded
//!    shutdown (each part stopped through its `CancellationToken`, each wait bounded).
//!
//! Exit status: 0 after a graceful shutdown, 2 for a configuration error
//! ([`Failure::Config`]), 1 for any other failure ([`Failure::Start`]).

use std::future::Future;
use std::io::Write;
use std::process::ExitCode;

use crate::logging::LogFormat;

/// `--threads`: the flag every serving binary takes for its runtime. A binary flattens
/// it into its arguments and names its environment variable with `mut_arg`
/// (`WEIR_INGRESS_THREADS`, `WEIR_LLM_THREADS`). The log format is a configuration key
/// (`log.format`, the shared log section), known once the configuration is loaded.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct RunFlags {
    /// Tokio worker threads (1 = a current-thread runtime); default: one per core.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
}

/// Why a binary stopped before or instead of a graceful shutdown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The configuration is invalid: exit status 2.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Anything else (a port taken, NATS unreachable, ...): exit status 1.
    #[error("{0}")]
    Start(String),
}

impl Failure {
    /// A start-up failure described by `what` and its cause.
    pub fn start(what: impl std::fmt::Display, cause: impl std::fmt::Display) -> Self {
        Self::Start(format!("{what}: {cause}"))
    }

    /// The process's exit status for this failure.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Config(_) => ExitCode::from(2),
            Self::Start(_) => ExitCode::FAILURE,
        }
    }
}

/// The tokio runtime for `threads` workers (1 = current-thread; `None` = one per core).
pub fn runtime(threads: Option<u16>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = match threads {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if let Some(n) = threads.filter(|&n| n != 1) {
        builder.worker_threads(usize::from(n.max(1)));
    }
    builder.enable_all().build()
}

/// Runs a binary's body: logging in `log_format`, the runtime, the body, the exit
/// status. `name` prefixes the one line a failure prints on stderr.
pub fn run<F>(
    name: &str,
    flags: RunFlags,
    log_format: LogFormat,
    body: impl FnOnce() -> F,
) -> ExitCode
where
    F: Future<Output = Result<(), Failure>>,
{
    let _telemetry = crate::logging::init(log_format);
    let runtime = match runtime(flags.threads) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(body()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("{name}: {failure}");
            failure.exit_code()
        }
    }
}

/// Installs `recorder` as the process's metrics recorder, registers every metric of
/// `declared` at zero (each is in the first scrape, so that alert rules see a series
/// before the first event) and sets `weir_build_info{service, version}`. Call once,
/// before any metric handle exists.
pub fn install_recorder<R>(
    recorder: R,
    declared: &[crate::metrics::Declared],
    service: &'static str,
    version: &'static str,
) where
    R: metrics::Recorder + Send + Sync + 'static,
{
    if metrics::set_global_recorder(recorder).is_err() {
        tracing::warn!("a metrics recorder was already installed; /metrics may be incomplete");
    }
    crate::metrics::register(declared);
    crate::process::build_info(service, version);
}

/// Prints the ready line (one JSON object, `weir_protocol::admin::ReadyLine`) on stdout
/// and flushes it: the one line a supervisor or test waits for.
pub fn print_ready(line: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| Failure::start("stdout", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_failure_exits_2_and_any_other_1() {
        assert_eq!(Failure::Config("x".into()).exit_code(), ExitCode::from(2));
        assert_eq!(
            Failure::start("admin.listen", "taken").exit_code(),
            ExitCode::FAILURE
        );
        assert_eq!(
            Failure::Config("key `a`: too big".into()).to_string(),
            "invalid configuration: key `a`: too big"
        );
    }

    #[test]
    fn one_thread_is_a_current_thread_runtime() {
        let rt = runtime(Some(1)).expect("runtime");
        assert_eq!(
            rt.handle().runtime_flavor(),
            tokio::runtime::RuntimeFlavor::CurrentThread
        );
        let rt = runtime(Some(2)).expect("runtime");
        assert_eq!(rt.handle().metrics().num_workers(), 2);
    }

    #[test]
    fn the_body_runs_on_the_runtime_and_its_failure_is_the_exit_status() {
        let flags = RunFlags { threads: Some(1) };
        let code = run("test", flags, LogFormat::Text, || async {
            tokio::task::yield_now().await;
            Err(Failure::Config("bad".into()))
        });
        assert_eq!(code, ExitCode::from(2));
        let ok = run("test", flags, LogFormat::Text, || async { Ok(()) });
        assert_eq!(ok, ExitCode::SUCCESS);
    }
}
