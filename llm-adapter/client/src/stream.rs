//! Streamed replies (`Weir-Stream: 1`): the events a caller reads ([`LlmEvent`]), the
//! stream that yields them in order ([`LlmStream`], which acknowledges each chunk for
//! the adapter's flow control), and [`RequestBuilder::stream`], which starts one.

use super::*;

/// One event of a streamed reply ([`RequestBuilder::stream`]).
#[derive(Debug, Clone, PartialEq)]
pub enum LlmEvent {
    /// Accepted, waiting: 1-based position (1 = next) and the predicted wait.
    Queued {
        /// Position among the queued requests.
        position: usize,
        /// Predicted wait before inference starts (none without an estimate).
        predicted_start: Option<Duration>,
    },
    /// Inference started after this queue wait.
    Started {
        /// Receipt → start of inference.
        queue_time: Option<Duration>,
    },
    /// Part of the body: one or more SSE events from the backend, unchanged.
    Chunk {
        /// 1, 2, 3, ... without gaps (a gap is reported as an error).
        seq: u64,
        /// The bytes.
        data: Bytes,
    },
    /// The reply is complete. Always the last event of a successful stream.
    End(StreamEnd),
}

/// The figures of a completed stream (the `end` event).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEnd {
    /// Receipt → start of inference.
    pub queue_time: Option<Duration>,
    /// Start of inference → end.
    pub inference_time: Option<Duration>,
    /// Start of inference → first chunk published.
    pub ttft: Option<Duration>,
    /// Chunks the adapter sent to this caller.
    pub chunks: u64,
    /// Body bytes the adapter sent to this caller.
    pub bytes: u64,
    /// This caller joined another caller's stream with the same request id (or found
    /// it in the completion cache): the request ran once, its text went to the first
    /// caller and is not kept, so this caller received no chunk
    /// (`Weir-Stream-Outcome: joined`).
    pub joined: bool,
    /// The backend that served the stream (`Weir-Backend`), when the adapter says.
    pub backend: Option<String>,
}

/// The events of a streamed reply: a [`futures::Stream`] of [`LlmEvent`]s that ends
/// after [`LlmEvent::End`] or after the first error (a refusal, a failure, a lost chunk,
/// the overall timeout). Reading it acknowledges the chunks (the adapter's flow
/// control): a stream that is not read is aborted by the adapter after its window.
/// Dropping it unsubscribes (the adapter then notices the caller is gone).
pub type LlmStream = futures::stream::BoxStream<'static, Result<LlmEvent, ClientError>>;

struct StreamState {
    sub: async_nats::Subscriber,
    nats: async_nats::Client,
    until: tokio::time::Instant,
    next_seq: u64,
    _slot: Option<LocalSlot>,
}

/// The longest a chunk's acknowledgement may wait to be queued.
const ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// A numeric header, `0` when absent or not a number.
fn num_header<T: FromStr + Default>(hm: &HeaderMap, name: &str) -> T {
    get(hm, name)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_default()
}

impl StreamState {
    /// Reads one message: its event, `None` for one to skip, or the error that ends
    /// the stream.
    async fn step(&mut self) -> Result<Option<LlmEvent>, ClientError> {
        use futures::StreamExt;
        use weir_protocol::llm::stream::{self as s, StreamEvent};
        let msg = tokio::time::timeout_at(self.until, self.sub.next())
            .await
            .map_err(|_| ClientError::new(ClientErrorKind::TimedOut, "stream did not end in time"))?
            .ok_or_else(|| ClientError::new(ClientErrorKind::Transport, "subscription closed"))?;
        if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Err(ClientError::new(
                ClientErrorKind::NoResponders,
                "no adapter is listening on the subject",
            ));
        }
        check_error(&msg)?;
        let hm = msg.headers.clone().unwrap_or_default();
        let event = match get(&hm, s::STREAM_EVENT).and_then(StreamEvent::parse) {
            Some(StreamEvent::Queued) => LlmEvent::Queued {
                position: num_header(&hm, s::QUEUE_POSITION),
                predicted_start: ms_header(&hm, s::PREDICTED_START_MS),
            },
            Some(StreamEvent::Started) => LlmEvent::Started {
                queue_time: ms_header(&hm, h::QUEUE_MS),
            },
            Some(StreamEvent::Chunk) => {
                let seq: u64 = num_header(&hm, s::STREAM_SEQ);
                if seq != self.next_seq {
                    return Err(ClientError::new(
                        ClientErrorKind::InvalidReply,
                        format!("chunk {seq} arrived, {} expected (lost)", self.next_seq),
                    ));
                }
                self.next_seq += 1;
                if let Some(ack) = msg.reply.clone() {
                    // Best effort: a lost acknowledgement is repaired by the next.
                    let _ = tokio::time::timeout(
                        ACK_TIMEOUT,
                        self.nats.publish(ack, seq.to_string().into()),
                    )
                    .await;
                }
                LlmEvent::Chunk {
                    seq,
                    data: msg.payload,
                }
            }
            Some(StreamEvent::End) => {
                let chunks = num_header(&hm, s::STREAM_CHUNKS);
                if chunks != self.next_seq - 1 {
                    return Err(ClientError::new(
                        ClientErrorKind::InvalidReply,
                        format!("end says {chunks} chunks, {} arrived", self.next_seq - 1),
                    ));
                }
                LlmEvent::End(StreamEnd {
                    queue_time: ms_header(&hm, h::QUEUE_MS),
                    inference_time: ms_header(&hm, h::INFERENCE_MS),
                    ttft: ms_header(&hm, s::TTFT_MS),
                    chunks,
                    bytes: num_header(&hm, s::STREAM_BYTES),
                    joined: get(&hm, s::STREAM_OUTCOME).is_some_and(|v| v.trim() == "joined"),
                    backend: get(&hm, h::BACKEND).map(str::to_owned),
                })
            }
            // An error reply was handled above; unknown events (a newer adapter) are
            // skipped.
            Some(StreamEvent::Error) | None => return Ok(None),
        };
        Ok(Some(event))
    }
}

impl RequestBuilder<'_> {
    /// Sends the request asking for a streamed reply (`Weir-Stream: 1`) and returns
    /// its events as they arrive. The local session cap applies as for
    /// [`RequestBuilder::send`] (its slot is held until the stream ends or is dropped);
    /// the whole stream is bounded by the budget (or the default timeout).
    pub async fn stream(self) -> Result<LlmStream, ClientError> {
        use weir_protocol::llm::stream as s;
        let c = self.client;
        let slot = c.take_slot(self.session.as_deref())?;
        let (mut headers, wait) = self.headers_and_wait();
        put(&mut headers, s::STREAM, "1");
        let inbox = c.nats.new_inbox();
        let sub = tokio::time::timeout(wait, c.nats.subscribe(inbox.clone()))
            .await
            .map_err(|_| ClientError::new(ClientErrorKind::TimedOut, "subscribe timed out"))?
            .map_err(|e| ClientError::with_source(ClientErrorKind::Transport, "subscribe", e))?;
        tokio::time::timeout(
            wait,
            c.nats
                .publish_with_reply_and_headers(c.subject.clone(), inbox, headers, self.body),
        )
        .await
        .map_err(|_| ClientError::new(ClientErrorKind::TimedOut, "publish timed out"))?
        .map_err(|e| ClientError::with_source(ClientErrorKind::Transport, "publish", e))?;
        let state = StreamState {
            sub,
            nats: c.nats.clone(),
            until: tokio::time::Instant::now() + wait + MARGIN,
            next_seq: 1,
            _slot: slot,
        };
        // The state (subscription, session slot) goes with the end or the first error.
        let inner = futures::stream::unfold(Some(state), |st| async move {
            let mut st = st?;
            loop {
                match st.step().await {
                    Ok(None) => {}
                    Ok(Some(event)) => {
                        let more = !matches!(event, LlmEvent::End(_));
                        return Some((Ok(event), more.then_some(st)));
                    }
                    Err(e) => return Some((Err(e), None)),
                }
            }
        });
        Ok(Box::pin(inner))
    }
}
