//! The Twilio transport of a synthetic producer (`--transport twilio`): the WebSocket
//! stream life ([`Producer::ws_stream`]) on the telephony door `/v1/telephony/twilio`,
//! spoken as Twilio Media Streams speaks to a customer's server: `connected`, `start`
//! (the door's stream id in `customParameters.stream_id`), one `media` per tick (160
//! µ-law bytes in base64), and `stop` at the end (Twilio has no weir `end`), after which
//! the server closes the socket. docs/loadtest.md (`--transport`) lists every member,
//! and how the server's carrier-dialect messages (`carrier_events`; there is no
//! `closed` event) and close frames are counted.
//!
//! Encoding: each distinct clip is downsampled to 8 kHz and µ-law encoded once, before
//! the run, with every chunk's base64 payload ([`TwilioClip`]): a producer's per-chunk
//! work is one string format. One 20 ms chunk at 8 kHz is one 20 ms frame at 16 kHz, so
//! frame accounting is the WebSocket one.
//!
//! Invariants: every chunk written is counted in `frames_sent` exactly once; chunk
//! numbers are consecutive per connection (a skipped tick sends and numbers nothing).

use std::sync::Arc;

use base64::Engine;
use rand::Rng;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use weir_audio_telephony::codec::{Encoder, Encoding, MediaFormat};

use super::{ConnectionEnd, Producer};
use crate::error::{Error, ErrorKind};
use crate::speech::SpeechClip;

/// The door's route for Twilio Media Streams.
pub const ROUTE: &str = "/v1/telephony/twilio";

/// µ-law bytes of one 20 ms chunk at 8 kHz.
pub const CHUNK_BYTES: usize = 160;

/// A clip's 20 ms chunks as base64 µ-law payloads, encoded once (shared by every
/// producer of the clip).
#[derive(Debug, Clone)]
pub struct TwilioClip(Arc<Vec<String>>);

impl TwilioClip {
    /// Downsamples `clip` to 8 kHz and µ-law encodes it: one 160-byte payload (216
    /// base64 characters) per 640-byte frame of the clip. The clip is a loop, so it is
    /// encoded twice and the second pass kept: the resampler's history at the loop's
    /// start is the clip's end, and the loop seam has no start-up transient.
    pub fn encode(clip: &SpeechClip) -> Result<Self, Error> {
        let format = MediaFormat::new(Encoding::Pcmu, 8000, 1)
            .map_err(|e| Error::new(ErrorKind::Run, format!("µ-law format: {e}")))?;
        let pcm = clip.samples();
        let mut encoder = Encoder::new(format);
        let mut mulaw = Vec::with_capacity(pcm.len() / 2);
        encoder.encode(&pcm, &mut mulaw);
        mulaw.clear();
        encoder.encode(&pcm, &mut mulaw);
        if mulaw.len() != clip.frames() * CHUNK_BYTES {
            return Err(Error::new(
                ErrorKind::Run,
                format!(
                    "µ-law clip: {} bytes for {} frames (expected {} per frame)",
                    mulaw.len(),
                    clip.frames(),
                    CHUNK_BYTES
                ),
            ));
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let payloads = mulaw
            .chunks_exact(CHUNK_BYTES)
            .map(|c| b64.encode(c))
            .collect();
        Ok(Self(Arc::new(payloads)))
    }

    /// Chunk `index` of the loop (wraps around), base64.
    fn payload(&self, index: u64) -> &str {
        &self.0[(index % self.0.len() as u64) as usize]
    }
}

/// A fresh Twilio-shaped SID: `prefix` and 32 lowercase hex digits.
fn sid(prefix: &str) -> String {
    format!("{prefix}{:032x}", rand::rng().random::<u128>())
}

/// The messages of one Twilio stream, as Twilio writes them.
struct Call {
    stream_sid: String,
    call_sid: String,
    account_sid: String,
}

impl Call {
    fn connected() -> String {
        r#"{"event":"connected","protocol":"Call","version":"1.0.0"}"#.to_owned()
    }

    fn start(&self, id: &str) -> String {
        serde_json::json!({
            "event": "start",
            "sequenceNumber": "1",
            "start": {
                "accountSid": self.account_sid,
                "streamSid": self.stream_sid,
                "callSid": self.call_sid,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": {"stream_id": id},
            },
            "streamSid": self.stream_sid,
        })
        .to_string()
    }

    /// The hot path: one format, the payload pre-built.
    fn media(&self, seq: u64, chunk: u64, timestamp_ms: u64, payload: &str) -> String {
        format!(
            r#"{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound","chunk":"{chunk}","timestamp":"{timestamp_ms}","payload":"{payload}"}},"streamSid":"{}"}}"#,
            self.stream_sid
        )
    }

    fn stop(&self, seq: u64) -> String {
        serde_json::json!({
            "event": "stop",
            "sequenceNumber": seq.to_string(),
            "streamSid": self.stream_sid,
            "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
        })
        .to_string()
    }
}

impl Producer {
    /// One Twilio stream under `id` (see the module docs).
    pub(super) async fn twilio_connection(
        &self,
        id: &str,
        clip: &TwilioClip,
        frame_index: &mut u64,
    ) -> ConnectionEnd {
        let url = format!("ws://{}{ROUTE}", self.config.ws_addr);
        let call = Call {
            stream_sid: sid("MZ"),
            call_sid: sid("CA"),
            account_sid: sid("AC"),
        };
        // `start` was message 1: chunk n (from 1) is message n + 1, `stop` the last.
        let media = |tick: Instant, began, sent, i| {
            let timestamp_ms = tick.saturating_duration_since(began).as_millis() as u64;
            let text = call.media(sent + 2, sent + 1, timestamp_ms, clip.payload(i));
            Message::Text(text.into())
        };
        let hello = vec![Call::connected(), call.start(id)];
        let stop = |sent| call.stop(sent + 2);
        self.ws_stream(&url, hello, frame_index, media, stop).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producers::{ProducerConfig, ProducerCounters, Transport, start};
    use futures::{SinkExt, StreamExt};
    use std::time::Duration;
    use tokio_tungstenite::tungstenite::protocol::CloseFrame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

    /// The door's own parser (the telephony crate's Twilio dialect) reads every message
    /// the producer writes as Twilio's.
    #[test]
    fn the_door_s_parser_reads_the_producer_s_messages() {
        use weir_audio_telephony::dialect::{Dialect, Inbound, Track, detect, parse};
        let call = Call {
            stream_sid: sid("MZ"),
            call_sid: sid("CA"),
            account_sid: sid("AC"),
        };
        let connected = Call::connected();
        assert_eq!(detect(&connected), Some(Dialect::Twilio));
        assert!(matches!(
            parse(Dialect::Twilio, &connected),
            Ok(Inbound::Connected { .. })
        ));
        let Ok(Inbound::Start(start)) = parse(Dialect::Twilio, &call.start("s3")) else {
            panic!("start refused: {}", call.start("s3"));
        };
        assert_eq!(start.seq, Some(1));
        assert_eq!(start.stream_sid, call.stream_sid);
        assert_eq!(start.call_id, call.call_sid);
        assert_eq!(
            start.custom.get("stream_id").map(String::as_str),
            Some("s3")
        );
        assert_eq!(start.tracks, vec![Track::Inbound]);
        assert_eq!(start.format.samples_per_ms() * 20, CHUNK_BYTES);
        let clip = TwilioClip::encode(&SpeechClip::render(5, 10)).expect("encodes");
        let text = call.media(7, 6, 100, clip.payload(5));
        let Ok(Inbound::Media(media)) = parse(Dialect::Twilio, &text) else {
            panic!("media refused: {text}");
        };
        assert_eq!(
            (media.seq, media.chunk, media.timestamp_ms),
            (Some(7), 6, 100)
        );
        assert_eq!(media.track, Track::Inbound);
        assert_eq!(media.payload.len(), CHUNK_BYTES);
        assert_eq!(parse(Dialect::Twilio, &call.stop(8)), Ok(Inbound::Stop));
    }

    /// What a stand-in door saw of one stream.
    #[derive(Debug, Default)]
    struct Seen {
        stream_id: String,
        media: u64,
        stopped: bool,
    }

    /// A stand-in for the telephony door: checks the Twilio dialect message by message
    /// (connected, start, consecutive chunks of 160 bytes, stop), answers each `media`
    /// 100th with a `mark` (a carrier-dialect message) and closes after `stop`.
    async fn door(listener: tokio::net::TcpListener, streams: usize) -> Vec<Seen> {
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..streams {
            let Ok(Ok((tcp, _))) =
                tokio::time::timeout(Duration::from_secs(5), listener.accept()).await
            else {
                break;
            };
            calls.spawn(async move {
                let mut ws = tokio_tungstenite::accept_async(tcp).await.expect("upgrade");
                let mut seen = Seen::default();
                let b64 = base64::engine::general_purpose::STANDARD;
                let mut n = 0u64;
                while let Some(Ok(msg)) = ws.next().await {
                    let Message::Text(text) = msg else { continue };
                    let v: serde_json::Value = serde_json::from_str(text.as_str()).expect("JSON");
                    n += 1;
                    match (n, v["event"].as_str()) {
                        (1, Some("connected")) => assert_eq!(v["protocol"], "Call"),
                        (2, Some("start")) => {
                            assert_eq!(v["sequenceNumber"], "1");
                            let id = v["start"]["customParameters"]["stream_id"].as_str();
                            seen.stream_id = id.expect("stream_id").to_owned();
                        }
                        (_, Some("media")) => {
                            seen.media += 1;
                            assert_eq!(v["sequenceNumber"], (seen.media + 1).to_string());
                            assert_eq!(v["media"]["chunk"], seen.media.to_string());
                            let payload = v["media"]["payload"].as_str().expect("payload");
                            let bytes = b64.decode(payload).expect("base64");
                            assert_eq!(bytes.len(), CHUNK_BYTES);
                            if seen.media % 100 == 1 {
                                let mark =
                                    r#"{"event":"mark","streamSid":"MZ0","mark":{"name":"m"}}"#;
                                ws.send(Message::Text(mark.into())).await.expect("mark");
                            }
                        }
                        (_, Some("stop")) => {
                            assert_eq!(v["sequenceNumber"], (seen.media + 2).to_string());
                            seen.stopped = true;
                            let _ = ws
                                .close(Some(CloseFrame {
                                    code: CloseCode::Normal,
                                    reason: "".into(),
                                }))
                                .await;
                        }
                        other => panic!("unexpected message {other:?}: {v}"),
                    }
                }
                seen
            });
        }
        calls.join_all().await
    }

    async fn run(streams: usize, vanish_share: f64) -> (Vec<Seen>, super::super::ProducerSnapshot) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let ws_addr = listener.local_addr().expect("addr");
        let door = tokio::spawn(door(listener, streams));
        let counters = Arc::new(ProducerCounters::default());
        let config = ProducerConfig {
            ws_addr,
            duration: Duration::from_millis(600),
            vanish_share,
            reconnect: false,
            reconnect_delay: Duration::from_millis(100),
            start_spread: Duration::from_millis(50),
            transport: Transport::Twilio,
            ids: Arc::new((0..streams).map(|i| format!("t{i}")).collect()),
        };
        let producers = start(config, 1, counters.clone());
        tokio::time::timeout(Duration::from_secs(10), producers.join_all())
            .await
            .expect("producers end");
        let seen = tokio::time::timeout(Duration::from_secs(10), door)
            .await
            .expect("door ends")
            .expect("door task");
        (seen, counters.snapshot())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_twilio_stream_is_sent_and_stopped_as_twilio_does() {
        let (seen, p) = run(2, 0.0).await;
        assert_eq!(seen.len(), 2);
        let mut ids: Vec<&str> = seen.iter().map(|s| s.stream_id.as_str()).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["t0", "t1"]);
        assert!(seen.iter().all(|s| s.stopped), "{seen:?}");
        let media: u64 = seen.iter().map(|s| s.media).sum();
        assert_eq!(p.frames_sent, media, "every chunk written arrived: {p:?}");
        assert!(media >= 40, "30 ticks per stream nominal: {media}");
        assert_eq!((p.connects, p.ended, p.vanished, p.broken), (2, 2, 0, 0));
        assert_eq!(p.ended_by_server, 0, "{p:?}");
        assert_eq!(p.carrier_events, 2, "one mark each: {p:?}");
        assert_eq!(p.closed_events, 0);
        assert_eq!(p.close_codes.get(&1000), Some(&2), "{p:?}");
        assert_eq!(p.active, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vanishing_twilio_stream_sends_no_stop() {
        let (seen, p) = run(2, 1.0).await;
        assert_eq!(seen.len(), 2);
        assert!(seen.iter().all(|s| !s.stopped && s.media > 0), "{seen:?}");
        let media: u64 = seen.iter().map(|s| s.media).sum();
        assert_eq!(p.frames_sent, media, "{p:?}");
        assert_eq!((p.vanished, p.ended, p.ended_by_server), (2, 0, 0), "{p:?}");
        assert!(p.close_codes.is_empty(), "{p:?}");
    }

    #[test]
    fn a_clip_becomes_one_base64_payload_of_160_bytes_per_frame() {
        let clip = SpeechClip::render(3, 50);
        let tw = TwilioClip::encode(&clip).expect("encodes");
        assert_eq!(tw.0.len(), 50);
        let b64 = base64::engine::general_purpose::STANDARD;
        for i in 0..50 {
            let bytes = b64.decode(tw.payload(i)).expect("base64");
            assert_eq!(bytes.len(), CHUNK_BYTES);
        }
        assert_eq!(tw.payload(3), tw.payload(53), "a loop");
        // Speech, not µ-law silence (0xFF / 0x7F) everywhere.
        let loud = (0..50)
            .map(|i| b64.decode(tw.payload(i)).expect("base64"))
            .filter(|c| c.iter().any(|&b| b & 0x7F < 0x40))
            .count();
        assert!(loud > 10, "{loud} loud chunks");
    }

    #[test]
    fn messages_are_twilio_shaped() {
        let call = Call {
            stream_sid: sid("MZ"),
            call_sid: sid("CA"),
            account_sid: sid("AC"),
        };
        assert_eq!(call.stream_sid.len(), 34);
        assert!(call.call_sid.starts_with("CA"));
        let start: serde_json::Value =
            serde_json::from_str(&call.start("s7r1")).expect("start is JSON");
        assert_eq!(start["event"], "start");
        assert_eq!(start["sequenceNumber"], "1");
        assert_eq!(start["streamSid"], call.stream_sid.as_str());
        assert_eq!(start["start"]["customParameters"]["stream_id"], "s7r1");
        assert_eq!(start["start"]["tracks"][0], "inbound");
        assert_eq!(
            start["start"]["mediaFormat"],
            serde_json::json!({"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1})
        );
        let media: serde_json::Value =
            serde_json::from_str(&call.media(2, 1, 20, "AAEC")).expect("media is JSON");
        assert_eq!(media["event"], "media");
        assert_eq!(media["sequenceNumber"], "2");
        assert_eq!(media["media"]["chunk"], "1");
        assert_eq!(media["media"]["timestamp"], "20");
        assert_eq!(media["media"]["track"], "inbound");
        assert_eq!(media["media"]["payload"], "AAEC");
        assert_eq!(media["streamSid"], call.stream_sid.as_str());
        let stop: serde_json::Value = serde_json::from_str(&call.stop(9)).expect("stop is JSON");
        assert_eq!(stop["event"], "stop");
        assert_eq!(stop["sequenceNumber"], "9");
        assert_eq!(stop["stop"]["callSid"], call.call_sid.as_str());
        let connected: serde_json::Value =
            serde_json::from_str(&Call::connected()).expect("connected is JSON");
        assert_eq!(connected["protocol"], "Call");
    }
}
