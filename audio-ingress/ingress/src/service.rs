//! `audio-ingress serve` assembled as a library value, so tests and tools can run it in
//! process: bind the listeners, serve the WebSocket front door and the admin HTTP, keep
//! the metrics upkeep going, and shut down gracefully.
//!
//! Shutdown order (bounded at every step; see [`crate::shutdown`]): stop accepting new
//! WebSocket connections and WHIP offers → `Ingress::shutdown(grace)` (every stream
//! drains and hands its `end` to NATS) → wait for the WebSocket handlers' close frames
//! and the WHIP pumps' `closed` events → wait for the WHIP sessions' ICE/DTLS to close
//! → flush the NATS client → stop the admin listener.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::admin::{self, AdminState};
use crate::auth::Authenticator;
use crate::capacity::Capacity;
use crate::config::{Config, ServerConfig};
use crate::door::{self, Door};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::error::{Error, ErrorKind};
use crate::listener::{FdLimit, check_fd_limit};
use crate::resume::Resume;
use crate::shutdown::TaskTracker;
use crate::whip::Whip;
use crate::ws;
use weir_audio_producer::jetstream::NatsSink;
use weir_audio_producer::publisher::Sink;
use weir_audio_producer::stream::{Ingress, ShutdownReport};
use weir_protocol::WireName;
use weir_service::http::{ConnLimiter, HttpOptions};
use weir_service::shutdown::CancellationToken;

/// A running service.
pub struct RunningService<S: Sink> {
    ws_addr: SocketAddr,
    admin_addr: SocketAddr,
    grace: Duration,
    stop_ws: CancellationToken,
    stop_admin: CancellationToken,
    ws_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    upkeep: JoinHandle<()>,
    /// The doors' state; its tracker's handlers are closed and waited for at shutdown.
    door: Door<S>,
    whip: Option<Whip>,
}

/// The listener of config key `key` and its bound address.
async fn bind(addr: SocketAddr, key: &str) -> Result<(TcpListener, SocketAddr), Error> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| crate::error::io(format!("config key `{key}`: cannot listen on {addr}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| crate::error::io(format!("{key} address"), e))?;
    Ok((listener, bound))
}

/// Serves `router` on `listener` with `options`, at most `max` connections (`per_ip`
/// from one address; `evict_silent`: see `ConnLimiter::evict_silent_when_full`),
/// until the returned token is cancelled.
fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    options: HttpOptions,
    max: usize,
    per_ip: usize,
    evict_silent: bool,
) -> (CancellationToken, JoinHandle<()>) {
    let mut limiter = ConnLimiter::new(
        options.name,
        crate::metrics::HTTP_CONNECTIONS_OPEN,
        max,
        per_ip,
    );
    if evict_silent {
        limiter = limiter.evict_silent_when_full();
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(weir_service::http::serve(
        listener,
        router,
        limiter,
        options,
        stop.clone().cancelled_owned(),
    ));
    (stop, task)
}

/// Connects to NATS (retrying in the background: the service starts not-ready) and
/// starts the service: publishing to JetStream, admitting by recognition capacity; the
/// telephony door's return path and call events use the same client.
///
/// In order: connect, check the open-file limit, bind the WebSocket then the admin
/// listener, set up authentication, WHIP and resumption, serve the front door, then the
/// admin HTTP, then start the metrics upkeep. A failing step stops the start there.
pub async fn start(
    config: Config,
    prometheus: Option<PrometheusHandle>,
) -> Result<RunningService<NatsSink>, Error> {
    // Streams are refused until NATS is connected (readiness gates admission): the
    // first connect gets one connection timeout before the ready line, so that a
    // producer that starts with the service is not refused for nothing. A server that
    // is down does not stop the start: the service reports not-ready instead.
    let client = weir_audio_producer::nats::connect(&config.nats)
        .await
        .map_err(|e| e.map_kind(ErrorKind::Nats))?;
    let sink = NatsSink::for_config(client.clone(), &config.stream)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, "creating the JetStream stream", e))?;
    let stream = &config.stream;
    let capacity = Capacity::start(
        client.clone(),
        &config.capacity,
        stream.subject().as_str(),
        stream.partitions(),
    );
    let server = &config.server;
    let fd = check_open_files(server)?;
    let (ws_listener, ws_addr) = bind(config.server.listen, "listen").await?;
    let (admin_listener, admin_addr) = bind(config.server.admin.listen, "admin").await?;
    let max_streams = config.server.max_streams.get();
    let ingress = Ingress::with_max_streams(sink, config.stream.clone(), max_streams);
    let door = Door {
        ingress: ingress.clone(),
        retry_after: server.retry_after,
        idle_timeout: server.idle_timeout,
        send_timeout: server.ws_send_timeout,
        tracker: TaskTracker::new(),
        auth: authenticator(server)?,
        capacity: Some(capacity),
        resume: resume_streams(server)?,
    };
    let whip = match &config.server.whip {
        None => None,
        Some(w) => Some(Whip::start(w.clone()).await?),
    };
    let ws_router = front_router(&door, &config, whip.as_ref(), Some(client));
    let (stop_ws, ws_task) = serve_http(
        ws_listener,
        ws_router,
        http_options(server, "ws", config.server.send_buffer),
        server.max_connections.get(),
        server.max_connections_per_ip.get(),
        false,
    );

    let admin_router = admin::router(AdminState {
        ingress: ingress.clone(),
        prometheus: prometheus.clone(),
        edge: edge_view(server, &fd),
        max_streams,
        whip: whip.as_ref().map(Whip::view),
        limits: config.server.admin.request_limits,
    });
    // Per address = the whole cap: the admin port is for local scrapers and probes.
    // Silent connections are evicted when it is full, so probes are always let in.
    let admin_cap = server.admin.max_connections.get();
    let (stop_admin, admin_task) = serve_http(
        admin_listener,
        admin_router,
        http_options(server, "admin", None),
        admin_cap,
        admin_cap,
        true,
    );

    let upkeep = spawn_upkeep(ingress.clone(), prometheus);

    tracing::info!(%ws_addr, %admin_addr, policy = config.stream.policy().as_str(),
        max_bytes = config.stream.max_bytes(), max_age_ms = config.stream.max_age().as_millis() as u64,
        shadow = config.stream.shadow(), max_streams, auth = config.server.auth.is_some(),
        "audio-ingress serving");
    Ok(RunningService {
        ws_addr,
        admin_addr,
        grace: config.server.grace_period,
        stop_ws,
        stop_admin,
        ws_task,
        admin_task,
        upkeep,
        door,
        whip,
    })
}

/// Checks (and raises, if it can) the open-file limit against both listeners' caps, and
/// logs what it found.
fn check_open_files(server: &ServerConfig) -> Result<FdLimit, Error> {
    let fd = check_fd_limit(
        server.max_connections.get(),
        server.admin.max_connections.get(),
    )
    .map_err(crate::error::config)?;
    tracing::info!(
        rlimit_nofile_soft = fd.soft,
        rlimit_nofile_hard = fd.hard,
        needed = fd.needed,
        raised_from = fd.raised_from,
        max_connections = server.max_connections.get(),
        admin_max_connections = server.admin.max_connections.get(),
        "open-file limit checked"
    );
    Ok(fd)
}

/// The token check of `auth_required` (`None`: the doors are open).
fn authenticator(server: &ServerConfig) -> Result<Option<Arc<Authenticator>>, Error> {
    let refused = |e: crate::auth::KeyError| {
        let e = ConfigError::new("auth_required", ConfigErrorKind::Invalid, e.to_string());
        crate::error::config(e)
    };
    let auth = server.auth.as_ref().map(Authenticator::new).transpose();
    Ok(auth.map_err(refused)?.map(Arc::new))
}

/// The resumable streams, keyed by a secret drawn from the OS.
fn resume_streams(server: &ServerConfig) -> Result<Arc<Resume>, Error> {
    Resume::new(server.resume_window).ok_or_else(|| {
        crate::error::config(ConfigError::new(
            "resume_window_ms",
            ConfigErrorKind::Invalid,
            "no randomness from the OS for the resume tokens' key".to_owned(),
        ))
    })
}

/// The front listener's router: the WebSocket door, WHIP (when configured), the
/// telephony doors and the publish page (when on), with the fallbacks.
fn front_router<S: Sink>(
    door: &Door<S>,
    config: &Config,
    whip: Option<&Whip>,
    voice: Option<async_nats::Client>,
) -> axum::Router {
    let mut routes = ws::routes(door.clone());
    if let Some(w) = whip {
        routes = routes.merge(w.routes(door.clone()));
    }
    routes = routes.merge(crate::telephony::routes(crate::telephony::TelephonyState {
        door: door.clone(),
        config: Arc::new(config.telephony.clone()),
        nats: voice,
        out_total: Arc::default(),
    }));
    if config.server.publish_page {
        routes = routes.merge(crate::publish::routes());
    }
    door::with_fallbacks(routes)
}

/// The HTTP settings of the listener `name`.
fn http_options(
    server: &ServerConfig,
    name: &'static str,
    send_buffer: Option<usize>,
) -> HttpOptions {
    HttpOptions {
        name,
        header_timeout: server.http_header_timeout,
        idle_timeout: server.http_idle_timeout,
        max_header_bytes: server.http_max_header_bytes,
        body: server.http_body,
        retry_after: server.retry_after,
        metrics: crate::metrics::LISTENER,
        send_buffer,
    }
}

/// The edge settings the admin API shows (`edge`).
fn edge_view(s: &ServerConfig, fd: &FdLimit) -> serde_json::Value {
    serde_json::json!({
        "max_connections": s.max_connections.get(),
        "max_connections_per_ip": s.max_connections_per_ip.get(),
        "admin_max_connections": s.admin.max_connections.get(),
        "http_header_timeout_ms": s.http_header_timeout.as_millis() as u64,
        "http_idle_timeout_ms": s.http_idle_timeout.as_millis() as u64,
        "http_max_header_bytes": s.http_max_header_bytes,
        "http_body_timeout_ms": s.http_body.timeout.as_millis() as u64,
        "http_body_min_rate": s.http_body.min_rate,
        "rlimit_nofile": fd.soft,
        "auth_required": s.auth.is_some(),
        "whip": s.whip.as_ref().map(|w| serde_json::json!({
            "udp_listen": w.udp_listen.to_string(),
            "advertise_ips": w.advertise.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "connect_timeout_ms": w.connect_timeout.as_millis() as u64,
            "disconnect_timeout_ms": w.disconnect_timeout.as_millis() as u64,
            "max_sessions": w.max_sessions.get(),
            "max_sessions_per_ip": w.max_sessions_per_ip.get(),
            "allow_foreign_candidates": w.allow_foreign_candidates,
        })),
        "publish_page": s.publish_page,
    })
}

/// Once a second: the oldest-frame gauge, and the Prometheus recorder's upkeep.
fn spawn_upkeep<S: Sink>(
    ingress: Ingress<S>,
    prometheus: Option<PrometheusHandle>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            ingress.oldest_frame_age();
            if let Some(h) = &prometheus {
                h.run_upkeep();
            }
        }
    })
}

impl<S: Sink> RunningService<S> {
    /// The WebSocket listener's address.
    pub fn ws_addr(&self) -> SocketAddr {
        self.ws_addr
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The producer core.
    pub fn ingress(&self) -> &Ingress<S> {
        &self.door.ingress
    }

    /// The recognition-capacity check (`None`: a service started without one).
    pub fn capacity(&self) -> Option<&Capacity> {
        self.door.capacity.as_deref()
    }

    /// The one line printed on stdout when ready (docs/contracts.md).
    pub fn ready_line(&self) -> String {
        weir_protocol::admin::ReadyLine::new(
            Some(self.ws_addr.to_string()),
            Some(self.admin_addr.to_string()),
            self.whip.as_ref().map(|w| w.udp_addr().to_string()),
        )
        .to_line()
    }

    /// Graceful shutdown; see the module docs for the order.
    pub async fn shutdown(mut self) -> ShutdownReport {
        tracing::info!(grace_ms = self.grace.as_millis() as u64, "shutting down");
        self.stop_ws.cancel();
        let report = self.door.ingress.shutdown(self.grace).await;
        // Parked streams ended with the others; their slots go now.
        self.door.resume.clear();
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.ws_task).await;
        self.ws_task.abort();
        // The listener is gone: no handler starts after this.
        self.door.tracker.close();
        let handlers_done = tokio::time::timeout(Duration::from_secs(2), self.door.tracker.wait())
            .await
            .is_ok();
        // The WHIP pumps sent their `closed` events and asked for the sessions to close.
        if let Some(w) = self.whip.take() {
            w.shutdown(Duration::from_secs(2)).await;
        }
        if let Err(e) =
            tokio::time::timeout(Duration::from_secs(1), self.door.ingress.sink().flush()).await
        {
            tracing::warn!(error = %e, "NATS flush timed out at shutdown");
        }
        self.stop_admin.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.admin_task).await;
        self.admin_task.abort();
        self.upkeep.abort();
        tracing::info!(
            streams = report.streams,
            unfinished = report.unfinished,
            handlers_done,
            lost_control_packets = self.door.ingress.global().control_packets_lost(),
            "shutdown complete"
        );
        report
    }
}
