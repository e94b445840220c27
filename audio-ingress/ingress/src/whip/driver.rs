//! The WHIP driver: one task that owns the UDP socket and every session's `str0m::Rtc`
//! (why one task: see [`super`]).
//!
//! Loop: wait for a datagram, a command or the earliest session deadline; feed the
//! input to the one session it belongs to (source-address map, confirmed by
//! `Rtc::accepts`; STUN goes by `accepts` over the sessions, since it also carries the
//! ICE credentials); drain that session's output (str0m's single-mutation rule:
//! every mutation is followed by a full drain to `Output::Timeout`); then run the
//! timeouts that are due and the liveness checks.
//!
//! Invariants:
//! - The loop never awaits anything but its inputs: datagrams go out with
//!   `try_send_to` (a full socket buffer drops the datagram and counts it, as UDP
//!   would), Opus packets go to a pump with `try_send` (a full channel drops and counts
//!   the packet; the pump sees an RTP gap and conceals it).
//! - A session's state is dropped in exactly one place, [`Driver::remove`]; its
//!   [`SessionSlot`] goes with it (the resource then answers 404) and dropping its media
//!   sender tells the pump the publisher is gone.
//! - A panic inside str0m for one session (a bug reached by a hostile datagram) ends
//!   that session only.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use str0m::channel::ChannelId;
use str0m::net::{Protocol, Receive};
use str0m::{Event, IceConnectionState, Input, Output, Rtc};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use super::{EVENTS_CHANNEL, SessionSlot, WhipCounters, count};
use crate::config::WhipConfig;
use crate::metrics as m;

/// One Opus packet for a pump.
#[derive(Debug)]
pub struct Media {
    /// Extended RTP sequence number of the packet.
    pub seq: u64,
    /// The Opus payload.
    pub data: Arc<[u8]>,
}

/// What the handlers and pumps ask of the driver.
pub(crate) enum Command {
    /// Start driving a session (its resource key, the session).
    Add(String, Box<Session>),
    /// Send a JSON event on the session's `weir` data channel (queued until it opens).
    Event { key: String, text: String },
    /// The session's stream ended: let the data channel drain (bounded), then close
    /// ICE/DTLS and forget the session.
    Close { key: String },
}

/// Events queued for a data channel that is not open yet or is full.
const MAX_QUEUED_EVENTS: usize = 64;
/// How long a closing session waits for its data channel to drain.
const CLOSE_LINGER: Duration = Duration::from_millis(1000);
/// How long str0m gets to send its close output (RTCP BYE, SCTP and DTLS close).
const CLOSE_DRAIN: Duration = Duration::from_millis(500);
/// Largest datagram read (str0m's MTU target is far below).
const RECV_BUFFER_BYTES: usize = 2048;
/// Liveness checks run at least this often.
const HOUSEKEEPING: Duration = Duration::from_millis(100);

enum Phase {
    Live,
    /// The stream ended: waiting for the data channel to drain until `until`.
    Lingering {
        until: Instant,
    },
    /// `Rtc::close` was called: forgotten once str0m is done or at `until`.
    Closing {
        until: Instant,
    },
}

/// One session in the driver: handed over by the `POST` handler (offer already
/// accepted).
pub(crate) struct Session {
    rtc: Rtc,
    media: Option<mpsc::Sender<Media>>,
    _slot: SessionSlot,
    /// str0m's next timeout.
    next: Instant,
    created: Instant,
    connected: bool,
    last_rx: Instant,
    disconnected_since: Option<Instant>,
    channel: Option<ChannelId>,
    events: VecDeque<String>,
    phase: Phase,
}

impl Session {
    /// The session of an accepted offer; its Opus packets go to `media`.
    pub(crate) fn new(rtc: Rtc, media: mpsc::Sender<Media>, slot: SessionSlot) -> Self {
        let now = Instant::now();
        Self {
            rtc,
            media: Some(media),
            _slot: slot,
            next: now,
            created: now,
            connected: false,
            last_rx: now,
            disconnected_since: None,
            channel: None,
            events: VecDeque::new(),
            phase: Phase::Live,
        }
    }
}

struct Driver {
    socket: UdpSocket,
    local: SocketAddr,
    sessions: HashMap<String, Session>,
    /// Source address → session, learnt from `accepts`.
    by_source: HashMap<SocketAddr, String>,
    /// The liveness checks' timeouts (`connect_timeout`, `disconnect_timeout`).
    config: WhipConfig,
    counters: Arc<WhipCounters>,
}

/// Runs the driver until the command channel closes (every handle dropped).
pub(crate) async fn run(
    socket: UdpSocket,
    mut commands: mpsc::Receiver<Command>,
    config: WhipConfig,
    counters: Arc<WhipCounters>,
) {
    let local = match socket.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "WHIP UDP socket has no address; WHIP is off");
            return;
        }
    };
    let mut d = Driver {
        socket,
        local,
        sessions: HashMap::new(),
        by_source: HashMap::new(),
        config,
        counters,
    };
    let mut buf = vec![0u8; RECV_BUFFER_BYTES];
    loop {
        let now = Instant::now();
        let wake = d
            .sessions
            .values()
            .map(|s| s.next)
            .min()
            .unwrap_or(now + HOUSEKEEPING)
            .min(now + HOUSEKEEPING);
        tokio::select! {
            // Commands first: a session's `Add` is queued before its 201 is sent, so
            // it must be in place before the publisher's first datagram is matched.
            biased;
            cmd = commands.recv() => match cmd {
                Some(c) => d.command(c),
                None => break,
            },
            r = d.socket.recv_from(&mut buf) => match r {
                Ok((n, source)) => d.datagram(&buf[..n], source),
                // ICMP errors (a publisher's port closed) surface here on Linux: not
                // the socket's failure.
                Err(e) => tracing::debug!(error = %e, "WHIP UDP receive error"),
            },
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(wake)) => {}
        }
        d.timeouts(Instant::now());
    }
    let keys: Vec<String> = d.sessions.keys().cloned().collect();
    for k in keys {
        d.remove(&k);
    }
}

/// Feeds `input` to `s` and drains its output. `Err`: the session failed (error or
/// panic inside str0m) and must be removed.
fn drive(
    s: &mut Session,
    input: Option<Input<'_>>,
    socket: &UdpSocket,
    counters: &WhipCounters,
) -> Result<(), SessionError> {
    catch_unwind(AssertUnwindSafe(|| {
        if let Some(input) = input {
            s.rtc.handle_input(input)?;
        }
        drain(s, socket, counters)
    }))
    .unwrap_or(Err(SessionError::Panicked))
}

/// Why a session failed (it is then dropped).
#[derive(Debug, thiserror::Error)]
enum SessionError {
    /// str0m refused an input or failed to produce output.
    #[error("{0}")]
    Rtc(#[from] str0m::RtcError),
    /// str0m panicked (caught: one session must not take the driver down).
    #[error("str0m panicked")]
    Panicked,
}

/// Polls `s` until `Output::Timeout`.
fn drain(s: &mut Session, socket: &UdpSocket, counters: &WhipCounters) -> Result<(), SessionError> {
    loop {
        if !s.rtc.is_alive() {
            return Ok(());
        }
        match s.rtc.poll_output()? {
            Output::Timeout(t) => {
                s.next = t;
                return Ok(());
            }
            Output::Transmit(t) => {
                if socket.try_send_to(&t.contents, t.destination).is_err() {
                    count(&counters.send_failures);
                }
            }
            Output::Event(e) => event(s, e, counters),
        }
    }
}

fn event(s: &mut Session, e: Event, counters: &WhipCounters) {
    match e {
        Event::Connected => s.connected = true,
        Event::IceConnectionStateChange(state) => match state {
            IceConnectionState::Disconnected => {
                s.disconnected_since.get_or_insert_with(Instant::now);
            }
            _ => s.disconnected_since = None,
        },
        Event::MediaData(m) => {
            let Some(tx) = &s.media else { return };
            let packet = Media {
                seq: **m.seq_range.start(),
                data: m.data,
            };
            if tx.try_send(packet).is_err() {
                count(&counters.packets_dropped_behind);
                metrics::counter!(m::WHIP_PACKETS_DROPPED_TOTAL, weir_audio_producer::metrics::LABEL_REASON => "behind")
                    .increment(1);
            }
        }
        Event::ChannelOpen(id, label) if label == EVENTS_CHANNEL => {
            s.channel = Some(id);
            flush_events(s, counters);
        }
        Event::ChannelClose(id) if s.channel == Some(id) => s.channel = None,
        Event::ChannelBufferedAmountLow(id) if s.channel == Some(id) => {
            flush_events(s, counters);
        }
        _ => {}
    }
}

/// Writes queued events to the open `weir` channel while it takes them.
fn flush_events(s: &mut Session, counters: &WhipCounters) {
    let Some(id) = s.channel else { return };
    while let Some(text) = s.events.front() {
        let Some(mut ch) = s.rtc.channel(id) else {
            return;
        };
        match ch.write(false, text.as_bytes()) {
            Ok(true) => {
                count(&counters.events_sent);
                s.events.pop_front();
            }
            Ok(false) => return,
            Err(_) => {
                count(&counters.events_dropped);
                s.events.pop_front();
            }
        }
    }
}

/// Whether the `weir` channel has nothing left to send.
fn channel_drained(s: &mut Session) -> bool {
    if !s.events.is_empty() && s.channel.is_some() {
        return false;
    }
    match s.channel.and_then(|id| s.rtc.channel(id)) {
        Some(mut ch) => ch.buffered_amount() == 0,
        None => true,
    }
}

impl Driver {
    fn datagram(&mut self, data: &[u8], source: SocketAddr) {
        count(&self.counters.datagrams);
        let now = Instant::now();
        let Ok(contents) = data.try_into() else {
            count(&self.counters.datagrams_unmatched);
            return;
        };
        let input = Input::Receive(
            now,
            Receive {
                proto: Protocol::Udp,
                source,
                destination: self.local,
                contents,
            },
        );
        let cached = self
            .by_source
            .get(&source)
            .filter(|k| self.sessions.get(*k).is_some_and(|s| s.rtc.accepts(&input)))
            .cloned();
        let key = cached.or_else(|| {
            self.sessions
                .iter()
                .find(|(_, s)| s.rtc.accepts(&input))
                .map(|(k, _)| k.clone())
        });
        let Some(key) = key else {
            count(&self.counters.datagrams_unmatched);
            tracing::debug!(%source, first_byte = data.first().copied().unwrap_or(0), len = data.len(), "WHIP datagram no session accepts");
            return;
        };
        if self.by_source.get(&source) != Some(&key) {
            self.by_source.insert(source, key.clone());
        }
        let Some(s) = self.sessions.get_mut(&key) else {
            return;
        };
        s.last_rx = now;
        if let Err(e) = drive(s, Some(input), &self.socket, &self.counters) {
            tracing::warn!(resource = %key, error = %e, "WHIP session failed");
            self.lost(&key);
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Add(key, mut s) => {
                if drive(&mut s, None, &self.socket, &self.counters).is_ok() {
                    self.sessions.insert(key, *s);
                }
                // Else dropped: the pump sees its media channel close (producer_gone).
            }
            Command::Event { key, text } => {
                let Some(s) = self.sessions.get_mut(&key) else {
                    return;
                };
                if s.events.len() >= MAX_QUEUED_EVENTS {
                    s.events.pop_front();
                    count(&self.counters.events_dropped);
                }
                s.events.push_back(text);
                flush_events(s, &self.counters);
                if drive(s, None, &self.socket, &self.counters).is_err() {
                    self.lost(&key);
                }
            }
            Command::Close { key } => {
                if let Some(s) = self.sessions.get_mut(&key)
                    && matches!(s.phase, Phase::Live)
                {
                    s.media = None;
                    s.phase = Phase::Lingering {
                        until: Instant::now() + CLOSE_LINGER,
                    };
                }
            }
        }
    }

    /// Runs due str0m timeouts, the liveness checks and the close phases.
    fn timeouts(&mut self, now: Instant) {
        let mut lost = Vec::new();
        let mut forget = Vec::new();
        let st = &self.config;
        for (key, s) in &mut self.sessions {
            if s.next <= now
                && drive(s, Some(Input::Timeout(now)), &self.socket, &self.counters).is_err()
            {
                lost.push(key.clone());
                continue;
            }
            match s.phase {
                Phase::Live => {
                    let silent = now.saturating_duration_since(s.last_rx);
                    let timed_out = if s.connected {
                        silent >= st.disconnect_timeout
                            || s.disconnected_since.is_some_and(|t| {
                                now.saturating_duration_since(t) >= st.disconnect_timeout
                            })
                    } else {
                        now.saturating_duration_since(s.created) >= st.connect_timeout
                    };
                    if timed_out || !s.rtc.is_alive() {
                        tracing::info!(resource = %key, "WHIP publisher gone (ICE disconnected, silent or never connected)");
                        lost.push(key.clone());
                    }
                }
                Phase::Lingering { until } => {
                    if now >= until || channel_drained(s) {
                        let _ = catch_unwind(AssertUnwindSafe(|| s.rtc.close()));
                        s.phase = Phase::Closing {
                            until: now + CLOSE_DRAIN,
                        };
                        if drive(s, None, &self.socket, &self.counters).is_err() {
                            forget.push(key.clone());
                        }
                    }
                }
                Phase::Closing { until } => {
                    if now >= until || !s.rtc.is_alive() {
                        forget.push(key.clone());
                    }
                }
            }
        }
        for key in lost {
            self.lost(&key);
        }
        for key in forget {
            self.remove(&key);
        }
    }

    /// The publisher is gone or the session failed: the pump ends the stream
    /// (`producer_gone`), ICE/DTLS is closed, the session forgotten.
    fn lost(&mut self, key: &str) {
        if let Some(s) = self.sessions.get_mut(key) {
            // Counted once, for a session that was live (not one already closing).
            if matches!(s.phase, Phase::Live) {
                count(&self.counters.sessions_lost);
                metrics::counter!(m::WHIP_SESSIONS_LOST_TOTAL).increment(1);
            }
            s.media = None;
            let now = Instant::now();
            let _ = catch_unwind(AssertUnwindSafe(|| s.rtc.close()));
            s.phase = Phase::Closing {
                until: now + CLOSE_DRAIN,
            };
            if drive(s, None, &self.socket, &self.counters).is_err() || !s.rtc.is_alive() {
                self.remove(key);
            }
        }
    }

    fn remove(&mut self, key: &str) {
        if self.sessions.remove(key).is_some() {
            self.by_source.retain(|_, k| k != key);
        }
    }
}
