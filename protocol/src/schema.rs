//! JSON Schemas (draft 2020-12) of weir's wire contracts, generated from the protocol
//! types with `schemars` (feature `schema`; the services build without it).
//!
//! [`all`] lists every contract by the file name it is checked in under
//! (`protocol/schemas/<name>.json`); `tests/schemas.rs` regenerates them, fails when a
//! checked-in file differs (`WEIR_BLESS=1` rewrites them), and validates the golden
//! vectors and the Python client's messages against them.
//!
//! Most contracts are the serde types the code reads and writes. Three are not serde
//! types in the code, and are typed here for their schema only:
//! - [`PacketMeta`], the JSON meta of an audio packet: the codec writes and reads it by
//!   hand (the hot path), so this type describes what its decoder accepts;
//! - [`LlmRequestHeaders`] and [`StreamEventHeaders`], the LLM adapter's NATS headers
//!   as a JSON object of header name → value (the values are strings on the wire),
//!   with the rules of the parsers in [`crate::llm::headers`] as patterns.
//!
//! Invariant: a schema is never stricter than the reader it describes; where a reader
//! is lenient (an extension key of the wrong type is ignored), so is the schema.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema, schema_for};
use serde::Deserialize;

use crate::admin::{AdapterStats, HttpRefusal, IngressStats, ReadyLine};
use crate::audio::GapReason;
use crate::audio::extension::{Overload, PossibleLoss};
use crate::audio::ws;
use crate::capacity::{Announcement, Refusal};
use crate::llm::{
    CancelReply, Capabilities, EnvelopeMeta, ErrorBody, ErrorCode, ResponseEnvelope,
    SessionCancelReply,
};

/// Every contract's schema, by file name (without `.json`), in a fixed order.
pub fn all() -> Vec<(&'static str, Schema)> {
    vec![
        ("audio-packet-meta", schema_for!(PacketMeta)),
        ("audio-overload-header", schema_for!(Overload)),
        ("audio-possibly-lost-header", schema_for!(PossibleLoss)),
        ("audio-ws-control", schema_for!(ws::Control)),
        ("audio-ws-event", schema_for!(ws::Event)),
        ("llm-request-envelope", schema_for!(EnvelopeMeta)),
        ("llm-response-envelope", schema_for!(ResponseEnvelope)),
        ("llm-error-body", schema_for!(ErrorBody)),
        ("llm-cancel-reply", schema_for!(CancelReply)),
        ("llm-cancel-session-reply", schema_for!(SessionCancelReply)),
        ("llm-capabilities", schema_for!(Capabilities)),
        ("llm-request-headers", schema_for!(LlmRequestHeaders)),
        ("llm-stream-event-headers", schema_for!(StreamEventHeaders)),
        ("ingress-stats", schema_for!(IngressStats)),
        ("adapter-stats", schema_for!(AdapterStats)),
        ("ready-line", schema_for!(ReadyLine)),
        ("http-refusal", schema_for!(HttpRefusal)),
        ("capacity-announcement", schema_for!(Announcement)),
        ("capacity-refusal", schema_for!(Refusal)),
    ]
}

/// Any JSON value but `null` (the envelope's required members).
pub(crate) fn non_null(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "not": { "type": "null" } })
}

/// The JSON meta of an audio packet (`[u32 BE length][meta][PCM]`,
/// [`crate::audio::packet`]), as the decoder accepts it: unknown members are ignored.
#[derive(Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PacketMeta {
    /// Audio follows the meta.
    Frame(MetaCommon),
    /// The stream ended; no PCM.
    End(MetaCommon),
    /// Frames `first_seq..=seq` are missing on purpose (opt-in extension); no PCM.
    Gap {
        /// The fields of every packet.
        #[serde(flatten)]
        common: MetaCommon,
        /// First missing sequence number (1..=`seq`).
        #[schemars(range(min = 1))]
        first_seq: u64,
        /// Frames missing, `seq - first_seq + 1` (optional).
        #[serde(default)]
        frames: Option<u64>,
        /// Samples missing.
        samples: u64,
        /// Why.
        reason: GapReason,
    },
}

/// The members of every packet's meta.
#[derive(Deserialize, JsonSchema)]
pub struct MetaCommon {
    /// Sequence number, from 1.
    #[schemars(range(min = 1))]
    pub seq: u64,
    /// Samples per second: 16000.
    #[schemars(range(min = 16000, max = 16000))]
    pub sample_rate: u32,
    /// Bytes per sample: 2 (s16le).
    #[schemars(range(min = 2, max = 2))]
    pub sample_width: u16,
    /// Channels: 1.
    #[schemars(range(min = 1, max = 1))]
    pub channels: u16,
    /// The producer's session id, at most 256 bytes (a schema bounds characters).
    #[serde(default)]
    #[schemars(length(max = 256))]
    pub session_id: Option<String>,
    /// When the audio was admitted, Unix milliseconds (extension). A value that is not
    /// a non-negative integer is ignored by readers, so any value is accepted.
    #[serde(default)]
    pub captured_at_ms: Option<serde_json::Value>,
}

/// An id header: 1..=256 bytes of visible ASCII ([`crate::llm::headers::parse_id`]).
const ID: &str = r"^[!-~]{1,256}$";
/// A whole number of milliseconds, surrounding spaces allowed
/// ([`crate::llm::headers::parse_ms`]).
const MS: &str = r"^\s*[0-9]{1,20}\s*$";
/// A non-negative decimal count.
const COUNT: &str = r"^[0-9]{1,20}$";
/// Milliseconds with three decimals ([`crate::llm::headers::format_ms`]).
const DECIMAL_MS: &str = r"^[0-9]+\.[0-9]{3}$";

/// The request headers of an LLM call (all optional; others are ignored).
#[derive(Deserialize, JsonSchema)]
pub struct LlmRequestHeaders {
    /// Caller-chosen request id; a retry with the same id joins the first.
    #[serde(rename = "Weir-Request-Id", default)]
    #[schemars(regex(pattern = ID))]
    pub request_id: Option<String>,
    /// Session id (per-session cap and ordering).
    #[serde(rename = "Weir-Session-Id", default)]
    #[schemars(regex(pattern = ID))]
    pub session_id: Option<String>,
    /// Caller identity for per-client limits.
    #[serde(rename = "Weir-Client-Key", default)]
    #[schemars(regex(pattern = ID))]
    pub client_key: Option<String>,
    /// Request id to cancel (cancel messages only).
    #[serde(rename = "Weir-Cancel", default)]
    #[schemars(regex(pattern = ID))]
    pub cancel: Option<String>,
    /// Session whose queued and running requests to cancel (cancel messages only).
    #[serde(rename = "Weir-Cancel-Session", default)]
    #[schemars(regex(pattern = ID))]
    pub cancel_session: Option<String>,
    /// `session` (any case): cancel the session's earlier requests before admitting
    /// this one (needs `Weir-Session-Id`).
    #[serde(rename = "Weir-Supersede", default)]
    #[schemars(regex(pattern = r"^\s*[Ss][Ee][Ss][Ss][Ii][Oo][Nn]\s*$"))]
    pub supersede: Option<String>,
    /// `interactive` or `batch` (any case): the priority class; absent = the class of
    /// the request's `[[limits]]` key, else `interactive`.
    #[serde(rename = "Weir-Priority", default)]
    #[schemars(regex(
        pattern = r"^\s*([Ii][Nn][Tt][Ee][Rr][Aa][Cc][Tt][Ii][Vv][Ee]|[Bb][Aa][Tt][Cc][Hh])\s*$"
    ))]
    pub priority: Option<String>,
    /// Absolute deadline, Unix milliseconds.
    #[serde(rename = "Weir-Deadline-Ms", default)]
    #[schemars(regex(pattern = MS))]
    pub deadline_ms: Option<String>,
    /// Budget in milliseconds from receipt.
    #[serde(rename = "Weir-Timeout-Ms", default)]
    #[schemars(regex(pattern = MS))]
    pub timeout_ms: Option<String>,
    /// `enqueue` (default) or `reject` when the session is busy (any case).
    #[serde(rename = "Weir-Admission", default)]
    #[schemars(regex(
        pattern = r"^\s*([Ee][Nn][Qq][Uu][Ee][Uu][Ee]|[Rr][Ee][Jj][Ee][Cc][Tt])\s*$"
    ))]
    pub admission: Option<String>,
    /// `1` / `true` asks for a streamed reply, `0` / `false` not (any case).
    #[serde(rename = "Weir-Stream", default)]
    #[schemars(regex(pattern = r"^\s*(0|1|[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])\s*$"))]
    pub stream: Option<String>,
    /// Durable intake: where the answer goes.
    #[serde(rename = "Weir-Reply-To", default)]
    #[schemars(length(min = 1))]
    pub reply_to: Option<String>,
    /// Durable intake: JetStream's deduplication id (the request id).
    #[serde(rename = "Nats-Msg-Id", default)]
    #[schemars(regex(pattern = ID))]
    pub nats_msg_id: Option<String>,
    /// W3C trace context (a malformed one is ignored, not refused).
    #[serde(rename = "traceparent", default)]
    #[schemars(regex(
        pattern = r"^[ \t]*[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?[ \t]*$"
    ))]
    pub traceparent: Option<String>,
    /// W3C trace context vendor state: printable ASCII, at most 512 bytes.
    #[serde(rename = "tracestate", default)]
    #[schemars(regex(pattern = r"^[ -~]{0,512}$"))]
    pub tracestate: Option<String>,
}

/// The headers of one message of a streamed reply ([`crate::llm::stream`]), by
/// `Weir-Stream-Event`.
#[derive(Deserialize, JsonSchema)]
#[serde(tag = "Weir-Stream-Event", rename_all = "snake_case")]
pub enum StreamEventHeaders {
    /// Accepted and waiting.
    Queued {
        /// 1-based position among queued requests.
        #[serde(rename = "Weir-Queue-Position")]
        #[schemars(regex(pattern = COUNT))]
        queue_position: String,
        /// Predicted wait before inference starts, milliseconds (absent without an
        /// estimate).
        #[serde(rename = "Weir-Predicted-Start-Ms", default)]
        #[schemars(regex(pattern = COUNT))]
        predicted_start_ms: Option<String>,
    },
    /// Inference started.
    Started {
        /// Receipt → start of inference.
        #[serde(rename = "Weir-Queue-Ms", default)]
        #[schemars(regex(pattern = DECIMAL_MS))]
        queue_ms: Option<String>,
    },
    /// Part of the reply body.
    Chunk {
        /// 1, 2, 3, ... without gaps.
        #[serde(rename = "Weir-Stream-Seq")]
        #[schemars(regex(pattern = r"^[1-9][0-9]{0,19}$"))]
        seq: String,
    },
    /// The reply is complete.
    End {
        /// Receipt → start of inference.
        #[serde(rename = "Weir-Queue-Ms", default)]
        #[schemars(regex(pattern = DECIMAL_MS))]
        queue_ms: Option<String>,
        /// The backend call.
        #[serde(rename = "Weir-Inference-Ms", default)]
        #[schemars(regex(pattern = DECIMAL_MS))]
        inference_ms: Option<String>,
        /// The backend that served the stream (its pool name, `default` for a single
        /// backend).
        #[serde(rename = "Weir-Backend", default)]
        #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
        backend: Option<String>,
        /// Start of inference → first chunk (absent without chunks).
        #[serde(rename = "Weir-Ttft-Ms", default)]
        #[schemars(regex(pattern = DECIMAL_MS))]
        ttft_ms: Option<String>,
        /// `chunk` messages sent.
        #[serde(rename = "Weir-Stream-Chunks")]
        #[schemars(regex(pattern = COUNT))]
        chunks: String,
        /// Body bytes sent in chunks.
        #[serde(rename = "Weir-Stream-Bytes")]
        #[schemars(regex(pattern = COUNT))]
        bytes: String,
        /// `ok`, or `joined` (this caller joined another caller's stream).
        #[serde(rename = "Weir-Stream-Outcome")]
        #[schemars(regex(pattern = r"^(ok|joined)$"))]
        outcome: String,
    },
    /// The usual error reply.
    Error {
        /// The error code.
        #[serde(rename = "Weir-Error-Code")]
        code: ErrorCode,
        /// `<code>: <message>`.
        #[serde(rename = "Nats-Service-Error", default)]
        service_error: Option<String>,
        /// The HTTP-like numeric code.
        #[serde(rename = "Nats-Service-Error-Code", default)]
        #[schemars(regex(pattern = r"^[0-9]{3}$"))]
        service_error_code: Option<String>,
    },
}
