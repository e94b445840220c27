//! A WHIP publisher (the client side) on str0m, for Rust producers, the WHIP tests and
//! the load test: one send-only Opus track and the `weir` data channel, on its own UDP
//! socket. The HTTP exchange is the caller's (POST [`Offer::sdp`], hand the answer to
//! [`Offer::answered`], DELETE the `Location`), so any HTTP client fits.
//!
//! ```no_run
//! # async fn demo(answer_sdp: &str, packets: Vec<Vec<u8>>) -> Result<(), weir_audio_ingress::whip::client::ClientError> {
//! use weir_audio_ingress::whip::client::{Offer, ClientEvent};
//! let offer = Offer::new("127.0.0.1:0".parse().unwrap()).await?;
//! // POST offer.sdp to /v1/whip/{stream_id}; the 201's body is the answer.
//! let mut client = offer.answered(answer_sdp)?;
//! let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
//! while let Some(ev) = client.next_event(deadline).await {
//!     if ev == ClientEvent::Connected { break; }
//! }
//! for p in &packets {
//!     client.send_opus(p); // one 20 ms packet; pace it yourself
//! }
//! # Ok(()) }
//! ```
//!
//! Invariant: str0m's single-mutation rule holds — every mutation (input, write) is
//! followed by a full drain of `poll_output` before the next.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Instant;

use str0m::change::{SdpAnswer, SdpPendingOffer};
use str0m::channel::ChannelId;
use str0m::media::{Direction, Frequency, MediaKind, MediaTime, Mid, Pt};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, IceConnectionState, Input, Output, Rtc, RtcConfig};
use tokio::net::UdpSocket;

use super::EVENTS_CHANNEL;

/// RTP clock ticks of one 20 ms Opus packet (48 kHz).
const PACKET_TICKS: u64 = 960;

/// What the session reports.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientEvent {
    /// ICE and DTLS connected: media may flow.
    Connected,
    /// The `weir` data channel opened.
    ChannelOpen,
    /// A JSON event on the `weir` channel (`overload`, `gap`, `closed`, ...).
    Message(serde_json::Value),
    /// The session is gone (the server closed it, ICE disconnected or str0m failed).
    Closed,
}

/// The offering side before the answer: the session, not connected yet.
pub struct Offer {
    client: Client,
    pending: SdpPendingOffer,
    /// The SDP offer to POST.
    pub sdp: String,
}

/// Why a WHIP publisher could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The UDP socket could not be bound, or has no address.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The host candidate was refused.
    #[error("{0}")]
    Candidate(#[from] str0m::error::IceError),
    /// str0m had no offer to make.
    #[error("no offer to make")]
    NoOffer,
    /// The answer is not SDP.
    #[error("answer: {0}")]
    Answer(#[from] str0m::error::SdpError),
    /// The answer does not fit the offer.
    #[error("answer refused: {0}")]
    AnswerRefused(#[from] str0m::RtcError),
    /// The Opus encoder refused.
    #[error("{0}")]
    Opus(#[from] opus_pure::Error),
}

impl Offer {
    /// Binds a UDP socket at `bind` (its address is the one host candidate) and makes
    /// the offer: audio send-only (Opus) and the `weir` data channel.
    pub async fn new(bind: SocketAddr) -> Result<Self, ClientError> {
        let bind_error = |source| ClientError::Bind { addr: bind, source };
        let socket = UdpSocket::bind(bind).await.map_err(bind_error)?;
        let local = socket.local_addr().map_err(bind_error)?;
        let mut rtc = RtcConfig::new()
            .clear_codecs()
            .enable_opus(true, false)
            .build(Instant::now());
        let candidate = Candidate::host(local, "udp")?;
        rtc.add_local_candidate(candidate);
        let mut api = rtc.sdp_api();
        let mid = api.add_media(MediaKind::Audio, Direction::SendOnly, None, None, None);
        let channel = api.add_channel(EVENTS_CHANNEL.to_owned());
        let (offer, pending) = api.apply().ok_or(ClientError::NoOffer)?;
        let client = Client {
            rtc,
            socket,
            local,
            mid,
            channel,
            pt: None,
            packets: 0,
            events: VecDeque::new(),
            next: Instant::now(),
            closed: false,
            buf: vec![0; 2048],
        };
        Ok(Self {
            client,
            pending,
            sdp: offer.to_sdp_string(),
        })
    }

    /// Applies the WHIP answer (the 201's body).
    pub fn answered(mut self, answer: &str) -> Result<Client, ClientError> {
        let sdp = SdpAnswer::from_sdp_string(answer)?;
        self.client.rtc.sdp_api().accept_answer(self.pending, sdp)?;
        Ok(self.client)
    }
}

/// A publisher session after the answer.
pub struct Client {
    rtc: Rtc,
    socket: UdpSocket,
    local: SocketAddr,
    mid: Mid,
    channel: ChannelId,
    pt: Option<Pt>,
    packets: u64,
    events: VecDeque<ClientEvent>,
    next: Instant,
    closed: bool,
    buf: Vec<u8>,
}

impl Client {
    /// Writes one 20 ms Opus packet (RTP time advances 960 ticks per packet). `false`
    /// when it could not be written (not connected yet, or the session is gone).
    pub fn send_opus(&mut self, packet: &[u8]) -> bool {
        if self.closed {
            return false;
        }
        let Some(writer) = self.rtc.writer(self.mid) else {
            return false;
        };
        let Some(pt) = self
            .pt
            .or_else(|| writer.payload_params().next().map(|p| p.pt()))
        else {
            return false;
        };
        self.pt = Some(pt);
        let time = MediaTime::new(self.packets * PACKET_TICKS, Frequency::FORTY_EIGHT_KHZ);
        let ok = writer
            .write(pt, Instant::now(), time, packet.to_vec())
            .is_ok();
        if ok {
            self.packets += 1;
        }
        self.drain();
        ok
    }

    /// Drives the session until it has an event or `until` passes (`None`).
    pub async fn next_event(&mut self, until: tokio::time::Instant) -> Option<ClientEvent> {
        loop {
            self.drain();
            if let Some(e) = self.events.pop_front() {
                return Some(e);
            }
            if self.closed || tokio::time::Instant::now() >= until {
                return None;
            }
            let wake = tokio::time::Instant::from_std(self.next).min(until);
            tokio::select! {
                r = self.socket.recv_from(&mut self.buf) => {
                    if let Ok((n, source)) = r
                        && let Ok(contents) = self.buf[..n].try_into()
                    {
                        let input = Input::Receive(Instant::now(), Receive {
                            proto: Protocol::Udp, source, destination: self.local, contents,
                        });
                        if self.rtc.handle_input(input).is_err() {
                            self.gone();
                        }
                    }
                }
                () = tokio::time::sleep_until(wake) => {
                    if self.rtc.handle_input(Input::Timeout(Instant::now())).is_err() {
                        self.gone();
                    }
                }
            }
        }
    }

    /// Drains str0m's output to its next timeout.
    fn drain(&mut self) {
        while !self.closed {
            if !self.rtc.is_alive() {
                self.gone();
                return;
            }
            match self.rtc.poll_output() {
                Ok(Output::Timeout(t)) => {
                    self.next = t;
                    return;
                }
                Ok(Output::Transmit(t)) => {
                    let _ = self.socket.try_send_to(&t.contents, t.destination);
                }
                Ok(Output::Event(e)) => self.event(e),
                Err(_) => self.gone(),
            }
        }
    }

    fn event(&mut self, e: Event) {
        match e {
            Event::Connected => self.events.push_back(ClientEvent::Connected),
            Event::ChannelOpen(id, _) if id == self.channel => {
                self.events.push_back(ClientEvent::ChannelOpen);
            }
            Event::ChannelData(d) if d.id == self.channel => {
                let v = serde_json::from_slice(&d.data).unwrap_or(serde_json::Value::Null);
                self.events.push_back(ClientEvent::Message(v));
            }
            Event::IceConnectionStateChange(IceConnectionState::Disconnected) => self.gone(),
            _ => {}
        }
    }

    fn gone(&mut self) {
        if !self.closed {
            self.closed = true;
            self.events.push_back(ClientEvent::Closed);
        }
    }
}

/// 20 ms Opus packets of 16 kHz mono s16 PCM (one per 320 samples; a trailing partial
/// frame is left out), encoded once by opus-pure — what a producer sends with
/// [`Client::send_opus`]. `Err` when the encoder refuses.
pub fn opus_packets(pcm: &[i16]) -> Result<Vec<Vec<u8>>, ClientError> {
    let mut enc = opus_pure::OpusEncoder::new(16_000, 1, opus_pure::Application::Audio)?;
    let mut out = vec![0u8; opus_pure::MAX_PACKET_BYTES];
    pcm.chunks_exact(weir_protocol::audio::FRAME_SAMPLES)
        .map(|frame| {
            let n = enc.encode_s16(frame, frame.len(), &mut out)?;
            Ok(out[..n].to_vec())
        })
        .collect()
}
