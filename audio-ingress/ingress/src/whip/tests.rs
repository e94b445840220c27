use super::*;

#[test]
fn an_answer_receives_opus_only_on_a_live_audio_section() {
    let ok = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n";
    assert!(answer_receives_opus(ok));
    assert!(answer_receives_opus(&ok.replace("opus", "OPUS")));
    assert!(!answer_receives_opus(&ok.replace("m=audio 9", "m=audio 0")));
    assert!(!answer_receives_opus(&ok.replace("m=audio", "m=video")));
    assert!(!answer_receives_opus(
        "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\na=rtpmap:0 PCMU/8000\r\n"
    ));
    assert!(!answer_receives_opus(""));
}

/// The shape of OBS's WHIP offer (libdatachannel): `a=group:LS`, ICE credentials
/// and fingerprint at session level, the codec spelled `OPUS`, a video section.
const OBS_OFFER: &str = "v=0\r\n\
o=rtc 3481936415 0 IN IP4 127.0.0.1\r\n\
s=-\r\n\
t=0 0\r\n\
a=group:BUNDLE 0 1\r\n\
a=group:LS 0 1\r\n\
a=msid-semantic:WMS *\r\n\
a=setup:actpass\r\n\
a=ice-ufrag:Xb7u\r\n\
a=ice-pwd:9f5cHr7vqbWNRRG2Dwkmhg\r\n\
a=ice-options:ice2,trickle\r\n\
a=fingerprint:sha-256 5C:C6:19:38:4D:3B:4F:63:AC:59:03:1D:2E:86:15:D9:53:19:55:3A:DE:D3:44:FE:9F:2D:A8:2D:0B:FA:4E:24\r\n\
m=audio 4000 UDP/TLS/RTP/SAVPF 111\r\n\
c=IN IP4 127.0.0.1\r\n\
a=mid:0\r\n\
a=sendonly\r\n\
a=ssrc:1717591808 cname:obs-audio\r\n\
a=msid:obs obs-audio\r\n\
a=rtcp-mux\r\n\
a=rtpmap:111 OPUS/48000/2\r\n\
a=fmtp:111 minptime=10;maxaveragebitrate=96000;stereo=1;sprop-stereo=1;useinbandfec=1\r\n\
a=candidate:1 1 UDP 2122317823 127.0.0.1 4000 typ host\r\n\
a=end-of-candidates\r\n\
m=video 4000 UDP/TLS/RTP/SAVPF 96\r\n\
c=IN IP4 127.0.0.1\r\n\
a=mid:1\r\n\
a=sendonly\r\n\
a=ssrc:1717591809 cname:obs-video\r\n\
a=msid:obs obs-video\r\n\
a=rtcp-mux\r\n\
a=rtpmap:96 H264/90000\r\n\
a=fmtp:96 profile-level-id=42e01f;packetization-mode=1;level-asymmetry-allowed=1\r\n\
";

#[test]
fn an_obs_shaped_offer_gets_an_opus_answer_and_video_is_refused() {
    let cand: std::net::SocketAddr = "127.0.0.1:9999".parse().expect("addr");
    let (_rtc, answer) = accept_with(&[cand], None, OBS_OFFER).expect("accepted");
    assert!(answer_receives_opus(&answer), "{answer}");
    assert!(answer.contains("a=recvonly"), "{answer}");
    assert!(answer.contains("127.0.0.1 9999 typ host"), "{answer}");
    // The video section is answered, disabled (port 0).
    assert!(
        answer.lines().any(|l| l.starts_with("m=video 0 ")),
        "{answer}"
    );
    assert!(accept_with(&[cand], None, "v=0\r\n").is_err());
    let pcmu = OBS_OFFER.replace("OPUS/48000/2", "PCMU/8000");
    assert!(accept_with(&[cand], None, &pcmu).is_err());
    // With the shared certificate, every answer carries its fingerprint.
    let cert = str0m::crypto::from_feature_flags()
        .dtls_provider
        .generate_certificate()
        .expect("certificate");
    let fingerprint = |a: &str| {
        a.lines()
            .find(|l| l.starts_with("a=fingerprint:"))
            .map(str::to_owned)
    };
    let (_, a1) = accept_with(&[cand], Some(&cert), OBS_OFFER).expect("a1");
    let (_, a2) = accept_with(&[cand], Some(&cert), OBS_OFFER).expect("a2");
    assert!(fingerprint(&a1).is_some());
    assert_eq!(fingerprint(&a1), fingerprint(&a2));
    assert_ne!(fingerprint(&a1), fingerprint(&answer));
}

#[test]
fn a_refused_offer_is_answered_without_the_parsers_internals() {
    let cand: std::net::SocketAddr = "127.0.0.1:9999".parse().expect("addr");
    for garbage in [
        "v=0\r\n",
        "v=0\r\no=- 1 1 IN IP4 x\r\nm=audio\r\n",
        "hello",
        "v=0\r\na=candidate:\u{1}\r\nm=audio 9 UDP/TLS/RTP/SAVPF x\r\n",
    ] {
        let e = accept_with(&[cand], None, garbage)
            .expect_err("refused")
            .to_string();
        assert!(
            e == "the offer is not a valid SDP offer"
                || e == "the offer could not be negotiated"
                || e.starts_with("the offer has no Opus audio"),
            "{garbage:?} -> {e}"
        );
        assert!(!e.contains("0x") && !e.contains("Pointer"), "{e}");
    }
}

#[test]
fn a_content_length_over_the_offer_bound_is_refused_before_the_body() {
    let mut h = HeaderMap::new();
    assert!(!announced_too_large(&h));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("65536"));
    assert!(!announced_too_large(&h));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("65537"));
    assert!(announced_too_large(&h));
}

#[test]
fn only_application_sdp_is_an_offer() {
    let mut h = HeaderMap::new();
    assert!(!is_sdp(&h));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("Application/SDP; charset=utf-8"),
    );
    assert!(is_sdp(&h));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    assert!(!is_sdp(&h));
}

#[test]
fn a_browser_on_another_origin_may_send_the_token_and_read_the_answers_headers() {
    let resp = preflight("POST, OPTIONS");
    let h = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_ascii_lowercase()
    };
    assert_eq!(h("access-control-allow-origin"), "*");
    let allowed = h("access-control-allow-headers");
    for name in ["authorization", "content-type", "weir-resume-token"] {
        assert!(allowed.contains(name), "{name} not allowed: {allowed}");
    }
    let exposed = h("access-control-expose-headers");
    for name in [
        "location",
        "retry-after",
        "weir-resume-token",
        "weir-resume-window-ms",
    ] {
        assert!(exposed.contains(name), "{name} not exposed: {exposed}");
    }
}
