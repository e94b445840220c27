//! What the front doors — WebSocket ([`crate::ws`]), WHIP ([`crate::whip`]) and
//! telephony ([`crate::telephony`]) — share ([`Door`]) and do the same way: the
//! admission of a stream (id, query, producer token, readiness, the registry's own
//! refusals), the JSON error body of every refusal, the JSON events a producer
//! receives (`overload`, `gap`, `error`, `closed`), the status and capacity arm of each
//! door's read loop ([`StatusWatch::next_or_notice`]) and how a door ends its stream
//! ([`Ending`]).
//!
//! Admission, in this order, nothing opened for a refused request:
//! 1. [`Door::check`] (run by the [`Admitted`] extractor): `400 invalid_stream_id` (an
//!    unsafe id), `400 invalid_request` (a query that is not UTF-8 once percent-decoded,
//!    or repeats a parameter), then the producer token when `auth_required` (`401` +
//!    `WWW-Authenticate: Bearer`, `403`); the telephony door, which learns the id from
//!    the carrier's `start`, runs [`Door::check_call`] instead;
//! 2. the door's own checks (the WebSocket upgrade; the WHIP offer and session cap);
//! 3. [`Door::open`]: `503 not_ready` + `Retry-After` while NATS is not connected, then
//!    the recognition capacity ([`crate::capacity`], `capacity.mode = enforce`):
//!    `503 no_capacity` + an estimated `Retry-After`, then the registry: `409
//!    stream_active`, `503 max_streams` / `shutting_down` + `Retry-After`.
//!
//! An opened stream comes with its capacity [`Ticket`]: the door keeps it until the
//! stream finished (its slot is held until then) and forwards its notices
//! ([`notice_event`](crate::capacity::notice_event): `degraded`, `recovered`; a worker's
//! refusal ends the stream with `no_capacity`).
//!
//! Invariant: every door calls these functions; a rule changed here changes for all.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use tokio::sync::watch::{self, error::RecvError};
use tokio_util::sync::ReusableBoxFuture;
use weir_protocol::audio::extension::{EndReason, Overload};
use weir_protocol::audio::ws::Event;
use weir_protocol::{StreamId, WireName};

use crate::auth::{Authenticator, Grant};
use crate::capacity::{Capacity, NoCapacity, Notice, Ticket};
use crate::resume::Resume;
use crate::shutdown::TaskTracker;
use crate::ws::close_code;
use crate::ws_query::UpgradeQuery;
use weir_audio_producer::error::{OpenError, PushError};
use weir_audio_producer::publisher::Sink;
use weir_audio_producer::stream::{Ingress, StreamHandle, StreamStatus, StreamSummary};

/// The JSON error body every refusal carries: `{"error":{"code":..,"message":..}}`,
/// the admin port's too.
pub use weir_service::admin::error_response;

/// A refusal's answer ([`error_response`]), which carries its code as a
/// [`RefusalCode`] extension; a `503` carries `Retry-After` (whole seconds, at least 1).
pub fn refusal(
    status: StatusCode,
    code: &'static str,
    message: impl Into<String>,
    retry_after: Duration,
) -> Response {
    let mut resp = error_response(status, code, message);
    resp.extensions_mut().insert(RefusalCode(code));
    if status == StatusCode::SERVICE_UNAVAILABLE
        && let Ok(v) = HeaderValue::from_str(&retry_after.as_secs().max(1).to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// The code of a door's refusal ([`refusal`]), for a door that answers it otherwise
/// than in HTTP (the telephony door's close reason).
#[derive(Debug, Clone, Copy)]
pub struct RefusalCode(pub &'static str);

/// The answer to a refused [`Ingress::open_id`].
pub fn open_refusal(e: &OpenError, retry_after: Duration) -> Response {
    let (status, code) = match e {
        OpenError::InvalidId(_) | OpenError::InvalidSession(_) => {
            (StatusCode::BAD_REQUEST, "invalid_request")
        }
        OpenError::AlreadyActive(_) => (StatusCode::CONFLICT, "stream_active"),
        OpenError::TooManyStreams { .. } => (StatusCode::SERVICE_UNAVAILABLE, "max_streams"),
        OpenError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        OpenError::NoRuntime => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    };
    refusal(status, code, e.to_string(), retry_after)
}

/// A refusal: the complete answer (boxed: a `Response` is large).
pub type Refused = Box<Response>;

/// A request that passed [`Door::check`]: who may open what.
#[derive(Debug)]
pub struct Admitted {
    /// The stream id.
    pub id: StreamId,
    /// `session_id` from the query.
    pub session: Option<String>,
    /// The producer token's grant (`None` when authentication is off).
    pub grant: Option<Grant>,
    /// The resume this request asks for (`None`: open a new stream).
    pub resume: Option<ResumeAsk>,
}

impl Admitted {
    /// The producer token's scope (zero without authentication): what a resume token
    /// is bound to.
    pub fn scope(&self) -> [u8; 8] {
        self.grant.map_or([0; 8], |g| g.scope)
    }
}

/// What a resuming producer presents ([`crate::resume`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeAsk {
    /// The stream's resume token (`Weir-Resume-Token`, else `resume_token`).
    pub token: String,
    /// The last seq the producer knows the door took.
    pub last_seq: Option<u64>,
    /// The seq of the producer's next frame.
    pub next_seq: Option<u64>,
}

/// The header a resuming producer may present its token in (the query's
/// `resume_token` is the browser WebSocket's way), and the WHIP `201`'s with the token.
pub const RESUME_TOKEN_HEADER: HeaderName = HeaderName::from_static("weir-resume-token");

/// What every door shares: the producer core, the connection settings, the handler
/// tracker, the token check, the capacity check and the resumable streams. It is the
/// WebSocket door's route state; the WHIP and telephony doors' states hold it.
#[derive(Clone)]
pub struct Door<S: Sink> {
    /// The producer core.
    pub ingress: Ingress<S>,
    /// `Retry-After` of a 503.
    pub retry_after: Duration,
    /// A connection silent for this long is ended (reason `idle`).
    pub idle_timeout: Duration,
    /// Bound on one send to the client; on expiry the socket is abandoned.
    pub send_timeout: Duration,
    /// Tracks connection handlers so shutdown can wait for their close frames.
    pub tracker: TaskTracker,
    /// Producer tokens are checked before the upgrade (`auth_required`); `None`: off.
    pub auth: Option<Arc<Authenticator>>,
    /// The recognition-capacity check (`None`: a service started without one).
    pub capacity: Option<Arc<Capacity>>,
    /// The resumable streams of the doors.
    pub resume: Arc<Resume>,
}

/// The answer to a stream refused for recognition capacity: `503 no_capacity` with
/// the estimated `Retry-After`.
pub fn no_capacity_refusal(no_capacity: &NoCapacity) -> Response {
    let reason: &'static str = no_capacity.reason.into();
    let message = match &no_capacity.worker {
        Some(w) => {
            format!("no recognition capacity for this stream ({reason}, worker {w}); retry later")
        }
        None => format!("no recognition capacity for this stream ({reason}); retry later"),
    };
    let status = StatusCode::SERVICE_UNAVAILABLE;
    refusal(status, "no_capacity", message, no_capacity.retry_after)
}

/// The state of a door's routes: the [`Door`] it admits with. With it, [`Admitted`]
/// is an extractor: step 1 of the admission, done before the handler runs.
pub trait HasDoor: Send + Sync {
    /// The producer core's NATS side.
    type Sink: Sink;
    /// The door.
    fn door(&self) -> &Door<Self::Sink>;
}

impl<S: Sink> HasDoor for Door<S> {
    type Sink = S;

    fn door(&self) -> &Door<S> {
        self
    }
}

/// [`Door::check`] of the request's `{stream_id}` path segment (the path extractor's
/// refusal included), query and headers; a refusal is the door's complete answer.
impl<T: HasDoor> FromRequestParts<T> for Admitted {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &T) -> Result<Self, Response> {
        let path = Path::<String>::from_request_parts(parts, state).await;
        let raw_id = path.map(|Path(raw)| raw);
        let door = state.door();
        door.check(raw_id, parts.uri.query(), &parts.headers)
            .map_err(|refused| *refused)
    }
}

impl<S: Sink> Door<S> {
    /// Step 1 of the admission: the stream id (`raw_id`: the path segment, or the path
    /// extractor's refusal), the query and the producer token. Counted refusals.
    pub fn check(
        &self,
        raw_id: Result<String, PathRejection>,
        raw_query: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Admitted, Refused> {
        let id = raw_id
            .map_err(|e| e.body_text())
            .and_then(|raw| StreamId::parse(&raw).map_err(|e| e.to_string()))
            .map_err(|message| self.bad_request("invalid_id", "invalid_stream_id", message))?;
        let query = self.query(raw_query)?;
        // Authentication before anything else is looked at or opened.
        let token = crate::auth::token_of(bearer(headers), query.access_token.as_deref());
        let grant = self.grant(&id, token)?;
        let header_token = headers
            .get(RESUME_TOKEN_HEADER)
            .map(|v| v.to_str().map(str::to_owned))
            .transpose()
            .map_err(|_| {
                let message = "Weir-Resume-Token is not ASCII";
                self.bad_request("invalid_session", "invalid_request", message)
            })?;
        let resume = header_token
            .filter(|t| !t.is_empty())
            .or(query.resume_token)
            .map(|token| ResumeAsk {
                token,
                last_seq: query.last_seq,
                next_seq: query.next_seq,
            });
        Ok(Admitted {
            id,
            session: query.session_id,
            grant,
            resume,
        })
    }

    /// The request's query: `400 invalid_request` when it is not UTF-8 once
    /// percent-decoded or repeats a parameter. Counted refusal.
    pub fn query(&self, raw_query: Option<&str>) -> Result<UpgradeQuery, Refused> {
        UpgradeQuery::parse(raw_query)
            .map_err(|e| self.bad_request("invalid_session", "invalid_request", e.to_string()))
    }

    /// A `400` refusal, counted under `label`.
    fn bad_request(
        &self,
        label: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Refused {
        self.refuse(label, StatusCode::BAD_REQUEST, code, message)
    }

    /// A refusal ([`refusal`]), counted under `label`.
    fn refuse(
        &self,
        label: &'static str,
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> Refused {
        self.ingress.global().admission_rejected(label);
        Box::new(refusal(status, code, message, self.retry_after))
    }

    /// Step 1 for a door that learns the stream id after the upgrade (the telephony
    /// door, from the carrier's `start`): the id, then the producer token (`token`:
    /// from the call, else the upgrade request's). Counted refusals, as [`Self::check`].
    pub fn check_call(
        &self,
        raw_id: &str,
        session: Option<String>,
        token: Option<&str>,
    ) -> Result<Admitted, Refused> {
        let id = StreamId::parse(raw_id)
            .map_err(|e| self.bad_request("invalid_id", "invalid_stream_id", e.to_string()))?;
        let grant = self.grant(&id, token)?;
        Ok(Admitted {
            id,
            session: session.filter(|s| !s.is_empty()),
            grant,
            resume: None,
        })
    }

    /// The producer token `token` checked for `id` when authentication is on (`None`
    /// when it is off): `401` + `WWW-Authenticate: Bearer`, or `403`. Counted refusals.
    fn grant(&self, id: &StreamId, token: Option<&str>) -> Result<Option<Grant>, Refused> {
        let Some(auth) = self.auth.as_deref() else {
            return Ok(None);
        };
        auth.check(token, id.as_str()).map(Some).map_err(|e| {
            let status = if e.code() == "forbidden" {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::UNAUTHORIZED
            };
            let mut resp = self.refuse(e.code(), status, e.code(), e.to_string());
            if status == StatusCode::UNAUTHORIZED {
                resp.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            resp
        })
    }

    /// Readiness gates admission: a stream opened while NATS is disconnected (or
    /// before the first connect) could only queue into the client; it is refused like
    /// a full cap, `503 not_ready` + `Retry-After`. Counted.
    pub fn ready(&self) -> Result<(), Refused> {
        if self.ingress.sink().is_connected() {
            return Ok(());
        }
        let message = "not connected to NATS; retry later";
        let status = StatusCode::SERVICE_UNAVAILABLE;
        Err(self.refuse("not_ready", status, "not_ready", message))
    }

    /// Step 3 of the admission: readiness, the recognition capacity, then the
    /// registry; applies the token's rate class to the opened stream. The ticket holds
    /// the stream's capacity slot: keep it until the stream finished.
    pub fn open(&self, admitted: Admitted) -> Result<(StreamHandle, Ticket), Refused> {
        let ingress = &self.ingress;
        self.ready()?;
        // In memory (no NATS round trip); a refused stream opens nothing. A registry
        // refusal drops the ticket: the slot is released.
        let mut ticket = match self.capacity.as_deref() {
            None => Ticket::none(),
            Some(c) => c.admit(&admitted.id).map_err(|r| {
                ingress.global().admission_rejected("no_capacity");
                Box::new(no_capacity_refusal(&r))
            })?,
        };
        let handle = ingress
            .open_id(admitted.id, admitted.session)
            .map_err(|e| Box::new(open_refusal(&e, self.retry_after)))?;
        ticket.bind();
        if let Some(permille) = admitted.grant.and_then(|g| g.max_rate_permille) {
            handle.limit_rate(permille);
        }
        Ok((handle, ticket))
    }
}

/// The `Authorization` header's value, when it is text.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// The routes of both doors, with the JSON `404` and `405` answers.
pub fn with_fallbacks(routes: Router) -> Router {
    routes
        .fallback(|| async {
            error_response(
                StatusCode::NOT_FOUND,
                "not_found",
                "the paths are /v1/streams/{stream_id} (WebSocket), /v1/whip/{stream_id} (WHIP) and /v1/telephony/{twilio,telnyx} (carrier media streams)",
            )
        })
        .method_not_allowed_fallback(|| async {
            error_response(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "a stream is opened with GET (WebSocket upgrade) on /v1/streams/{stream_id}",
            )
        })
}

/// `ws` with the doors' bounds: messages of at most `max_message` bytes, and small read
/// and write buffers (a byte bound on writes instead of tungstenite's unbounded
/// default; every send is also bounded in time).
pub fn bounded_socket(ws: WebSocketUpgrade, max_message: usize) -> WebSocketUpgrade {
    ws.max_message_size(max_message)
        .max_frame_size(max_message)
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_write_buffer_size(MAX_WRITE_BUFFER_BYTES)
}

/// Read size of one WebSocket connection (a frame's packet is ~700 bytes, a carrier's
/// 20 ms µ-law `media` event ~370; the buffer still grows for a larger message up to
/// the limit). tungstenite's default, 128 KiB, is ~8x the whole default PCM budget of
/// a stream.
/// Small on purpose: tungstenite zero-fills up to this much of its buffer before every
/// socket read, and a producer's socket holds one ~700-byte message per read at the
/// real cadence — at 16 KiB that fill was ~4 % of the ingress's CPU at 1,000 streams.
const READ_BUFFER_BYTES: usize = 2 * 1024;
/// Write buffer of one WebSocket connection before it is flushed: server → client
/// traffic is small JSON events (a carrier's: a few `media` events).
const WRITE_BUFFER_BYTES: usize = 8 * 1024;
/// Largest write buffer of one WebSocket connection (a client that does not read makes
/// a send fail at this size, or time out first).
const MAX_WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// Bound on holding a capacity slot after the door let go of its stream (the
/// stream's own finish bound is shorter).
const RELEASE_BOUND: Duration = Duration::from_secs(30);

/// Keeps `ticket` (the stream's capacity slot) until the stream of `status` finished
/// (at most 30 s), then drops it; at once when it already finished.
pub fn release_when_finished(ticket: Ticket, mut status: watch::Receiver<StreamStatus>) {
    if !ticket.holds() || status.borrow().finished {
        return;
    }
    // Without a runtime (a stream let go of while the process tears down) the slot goes
    // now.
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let _ = tokio::time::timeout(RELEASE_BOUND, status.wait_for(|s| s.finished)).await;
        drop(ticket);
    });
}

/// `event` as the JSON value a door sends.
pub fn event_value(event: &Event) -> serde_json::Value {
    serde_json::to_value(event).unwrap_or_default()
}

/// The `error` event.
pub fn error_event(code: &str, message: impl Into<String>) -> serde_json::Value {
    event_value(&Event::Error {
        code: code.to_owned(),
        message: message.into(),
    })
}

/// The `overload` event.
pub fn overload_event(o: &Overload, handle: &StreamHandle) -> serde_json::Value {
    event_value(&Event::Overload {
        reason: o.reason,
        dropped_frames: o.dropped_frames,
        dropped_samples: o.dropped_samples,
        pending_bytes: o.pending_bytes,
        max_bytes: o.max_bytes,
        max_age_ms: o.max_age_ms,
        frames_published: handle.snapshot().frames.published,
    })
}

/// The `closed` event.
pub fn closed_event(reason: EndReason, summary: &StreamSummary) -> serde_json::Value {
    let f = &summary.snapshot.frames;
    event_value(&Event::Closed {
        reason,
        frames_published: f.published,
        frames_dropped: f.dropped.values().sum(),
        end_delivered: summary.snapshot.end_delivered,
    })
}

/// A message a door refuses: the stream ends `error`, the producer gets the `error`
/// event and the socket closes with `close` and the code as its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadInput {
    /// The close code.
    pub close: u16,
    /// Stable snake_case code (the close reason, the `error` event's code).
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

impl BadInput {
    /// A message refused with `close`.
    pub fn new(close: u16, code: &'static str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            close,
            code,
            message,
        }
    }

    /// A message against the stream's rules (close 1008).
    pub fn policy(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(close_code::POLICY, code, message)
    }

    /// A message the door does not take (close 1003).
    pub fn unsupported(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(close_code::UNSUPPORTED, code, message)
    }
}

/// How a door ends a stream it holds (rather than letting go of it).
#[derive(Debug)]
pub enum Ending {
    /// The producer ended it (WebSocket `end`, WHIP `DELETE`, the carrier's `stop`).
    Producer,
    /// No message for `idle_timeout`.
    Idle,
    /// A bad message: the `error` event at once.
    Bad(BadInput),
    /// The door failed (reason `error`, no `error` event).
    Internal,
    /// The stream overloaded (`close` policy): the `overload` event at once.
    Overload(Overload),
    /// The stream ended otherwise (shutdown, no capacity, its status channel closed).
    Closed(EndReason),
}

/// A frame the stream did not take: it overloaded or ended, or the frame is bad
/// (`bad_frame`).
impl From<PushError> for Ending {
    fn from(e: PushError) -> Self {
        match e {
            PushError::Overloaded(o) => Self::Overload(o),
            PushError::Closed(r) => Self::Closed(r),
            e => Self::Bad(BadInput::policy("bad_frame", e.to_string())),
        }
    }
}

impl Ending {
    /// The stream's end reason.
    pub fn reason(&self) -> EndReason {
        match self {
            Self::Producer => EndReason::Producer,
            Self::Idle => EndReason::Idle,
            Self::Bad(_) | Self::Internal => EndReason::Error,
            Self::Overload(_) => EndReason::Overload,
            Self::Closed(r) => *r,
        }
    }

    /// The close code and reason of the producer's socket (`producer`: the reason of
    /// an end the producer asked for).
    pub fn close_frame(&self, producer: &'static str) -> (u16, &'static str) {
        match self {
            Self::Producer => (close_code::NORMAL, producer),
            Self::Bad(b) => (b.close, b.code),
            other => (close_code::of_end(other.reason()), other.reason().as_str()),
        }
    }

    /// Ends the stream of `handle` (one that overloaded or ended is closed already) and
    /// returns the event to send at once: `overload` or `error`. Ended first, so that
    /// a producer that does not read cannot delay it.
    pub fn close(&self, handle: &mut StreamHandle) -> Option<serde_json::Value> {
        match self {
            Self::Overload(o) => return Some(overload_event(o, handle)),
            Self::Closed(_) => return None,
            _ => handle.close(self.reason()),
        }
        match self {
            Self::Bad(b) => Some(error_event(b.code, b.message.clone())),
            _ => None,
        }
    }

    /// Waits until the stream finished: its summary, for the `closed` event (which so
    /// counts what the server confirmed after an overload and whether the `end` got
    /// through).
    pub async fn finished(&self, handle: &StreamHandle) -> StreamSummary {
        match self {
            Self::Closed(_) => handle.wait_finished(CLOSED_BOUND).await,
            _ => handle.wait_ended().await,
        }
    }
}

/// `samples` as a frame of s16le bytes (the WHIP and telephony doors' decoded audio):
/// one allocation of the exact size (a shared arena cost more: its split and reference
/// counts measured more than the allocation), one copy.
#[cfg(target_endian = "little")]
pub fn frame_bytes(samples: &[i16]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(zerocopy::IntoBytes::as_bytes(samples))
}

/// `samples` as a frame of s16le bytes (a big-endian target swaps each sample).
#[cfg(not(target_endian = "little"))]
pub fn frame_bytes(samples: &[i16]) -> bytes::Bytes {
    let mut b = vec![0u8; samples.len() * 2];
    for (pair, s) in b.chunks_exact_mut(2).zip(samples) {
        pair.copy_from_slice(&s.to_le_bytes());
    }
    bytes::Bytes::from(b)
}

/// Bound on the wait for a stream that ended from the server side to finish.
const CLOSED_BOUND: Duration = Duration::from_secs(30);

/// What a door does after its stream's status changed or its capacity ticket told it
/// something: send the event, if any, then stop (in that order).
#[derive(Debug)]
pub struct StatusChange {
    /// The `gap` event of a new gap marker, or the `degraded`/`recovered` notice.
    pub event: Option<serde_json::Value>,
    /// The stream overloaded or ended ([`Ending::Overload`], [`Ending::Closed`]).
    pub stop: Option<Ending>,
}

/// What a door's read loop waits on for its stream's status changes: one future that
/// stays registered with the status channel from one change to the next.
///
/// Invariant: [`StatusWatch::next`] is cancel-safe; dropped unfinished (the `select!`
/// took a frame), the wait stays registered and no change is lost. Calling
/// `watch::Receiver::changed` afresh in every `select!` round registered and removed a
/// waiter under the channel's lock for every frame (~4 % of the ingress's CPU at 1,000
/// streams).
pub struct StatusWatch {
    next: ReusableBoxFuture<'static, Waited>,
    gaps_seen: u64,
}

/// A finished wait: its result, and the receiver handed back.
type Waited = (Result<(), RecvError>, watch::Receiver<StreamStatus>);

async fn wait(mut status: watch::Receiver<StreamStatus>) -> Waited {
    let changed = status.changed().await;
    (changed, status)
}

/// A wait that is over at once (the first read of [`StatusWatch::since`]).
async fn ready(status: watch::Receiver<StreamStatus>) -> Waited {
    (Ok(()), status)
}

impl StatusWatch {
    /// Watches `handle`'s stream from its current status on (the gaps it already
    /// counts are not told again: a resumed stream's earlier connection told them).
    pub fn new(handle: &StreamHandle) -> Self {
        let status = handle.status();
        let gaps_seen = status.borrow().gaps;
        Self {
            next: ReusableBoxFuture::new(wait(status)),
            gaps_seen,
        }
    }

    /// Watches `handle`'s stream, telling every gap counted after `gaps_seen` — a
    /// resumed connection's, whose loss was declared before it could watch. The first
    /// [`Self::next`] reads the current status at once.
    pub fn since(handle: &StreamHandle, gaps_seen: u64) -> Self {
        Self {
            next: ReusableBoxFuture::new(ready(handle.status())),
            gaps_seen,
        }
    }

    /// Waits for the next change and reads it (a closed channel reads as an end with
    /// `error`).
    pub async fn next(&mut self) -> StatusChange {
        let (changed, mut status) = (&mut self.next).await;
        let change = if changed.is_err() {
            StatusChange {
                event: None,
                stop: Some(Ending::Closed(EndReason::Error)),
            }
        } else {
            let s = status.borrow_and_update().clone();
            let stop = match (s.overload.clone(), s.end_reason) {
                (Some(o), _) => Some(Ending::Overload(o)),
                (None, Some(r)) => Some(Ending::Closed(r)),
                (None, None) => None,
            };
            StatusChange {
                event: gap_event(&s, &mut self.gaps_seen),
                stop,
            }
        };
        // Re-armed before this call returns, so a finished future is never polled.
        self.next.set(wait(status));
        change
    }

    /// [`Self::next`], or the next notice of the stream's capacity `ticket`, the
    /// status first (a flood of frames must not starve these events either). A
    /// worker's refusal closes the stream of `handle` (`no_capacity`). Cancel-safe,
    /// as both waits are.
    pub async fn next_or_notice(
        &mut self,
        ticket: &mut Ticket,
        handle: &mut StreamHandle,
    ) -> StatusChange {
        tokio::select! {
            biased;
            change = self.next() => change,
            notice = ticket.next() => match crate::capacity::notice_event(&notice) {
                Some(ev) => StatusChange { event: Some(ev), stop: None },
                None => {
                    debug_assert_eq!(notice, Notice::Refused);
                    handle.close(EndReason::NoCapacity);
                    StatusChange { event: None, stop: Some(Ending::Closed(EndReason::NoCapacity)) }
                }
            },
        }
    }
}

/// The `gap` event for a status that counts more gaps than `gaps_seen` (and moves
/// `gaps_seen` on); `None` when no new gap marker was published.
fn gap_event(status: &StreamStatus, gaps_seen: &mut u64) -> Option<serde_json::Value> {
    if status.gaps <= *gaps_seen {
        return None;
    }
    *gaps_seen = status.gaps;
    let g = status.last_gap.as_ref()?;
    Some(event_value(&Event::Gap {
        first_seq: g.first_seq,
        last_seq: g.last_seq,
        frames: g.frames(),
        samples: g.samples,
        reason: g.reason,
        gaps_total: status.gaps,
    }))
}
