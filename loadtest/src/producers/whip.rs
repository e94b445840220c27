//! The WHIP transport of a synthetic producer (`--transport whip`): the same stream
//! life as the WebSocket one ([`super`]) — connect, frames at the 20 ms cadence (Skip),
//! server events counted, `end` or vanish at the stop time, reconnect under a new id
//! after the server ended or refused the stream — over WHIP: POST an SDP offer, ICE +
//! DTLS on the producer's own loopback UDP socket (weir's `whip::client`), 20 ms Opus
//! packets, events on the `weir` data channel, DELETE to end.
//!
//! Encoding: each distinct clip is encoded to Opus once, before the run
//! ([`OpusClip`]); a producer only sends the packets, so the encoder's cost is not
//! part of the rig's per-frame work and does not compete with the ingress for the
//! two cores. One packet decodes to one 640-byte frame, so frame accounting is the
//! WebSocket one.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use weir_audio_ingress::whip::client::{ClientEvent, Offer, opus_packets};
use weir_protocol::audio::FRAME_DURATION;

use super::{CONNECT_TIMEOUT, ConnectionEnd, END_GRACE, Producer};
use crate::counters::Count;
use crate::error::{Error, ErrorKind};
use crate::speech::SpeechClip;

/// A clip's frames as Opus packets, encoded once (shared by every producer of the clip).
#[derive(Debug, Clone)]
pub struct OpusClip(Arc<Vec<Vec<u8>>>);

impl OpusClip {
    /// Encodes every frame of `clip` (one 20 ms packet per 640-byte frame).
    pub fn encode(clip: &SpeechClip) -> Result<Self, Error> {
        let pcm = clip.samples();
        let packets = opus_packets(&pcm).map_err(|e| Error::new(ErrorKind::Run, e.to_string()))?;
        Ok(Self(Arc::new(packets)))
    }

    fn packet(&self, index: u64) -> &[u8] {
        &self.0[(index % self.0.len() as u64) as usize]
    }
}

/// Header `name` of `r`, when it is text.
fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    let value = r.headers().get(name)?.to_str().ok()?;
    Some(value.to_owned())
}

impl Producer {
    /// One WHIP session under `id` (see the module docs).
    pub(super) async fn whip_connection(
        &self,
        id: &str,
        opus: &OpusClip,
        frame_index: &mut u64,
    ) -> ConnectionEnd {
        let counters = &self.counters;
        let Ok(offer) = Offer::new(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await else {
            return self.connect_failed();
        };
        let base = format!("http://{}", self.config.ws_addr);
        let post = self
            .http
            .post(format!("{base}/v1/whip/{id}"))
            .header("content-type", "application/sdp")
            .body(offer.sdp.clone())
            .send();
        let (location, answer) = match tokio::time::timeout(CONNECT_TIMEOUT, post).await {
            Ok(Ok(r)) if r.status().as_u16() == 201 => {
                match (header(&r, "location"), r.text().await) {
                    (Some(l), Ok(body)) => (l, body),
                    _ => return self.connect_failed(),
                }
            }
            Ok(Ok(r)) => {
                let hint = header(&r, "retry-after");
                return self.refused(r.status().as_u16(), hint.as_deref());
            }
            _ => return self.connect_failed(),
        };
        let Ok(mut client) = offer.answered(&answer) else {
            return self.connect_failed();
        };
        let connect_by = Instant::now() + CONNECT_TIMEOUT;
        loop {
            match client.next_event(connect_by).await {
                Some(ClientEvent::Connected) => break,
                Some(ClientEvent::Closed) | None => return self.connect_failed(),
                Some(_) => {}
            }
        }
        counters.connects.inc();

        let began = Instant::now();
        let mut next = began;
        let mut sent_here = 0u64;
        let mut server_done = false;
        let mut got_closed = false;
        while !server_done {
            // Events until the next frame is due.
            while let Some(ev) = client.next_event(next.min(self.stop_at)).await {
                let (done, closed) = self.whip_event(ev);
                server_done |= done;
                got_closed |= closed;
            }
            let now = Instant::now();
            if now >= self.stop_at || server_done {
                break;
            }
            if client.send_opus(opus.packet(*frame_index)) {
                *frame_index += 1;
                sent_here += 1;
                counters.frames_sent.inc();
            }
            // Skip, as the WebSocket producers: a late tick is not made up.
            next += FRAME_DURATION;
            if next < now {
                let behind = (now - next).as_micros() / FRAME_DURATION.as_micros() + 1;
                next += FRAME_DURATION * behind as u32;
            }
        }
        self.count_missed(began, sent_here);

        if server_done {
            counters.ended_by_server.inc();
            return self.retry_unless_over();
        }
        if self.vanish {
            // No DELETE, no DTLS close: the socket just goes quiet.
            counters.vanished.inc();
            return ConnectionEnd::Finished;
        }
        // DELETE, while the session is driven so that the `closed` event is read.
        let delete = tokio::spawn({
            let req = self.http.delete(format!("{base}{location}")).send();
            async move { tokio::time::timeout(END_GRACE, req).await }
        });
        let deadline = Instant::now() + END_GRACE;
        while !got_closed {
            match client.next_event(deadline).await {
                Some(ClientEvent::Closed) | None => break,
                Some(ev) => got_closed |= self.whip_event(ev).1,
            }
        }
        if let Ok(Ok(Ok(Ok(r)))) = tokio::time::timeout(Duration::from_secs(1), delete).await
            && r.status().is_success()
        {
            counters.ended.inc();
        }
        ConnectionEnd::Finished
    }

    /// Counts one session event: (the server ended the stream, it was `closed`).
    fn whip_event(&self, ev: ClientEvent) -> (bool, bool) {
        match ev {
            ClientEvent::Message(v) => match self.counters.count_event(&v) {
                Some("overload") => (true, false),
                Some("closed") => (true, true),
                _ => (false, false),
            },
            ClientEvent::Closed => (true, false),
            ClientEvent::Connected | ClientEvent::ChannelOpen => (false, false),
        }
    }
}
