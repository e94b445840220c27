//! WHIP ingest (RFC 9725): a WebRTC publisher (OBS, GStreamer, a browser, aiortc)
//! pushes Opus audio into the same bounded per-stream queue and publisher as a
//! WebSocket producer. On by setting `whip_udp_listen`.
//!
//! HTTP, on the front door's port: `POST /v1/whip/{stream_id}` (the offer; `201` with
//! the answer, its `Location` and, resume on, `Weir-Resume-Token` and
//! `Weir-Resume-Window-Ms`; with `Weir-Resume-Token` a resume, [`crate::resume`]),
//! `DELETE` on the `Location` (`200` once the `end` is handed to NATS), `OPTIONS`
//! (CORS), `PATCH` (`405`: no trickle ICE). The requests, the answers and the
//! refusals, in their order (the body is read only after the cheap ones; the offer's
//! parser's text is never answered), are tabled in docs/audio-ingress.md § WHIP ingest.
//!
//! Candidates: unless `whip_allow_foreign_candidates`, the offer's ICE candidates on
//! any address other than the HTTP client's are dropped before negotiation, so the
//! server sends connectivity checks only to the client that made the offer.
//!
//! Media path, per session: one `str0m::Rtc` in the **one driver task**
//! ([`driver`]) that owns the UDP socket; its Opus packets go through a bounded channel
//! to the stream's **pump task** ([`pump`]), which decodes them to 16 kHz mono, cuts 20 ms
//! frames and pushes them into the stream's [`StreamHandle`](crate::StreamHandle) — the
//! same queue and publisher task as a WebSocket stream. Tasks per WHIP stream: the pump
//! and the publisher (a WebSocket stream has its handler and its publisher).
//!
//! Why one driver task for every session rather than a task per session: a datagram
//! must be matched to its session by `Rtc::accepts`, which needs the `Rtc`; with a task
//! per session the socket reader would have to ask every task, or keep its own copy
//! of each session's ICE credentials and addresses. Owning every `Rtc` in one loop makes
//! the match a map lookup (by source address) with `accepts` as the check. The loop does
//! only bounded work per datagram (SRTP, DTLS, SCTP in str0m); the expensive part,
//! decoding, runs in the pump tasks, so a slow decoder cannot stall ICE and DTLS of the
//! other sessions, and the loop never awaits anything but its own inputs (sends are
//! `try_send`).
//!
//! Signals to the publisher: the JSON events of the WebSocket door (`overload`, `gap`,
//! `closed`) on a data channel labelled `weir` when the publisher opened one, and always
//! the end of the session: ICE/DTLS closed, then the resource answers 404. A session
//! whose ICE is disconnected (or that sends nothing) for `whip_disconnect_timeout_ms`
//! parks the stream for `resume_window_ms` (then it ends with `producer_gone`); one that
//! never connects within `whip_connect_timeout_ms` too.
//!
//! Invariants: a session's slot (`whip_max_sessions`) is held by a guard owned by the
//! driver's session and released exactly once when the driver drops it; nothing is
//! spawned per packet; a bad datagram or a bad Opus packet ends at most its own session
//! (str0m and the decoder run under `catch_unwind`).

pub mod client;
pub mod driver;
mod offer_guard;
pub mod pump;
mod sessions;

pub(crate) use sessions::SessionSlot;
use sessions::{Full, Sessions};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use serde_json::json;
use str0m::change::SdpOffer;
use str0m::config::DtlsCert;
use str0m::{Candidate, Rtc, RtcConfig};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot};
use weir_protocol::StreamId;

use crate::config::WhipConfig;
use crate::door::{self, Door, HasDoor};
use crate::error::Error;
use crate::resume::admit::Loss;
use weir_audio_producer::publisher::Sink;
use weir_protocol::WireName;
use weir_protocol::audio::extension::EndReason;
use weir_service::http::{Client, PeerAddr};

/// Largest SDP offer accepted (a browser's audio offer is 3–6 KiB).
pub const MAX_OFFER_BYTES: usize = 64 * 1024;

/// The label of the data channel that carries the JSON events.
pub const EVENTS_CHANNEL: &str = "weir";

/// The `201`'s header with `resume_window_ms`.
pub const RESUME_WINDOW_MS: HeaderName = HeaderName::from_static("weir-resume-window-ms");

/// Counters of the WHIP door, summed over every session (and per session in
/// [`SessionCounters`]). Read by the admin `/v1/whip` view (by these names).
#[derive(Debug, Default, serde::Serialize)]
pub struct WhipCounters {
    /// Sessions created (201 answered).
    pub sessions_total: AtomicU64,
    /// Offers refused, any reason.
    pub offers_refused: AtomicU64,
    /// Datagrams received on the UDP socket.
    pub datagrams: AtomicU64,
    /// Datagrams that no session accepted.
    pub datagrams_unmatched: AtomicU64,
    /// Datagrams that could not be sent (socket buffer full or error).
    pub send_failures: AtomicU64,
    /// Opus packets dropped before decoding because the pump was behind (bounded
    /// channel full); the pump sees them as an RTP sequence gap.
    pub packets_dropped_behind: AtomicU64,
    /// Events for the `weir` data channel dropped (channel full or never opened).
    pub events_dropped: AtomicU64,
    /// Events written to the `weir` data channel.
    pub events_sent: AtomicU64,
    /// Sessions ended by the driver, because ICE/DTLS failed or timed out.
    pub sessions_lost: AtomicU64,
    /// Offer candidates dropped because they were not on the HTTP client's address.
    pub candidates_dropped: AtomicU64,
    /// Total over every pump (see [`SessionCounters`]).
    #[serde(serialize_with = "media")]
    pub media: SessionCounters,
}

fn media<S: serde::Serializer>(c: &SessionCounters, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&c.snapshot(), s)
}

/// One more event on a relaxed counter.
pub(crate) fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Media counters of one session (and, summed, of all).
#[derive(Debug, Default, serde::Serialize)]
pub struct SessionCounters {
    /// Opus packets received.
    pub packets: AtomicU64,
    /// Opus packets decoded.
    pub decoded: AtomicU64,
    /// Time spent decoding, ns.
    #[serde(skip)]
    pub decode_ns: AtomicU64,
    /// Longest single decode, ns.
    #[serde(skip)]
    pub decode_ns_max: AtomicU64,
    /// Opus packets the decoder refused (counted, concealed).
    pub decode_errors: AtomicU64,
    /// 20 ms frames made by loss concealment instead of decoded audio.
    pub concealed_frames: AtomicU64,
    /// RTP sequence gaps (one per jump, whatever its length).
    pub rtp_gaps: AtomicU64,
    /// RTP packets missing in those gaps.
    pub rtp_lost: AtomicU64,
    /// Packets that came late or twice (sequence not after the last one), ignored.
    pub rtp_late: AtomicU64,
    /// 20 ms frames pushed into the stream.
    pub frames: AtomicU64,
}

impl SessionCounters {
    fn add(&self, field: impl Fn(&Self) -> &AtomicU64, total: &Self, n: u64) {
        field(self).fetch_add(n, Ordering::Relaxed);
        field(total).fetch_add(n, Ordering::Relaxed);
    }

    fn decode_took(&self, total: &Self, ns: u64) {
        self.add(|c| &c.decoded, total, 1);
        self.add(|c| &c.decode_ns, total, ns);
        self.decode_ns_max.fetch_max(ns, Ordering::Relaxed);
        total.decode_ns_max.fetch_max(ns, Ordering::Relaxed);
    }

    /// The admin view's JSON: the counters, the decode time as the mean and the
    /// longest decode of one packet in µs.
    pub fn snapshot(&self) -> serde_json::Value {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let mut v = serde_json::to_value(self).unwrap_or_default();
        // Decode time is only added with a decoded packet: 0 when none was.
        v["decode_us_mean"] = (g(&self.decode_ns) / g(&self.decoded).max(1.0) / 1e3).into();
        v["decode_us_max"] = (g(&self.decode_ns_max) / 1e3).into();
        v
    }
}

/// One WHIP resource in the registry.
pub(crate) struct Entry {
    stream_id: StreamId,
    /// A DELETE: end the stream with `end`, then reply once the `end` was handed to
    /// NATS (or given up on).
    stop: mpsc::Sender<oneshot::Sender<()>>,
    /// Set when the stream ended: the resource answers 404 from then on, even while
    /// the driver still closes ICE/DTLS.
    ended: Arc<AtomicBool>,
    counters: Arc<SessionCounters>,
}

/// What the HTTP handlers and the driver share.
pub(crate) struct Shared {
    config: WhipConfig,
    /// The DTLS certificate of every session (its fingerprint is in each answer):
    /// generated once at start, so that an offer does not pay for a key pair.
    cert: Option<DtlsCert>,
    /// The bound UDP address (its port is in every candidate).
    udp_addr: std::net::SocketAddr,
    sessions: Arc<Sessions>,
    counters: Arc<WhipCounters>,
    driver: mpsc::Sender<driver::Command>,
}

/// The running WHIP door: the driver task and what the handlers need.
pub struct Whip {
    shared: Arc<Shared>,
    driver: tokio::task::JoinHandle<()>,
}

/// The WHIP admin view (`/v1/whip`).
#[derive(Clone)]
pub struct WhipView {
    shared: Arc<Shared>,
}

impl WhipView {
    /// Sessions, counters and limits as JSON.
    pub fn snapshot(&self) -> serde_json::Value {
        let shared = &self.shared;
        let sessions: Vec<_> = shared
            .sessions
            .lock()
            .iter()
            .map(|(key, e)| {
                json!({
                    "resource": key,
                    "stream_id": e.stream_id.as_str(),
                    "ended": e.ended.load(Ordering::Relaxed),
                    "media": e.counters.snapshot(),
                })
            })
            .collect();
        let mut v = serde_json::to_value(&*shared.counters).unwrap_or_default();
        v["udp"] = shared.udp_addr.to_string().into();
        v["advertise"] = json!(shared.config.advertise);
        v["max_sessions"] = shared.sessions.max.into();
        v["max_sessions_per_ip"] = shared.sessions.per_ip.into();
        v["allow_foreign_candidates"] = shared.config.allow_foreign_candidates.into();
        v["active_sessions"] = sessions.len().into();
        v["sessions"] = sessions.into();
        v
    }
}

impl Whip {
    /// Binds the UDP socket and starts the driver task.
    pub async fn start(config: WhipConfig) -> Result<Self, Error> {
        let listen = config.udp_listen;
        let socket = UdpSocket::bind(listen).await.map_err(|e| {
            crate::error::io(
                format!("config key `whip_udp_listen`: cannot bind UDP {listen}"),
                e,
            )
        })?;
        let udp_addr = socket
            .local_addr()
            .map_err(|e| crate::error::io("WHIP UDP address", e))?;
        let counters = Arc::new(WhipCounters::default());
        let (tx, rx) = mpsc::channel(DRIVER_COMMANDS);
        let sessions = Arc::new(Sessions::new(
            config.max_sessions.get(),
            config.max_sessions_per_ip.get(),
        ));
        let driver = tokio::spawn(driver::run(
            socket,
            rx,
            config.clone(),
            Arc::clone(&counters),
        ));
        // A session without it generates its own (str0m's default).
        let cert = str0m::crypto::from_feature_flags()
            .dtls_provider
            .generate_certificate();
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                cert,
                udp_addr,
                sessions,
                counters,
                driver: tx,
            }),
            driver,
        })
    }

    /// The bound UDP address.
    pub fn udp_addr(&self) -> std::net::SocketAddr {
        self.shared.udp_addr
    }

    /// The admin view.
    pub fn view(&self) -> WhipView {
        WhipView {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The WHIP routes (without fallbacks; see [`door::with_fallbacks`]).
    pub fn routes<S: Sink>(&self, door: Door<S>) -> Router {
        let state = WhipState {
            door,
            shared: Arc::clone(&self.shared),
        };
        Router::new()
            .route(
                "/v1/whip/{stream_id}",
                post(offer::<S>)
                    .options(|| async { preflight("POST, OPTIONS") })
                    .fallback(|| async { method_not_allowed("POST, OPTIONS") }),
            )
            .route(
                "/v1/whip/{stream_id}/{resource}",
                delete(delete_session::<S>)
                    .options(|| async { preflight("DELETE, PATCH, OPTIONS") })
                    .patch(|| async {
                        let message = "no trickle ICE nor ICE restart: every candidate is in the \
                                       offer and the answer; start a new session instead";
                        refuse_method("DELETE, OPTIONS", "trickle_not_supported", message)
                    })
                    .fallback(|| async { method_not_allowed("DELETE, PATCH, OPTIONS") }),
            )
            .layer(DefaultBodyLimit::max(MAX_OFFER_BYTES))
            .with_state(state)
    }

    /// Waits (at most `bound`) until every session's ICE/DTLS is closed, then stops the
    /// driver. Call after the streams ended (`Ingress::shutdown`).
    pub async fn shutdown(self, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        while !self.shared.sessions.lock().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.driver.abort();
    }
}

/// Commands queued to the driver (new sessions, events, closes); senders wait when full.
const DRIVER_COMMANDS: usize = 1024;

/// Opus packets queued from the driver to one pump (1.28 s of 20 ms packets): more
/// than the `close` policy's wait, so a full channel means the pump is starved of CPU.
const PUMP_PACKETS: usize = 64;

#[derive(Clone)]
struct WhipState<S: Sink> {
    door: Door<S>,
    shared: Arc<Shared>,
}

impl<S: Sink> HasDoor for WhipState<S> {
    type Sink = S;

    fn door(&self) -> &Door<S> {
        &self.door
    }
}

/// Sets each header to its value.
fn set_headers<const N: usize>(resp: &mut Response, headers: [(HeaderName, &'static str); N]) {
    for (name, value) in headers {
        resp.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
}

fn method_not_allowed(methods: &'static str) -> Response {
    let message = format!("this WHIP URL answers {methods}");
    refuse_method(methods, "method_not_allowed", message)
}

/// A `405` with `Allow: methods`.
fn refuse_method(methods: &'static str, code: &str, message: impl Into<String>) -> Response {
    let mut resp = door::error_response(StatusCode::METHOD_NOT_ALLOWED, code, message);
    set_headers(&mut resp, [(header::ALLOW, methods)]);
    resp
}

/// CORS for browser publishers on another origin (tokens travel in `Authorization`,
/// never in cookies, so any origin may call). Exposed: what a page reads from a 201
/// (`Location`, the resume token and window) and from a 503 (`Retry-After`).
fn with_cors(mut resp: Response) -> Response {
    set_headers(
        &mut resp,
        [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
            (
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                "Location, Retry-After, Weir-Resume-Token, Weir-Resume-Window-Ms",
            ),
        ],
    );
    resp
}

fn preflight(methods: &'static str) -> Response {
    let mut resp = with_cors(StatusCode::NO_CONTENT.into_response());
    set_headers(
        &mut resp,
        [
            (header::ALLOW, methods),
            (header::ACCESS_CONTROL_ALLOW_METHODS, methods),
            (
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                "Authorization, Content-Type, Weir-Resume-Token",
            ),
            (HeaderName::from_static("accept-post"), "application/sdp"),
        ],
    );
    resp
}

fn refused(
    shared: &Shared,
    status: StatusCode,
    code: &str,
    message: impl Into<String>,
) -> Response {
    count(&shared.counters.offers_refused);
    door::error_response(status, code, message)
}

/// Whether a `Content-Type` is `application/sdp` (parameters ignored).
fn is_sdp(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/sdp"))
}

/// Whether an SDP answer receives Opus audio: an `m=audio` section with a non-zero
/// port and an `a=rtpmap:<pt> opus/48000...` line.
pub fn answer_receives_opus(answer: &str) -> bool {
    let mut in_audio = false;
    for line in answer.lines().map(str::trim) {
        if let Some(m) = line.strip_prefix("m=") {
            let mut parts = m.split_whitespace();
            in_audio = parts.next() == Some("audio") && parts.next().is_some_and(|p| p != "0");
        } else if in_audio
            && let Some(map) = line.strip_prefix("a=rtpmap:")
            && map
                .split_whitespace()
                .nth(1)
                .is_some_and(|c| c.to_ascii_lowercase().starts_with("opus/48000"))
        {
            return true;
        }
    }
    false
}

/// A new resource id: 128 random bits, hex (the resource URL is also a capability).
fn resource_id() -> Option<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).ok()?;
    Some(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Why an offer is refused: the text is the `400 invalid_offer` answer, so it never
/// carries the parser's or the negotiation's own text (internals, heap addresses in a
/// parser's Debug output); those are logged.
#[derive(Debug, thiserror::Error)]
enum OfferRefused {
    /// Not an SDP offer.
    #[error("the offer is not a valid SDP offer")]
    NotSdp,
    /// str0m could not negotiate it (or panicked trying).
    #[error("the offer could not be negotiated")]
    NotNegotiated,
    /// The answer would receive no Opus audio.
    #[error("the offer has no Opus audio to send (m=audio with opus/48000/2)")]
    NoOpus,
    /// A configured host candidate was refused.
    #[error("candidate {addr}: {source}")]
    Candidate {
        /// The advertised address.
        addr: std::net::SocketAddr,
        /// str0m's refusal.
        source: str0m::error::IceError,
    },
}

/// The `Rtc` of an accepted offer from `client`, and its answer. `Err`: why the offer
/// is refused. Unless foreign candidates are allowed, only the offer's candidates on
/// `client`'s address are kept (`None`, the address unknown: none is).
fn accept(
    shared: &Shared,
    sdp: &str,
    client: Option<std::net::IpAddr>,
) -> Result<(Rtc, String), OfferRefused> {
    let filtered;
    let sdp = if shared.config.allow_foreign_candidates {
        sdp
    } else {
        let unspecified = std::net::IpAddr::from([0u8, 0, 0, 0]);
        let (kept, dropped) = offer_guard::keep_own_candidates(sdp, client.unwrap_or(unspecified));
        shared
            .counters
            .candidates_dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
        filtered = kept;
        filtered.as_str()
    };
    let port = shared.udp_addr.port();
    let candidates: Vec<_> = shared
        .config
        .advertise
        .iter()
        .map(|ip| std::net::SocketAddr::new(*ip, port))
        .collect();
    accept_with(&candidates, shared.cert.as_ref(), sdp)
}

/// [`accept`] with these host candidates and DTLS certificate (`None`: a new one).
fn accept_with(
    candidates: &[std::net::SocketAddr],
    cert: Option<&DtlsCert>,
    sdp: &str,
) -> Result<(Rtc, String), OfferRefused> {
    // The parser's and negotiation's errors are logged, never answered: their text
    // can carry internals (heap addresses in a parser's Debug output).
    let offer = SdpOffer::from_sdp_string(sdp).map_err(|e| {
        tracing::debug!(error = %e, "WHIP offer is not SDP");
        OfferRefused::NotSdp
    })?;
    // Opus only: anything else is refused in the answer (port 0).
    let mut config = RtcConfig::new().clear_codecs().enable_opus(true, false);
    if let Some(cert) = cert {
        config = config.set_dtls_cert(cert.clone());
    }
    let mut rtc = config.build(std::time::Instant::now());
    for &addr in candidates {
        let candidate = Candidate::host(addr, "udp")
            .map_err(|source| OfferRefused::Candidate { addr, source })?;
        rtc.add_local_candidate(candidate);
    }
    let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rtc.sdp_api().accept_offer(offer)
    }))
    .map_err(|_| OfferRefused::NotNegotiated)?
    .map_err(|e| {
        tracing::debug!(error = %e, "WHIP offer not negotiated");
        OfferRefused::NotNegotiated
    })?
    .to_sdp_string();
    if !answer_receives_opus(&answer) {
        return Err(OfferRefused::NoOpus);
    }
    Ok((rtc, answer))
}

/// `POST /v1/whip/{stream_id}`: every answer, refusals included, carries CORS.
async fn offer<S: Sink>(
    State(state): State<WhipState<S>>,
    admitted: Result<door::Admitted, Response>,
    peer: Option<axum::Extension<PeerAddr>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let client = peer.map(|axum::Extension(PeerAddr(addr))| addr.ip());
    with_cors(
        create_session(&state, admitted, client, &headers, body)
            .await
            .unwrap_or_else(|r| r),
    )
}

/// The `503` of a full session cap.
fn sessions_full<S: Sink>(state: &WhipState<S>, full: Full) -> Response {
    // The code is also the admission refusal's label.
    let (code, message) = match full {
        Full::All(max) => (
            "max_sessions",
            format!("{max} WHIP sessions are active (whip_max_sessions); retry later"),
        ),
        Full::PerIp(max) => (
            "max_sessions_per_ip",
            format!(
                "{max} WHIP sessions are active from this address (whip_max_sessions_per_ip); retry later"
            ),
        ),
    };
    state.door.ingress.global().admission_rejected(code);
    count(&state.shared.counters.offers_refused);
    let status = StatusCode::SERVICE_UNAVAILABLE;
    door::refusal(status, code, message, state.door.retry_after)
}

/// Whether the request announces a body over [`MAX_OFFER_BYTES`].
fn announced_too_large(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > MAX_OFFER_BYTES as u64)
}

async fn create_session<S: Sink>(
    state: &WhipState<S>,
    admitted: Result<door::Admitted, Response>,
    client: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, Response> {
    let shared = &state.shared;
    let invalid_offer =
        |message: String| refused(shared, StatusCode::BAD_REQUEST, "invalid_offer", message);
    // Every cheap refusal before a byte of the body is read: the id, query and token,
    // the content type, the announced length, the session caps.
    let admitted = admitted?;
    if !is_sdp(headers) {
        return Err(refused(
            shared,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "a WHIP offer is Content-Type: application/sdp",
        ));
    }
    if announced_too_large(headers) {
        let (status, code, message) = offer_guard::too_large();
        return Err(refused(shared, status, code, message));
    }
    // An unknown address (not served by the accept loop) counts as one client.
    let who = Client::of(client.unwrap_or(std::net::IpAddr::from([0u8, 0, 0, 0])));
    shared
        .sessions
        .room_for(who)
        .map_err(|full| sessions_full(state, full))?;
    let body = offer_guard::read_offer(body)
        .await
        .map_err(|(status, code, message)| refused(shared, status, code, message))?;
    let sdp = std::str::from_utf8(&body)
        .map_err(|_| invalid_offer("the offer is not UTF-8".to_owned()))?;
    // The cap before the (costly) negotiation; the slot is released if a later step
    // refuses.
    let (stop_tx, stop_rx) = mpsc::channel(1);
    let ended = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(SessionCounters::default());
    let Some(key) = resource_id() else {
        return Err(refused(
            shared,
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "no randomness for a resource id",
        ));
    };
    let entry = Entry {
        stream_id: admitted.id.clone(),
        stop: stop_tx,
        ended: Arc::clone(&ended),
        counters: Arc::clone(&counters),
    };
    let slot = shared
        .sessions
        .reserve(who, key.clone(), entry)
        .map_err(|full| sessions_full(state, full))?;
    let (rtc, answer) = accept(shared, sdp, client).map_err(|e| invalid_offer(e.to_string()))?;
    let stream_id = admitted.id.clone();
    let requested_at = tokio::time::Instant::now();
    let window = state.door.resume.window();
    let opened = state
        .door
        .open_or_resume(admitted, Loss::AtFirstFrame)
        .await;
    let (att, first_event, resumed) = opened.map_err(|resp| {
        count(&shared.counters.offers_refused);
        *resp
    })?;
    let resumed_at = resumed.map(|_| requested_at);
    let token = att.token().map(str::to_owned);
    let (media_tx, media_rx) = mpsc::channel(PUMP_PACKETS);
    let session = Box::new(driver::Session::new(rtc, media_tx, slot));
    if shared
        .driver
        .send(driver::Command::Add(key.clone(), session))
        .await
        .is_err()
    {
        // The driver is gone (shutdown): the stream ends at once.
        att.end(EndReason::Shutdown.as_str()).release();
        return Err(door::error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the WHIP door is stopping",
        ));
    }
    count(&shared.counters.sessions_total);
    metrics::counter!(crate::metrics::WHIP_SESSIONS_TOTAL).increment(1);
    tokio::spawn(pump::run(pump::Pump {
        att,
        first_event,
        resumed_at,
        media: media_rx,
        stop: stop_rx,
        driver: shared.driver.clone(),
        key: key.clone(),
        counters,
        totals: Arc::clone(&shared.counters),
        ended,
        _guard: state.door.tracker.token(),
    }));
    tracing::info!(stream_id = %stream_id, resource = %key, "WHIP session created");
    Ok(created(
        answer,
        &format!("/v1/whip/{stream_id}/{key}"),
        token,
        window,
    ))
}

/// The `201` of a session: the answer, its `Location`, and the resume token and
/// window (resume on).
fn created(answer: String, location: &str, token: Option<String>, window: Duration) -> Response {
    let mut resp = (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/sdp")],
        answer,
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    if let Some(v) = token.and_then(|t| HeaderValue::from_str(&t).ok()) {
        let h = resp.headers_mut();
        h.insert(door::RESUME_TOKEN_HEADER, v);
        h.insert(
            RESUME_WINDOW_MS,
            HeaderValue::from(window.as_millis() as u64),
        );
    }
    resp
}

async fn delete_session<S: Sink>(
    State(state): State<WhipState<S>>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(raw_query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let not_found = || {
        with_cors(door::error_response(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such WHIP session (it ended or never existed)",
        ))
    };
    let Ok(Path((raw_id, key))) = path else {
        return not_found();
    };
    // The same token that opened the stream may end it.
    if let Err(resp) = state
        .door
        .check(Ok(raw_id.clone()), raw_query.as_deref(), &headers)
    {
        return with_cors(*resp);
    }
    let stop = {
        let map = state.shared.sessions.lock();
        match map.get(&key) {
            Some(e) if e.stream_id.as_str() == raw_id && !e.ended.load(Ordering::Acquire) => {
                Some(e.stop.clone())
            }
            _ => None,
        }
    };
    let Some(stop) = stop else {
        return not_found();
    };
    let (reply, done) = oneshot::channel();
    if stop.try_send(reply).is_err() {
        // Another DELETE is already ending it, or it is ending by itself.
        return not_found();
    }
    // Bounded: the pump waits at most end_timeout + 500 ms for the `end`.
    let bound = state.door.ingress.config().end_timeout() + Duration::from_secs(1);
    let _ = tokio::time::timeout(bound, done).await;
    with_cors(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests;
