//! One real `nats-server` process, owned by a [`NatsServer`] value.
//!
//! Invariants:
//! - **No port races.** The first start runs `nats-server -a 127.0.0.1 -p -1
//!   --ports_file_dir <dir>`: the server picks a free port itself and reports it in
//!   `<dir>/nats-server_<pid>.ports`. Nothing here ever guesses a free port.
//! - **Ready means ready.** `start*` and `restart` return only after a TCP connection to
//!   the port received the server's `INFO` line, so a client may connect at once. Every
//!   wait is bounded by [`NatsServerOptions::startup_timeout`].
//! - **Same address for life.** [`url`](NatsServer::url) and [`port`](NatsServer::port)
//!   never change: `restart` starts a new process on the same port with the same options
//!   and the same temporary directory (so JetStream data survives a restart, like a real
//!   server restart). [`pid`](NatsServer::pid) changes on every restart.
//! - **No orphans from a test that fails.** Dropping the value — also while a panic
//!   unwinds — resumes the process if it is paused, sends SIGKILL and reaps it. (A test
//!   binary that is itself killed with SIGKILL or aborts cannot run `Drop`; then the
//!   server outlives it. Setting a parent-death signal would need `unsafe`.)
//! - **Signals are observed, not assumed.** `pause` (SIGSTOP) returns once Linux reports
//!   the process as stopped, `resume` (SIGCONT) once it is no longer stopped; `kill`
//!   returns after the process was reaped.
//!
//! All methods take `&self` (state sits behind a mutex), so one server can be shared by
//! reference or `Arc` between a test and the tasks that pause or restart it. Every call
//! is short and blocking; it is fine to call from async tests.
//!
//! The server's stderr goes to [`log_path`](NatsServer::log_path); an error about a
//! failed start quotes the end of that log.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::binary::nats_server_bin;
use crate::error::{Error, ErrorKind};

/// How long `start*` and `restart` wait for the server by default.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `pause` and `resume` wait to see the process state change.
const SIGNAL_SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

/// Poll interval of every bounded wait here.
const POLL: Duration = Duration::from_millis(10);

/// Per-attempt bound of the readiness probe (connect, then read `INFO`).
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// How many log lines an error quotes.
const LOG_TAIL_LINES: usize = 25;

/// The line written to the log before every launch, so that an error quotes only the
/// output of the launch that failed.
const LAUNCH_MARKER: &str = "--- weir-testkit: launching";

/// Client authentication the server requires (passed as command-line flags).
///
/// Do not combine with an `authorization` block in [`NatsServerOptions::config`]: the
/// server refuses or one silently wins. Use the config text for anything richer (users
/// with permissions, accounts, nkeys).
#[derive(Clone, PartialEq, Eq)]
pub enum Auth {
    /// `--user <user> --pass <password>`.
    UserPassword {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// `--auth <token>`.
    Token(String),
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"***")
                .finish(),
            Self::Token(_) => f.debug_tuple("Token").field(&"***").finish(),
        }
    }
}

/// How to run the server. `Default` is a plain core-NATS server.
///
/// ```no_run
/// use weir_testkit::{NatsServer, NatsServerOptions};
/// let server = NatsServer::start_with(NatsServerOptions {
///     jetstream: true,
///     config: Some(r#"mappings = { "audio.*": "audio.{{partition(8,1)}}.{{wildcard(1)}}" }"#.into()),
///     ..Default::default()
/// })?;
/// # Ok::<(), weir_testkit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct NatsServerOptions {
    /// Enable JetStream (`-js -sd <tempdir>/jetstream`). The store survives `restart`.
    pub jetstream: bool,
    /// Extra server configuration text (mappings, authorization, accounts, limits...),
    /// written to `<tempdir>/server.conf` and passed with `-c`. The address and port are
    /// always set on the command line, which takes precedence over the file.
    pub config: Option<String>,
    /// Require client authentication.
    pub auth: Option<Auth>,
    /// Run this binary instead of the one [`nats_server_bin`]
    /// finds (e.g. to test a second server version side by side).
    pub binary: Option<PathBuf>,
    /// More command-line arguments, appended after the testkit's own.
    pub extra_args: Vec<String>,
    /// Bound on every start and restart (default [`DEFAULT_STARTUP_TIMEOUT`]).
    pub startup_timeout: Duration,
}

impl Default for NatsServerOptions {
    fn default() -> Self {
        Self {
            jetstream: false,
            config: None,
            auth: None,
            binary: None,
            extra_args: Vec::new(),
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
        }
    }
}

/// The process part of the state; everything else in [`NatsServer`] is fixed at start.
#[derive(Debug)]
struct State {
    /// `None` after `kill`.
    child: Option<Child>,
    /// Pid of the current (or last) process.
    pid: u32,
    /// Whether we sent SIGSTOP and not yet SIGCONT.
    paused: bool,
}

/// A running `nats-server` on a loopback port; see the [module docs](self).
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    options: NatsServerOptions,
    port: u16,
    url: String,
    /// Holds the ports files, config file, log and JetStream store ([`Layout`]);
    /// removed on drop.
    _dir: TempDir,
    layout: Layout,
    state: Mutex<State>,
}

impl NatsServer {
    /// Starts a plain server on a free loopback port.
    pub fn start() -> Result<Self, Error> {
        Self::start_with(NatsServerOptions::default())
    }

    /// Starts a server with `options` on a free loopback port.
    pub fn start_with(options: NatsServerOptions) -> Result<Self, Error> {
        let binary = match &options.binary {
            Some(path) => path.clone(),
            None => nats_server_bin()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("weir-nats-")
            .tempdir()
            .map_err(because(
                ErrorKind::Io,
                "could not create a temporary directory".into(),
            ))?;
        let layout = Layout::new(dir.path());
        fs::create_dir_all(&layout.ports_dir).map_err(io_error_at("create", &layout.ports_dir))?;
        if let Some(config) = &options.config {
            fs::write(&layout.config_file, config)
                .map_err(io_error_at("write", &layout.config_file))?;
        }
        let mut server = Self {
            url: String::new(),
            port: 0,
            binary,
            _dir: dir,
            layout,
            state: Mutex::new(State {
                child: None,
                pid: 0,
                paused: false,
            }),
            options,
        };
        let (child, port) = server.launch(None, Instant::now() + server.options.startup_timeout)?;
        server.url = format!("nats://127.0.0.1:{port}");
        server.port = port;
        let state = server
            .state
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        state.pid = child.id();
        state.child = Some(child);
        Ok(server)
    }

    /// The client URL, `nats://127.0.0.1:PORT`. Never changes, also across `restart`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The client port. Never changes, also across `restart`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The pid of the current process (of the last one after `kill`).
    pub fn pid(&self) -> u32 {
        self.lock().pid
    }

    /// The binary that runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The file that receives the server's output (all launches, appended).
    pub fn log_path(&self) -> PathBuf {
        self.layout.log_file.clone()
    }

    /// The JetStream store directory, when JetStream is on.
    pub fn store_dir(&self) -> Option<PathBuf> {
        self.options
            .jetstream
            .then(|| self.layout.store_dir.clone())
    }

    /// The text of the current process's ports file (`{"nats":[...],"cluster":[...],
    /// "monitoring":[...]}`), if it was written.
    pub(crate) fn ports_file_text(&self) -> Option<String> {
        fs::read_to_string(self.layout.ports_file(self.pid())).ok()
    }

    /// Whether the process exists (it may be paused).
    pub fn is_running(&self) -> bool {
        let mut state = self.lock();
        (state.child.as_mut()).is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Whether the process is paused by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    /// Stops the process with SIGSTOP: it keeps its port and connections but answers
    /// nothing (the kernel still completes new TCP handshakes into the listen backlog).
    /// Returns once the process is seen stopped. Pausing a paused server is a no-op.
    pub fn pause(&self) -> Result<(), Error> {
        self.set_paused(true)
    }

    /// Continues a paused process with SIGCONT; returns once it is no longer stopped.
    /// Resuming a running server is a no-op.
    pub fn resume(&self) -> Result<(), Error> {
        self.set_paused(false)
    }

    /// SIGSTOP (`paused`) or SIGCONT, then waits until the process state shows it.
    fn set_paused(&self, paused: bool) -> Result<(), Error> {
        let mut state = self.lock();
        let pid = running_pid(&mut state)?;
        if paused && state.paused {
            return Ok(());
        }
        let signal = if paused {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        send_signal(pid, signal)?;
        wait_proc_state(pid, paused)?;
        state.paused = paused;
        Ok(())
    }

    /// Kills the process with SIGKILL (no lame-duck, no goodbye to clients) and reaps
    /// it. The port is free afterwards until [`restart`](Self::restart). Killing a
    /// killed server is a no-op.
    pub fn kill(&self) -> Result<(), Error> {
        stop(&mut self.lock())
    }

    /// Kills the process if it runs, then starts a new one on the same port with the
    /// same options, and waits until it is ready. If the port is briefly still taken the
    /// launch is retried until the startup timeout.
    pub fn restart(&self) -> Result<(), Error> {
        let mut state = self.lock();
        stop(&mut state)?;
        let deadline = Instant::now() + self.options.startup_timeout;
        loop {
            match self.launch(Some(self.port), deadline) {
                Ok((child, _)) => {
                    state.pid = child.id();
                    state.child = Some(child);
                    state.paused = false;
                    return Ok(());
                }
                Err(e)
                    if e.kind() == ErrorKind::Exited
                        && e.to_string().contains("address already in use")
                        && Instant::now() + Duration::from_millis(100) < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave `State` inconsistent (every field
        // is written after the operation it records succeeded), so poison is ignored.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        // Nothing useful can be done with an error while dropping (perhaps unwinding).
        let _ = stop(state);
    }
}

/// The pid of a live process, or `NotRunning`.
fn running_pid(state: &mut State) -> Result<u32, Error> {
    let Some(child) = state.child.as_mut() else {
        return Err(Error::new(
            ErrorKind::NotRunning,
            "nats-server was killed; call restart() first",
        ));
    };
    match child.try_wait() {
        Ok(None) => Ok(child.id()),
        Ok(Some(status)) => Err(Error::new(
            ErrorKind::NotRunning,
            format!(
                "nats-server (pid {}) exited on its own: {status}",
                child.id()
            ),
        )),
        Err(e) => Err(because(
            ErrorKind::Signal,
            format!("could not query nats-server (pid {})", child.id()),
        )(e)),
    }
}

/// Resume if paused, SIGKILL, reap. Leaves `state` without a child.
fn stop(state: &mut State) -> Result<(), Error> {
    let Some(mut child) = state.child.take() else {
        return Ok(());
    };
    if state.paused {
        // SIGKILL ends a stopped process too; resuming first keeps the documented
        // behaviour simple and lets a stopped process see its pending signals.
        let _ = send_signal(child.id(), Signal::SIGCONT);
        state.paused = false;
    }
    kill_and_reap(&mut child)
}

fn kill_and_reap(child: &mut Child) -> Result<(), Error> {
    // `kill` on a child that already exited (but is not reaped) returns Ok.
    let pid = child.id();
    let signal_error = |what| because(ErrorKind::Signal, format!("could not {what} (pid {pid})"));
    child.kill().map_err(signal_error("SIGKILL nats-server"))?;
    child
        .wait()
        .map(drop)
        .map_err(signal_error("reap nats-server"))
}

fn send_signal(pid: u32, sig: Signal) -> Result<(), Error> {
    let raw = i32::try_from(pid)
        .map_err(|_| Error::new(ErrorKind::Signal, format!("pid {pid} out of range")))?;
    let what = format!("could not send {sig} to nats-server (pid {pid})");
    signal::kill(Pid::from_raw(raw), sig).map_err(because(ErrorKind::Signal, what))
}

/// Waits until `/proc/<pid>/stat` says the process is stopped (`want_stopped`) or not.
/// Where `/proc` is unavailable this returns at once: the signal was delivered, only
/// the confirmation is missing.
fn wait_proc_state(pid: u32, want_stopped: bool) -> Result<(), Error> {
    let deadline = Instant::now() + SIGNAL_SETTLE_TIMEOUT;
    loop {
        let Some(state) = weir_service::process::state_of(pid) else {
            return Ok(());
        };
        let stopped = matches!(state, 'T' | 't');
        if stopped == want_stopped {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::new(
                ErrorKind::Signal,
                format!(
                    "nats-server (pid {pid}) is in state {state:?} {SIGNAL_SETTLE_TIMEOUT:?} after {}",
                    if want_stopped { "SIGSTOP" } else { "SIGCONT" }
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Paths inside the server's temporary directory.
#[derive(Debug)]
struct Layout {
    ports_dir: PathBuf,
    config_file: PathBuf,
    store_dir: PathBuf,
    log_file: PathBuf,
}

impl Layout {
    fn new(dir: &Path) -> Self {
        Self {
            ports_dir: dir.join("ports"),
            config_file: dir.join("server.conf"),
            store_dir: dir.join("jetstream"),
            log_file: dir.join("nats-server.log"),
        }
    }

    /// The ports file the process `pid` writes.
    fn ports_file(&self, pid: u32) -> PathBuf {
        self.ports_dir.join(format!("nats-server_{pid}.ports"))
    }
}

/// Launching one process (by `start_with` and `restart`).
impl NatsServer {
    /// The command line; `port = None` lets the server choose (`-p -1`).
    fn args(&self, port: Option<u16>) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        let mut args = Vec::new();
        if self.options.config.is_some() {
            args.extend(["-c".to_owned(), path(&self.layout.config_file)]);
        }
        let port = port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
        args.extend([
            "-a".to_owned(),
            Ipv4Addr::LOCALHOST.to_string(),
            "-p".into(),
            port,
        ]);
        args.extend(["--ports_file_dir".to_owned(), path(&self.layout.ports_dir)]);
        if self.options.jetstream {
            args.extend(["-js".to_owned(), "-sd".into(), path(&self.layout.store_dir)]);
        }
        match &self.options.auth {
            Some(Auth::UserPassword { user, password }) => {
                args.extend(["--user".to_owned(), user.clone()]);
                args.extend(["--pass".to_owned(), password.clone()]);
            }
            Some(Auth::Token(token)) => args.extend(["--auth".to_owned(), token.clone()]),
            None => {}
        }
        args.extend(self.options.extra_args.iter().cloned());
        args
    }

    /// Spawns the process and waits until it is ready; on any failure the process is
    /// killed and reaped before the error is returned.
    fn launch(&self, port: Option<u16>, deadline: Instant) -> Result<(Child, u16), Error> {
        let args = self.args(port);
        let log = self.open_log(&args)?;
        let stdout = log.try_clone().map_err(because(
            ErrorKind::Io,
            "could not duplicate the log file handle".into(),
        ))?;
        let mut child = Command::new(&self.binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .map_err(because(
                ErrorKind::Spawn,
                format!("could not start {}", self.binary.display()),
            ))?;
        match self.wait_ready(&mut child, port, deadline) {
            Ok(port) => Ok((child, port)),
            Err(e) => {
                let _ = kill_and_reap(&mut child);
                Err(e)
            }
        }
    }

    /// Appends a launch marker to the log and returns the handle for the child.
    fn open_log(&self, args: &[String]) -> Result<File, Error> {
        let path = &self.layout.log_file;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_error_at("open", path))?;
        writeln!(
            log,
            "{LAUNCH_MARKER} {} {} ---",
            self.binary.display(),
            redact(args).join(" ")
        )
        .map_err(io_error_at("write", path))?;
        Ok(log)
    }

    /// Polls until the ports file names the port and the port answers with `INFO`.
    fn wait_ready(
        &self,
        child: &mut Child,
        fixed_port: Option<u16>,
        deadline: Instant,
    ) -> Result<u16, Error> {
        let pid = child.id();
        let ports_file = self.layout.ports_file(pid);
        let mut port = None;
        loop {
            let query_error = because(ErrorKind::Signal, "could not query nats-server".into());
            if let Some(status) = child.try_wait().map_err(query_error)? {
                return Err(self.exited(pid, status));
            }
            if port.is_none() {
                port = fs::read_to_string(&ports_file)
                    .ok()
                    .and_then(|text| parse_ports_entry(&text, "nats"));
                if let (Some(found), Some(fixed)) = (port, fixed_port)
                    && found != fixed
                {
                    return Err(Error::new(
                        ErrorKind::Exited,
                        format!("nats-server (pid {pid}) listens on {found}, not on {fixed}"),
                    ));
                }
            }
            if let Some(port) = port
                && probe_info(port)
            {
                return Ok(port);
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::StartTimeout,
                    format!(
                        "nats-server (pid {pid}) was not ready in time ({}); its log:\n{}",
                        match port {
                            None => format!("no port in {}", ports_file.display()),
                            Some(p) => format!("port {p} did not answer with INFO"),
                        },
                        self.log_tail()
                    ),
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    fn exited(&self, pid: u32, status: ExitStatus) -> Error {
        Error::new(
            ErrorKind::Exited,
            format!(
                "nats-server (pid {pid}, {}) exited during startup: {status}; its log:\n{}",
                self.binary.display(),
                self.log_tail()
            ),
        )
    }

    /// The last lines of the log since the last launch marker.
    fn log_tail(&self) -> String {
        let Ok(text) = fs::read_to_string(&self.layout.log_file) else {
            return "(no log)".to_owned();
        };
        let since_launch = text
            .rfind(LAUNCH_MARKER)
            .map_or(text.as_str(), |at| &text[at..]);
        let lines: Vec<&str> = since_launch.lines().collect();
        let start = lines.len().saturating_sub(LOG_TAIL_LINES);
        lines[start..].join("\n")
    }
}

/// Hides passwords and tokens in a command line that goes into the log.
fn redact(args: &[String]) -> Vec<String> {
    let after_secret_flag = args
        .iter()
        .map(|a| matches!(a.as_str(), "--pass" | "--auth"));
    let hide = std::iter::once(false).chain(after_secret_flag);
    args.iter()
        .zip(hide)
        .map(|(arg, hide)| if hide { "***".to_owned() } else { arg.clone() })
        .collect()
}

/// The port of entry `key` (`nats`, `cluster`, `monitoring`) of a ports file:
/// `{"nats":["nats://127.0.0.1:PORT"],...}`. `None` while the file is incomplete (it is
/// not written atomically).
pub(crate) fn parse_ports_entry(text: &str, key: &str) -> Option<u16> {
    let after_key = &text[text.find(&format!("\"{key}\""))?..];
    let url_start = after_key.find("://")? + "://".len();
    let rest = &after_key[url_start..];
    let host_port = &rest[..rest.find('"')?];
    host_port.rsplit_once(':')?.1.parse().ok()
}

/// Whether a NATS server on `port` answers a new connection with its `INFO` line.
fn probe_info(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(stream) = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) else {
        return false;
    };
    if stream.set_read_timeout(Some(PROBE_TIMEOUT)).is_err() {
        return false;
    }
    let mut line = String::new();
    let mut reader = BufReader::new(stream.take(64 * 1024));
    matches!(reader.read_line(&mut line), Ok(n) if n > 0) && line.starts_with("INFO ")
}

/// An error of `kind` saying `what`, caused by the error it is applied to.
fn because<E: Into<weir_service::error::Source>>(
    kind: ErrorKind,
    what: String,
) -> impl FnOnce(E) -> Error {
    move |e| Error::with_source(kind, what, e)
}

/// An I/O error of `could not <verb> <path>`.
fn io_error_at(verb: &str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    because(
        ErrorKind::Io,
        format!("could not {verb} {}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports_files() {
        assert_eq!(
            parse_ports_entry(r#"{"nats":["nats://127.0.0.1:42405"]}"#, "nats"),
            Some(42405)
        );
        assert_eq!(
            parse_ports_entry(
                r#"{"nats":["nats://127.0.0.1:4222"],"monitoring":["http://127.0.0.1:8222"]}"#,
                "nats"
            ),
            Some(4222)
        );
        assert_eq!(parse_ports_entry("", "nats"), None);
        assert_eq!(
            parse_ports_entry(r#"{"nats":["nats://127.0.0.1:42"#, "nats"),
            None
        );
        assert_eq!(
            parse_ports_entry(r#"{"nats":["nats://127.0.0.1:x"]}"#, "nats"),
            None
        );
    }

    #[test]
    fn reads_own_process_state() {
        // The main thread of this process is running or waiting, never stopped.
        let state = weir_service::process::state_of(std::process::id());
        if Path::new("/proc/self/stat").exists() {
            assert!(matches!(state, Some('R' | 'S')), "{state:?}");
        }
    }

    #[test]
    fn redacts_secrets() {
        let args: Vec<String> = ["--user", "u", "--pass", "p", "--auth", "t", "-js"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            redact(&args),
            ["--user", "u", "--pass", "***", "--auth", "***", "-js"]
        );
        let auth = Auth::Token("secret".into());
        assert!(!format!("{auth:?}").contains("secret"));
    }
}
