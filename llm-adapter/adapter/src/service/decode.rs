//! Request decoding: the `Weir-*` headers (and, without them, the deployed JSON
//! envelope's fields) become a [`Submission`].
//!
//! Invariants: nothing from the network can panic here: headers are read with the
//! fallible parsers and ids are validated; an invalid value is `invalid_request` naming
//! the header or envelope field, never silently ignored.

use async_nats::service::Request;
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;
use weir_protocol::llm::headers as h;
use weir_protocol::llm::stream as s;
use weir_protocol::llm::{AdmissionPolicy, EnvelopeMeta, ErrorBody, ErrorCode, HeaderError};
use weir_service::clock::unix_ms_now;

use crate::admission::Submission;

/// Looks a header up by exact name, then case-insensitively (Go clients canonicalise,
/// others may not).
pub(crate) fn header<'a>(map: Option<&'a HeaderMap>, name: &'static str) -> Option<&'a str> {
    let map = map?;
    if let Some(v) = map.get(HeaderName::from_static(name)) {
        return Some(v.as_str());
    }
    map.iter()
        .find(|(k, _)| AsRef::<str>::as_ref(*k).eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.first())
        .map(HeaderValue::as_str)
}

/// The request headers the adapter reads, found in one pass over the map (names
/// compared case-insensitively; the first value of a repeated header wins).
#[derive(Default)]
pub(super) struct Known<'a> {
    pub(super) request_id: Option<&'a str>,
    pub(super) session: Option<&'a str>,
    pub(super) client_key: Option<&'a str>,
    pub(super) admission: Option<&'a str>,
    pub(super) deadline: Option<&'a str>,
    pub(super) timeout: Option<&'a str>,
    pub(super) cancel: Option<&'a str>,
    pub(super) cancel_session: Option<&'a str>,
    pub(super) supersede: Option<&'a str>,
    pub(super) priority: Option<&'a str>,
    pub(super) stream: Option<&'a str>,
    pub(super) traceparent: Option<&'a str>,
    pub(super) tracestate: Option<&'a str>,
}

impl<'a> Known<'a> {
    pub(super) fn read(map: Option<&'a HeaderMap>) -> Self {
        let mut k = Self::default();
        let Some(map) = map else {
            return k;
        };
        for (name, values) in map.iter() {
            let Some(v) = values.first().map(HeaderValue::as_str) else {
                continue;
            };
            let n: &str = name.as_ref();
            let slots = [
                (h::REQUEST_ID, &mut k.request_id),
                (h::SESSION_ID, &mut k.session),
                (h::CLIENT_KEY, &mut k.client_key),
                (h::ADMISSION, &mut k.admission),
                (h::DEADLINE_MS, &mut k.deadline),
                (h::TIMEOUT_MS, &mut k.timeout),
                (h::CANCEL, &mut k.cancel),
                (h::CANCEL_SESSION, &mut k.cancel_session),
                (h::SUPERSEDE, &mut k.supersede),
                (h::PRIORITY, &mut k.priority),
                (s::STREAM, &mut k.stream),
                (h::TRACEPARENT, &mut k.traceparent),
                (h::TRACESTATE, &mut k.tracestate),
            ];
            if let Some((_, slot)) = slots.into_iter().find(|(h, _)| n.eq_ignore_ascii_case(h)) {
                slot.get_or_insert(v);
            }
        }
        k
    }
}

pub(super) fn invalid(e: &HeaderError) -> ErrorBody {
    ErrorBody::new(ErrorCode::InvalidRequest, e.to_string())
}

/// A header error as the refusal (boxed: `ErrorBody` is large for a `Result`).
pub(super) fn inv<T>(r: Result<T, HeaderError>) -> Result<T, Box<ErrorBody>> {
    r.map_err(|e| Box::new(invalid(&e)))
}

/// Decodes one inference request. The envelope is looked for only when an id header is
/// missing (`None` = not looked for; the sink looks when it must shape an error).
pub(super) fn decode(
    msg: &async_nats::Message,
    known: &Known<'_>,
    received_at: Instant,
) -> (Option<Option<EnvelopeMeta>>, Result<Submission, ErrorBody>) {
    let envelope = (known.request_id.is_none() || known.session.is_none())
        .then(|| EnvelopeMeta::detect(&msg.payload));
    let env = envelope.as_ref().and_then(Option::as_ref);
    let sub = (|| -> Result<Submission, Box<ErrorBody>> {
        let id = |name: &'static str, v: Option<&str>| -> Result<Option<String>, HeaderError> {
            v.map(|v| h::parse_id(name, v.trim()).map(str::to_owned))
                .transpose()
        };
        let request_id = match inv(id(h::REQUEST_ID, known.request_id))? {
            Some(r) => Some(r),
            None => env_id("request_id", env.and_then(EnvelopeMeta::request_id_str))?,
        };
        let session = match inv(id(h::SESSION_ID, known.session))? {
            Some(s) => Some(s),
            None => env_id("session_id", env.and_then(EnvelopeMeta::session_id_str))?,
        };
        let client_key = inv(id(h::CLIENT_KEY, known.client_key))?;
        let policy =
            inv(known.admission.map(AdmissionPolicy::parse).transpose())?.unwrap_or_default();
        let ms = |name, v: Option<&str>| inv(v.map(|v| h::parse_ms(name, v)).transpose());
        let deadline = ms(h::DEADLINE_MS, known.deadline)?;
        let timeout = ms(h::TIMEOUT_MS, known.timeout)?;
        Ok(Submission {
            // Opened by the replica that admits it ([`open_span`]), not by one that
            // only forwards it to the durable intake.
            span: tracing::Span::none(),
            // Never a refusal: a malformed `traceparent` is ignored.
            trace: h::TraceContext::from_headers(known.traceparent, known.tracestate),
            request_id,
            session,
            client_key,
            policy,
            // The wall clock is read only for absolute deadlines.
            budget: h::remaining_budget(
                deadline,
                timeout,
                if deadline.is_some() { unix_ms_now() } else { 0 },
            ),
            received_at,
            body: msg.payload.clone(),
            stream: None,
            priority: inv(known.priority.map(h::Priority::parse).transpose())?,
        })
    })()
    .map_err(|e| *e);
    (envelope, sub)
}

/// The session a request decodes to (the header, else the envelope's `session_id`),
/// unvalidated: what the durable intake's request fingerprint names
/// ([`crate::intake::fingerprint`]). For a valid request it equals
/// [`Submission::session`].
pub(crate) fn session_of(msg: &async_nats::Message) -> Option<String> {
    match Known::read(msg.headers.as_ref()).session {
        Some(s) => Some(s.trim().to_owned()),
        None => EnvelopeMeta::detect(&msg.payload).and_then(|e| e.session_id_str()),
    }
}

/// Opens the request's `llm_request` span ([`crate::trace::request_span`]): child of
/// its `traceparent`, else of the envelope's W3C `trace_id`.
pub(super) fn open_span(sub: &mut Submission, envelope: Option<&EnvelopeMeta>) {
    sub.span = crate::trace::request_span(
        sub.trace.as_ref(),
        sub.request_id.as_deref(),
        sub.session.as_deref(),
        envelope.and_then(|e| e.trace_id.as_str()),
    );
}

/// Validates an id taken from the JSON envelope like the header ids: an envelope id
/// that is not 1..=[`h::MAX_ID_LEN`] bytes of visible ASCII is refused with
/// `invalid_request` naming the envelope field, never ignored (ignoring it would
/// silently turn off the session cap, ordering and idempotency for that request).
pub(super) fn env_id(
    field: &'static str,
    v: Option<String>,
) -> Result<Option<String>, Box<ErrorBody>> {
    let Some(v) = v else {
        return Ok(None);
    };
    match h::parse_id(field, &v) {
        Ok(_) => Ok(Some(v)),
        Err(e) => {
            let text = e.to_string();
            let reason = text.split_once(": ").map_or(text.as_str(), |(_, r)| r);
            Err(Box::new(ErrorBody::new(
                ErrorCode::InvalidRequest,
                format!("envelope field {field}: {reason}"),
            )))
        }
    }
}

/// The request id a cancel or status message names: the `Weir-Cancel` header, else
/// `Weir-Request-Id`, else the body (trimmed).
pub(super) fn request_id_of(req: &Request) -> String {
    let hm = req.message.headers.as_ref();
    header(hm, h::CANCEL)
        .or_else(|| header(hm, h::REQUEST_ID))
        .map(str::to_owned)
        .or_else(|| {
            std::str::from_utf8(&req.message.payload)
                .ok()
                .map(str::to_owned)
        })
        .unwrap_or_default()
        .trim()
        .to_owned()
}
