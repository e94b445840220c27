//! `audio-ingress tap`: subscribe to a subject pattern and print every audio packet,
//! decoded, then a summary per subject when it stops.
//!
//! ```text
//! audio-ingress tap 'inference.whisper.stream.*' [--nats-url URL] [--json] [--count N] [--for SECONDS]
//! ```
//!
//! It stops on Ctrl-C / SIGTERM, after `--count` messages (decodable or not), or after
//! `--for` seconds, whichever comes first.
//!
//! Output on stdout, one line per packet. With `--json`, one JSON object per line:
//! - packet: `{"subject","type","seq","sample_rate","samples","bytes","session_id",
//!   "captured_at_ms","age_ms","headers":{...},"gap":{...}|null,
//!   "possibly_lost":{...}|null,"error":null}`. `captured_at_ms` is the meta key (the
//!   `Weir-Captured-At-Ms` header when the meta has none), `null` when neither;
//!   `age_ms` is the tap's wall clock minus it (negative when the clocks disagree);
//!   `possibly_lost` is the parsed `Weir-Possibly-Lost` header
//!   (`first_seq, last_seq, frames, total_frames, reason`);
//! - undecodable packet: the same keys, `type`/`seq`/`sample_rate`/`samples` `null` and
//!   `"error":{"kind":"<decode error kind>","message":"..."}`;
//! - on exit, one `{"type":"summary","subject",...}` line per subject (seq range,
//!   frames, samples, missing seqs and jumps, declared gaps, the largest frame age,
//!   possible-loss declarations and the producer's cumulative possibly-lost count, end
//!   seen, decode errors) and one `{"type":"total",...}` line.
//!
//! A line `tap: subscribed to <pattern> on <url>` goes to stderr once the server has
//! registered the subscription (scripts wait for it before publishing). A pattern that
//! breaks the wildcard rules is refused before connecting; a subscription the server
//! refuses (`-ERR`, seen within 200 ms of the confirmation or later) ends the tap with
//! an error (exit 1). Text output escapes control characters from the network.
//!
//! Each subject is tracked as one stream: "missing" counts seqs skipped without a
//! declared gap (loss in transit or undecodable packets). The tap is a diagnostic: it
//! holds one small record per subject seen, and never more than one message at a time.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use weir_protocol::WireName;
use weir_protocol::audio::extension::{Extensions, PossibleLoss, headers};
use weir_protocol::audio::{DecodeOptions, Packet, PacketBody, decode};
use weir_service::config::ConfigError;
use weir_service::config::section::NatsSection;
use weir_service::error::Source;
use weir_service::nats::NatsConfig;

use weir_audio_consumer::tracker::{Observation, SeqTracker, Seqs};

/// How long connecting to NATS may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to confirm the subscription.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Messages the NATS client may buffer for the tap before dropping (it prints at
/// terminal speed; a dropped message shows up as a slow-consumer warning and missing
/// seqs).
const TAP_SUBSCRIPTION_CAPACITY: usize = 16_384;
/// Weir headers shown with each packet.
const SHOWN_HEADERS: [&str; 5] = [
    headers::VERSION,
    headers::CAPTURED_AT_MS,
    headers::END_REASON,
    headers::OVERLOAD,
    headers::POSSIBLY_LOST,
];

/// Arguments of `audio-ingress tap`. One NATS authentication method at a time: the
/// group `auth`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(
    clap::ArgGroup::new("auth").multiple(false).args(["user", "token", "nkey", "creds_file"])
))]
pub struct TapArgs {
    /// Subject pattern to subscribe to; NATS wildcards allowed
    /// (e.g. `inference.whisper.stream.*` or `audio.3.*`).
    pub subject: String,
    /// NATS server URL.
    #[arg(
        long,
        default_value = "nats://127.0.0.1:4222",
        env = "WEIR_TAP_NATS_URL"
    )]
    pub nats_url: String,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many messages.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long = "for", value_name = "SECONDS", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// NATS user (with `--password`); one authentication method at a time.
    #[arg(long, env = "WEIR_TAP_NATS_USER", requires = "password")]
    pub user: Option<String>,
    /// NATS password (with `--user`); better from the environment.
    #[arg(
        long,
        env = "WEIR_TAP_NATS_PASSWORD",
        hide_env_values = true,
        requires = "user"
    )]
    pub password: Option<String>,
    /// NATS token; better from the environment.
    #[arg(long, env = "WEIR_TAP_NATS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// NATS NKey seed; better from the environment.
    #[arg(long, env = "WEIR_TAP_NATS_NKEY", hide_env_values = true)]
    pub nkey: Option<String>,
    /// NATS credentials file (JWT + NKey).
    #[arg(long = "creds-file", env = "WEIR_TAP_NATS_CREDS_FILE")]
    pub creds_file: Option<PathBuf>,
    /// Require TLS.
    #[arg(long)]
    pub tls_required: bool,
    /// Extra root CA, PEM.
    #[arg(long, value_name = "FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate, PEM (with `--tls-key-file`).
    #[arg(long, value_name = "FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Client key, PEM (with `--tls-cert-file`).
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Prefix of the client's inboxes (default `_INBOX`): the user's own where the
    /// server allows each user only its prefix, e.g. `_INBOX.operator`.
    #[arg(long, value_name = "PREFIX", env = "WEIR_TAP_NATS_INBOX_PREFIX")]
    pub inbox_prefix: Option<String>,
}

impl TapArgs {
    /// The connection settings, validated by the same code as `serve`'s `[nats]` (one
    /// auth method, files that exist); the tap's own timeouts are set on top.
    fn nats_config(&self) -> Result<NatsConfig, ConfigError> {
        let base = NatsConfig {
            connection_timeout: CONNECT_TIMEOUT,
            subscription_capacity: Some(TAP_SUBSCRIPTION_CAPACITY),
            retry_initial_connect: false,
            ..NatsConfig::named("weir-audio-ingress-tap")
        };
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        NatsSection {
            url: self.nats_url.clone(),
            user: text(&self.user),
            password: text(&self.password),
            token: text(&self.token),
            nkey: text(&self.nkey),
            creds_file: path(&self.creds_file).unwrap_or_default(),
            tls_required: self.tls_required,
            tls_ca_file: path(&self.tls_ca_file).unwrap_or_default(),
            tls_cert_file: path(&self.tls_cert_file).unwrap_or_default(),
            tls_key_file: path(&self.tls_key_file).unwrap_or_default(),
            inbox_prefix: text(&self.inbox_prefix),
            ..NatsSection::from_config(&base)
        }
        .validate(base)
        .map_err(|e| {
            // `nats.url` is `--nats-url`, `nats.tls_key_file` is `--tls-key-file`.
            let flag = match e.key().trim_start_matches("nats.") {
                "url" => "nats-url".to_owned(),
                field => field.replace('_', "-"),
            };
            e.with_key(format!("--{flag}"))
        })
    }
}

/// A `--for` value: seconds in (0, 1 year]; the refusal names the value.
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 31_536_000.0) {
        return Err(format!(
            "{s} is out of range; allowed (0, 31536000] seconds"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Why the tap failed: a [`TapErrorKind`], a message, and the cause (the NATS connect
/// error, the server's refusal, the I/O error) as [`std::error::Error::source`].
pub type TapError = weir_service::Error<TapErrorKind>;

/// Machine-readable kind of a [`TapError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TapErrorKind {
    /// The subject pattern is not a valid NATS subject (refused before connecting).
    InvalidSubject,
    /// Could not connect (bad settings, or no server).
    Connect,
    /// Could not subscribe, or the server refused the subscription.
    Subscribe,
    /// Could not write the output.
    Output,
}

/// A failed write of the output.
fn output_error(e: std::io::Error) -> TapError {
    TapError::with_source(TapErrorKind::Output, "cannot write output", e)
}

/// Per-subject summary.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SubjectSummary {
    /// The subject.
    pub subject: String,
    /// Lowest seq seen.
    pub first_seq: Option<u64>,
    /// Highest seq seen.
    pub last_seq: Option<u64>,
    /// Frames decoded.
    pub frames: u64,
    /// Samples in them.
    pub samples: u64,
    /// Seqs skipped without a declared gap.
    pub missing: u64,
    /// Number of such jumps.
    pub gaps: u64,
    /// Gap packets.
    pub declared_gaps: u64,
    /// Frames declared missing by gap packets.
    pub declared_gap_frames: u64,
    /// Duplicate or out-of-order packets.
    pub stale: u64,
    /// The largest `age_ms` of a frame with a capture time (`None` when no frame had
    /// one).
    pub max_age_ms: Option<i64>,
    /// Packets that carried a valid `Weir-Possibly-Lost` header.
    pub possible_loss_declarations: u64,
    /// The producer's cumulative count of possibly lost frames (`total_frames` of the
    /// last declaration).
    pub possibly_lost_frames: u64,
    /// Whether an `end` arrived.
    pub end_seen: bool,
    /// `Weir-End-Reason` of the end, if any.
    pub end_reason: Option<String>,
    /// Packets on this subject that could not be decoded.
    pub decode_errors: u64,
    #[serde(skip)]
    tracker: SeqTracker,
}

/// What the tap saw, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TapSummary {
    /// Messages received.
    pub messages: u64,
    /// Messages that could not be decoded.
    pub errors: u64,
    /// Per subject, sorted by subject.
    pub subjects: Vec<SubjectSummary>,
    /// Why it stopped: `count`, `duration`, `signal` or `closed`.
    pub stopped_by: String,
}

/// Runs the tap, printing to stdout, until Ctrl-C, `--count` or `--for`.
pub async fn run(args: TapArgs) -> Result<TapSummary, TapError> {
    // `Stdout` (not its lock) is `Send`; it is line-buffered, so every packet line
    // reaches a pipe as soon as it is printed.
    run_with(
        args,
        &mut std::io::stdout(),
        weir_service::shutdown::signal(),
    )
    .await
}

/// Runs the tap writing to `out` until `stop` completes, `--count` or `--for`.
pub async fn run_with(
    args: TapArgs,
    out: &mut (impl Write + Send),
    stop: impl std::future::Future<Output = ()> + Send,
) -> Result<TapSummary, TapError> {
    if !valid_pattern(&args.subject) {
        return Err(TapError::new(
            TapErrorKind::InvalidSubject,
            format!("invalid subject pattern {:?}", args.subject),
        ));
    }
    let (client, mut refused) = connect(&args).await?;
    let subscribe_error = |cause: weir_service::error::Source| {
        TapError::with_source(
            TapErrorKind::Subscribe,
            format!("cannot subscribe to {:?}", args.subject),
            cause,
        )
    };
    let refused_by_server =
        |e: &str| subscribe_error(format!("the server refused it: {}", escape_controls(e)).into());
    let mut sub = weir_service::nats::subscribe_confirmed(
        &client,
        vec![args.subject.clone()],
        SUBSCRIBE_TIMEOUT,
    )
    .await
    .map_err(|e| subscribe_error(e.into()))?
    .pop()
    .map(|(_, sub)| sub)
    .ok_or_else(|| subscribe_error("no subscription".into()))?;
    // The server answers a subscription it refuses (permissions, a subject it finds
    // invalid) with -ERR before the probe came back; the callback may run a little
    // later, so wait for it briefly before declaring success.
    if let Ok(Some(e)) = tokio::time::timeout(REFUSAL_GRACE, refused.recv()).await
        && is_subscription_refusal(&e)
    {
        return Err(refused_by_server(&e));
    }
    eprintln!("tap: subscribed to {} on {}", args.subject, args.nats_url);

    let mut tap = Tap::default();
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let until_deadline = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop);
    tokio::pin!(until_deadline);
    let stopped_by = loop {
        if args.count.is_some_and(|n| tap.messages >= n) {
            break "count";
        }
        tokio::select! {
            msg = sub.next() => match msg {
                Some(msg) => {
                    let line = tap.on_message(
                        &msg.subject,
                        &msg.payload,
                        msg.headers.as_ref(),
                        args.json,
                        weir_service::clock::unix_ms_now(),
                    );
                    if args.json {
                        writeln!(out, "{line}").map_err(output_error)?;
                    } else {
                        writeln!(out, "{}", escape_controls(&line)).map_err(output_error)?;
                    }
                }
                None => break "closed",
            },
            Some(e) = refused.recv() => {
                if is_subscription_refusal(&e) {
                    return Err(refused_by_server(&e));
                }
            }
            () = &mut until_deadline => break "duration",
            () = &mut stop => break "signal",
        }
    };
    drop(sub);
    let summary = tap.finish(stopped_by);
    for s in &summary.subjects {
        writeln!(out, "{}", escape_controls(&summary_line(s, args.json))).map_err(output_error)?;
    }
    writeln!(out, "{}", escape_controls(&total_line(&summary, args.json))).map_err(output_error)?;
    out.flush().map_err(output_error)?;
    Ok(summary)
}

/// Connects to NATS with `args`' settings; the server errors (`-ERR`) it reports come
/// on the returned receiver.
async fn connect(
    args: &TapArgs,
) -> Result<(async_nats::Client, tokio::sync::mpsc::Receiver<String>), TapError> {
    // Server errors (`-ERR`) reach the event callback, not the subscribe call: a
    // refused subscription shows up only there. They are forwarded to the loop.
    let (server_errors, refused) = tokio::sync::mpsc::channel::<String>(16);
    let connect_error = |cause: Source| {
        TapError::with_source(
            TapErrorKind::Connect,
            format!("cannot connect to NATS at {}", args.nats_url),
            cause,
        )
    };
    let nats = args
        .nats_config()
        .map_err(|e| connect_error(format!("{}: {}", e.key(), e.message()).into()))?;
    let options = weir_service::nats::options(&nats)
        .await
        .map_err(|e| connect_error(e.into()))?;
    let options = options.event_callback(move |event| {
        let server_errors = server_errors.clone();
        async move {
            match event {
                async_nats::Event::SlowConsumer(_) => {
                    eprintln!("tap: slow consumer: the NATS client dropped messages");
                }
                async_nats::Event::ServerError(e) => {
                    let text = e.to_string();
                    eprintln!("tap: NATS server error: {}", escape_controls(&text));
                    let _ = server_errors.try_send(text);
                }
                other => eprintln!("tap: NATS {other}"),
            }
        }
    });
    let connect = weir_service::nats::connect(&nats, options);
    let client = tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(1), connect)
        .await
        .map_err(|_| connect_error("timed out".into()))?
        .map_err(|e| connect_error(e.into()))?;
    Ok((client, refused))
}

/// How long after the server confirmed the subscription the tap waits for a refusal
/// (`-ERR`) to reach it before it reports `subscribed`.
const REFUSAL_GRACE: Duration = Duration::from_millis(200);

/// A NATS subject pattern the server accepts: non-empty tokens separated by `.`, no
/// whitespace or control characters, `*` and `>` only as whole tokens, `>` only last.
fn valid_pattern(s: &str) -> bool {
    let tokens: Vec<&str> = s.split('.').collect();
    !s.is_empty()
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
        && tokens.iter().enumerate().all(|(i, t)| {
            !t.is_empty()
                && match *t {
                    ">" => i + 1 == tokens.len(),
                    "*" => true,
                    t => !t.contains(['*', '>']),
                }
        })
}

/// Whether a server error is about a subscription (the server keeps the connection
/// and simply does not deliver: a tap would otherwise wait forever for nothing).
fn is_subscription_refusal(e: &str) -> bool {
    let e = e.to_ascii_lowercase();
    e.contains("subscription") || e.contains("invalid subject")
}

/// Text-mode output: control characters (newlines, escape sequences, ...) from the
/// network are shown escaped (`\n`, `\u{1b}`), so a session id or a header cannot
/// forge output lines or drive the terminal. JSON output is escaped by serde.
fn escape_controls(s: &str) -> String {
    let bad = |c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}';
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if bad(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[derive(Default)]
struct Tap {
    messages: u64,
    errors: u64,
    subjects: BTreeMap<String, SubjectSummary>,
    decode: DecodeOptions,
}

impl Tap {
    fn on_message(
        &mut self,
        subject: &str,
        payload: &Bytes,
        hdrs: Option<&async_nats::HeaderMap>,
        json: bool,
        now_ms: u64,
    ) -> String {
        self.messages += 1;
        let shown: BTreeMap<&str, &str> = SHOWN_HEADERS
            .iter()
            .filter_map(|&name| Some((name, hdrs?.get(name)?.as_str())))
            .collect();
        let summary = self
            .subjects
            .entry(subject.to_owned())
            .or_insert_with(|| SubjectSummary {
                subject: subject.to_owned(),
                ..SubjectSummary::default()
            });
        match decode(payload, &self.decode) {
            Ok(packet) => {
                let ext = Extensions::read(|k| shown.get(k).copied());
                let captured_at_ms = packet.captured_at_ms.or(ext.captured_at_ms);
                // Signed: a capture time ahead of this host's clock shows as negative.
                let age_ms = captured_at_ms.map(|at| {
                    i64::try_from(i128::from(now_ms) - i128::from(at)).unwrap_or(i64::MIN)
                });
                summary.observe(&packet, shown.get(headers::END_REASON).copied());
                if matches!(packet.body, PacketBody::Frame { .. })
                    && let Some(age) = age_ms
                {
                    summary.max_age_ms = Some(summary.max_age_ms.map_or(age, |m| m.max(age)));
                }
                if let Some(p) = &ext.possibly_lost {
                    summary.possible_loss_declarations += 1;
                    summary.possibly_lost_frames = p.total_frames;
                }
                let ext = PacketExt {
                    captured_at_ms,
                    age_ms,
                    possibly_lost: ext.possibly_lost,
                };
                packet_line(subject, payload.len(), &packet, &shown, &ext, json)
            }
            Err(e) => {
                self.errors += 1;
                summary.decode_errors += 1;
                let kind = e.kind().as_str();
                if json {
                    json!({
                        "subject": subject, "type": Value::Null, "seq": Value::Null,
                        "sample_rate": Value::Null, "samples": Value::Null,
                        "bytes": payload.len(), "headers": shown,
                        "error": {"kind": kind, "message": e.to_string()},
                    })
                    .to_string()
                } else {
                    format!("{subject} ERROR {kind}: {e} ({} bytes)", payload.len())
                }
            }
        }
    }

    fn finish(self, stopped_by: &str) -> TapSummary {
        TapSummary {
            messages: self.messages,
            errors: self.errors,
            subjects: self.subjects.into_values().collect(),
            stopped_by: stopped_by.to_owned(),
        }
    }
}

impl SubjectSummary {
    fn observe(&mut self, packet: &Packet, end_reason: Option<&str>) {
        let seqs = match &packet.body {
            PacketBody::Gap(g) => Seqs::Range {
                first: g.first_seq,
                last: g.last_seq,
            },
            _ => Seqs::Single(packet.seq),
        };
        let first = match seqs {
            Seqs::Range { first, .. } => first,
            Seqs::Single(s) => s,
        };
        self.first_seq = Some(self.first_seq.map_or(first, |f| f.min(first)));
        self.last_seq = Some(self.last_seq.map_or(packet.seq, |l| l.max(packet.seq)));
        match self.tracker.observe(seqs) {
            Observation::Accept {
                lost: Some(lost), ..
            } => {
                // Seqs come from the network: saturate, never panic.
                self.missing = self.missing.saturating_add(lost.end() - lost.start() + 1);
                self.gaps += 1;
            }
            Observation::Accept { lost: None, .. } => {}
            Observation::Stale => self.stale += 1,
            Observation::Restart => {
                // Same subject, new stream: keep counting on a fresh sequence.
                self.tracker = SeqTracker::new();
                self.tracker.observe(seqs);
            }
        }
        match &packet.body {
            PacketBody::Frame { .. } => {
                self.frames += 1;
                self.samples += packet.samples();
            }
            PacketBody::Gap(g) => {
                self.declared_gaps += 1;
                self.declared_gap_frames = self.declared_gap_frames.saturating_add(g.frames());
            }
            PacketBody::End => {
                self.end_seen = true;
                self.end_reason = end_reason.map(str::to_owned);
            }
        }
    }
}

/// What the tap derives from a packet's meta and headers besides the packet itself.
struct PacketExt {
    captured_at_ms: Option<u64>,
    age_ms: Option<i64>,
    possibly_lost: Option<PossibleLoss>,
}

fn packet_line(
    subject: &str,
    bytes: usize,
    packet: &Packet,
    shown: &BTreeMap<&str, &str>,
    ext: &PacketExt,
    json: bool,
) -> String {
    let gap = match &packet.body {
        PacketBody::Gap(g) => json!({
            "first_seq": g.first_seq, "last_seq": g.last_seq, "frames": g.frames(),
            "samples": g.samples, "reason": g.reason.as_str(),
        }),
        _ => Value::Null,
    };
    if json {
        return json!({
            "subject": subject,
            "type": packet.type_name(),
            "seq": packet.seq,
            "sample_rate": packet.format.sample_rate,
            "samples": packet.samples(),
            "bytes": bytes,
            "session_id": packet.session_id,
            "captured_at_ms": ext.captured_at_ms,
            "age_ms": ext.age_ms,
            "headers": shown,
            "gap": gap,
            "possibly_lost": ext.possibly_lost,
            "error": Value::Null,
        })
        .to_string();
    }
    let mut line = format!(
        "{subject} {} seq={} rate={} samples={}",
        packet.type_name(),
        packet.seq,
        packet.format.sample_rate,
        packet.samples()
    );
    if let PacketBody::Gap(g) = &packet.body {
        line.push_str(&format!(
            " missing={}..={} reason={}",
            g.first_seq,
            g.last_seq,
            g.reason.as_str()
        ));
    }
    if let Some(s) = &packet.session_id {
        line.push_str(&format!(" session={s}"));
    }
    if let (Some(at), Some(age)) = (ext.captured_at_ms, ext.age_ms) {
        line.push_str(&format!(" captured_at_ms={at} age_ms={age}"));
    }
    if let Some(p) = &ext.possibly_lost {
        line.push_str(&format!(
            " possibly_lost={}..={} frames={} total_frames={} reason={}",
            p.first_seq,
            p.last_seq,
            p.frames,
            p.total_frames,
            p.reason.as_str()
        ));
    }
    for (k, v) in shown {
        // Shown parsed above.
        if *k == headers::POSSIBLY_LOST && ext.possibly_lost.is_some() {
            continue;
        }
        line.push_str(&format!(" {k}={v}"));
    }
    line
}

fn summary_line(s: &SubjectSummary, json: bool) -> String {
    if json {
        let mut v = serde_json::to_value(s).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut v {
            map.insert("type".into(), Value::from("summary"));
        }
        return v.to_string();
    }
    let range = match (s.first_seq, s.last_seq) {
        (Some(a), Some(b)) => format!("{a}..={b}"),
        _ => "-".into(),
    };
    format!(
        "summary {} seq={range} frames={} samples={} missing={} gaps={} declared_gap_frames={} stale={} max_age_ms={} possible_loss_declarations={} possibly_lost_frames={} end={} decode_errors={}",
        s.subject,
        s.frames,
        s.samples,
        s.missing,
        s.gaps,
        s.declared_gap_frames,
        s.stale,
        s.max_age_ms
            .map_or_else(|| "-".to_owned(), |a| a.to_string()),
        s.possible_loss_declarations,
        s.possibly_lost_frames,
        match (&s.end_seen, &s.end_reason) {
            (false, _) => "no".to_owned(),
            (true, Some(r)) => format!("yes({r})"),
            (true, None) => "yes".to_owned(),
        },
        s.decode_errors
    )
}

fn total_line(t: &TapSummary, json: bool) -> String {
    if json {
        return json!({
            "type": "total", "messages": t.messages, "errors": t.errors,
            "subjects": t.subjects.len(), "stopped_by": t.stopped_by,
        })
        .to_string();
    }
    format!(
        "total messages={} errors={} subjects={} stopped_by={}",
        t.messages,
        t.errors,
        t.subjects.len(),
        t.stopped_by
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(p: Packet) -> Bytes {
        p.encode().expect("encodable")
    }

    #[test]
    fn patterns_follow_the_nats_wildcard_rules() {
        for ok in [
            "a",
            "a.b",
            "a.*",
            "a.>",
            ">",
            "*.b.>",
            "inference.whisper.stream.*",
        ] {
            assert!(valid_pattern(ok), "{ok}");
        }
        for bad in [
            ">.a", "a.>.b", "a*", "a.b>", "", "a..b", ".a", "a b", "a\nb", "a.>>",
        ] {
            assert!(!valid_pattern(bad), "{bad:?}");
        }
    }

    #[test]
    fn text_mode_escapes_control_characters_from_the_network() {
        let mut tap = Tap::default();
        let p = Packet::frame(1, Bytes::from(vec![0u8; 640]))
            .with_session(Some("s\nfake.subject end seq=9\u{1b}[2J".to_owned()));
        let line = tap.on_message("s.a", &payload(p), None, false, 0);
        let shown = escape_controls(&line);
        assert!(
            !shown.contains('\n') && !shown.contains('\u{1b}'),
            "{shown}"
        );
        assert!(shown.contains("session=s\\nfake.subject"), "{shown}");
        assert!(shown.contains("\\u{1b}[2J"), "{shown}");
        assert_eq!(escape_controls("plain line"), "plain line");
        // JSON mode needs nothing: serde escapes.
        let p = Packet::frame(2, Bytes::from(vec![0u8; 640])).with_session(Some("a\nb".into()));
        let json = tap.on_message("s.a", &payload(p), None, true, 0);
        assert!(!json.contains('\n'));
    }

    #[test]
    fn json_lines_have_the_documented_keys() {
        let mut tap = Tap::default();
        let line = tap.on_message(
            "s.a",
            &payload(Packet::frame(1, Bytes::from(vec![0u8; 640]))),
            None,
            true,
            0,
        );
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["subject"], "s.a");
        assert_eq!(v["type"], "frame");
        assert_eq!(v["seq"], 1);
        assert_eq!(v["sample_rate"], 16_000);
        assert_eq!(v["samples"], 320);
        assert!(v["error"].is_null());
        let bad = tap.on_message("s.a", &Bytes::from_static(b"\x00\x00"), None, true, 0);
        let v: Value = serde_json::from_str(&bad).expect("json");
        assert_eq!(v["error"]["kind"], "truncated");
        assert!(v["type"].is_null());
    }

    #[test]
    fn summary_counts_missing_and_end() {
        let mut tap = Tap::default();
        for seq in [1, 2, 5, 6] {
            tap.on_message(
                "s.a",
                &payload(Packet::frame(seq, Bytes::from(vec![0u8; 640]))),
                None,
                false,
                0,
            );
        }
        tap.on_message("s.a", &payload(Packet::end(7)), None, false, 0);
        let sum = tap.finish("count");
        let s = &sum.subjects[0];
        assert_eq!((s.first_seq, s.last_seq), (Some(1), Some(7)));
        assert_eq!((s.frames, s.samples, s.missing, s.gaps), (4, 1_280, 2, 1));
        assert!(s.end_seen);
        let line: Value = serde_json::from_str(&summary_line(s, true)).expect("json");
        assert_eq!(line["type"], "summary");
        assert_eq!(line["missing"], 2);
    }

    /// The capture time and its age come from the meta (the header as fallback); the
    /// possible-loss header is parsed, in text and JSON, and summed up.
    #[test]
    fn capture_time_age_and_possible_loss_are_shown() {
        let mut tap = Tap::default();
        let now = 1_764_500_000_000;
        let frame = |seq| Packet::frame(seq, Bytes::from(vec![0u8; 640]));
        let line = tap.on_message(
            "s.a",
            &payload(frame(1).with_captured_at_ms(Some(now - 1_234))),
            None,
            true,
            now,
        );
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["captured_at_ms"], now - 1_234);
        assert_eq!(v["age_ms"], 1_234);
        assert!(v["possibly_lost"].is_null());
        // Text, a clock ahead of ours: negative age.
        let line = tap.on_message(
            "s.a",
            &payload(frame(2).with_captured_at_ms(Some(now + 5))),
            None,
            false,
            now,
        );
        assert!(
            line.ends_with(&format!(" captured_at_ms={} age_ms=-5", now + 5)),
            "{line}"
        );
        // The header fallback, and the possible-loss declaration.
        let mut map = async_nats::HeaderMap::new();
        map.insert(headers::CAPTURED_AT_MS, (now - 40).to_string().as_str());
        let declared = r#"{"first_seq":3,"last_seq":4,"frames":2,"total_frames":7,"reason":"unconfirmed_at_disconnect"}"#;
        map.insert(headers::POSSIBLY_LOST, declared);
        let line = tap.on_message("s.a", &payload(frame(5)), Some(&map), true, now);
        let v: Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["captured_at_ms"], now - 40);
        assert_eq!(v["age_ms"], 40);
        assert_eq!(v["possibly_lost"]["first_seq"], 3);
        assert_eq!(v["possibly_lost"]["total_frames"], 7);
        assert_eq!(v["possibly_lost"]["reason"], "unconfirmed_at_disconnect");
        assert_eq!(v["headers"][headers::POSSIBLY_LOST], declared);
        let line = tap.on_message("s.a", &payload(frame(6)), Some(&map), false, now);
        assert!(
            line.contains(
                " possibly_lost=3..=4 frames=2 total_frames=7 reason=unconfirmed_at_disconnect"
            ),
            "{line}"
        );
        assert!(!line.contains(headers::POSSIBLY_LOST), "shown once: {line}");
        // No capture time: no age.
        let line = tap.on_message("s.a", &payload(frame(7)), None, true, now);
        let v: Value = serde_json::from_str(&line).expect("json");
        assert!(v["captured_at_ms"].is_null() && v["age_ms"].is_null());
        let sum = tap.finish("count");
        let s = &sum.subjects[0];
        assert_eq!(s.max_age_ms, Some(1_234));
        assert_eq!(
            (s.possible_loss_declarations, s.possibly_lost_frames),
            (2, 7)
        );
        assert!(
            summary_line(s, false)
                .contains(" max_age_ms=1234 possible_loss_declarations=2 possibly_lost_frames=7 "),
            "{}",
            summary_line(s, false)
        );
    }

    #[test]
    fn seconds_are_validated() {
        assert_eq!(parse_seconds("1.5"), Ok(Duration::from_millis(1_500)));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("-3").is_err());
        assert!(parse_seconds("nan").is_err());
        assert!(parse_seconds("x").is_err());
    }

    fn args_for(url: &str) -> TapArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            tap: TapArgs,
        }
        Cli::parse_from(["tap", "audio.*", "--nats-url", url]).tap
    }

    #[tokio::test]
    async fn a_connect_failure_keeps_the_nats_error_as_source() {
        // A port that was free a moment ago: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let args = args_for(&format!("nats://127.0.0.1:{port}"));
        let e = run_with(args, &mut Vec::new(), std::future::pending())
            .await
            .expect_err("nothing listens");
        assert_eq!(e.kind(), TapErrorKind::Connect);
        assert!(
            e.to_string()
                .starts_with("cannot connect to NATS at nats://127.0.0.1:")
        );
        let mut cause = std::error::Error::source(&e);
        let mut found = false;
        while let Some(c) = cause {
            found |= c.downcast_ref::<async_nats::ConnectError>().is_some();
            cause = c.source();
        }
        assert!(found, "async_nats::ConnectError reachable from {e:?}");
    }

    #[tokio::test]
    async fn an_invalid_pattern_has_no_source() {
        let mut args = args_for("nats://127.0.0.1:1");
        args.subject = "a..b".into();
        let e = run_with(args, &mut Vec::new(), std::future::pending())
            .await
            .expect_err("invalid");
        assert_eq!(e.kind(), TapErrorKind::InvalidSubject);
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn an_output_failure_keeps_the_io_error() {
        let e = output_error(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(e.kind(), TapErrorKind::Output);
        let io = std::error::Error::source(&e)
            .and_then(|c| c.downcast_ref::<std::io::Error>())
            .expect("io::Error kept");
        assert_eq!(io.kind(), std::io::ErrorKind::BrokenPipe);
    }
}
