//! What an offer must pass before it costs the server anything: its body read under
//! a byte bound (and the listener's body deadline and minimum rate,
//! `weir_service::http::body`), and its ICE candidates limited to the HTTP client's
//! own address, so that the server's connectivity checks (STUN) only go to the
//! client that asked for them.
//!
//! Invariants: at most [`super::MAX_OFFER_BYTES`] are buffered per offer; a refusal
//! message never contains the text of an internal error (a parser's Debug output can
//! carry heap addresses); with foreign candidates refused, every `a=candidate` line
//! left in the offer names the client's IP address (IPv4-mapped IPv6 compared as
//! IPv4).

use std::net::IpAddr;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use bytes::BytesMut;
use futures::StreamExt;
use weir_service::http::BodyTimeout;

use super::MAX_OFFER_BYTES;

/// Why an offer's body was not read: the status, the error code, the message.
pub(crate) type BodyRefusal = (StatusCode, &'static str, String);

/// Reads an offer's body, at most [`MAX_OFFER_BYTES`]: `413 offer_too_large` above
/// it, `408 body_timeout` when the body was cut off by the listener's body bounds,
/// `400 invalid_offer` when it could not be read otherwise.
pub(crate) async fn read_offer(body: Body) -> Result<Bytes, BodyRefusal> {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match BodyTimeout::find(&e) {
            Some(t) => (StatusCode::REQUEST_TIMEOUT, "body_timeout", t.to_string()),
            None => (
                StatusCode::BAD_REQUEST,
                "invalid_offer",
                "the offer's body could not be read".to_owned(),
            ),
        })?;
        if buf.len() + chunk.len() > MAX_OFFER_BYTES {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// The `413 offer_too_large` refusal.
pub(crate) fn too_large() -> BodyRefusal {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        "offer_too_large",
        format!("the offer is larger than {MAX_OFFER_BYTES} bytes"),
    )
}

/// The offer without the `a=candidate` lines whose address is not `client` (and
/// without those whose address is not an IP address: mDNS `.local` names, which the
/// server does not resolve), and how many were dropped. The client still connects:
/// its checks from its own address reach the server, which learns it as a
/// peer-reflexive candidate.
pub(crate) fn keep_own_candidates(sdp: &str, client: IpAddr) -> (String, usize) {
    let client = client.to_canonical();
    let mut kept = String::with_capacity(sdp.len());
    let mut dropped = 0;
    for line in sdp.split_inclusive('\n') {
        if let Some(addr) = candidate_address(line)
            && addr.map(|a| a.to_canonical()) != Some(client)
        {
            dropped += 1;
            continue;
        }
        kept.push_str(line);
    }
    (kept, dropped)
}

/// For an `a=candidate:` line, `Some(its address)` (`Some(None)`: not an IP address);
/// `None` for any other line.
fn candidate_address(line: &str) -> Option<Option<IpAddr>> {
    let rest = line.trim().strip_prefix("a=candidate:")?;
    // foundation component transport priority address port typ ...
    Some(rest.split_whitespace().nth(4).and_then(|a| a.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFFER: &str = "v=0\r\n\
m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n\
a=candidate:1 1 UDP 2122317823 192.0.2.7 4000 typ host\r\n\
a=candidate:2 1 UDP 2122317823 198.51.100.9 4000 typ host\r\n\
a=candidate:3 1 UDP 2122317823 ab12.local 4000 typ host\r\n\
a=candidate:4 1 UDP 1686052607 192.0.2.7 5000 typ srflx raddr 10.0.0.2 rport 4000\r\n\
a=candidate:5 1 UDP 2122317823 2001:db8::1 4000 typ host\r\n\
a=rtpmap:111 opus/48000/2\r\n";

    #[test]
    fn only_candidates_on_the_clients_address_are_kept() {
        let (kept, dropped) = keep_own_candidates(OFFER, "192.0.2.7".parse().expect("ip"));
        assert_eq!(dropped, 3);
        let candidates: Vec<_> = kept
            .lines()
            .filter(|l| l.starts_with("a=candidate:"))
            .collect();
        assert_eq!(candidates.len(), 2, "{kept}");
        assert!(candidates.iter().all(|l| l.contains(" 192.0.2.7 ")));
        assert!(kept.contains("a=rtpmap:111 opus/48000/2\r\n"));
        assert!(kept.starts_with("v=0\r\nm=audio"));
        // An IPv4-mapped client address is the IPv4 one.
        let (_, dropped) = keep_own_candidates(OFFER, "::ffff:192.0.2.7".parse().expect("ip"));
        assert_eq!(dropped, 3);
        let (kept, dropped) = keep_own_candidates(OFFER, "203.0.113.1".parse().expect("ip"));
        assert_eq!(dropped, 5);
        assert!(!kept.contains("a=candidate"));
    }
}
