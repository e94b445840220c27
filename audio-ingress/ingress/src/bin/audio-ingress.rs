//! `audio-ingress`: `serve` (WebSocket front door + admin HTTP, publishing to NATS),
//! `check-config` (the same configuration validated, its warnings printed), `tap`
//! (print decoded packets of a subject pattern) and `token` (mint a producer token for
//! `auth_required`).
//!
//! `serve` prints exactly one line on stdout when ready:
//! `{"event":"ready","ws":"127.0.0.1:PORT","admin":"127.0.0.1:PORT"}`; logs go to
//! stderr (`RUST_LOG` filters, default `info`). Exit codes: 0 after a graceful
//! shutdown, 2 for a configuration error, 1 for any other start-up failure.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use weir_audio_ingress::config::{self, Config, ConfigError, ConfigSources, ConfigWarning};
use weir_audio_ingress::error::ErrorKind;
use weir_audio_ingress::{metrics as m, service, tap};
use weir_service::app::{self, Failure, RunFlags};
use weir_service::cli::ConfigFlags;
use weir_service::logging::LogFormat;

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
    /// Validate the configuration and print its warnings (exit 2 if refused).
    CheckConfig(CheckArgs),
    /// Subscribe to a subject pattern and print decoded packets.
    Tap(tap::TapArgs),
    /// Mint a producer token (for tests and tooling; see `auth_required`).
    Token(TokenArgs),
}

/// `audio-ingress token`: prints one signed token on stdout.
#[derive(Args)]
struct TokenArgs {
    /// The one stream id the token may open.
    #[arg(long, conflicts_with = "stream_prefix", required_unless_present_any = ["stream_prefix", "print_public_key"])]
    stream: Option<String>,
    /// A prefix of the stream ids the token may open.
    #[arg(long)]
    stream_prefix: Option<String>,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    ttl_s: u64,
    /// Rate class: this stream's max_rate (multiple of real time, 1.0..=1000).
    #[arg(long)]
    max_rate: Option<f64>,
    /// HS256 secret (at least 32 bytes); prefer the environment variable.
    #[arg(
        long,
        env = "WEIR_INGRESS_AUTH_HS256_SECRET",
        hide_env_values = true,
        conflicts_with = "eddsa_seed"
    )]
    hs256_secret: Option<String>,
    /// EdDSA: the 32-byte Ed25519 seed (private key), base64url.
    #[arg(long, env = "WEIR_TOKEN_EDDSA_SEED", hide_env_values = true)]
    eddsa_seed: Option<String>,
    /// Print the public key of --eddsa-seed (the value of auth_eddsa_public_key) and exit.
    #[arg(long, requires = "eddsa_seed")]
    print_public_key: bool,
}

/// Every configuration key can also be set by `WEIR_INGRESS_<KEY>` or `--set key=value`.
#[derive(Args)]
#[command(mut_arg("set", |a| a.help("Any configuration key, e.g. `--set max_bytes=32000` (repeatable; applied last)")))]
#[command(mut_arg("markdown", |a| a.help("With --list-keys: print the Markdown tables of docs/audio-ingress.md")))]
#[command(mut_arg("threads", |a| a.env("WEIR_INGRESS_THREADS")))]
struct ServeArgs {
    /// TOML configuration file (flat `key = value` lines).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// NATS server URL(s), comma-separated (key `nats.url`).
    #[arg(long, value_name = "URL")]
    nats_url: Option<String>,
    /// WebSocket listen address (key `listen`); port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Admin HTTP listen address (key `admin.listen`); port 0 picks a free port.
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    #[command(flatten)]
    keys: ConfigFlags,
    /// Log format on stderr, `text` or `json` (key `log.format`).
    #[arg(long, env = "WEIR_INGRESS_LOG_FORMAT", value_name = "FORMAT")]
    log_format: Option<String>,
    #[command(flatten)]
    run: RunFlags,
}

/// `audio-ingress check-config`: the `serve` configuration, checked.
#[derive(Args)]
struct CheckArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// The consumers' `idle_timeout_ms`, to check it against the ingress's NATS hang
    /// detection.
    #[arg(long, value_name = "MS")]
    consumer_idle_timeout_ms: Option<u64>,
}

fn sources(args: &ServeArgs) -> Result<ConfigSources, ConfigError> {
    let overrides = weir_service::config::cli_overrides(
        &[
            ("nats.url", &args.nats_url),
            ("listen", &args.listen),
            ("admin.listen", &args.admin),
            ("log.format", &args.log_format),
        ],
        &args.keys.set,
    )?;
    Ok(ConfigSources {
        file: args.config.clone(),
        env: std::env::vars().collect(),
        overrides,
    })
}

/// The configuration of `args` with the warnings of its load; a refusal is printed.
fn load(args: &ServeArgs) -> Result<(Config, Vec<ConfigWarning>), ExitCode> {
    sources(args)
        .and_then(|s| Config::load_checked(&s))
        .map_err(|e| {
            eprintln!("audio-ingress: invalid configuration: {e}");
            ExitCode::from(2)
        })
}

/// `check-config`: refusals exit 2, warnings are printed on stderr (exit 0), and the
/// last line on stdout says which.
fn check_config(args: &CheckArgs) -> ExitCode {
    let (config, mut warnings) = match load(&args.serve) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let idle = args.consumer_idle_timeout_ms.map(Duration::from_millis);
    warnings.extend(config.warnings(idle));
    for w in &warnings {
        eprintln!("audio-ingress: {w}");
    }
    println!("configuration valid; {} warning(s)", warnings.len());
    ExitCode::SUCCESS
}

async fn serve(config: Config, warnings: Vec<ConfigWarning>) -> Result<(), Failure> {
    for w in warnings.iter().chain(&config.warnings(None)) {
        tracing::warn!("{w}");
    }
    let recorder = m::prometheus_recorder();
    let prometheus = recorder.handle();
    app::install_recorder(
        recorder,
        m::DECLARED,
        "audio-ingress",
        env!("CARGO_PKG_VERSION"),
    );
    // The producer core's names beside the front door's: every one in the first scrape.
    weir_service::metrics::register(weir_audio_producer::metrics::DECLARED);
    metrics::gauge!(m::MEMORY_BOUND_BYTES).set(config.memory_bound_bytes() as f64);
    let running = service::start(config, Some(prometheus))
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::Config => Failure::Config(e.to_string()),
            _ => Failure::Start(e.to_string()),
        })?;
    app::print_ready(&running.ready_line())?;
    weir_service::shutdown::signal().await;
    let report = running.shutdown().await;
    if report.unfinished > 0 {
        tracing::warn!(
            unfinished = report.unfinished,
            "streams still open at the end of the grace period"
        );
    }
    Ok(())
}

fn mint_token(args: &TokenArgs) -> ExitCode {
    use weir_audio_ingress::auth::{self, Claims, SigningKey};
    let fail = |e: &str| {
        eprintln!("audio-ingress token: {e}");
        ExitCode::from(2)
    };
    let seed: Option<[u8; 32]> = match &args.eddsa_seed {
        None => None,
        Some(s) => match auth::b64url_decode(s).and_then(|b| <[u8; 32]>::try_from(b).ok()) {
            Some(seed) => Some(seed),
            None => return fail("--eddsa-seed: expected 32 bytes in base64url"),
        },
    };
    if args.print_public_key {
        if let Some(seed) = &seed {
            println!("{}", auth::b64url(&auth::ed25519_public_key(seed)));
            return ExitCode::SUCCESS;
        }
        return fail("--print-public-key needs --eddsa-seed");
    }
    if args
        .max_rate
        .is_some_and(|r| auth::max_rate_permille(r).is_none())
    {
        return fail("--max-rate: allowed 1.0..=1000");
    }
    let claims = Claims {
        exp: auth::unix_now_s().saturating_add(args.ttl_s),
        stream: args.stream.clone(),
        stream_prefix: args.stream_prefix.clone(),
        max_rate: args.max_rate,
    };
    let key = match (&args.hs256_secret, &seed) {
        (Some(s), None) if s.len() >= auth::MIN_HS256_SECRET_BYTES => {
            SigningKey::Hs256(s.as_bytes())
        }
        (Some(_), None) => return fail("--hs256-secret: at least 32 bytes"),
        (None, Some(seed)) => SigningKey::EdDsa(seed),
        _ => {
            return fail("give --hs256-secret (or WEIR_INGRESS_AUTH_HS256_SECRET) or --eddsa-seed");
        }
    };
    match auth::mint(key, &claims) {
        Ok(token) => {
            println!("{token}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e.to_string()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) if args.keys.print_key_table(config::key_table) => ExitCode::SUCCESS,
        Command::Serve(args) => match load(&args) {
            Ok((config, warnings)) => app::run("audio-ingress", args.run, config.log, || {
                serve(config, warnings)
            }),
            Err(code) => code,
        },
        Command::CheckConfig(args) if args.serve.keys.print_key_table(config::key_table) => {
            ExitCode::SUCCESS
        }
        Command::CheckConfig(args) => check_config(&args),
        Command::Tap(args) => app::run(
            "audio-ingress tap",
            RunFlags::default(),
            LogFormat::Text,
            || async {
                tap::run(args)
                    .await
                    .map(drop)
                    .map_err(|e| Failure::Start(e.to_string()))
            },
        ),
        Command::Token(args) => mint_token(&args),
    }
}
