//! Outbound: the bot's audio from NATS to the carrier, marks, clear, a stalled carrier.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use weir_testkit::NatsServer;

use super::{BARGE_IN_TRIALS, Carrier, MAX_LAG, MIN_NCC, OUT_MAX_BYTES, data, reference, unix_s};
use crate::support::{self, Binary};
use crate::whip_support::best_ncc;

/// The door's outbound queue gauge (bytes of queued 16 kHz PCM).
const QUEUE_GAUGE: &str = "weir_ingress_telephony_out_queue_bytes";

/// The door's events for one stream, with their Unix arrival times.
type Events = Arc<Mutex<Vec<(f64, Value)>>>;

async fn events(client: &async_nats::Client, id: &str) -> Events {
    let mut sub = client
        .subscribe(format!("weir.voice.events.{id}"))
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let out: Events = Arc::default();
    let o = Arc::clone(&out);
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if let Ok(v) = serde_json::from_slice::<Value>(&m.payload) {
                o.lock().expect("events").push((unix_s(), v));
            }
        }
    });
    out
}

async fn wait_event(ev: &Events, bound: Duration, f: impl Fn(&Value) -> bool) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        if let Some((_, v)) = ev.lock().expect("events").iter().find(|(_, v)| f(v)) {
            return Some(v.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn le_bytes(pcm: &[i16]) -> bytes::Bytes {
    pcm.iter()
        .flat_map(|s| s.to_le_bytes())
        .collect::<Vec<u8>>()
        .into()
}

/// Publishes `pcm` on the stream's out subject, `Weir-Mark: name` after it if given.
async fn say(client: &async_nats::Client, id: &str, pcm: &[i16], mark: Option<&str>) {
    let subject = format!("weir.voice.out.{id}");
    match mark {
        Some(name) => {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Weir-Mark", name);
            client
                .publish_with_headers(subject, h, le_bytes(pcm))
                .await
                .expect("publish");
        }
        None => client
            .publish(subject, le_bytes(pcm))
            .await
            .expect("publish"),
    }
}

struct Outbound {
    _nats: NatsServer,
    bin: Binary,
    client: async_nats::Client,
    events: Events,
    carrier: Carrier,
}

/// A door, a carrier on a call of silence lasting `seconds` (`extra` args), the
/// door's events; returns once the door said `started`.
async fn outbound_call(id: &str, seconds: &str, extra: &[&str]) -> Outbound {
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(nats.url(), &[]).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let events = events(&client, id).await;
    let mut args = vec![
        "--dialect",
        "twilio",
        "--stream-id",
        id,
        "--duration",
        seconds,
    ];
    args.extend(extra);
    let carrier = Carrier::start(&bin, "/v1/telephony/twilio", &args);
    assert!(
        wait_event(&events, support::STEP, |v| v["type"] == "started")
            .await
            .is_some(),
        "{id}: the door said started"
    );
    // The door subscribes to the out subject before `started`; a margin all the same.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Outbound {
        _nats: nats,
        bin,
        client,
        events,
        carrier,
    }
}

fn media_times(report: &Value) -> Vec<(f64, u64)> {
    report["outbound_media"]
        .as_array()
        .expect("outbound_media")
        .iter()
        .map(|m| {
            (
                m["t"].as_f64().unwrap_or(0.0),
                m["bytes"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_seconds_in_one_burst_play_over_ten_seconds_with_marks_echoed_in_order() {
    let id = "tel-out";
    let dir = tempfile::tempdir().expect("tempdir");
    let saved = dir.path().join("out.ulaw");
    let o = outbound_call(
        id,
        "14",
        &["--save-outbound", saved.to_str().expect("utf-8")],
    )
    .await;
    // 10 s of speech at 16 kHz (FFmpeg's decode of the fixture), in 1 s messages.
    let speech = reference(&data("speech-8k.ulaw"), "PCMU");
    let source = &speech[..160_000];
    let marks = ["after-3s", "after-6s", "after-10s"];
    let published_at = unix_s();
    for (i, sec) in source.chunks(16_000).enumerate() {
        let mark = match i {
            2 => Some(marks[0]),
            5 => Some(marks[1]),
            9 => Some(marks[2]),
            _ => None,
        };
        say(&o.client, id, sec, mark).await;
    }
    o.client.flush().await.expect("flush");
    let report = o.carrier.finish(Duration::from_secs(40)).await;
    let media = media_times(&report);
    let bytes: u64 = media.iter().map(|m| m.1).sum();
    assert_eq!(
        bytes, 80_000,
        "{id}: 10 s of 8 kHz G.711 reached the carrier"
    );
    let first = media.first().expect("media").0;
    let span = media.last().expect("media").0 - first + 0.020;
    eprintln!(
        "{id}: {} media messages, {bytes} bytes, first {:.1} ms after the publish, spread over {span:.3} s",
        media.len(),
        (first - published_at) * 1e3
    );
    assert!((9.5..=10.5).contains(&span), "{id}: paced over {span:.3} s");
    let mark_events: Vec<String> = o
        .events
        .lock()
        .expect("events")
        .iter()
        .filter(|(_, v)| v["type"] == "mark")
        .filter_map(|(_, v)| v["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(mark_events, marks, "{id}: echoed marks on NATS, in order");
    let echoed: Vec<&str> = report["marks_echoed"]
        .as_array()
        .expect("echoed")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(echoed, marks, "{id}: the carrier got the marks in order");
    // What the carrier heard, decoded by FFmpeg, against what was published.
    let heard = reference(&saved, "PCMU");
    let (ncc, lag) = best_ncc(source, &heard, MAX_LAG);
    eprintln!("{id}: outbound audio ncc {ncc:.4} at lag {lag} samples");
    assert!(ncc >= MIN_NCC, "{id}: outbound ncc {ncc:.4} at lag {lag}");
}

/// One barge-in trial's figures.
#[derive(Debug)]
struct Trial {
    clear_sent: f64,
    /// Last media arrival after the clear minus the clear (0 when none came after).
    last_media_ms: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barge_in_stops_the_carriers_audio_within_20_ms_and_names_the_unplayed_marks() {
    let id = "tel-barge";
    let trials: usize = std::env::var("WEIR_BARGE_IN_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BARGE_IN_TRIALS);
    // Each trial: 2 s published, cleared 300–500 ms into it, 250 ms of quiet after.
    let seconds = format!("{}", 3 + trials);
    let o = outbound_call(id, &seconds, &[]).await;
    let tone: Vec<i16> = (0..16_000)
        .map(|i| {
            ((i as f64 * 2.0 * std::f64::consts::PI * 440.0 / 16_000.0).sin() * 8_000.0) as i16
        })
        .collect();
    let mut done = Vec::new();
    let mut starts = Vec::new();
    for t in 0..trials {
        let (a, b) = (format!("t{t}-a"), format!("t{t}-b"));
        starts.push(unix_s());
        say(&o.client, id, &tone, Some(&a)).await;
        say(&o.client, id, &tone, Some(&b)).await;
        o.client.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(300 + (t as u64 * 37) % 200)).await;
        let clear_sent = unix_s();
        let reply = tokio::time::timeout(
            Duration::from_secs(2),
            o.client
                .request(format!("weir.voice.ctl.{id}"), r#"{"type":"clear"}"#.into()),
        )
        .await
        .expect("the clear is answered in time")
        .expect("a reply");
        let reply: Value = serde_json::from_slice(&reply.payload).expect("JSON reply");
        assert_eq!(reply["type"], "cleared", "{reply}");
        assert_eq!(unplayed_marks(&reply), [a, b], "trial {t}: {reply}");
        done.push(Trial {
            clear_sent,
            last_media_ms: 0.0,
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    starts.push(f64::MAX);
    o.carrier.hang_up();
    let report = o.carrier.finish(Duration::from_secs(30)).await;
    let media = media_times(&report);
    let clears: Vec<f64> = report["clears"]
        .as_array()
        .expect("clears")
        .iter()
        .filter_map(|c| c["t"].as_f64())
        .collect();
    let mut clear_ms = Vec::new();
    let mut quiet_before = Vec::new();
    for (i, tr) in done.iter_mut().enumerate() {
        let window = |t: f64| t > tr.clear_sent && t < starts[i + 1];
        if let Some(last) = media
            .iter()
            .map(|m| m.0)
            .filter(|&t| window(t))
            .reduce(f64::max)
        {
            tr.last_media_ms = (last - tr.clear_sent) * 1e3;
        }
        let c = clears
            .iter()
            .copied()
            .find(|&t| window(t))
            .unwrap_or_else(|| panic!("trial {i}: the carrier got no clear: {tr:?}"));
        clear_ms.push((c - tr.clear_sent) * 1e3);
        // The clear came during playback: media was arriving up to it.
        let before = media
            .iter()
            .map(|m| m.0)
            .filter(|&t| t <= tr.clear_sent && t > starts[i])
            .reduce(f64::max)
            .map(|t| (tr.clear_sent - t) * 1e3)
            .unwrap_or_else(|| panic!("trial {i}: no media before the clear"));
        assert!(
            before <= 40.0,
            "trial {i}: no media for {before:.1} ms before the clear"
        );
        quiet_before.push(before);
    }
    // No mark of a cleared trial may be reported played by the door.
    let played: Vec<(f64, String)> = o
        .events
        .lock()
        .expect("events")
        .iter()
        .filter(|(_, v)| v["type"] == "mark")
        .map(|(t, v)| (*t, v["name"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert!(
        played.is_empty(),
        "marks reported played though they were cleared before playing: {played:?}"
    );
    let mut lat: Vec<f64> = done.iter().map(|t| t.last_media_ms).collect();
    lat.sort_by(f64::total_cmp);
    clear_ms.sort_by(f64::total_cmp);
    quiet_before.sort_by(f64::total_cmp);
    let p = |v: &[f64], q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    eprintln!(
        "{id}: {trials} trials; last media after the clear request: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; carrier's clear after the request: p50 {:.1} ms, p99 {:.1} ms; trials with media after the request {}; last media before the request: max {:.1} ms earlier",
        p(&lat, 0.5),
        p(&lat, 0.99),
        lat[lat.len() - 1],
        p(&clear_ms, 0.5),
        p(&clear_ms, 0.99),
        lat.iter().filter(|&&l| l > 0.0).count(),
        quiet_before[quiet_before.len() - 1]
    );
    assert!(
        p(&lat, 0.99) <= 20.0,
        "p99 {:.1} ms: {lat:?}",
        p(&lat, 0.99)
    );
}

/// The `cleared` reply's `unplayed_marks`.
fn unplayed_marks(reply: &Value) -> Vec<String> {
    reply["unplayed_marks"]
        .as_array()
        .unwrap_or_else(|| panic!("unplayed_marks: {reply}"))
        .iter()
        .filter_map(|m| m.as_str().map(str::to_owned))
        .collect()
}

/// A mark the door had sent to the carrier but the carrier had not played at the
/// clear: both carriers send pending marks back on `clear` (Telnyx: "A clear frame
/// also returns queued marks"), and the door must name it unplayed in the reply and
/// never report it played (a `mark` event). Clears land around the moment the first
/// mark is sent (300 ms of audio, 40 ms lead), so some trials catch it in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_sent_but_not_played_at_a_clear_is_named_unplayed_never_played() {
    let id = "tel-barge-mark";
    let trials = 12usize;
    let o = outbound_call(id, "20", &[]).await;
    let tone: Vec<i16> = (0..16_000)
        .map(|i| {
            ((i as f64 * 2.0 * std::f64::consts::PI * 440.0 / 16_000.0).sin() * 8_000.0) as i16
        })
        .collect();
    let mut replies = Vec::new();
    for t in 0..trials {
        let (a, b) = (format!("m{t}-a"), format!("m{t}-b"));
        say(&o.client, id, &tone[..4_800], Some(&a)).await;
        say(&o.client, id, &tone, Some(&b)).await;
        o.client.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(250 + 4 * t as u64)).await;
        let reply = tokio::time::timeout(
            Duration::from_secs(2),
            o.client
                .request(format!("weir.voice.ctl.{id}"), r#"{"type":"clear"}"#.into()),
        )
        .await
        .expect("the clear is answered in time")
        .expect("a reply");
        let reply: Value = serde_json::from_slice(&reply.payload).expect("JSON reply");
        assert_eq!(reply["type"], "cleared", "{reply}");
        replies.push((a, b, unplayed_marks(&reply)));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Marks the carrier sends back after the last clear have time to reach the door.
    tokio::time::sleep(Duration::from_millis(300)).await;
    o.carrier.hang_up();
    let report = o.carrier.finish(Duration::from_secs(30)).await;
    let played_events: Vec<String> = o
        .events
        .lock()
        .expect("events")
        .iter()
        .filter(|(_, v)| v["type"] == "mark")
        .filter_map(|(_, v)| v["name"].as_str().map(str::to_owned))
        .collect();
    let echoed_as = |name: &str| {
        report["marks_echoed"]
            .as_array()
            .expect("marks_echoed")
            .iter()
            .find(|m| m["name"] == name)
            .and_then(|m| m["why"].as_str())
            .map(str::to_owned)
    };
    let (mut in_flight, mut queued, mut played) = (0, 0, 0);
    for (a, b, unplayed) in &replies {
        assert!(!played_events.contains(b), "{b} reported played");
        match echoed_as(a).as_deref() {
            Some("played") => {
                played += 1;
                assert_eq!(unplayed, std::slice::from_ref(b), "{a} was played");
                assert!(played_events.contains(a), "{a} played, no mark event");
            }
            why => {
                if why == Some("cleared") {
                    in_flight += 1;
                } else {
                    queued += 1;
                }
                assert_eq!(unplayed, &[a.clone(), b.clone()], "{a}: {why:?}");
                assert!(
                    !played_events.contains(a),
                    "{a} was cleared ({why:?}) but reported played"
                );
            }
        }
    }
    eprintln!(
        "{id}: {trials} clears; first mark at the clear: at the carrier unplayed {in_flight}, \
         still in the door {queued}, already played {played}"
    );
    assert!(
        in_flight > 0,
        "no clear caught a mark at the carrier; nothing was checked"
    );
}

/// How long the stall case publishes real-time bot audio to a carrier that stopped
/// reading, waiting for the door to say so (`WEIR_STALL_WAIT_S` overrides it).
const STALL_WAIT_S: usize = 30;

/// A stalled carrier, default configuration: the door says so on NATS — `overload`
/// (`carrier_stalled`, the bot audio it will not play) once a send to the carrier
/// timed out behind the bounded send buffer (`send_buffer_bytes`), then `stopped`
/// (`producer_gone`) — and its outbound queue gauge never exceeds the per-call bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_that_stops_reading_is_reported_and_the_queue_stays_bounded() {
    let id = "tel-stall";
    let o = outbound_call(id, "900", &["--stall-after", "0.5", "--rcvbuf", "4096"]).await;
    let tone: Vec<i16> = (0..16_000)
        .map(|i| {
            ((i as f64 * 2.0 * std::f64::consts::PI * 300.0 / 16_000.0).sin() * 6_000.0) as i16
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let stalled_at = unix_s();
    let signal = |v: &Value| v["type"] == "overload" || v["type"] == "stopped";
    // Real-time audio, 1 s a second, until the door reports the stall.
    let mut gauge: Vec<f64> = Vec::new();
    let mut seen = None;
    let mut midway = String::new();
    let wait_s: usize = std::env::var("WEIR_STALL_WAIT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(STALL_WAIT_S);
    for second in 0..wait_s {
        say(&o.client, id, &tone, None).await;
        o.client.flush().await.expect("flush");
        for _ in 0..10 {
            gauge.extend(queue_gauge(&o.bin).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if second == 10 {
            midway = socket_queues(o.bin.ws.port());
        }
        if let Some(v) = wait_event(&o.events, Duration::ZERO, signal).await {
            seen = Some(v);
            break;
        }
    }
    let gauge_max = gauge.iter().copied().fold(0.0, f64::max);
    let types: Vec<String> = o
        .events
        .lock()
        .expect("events")
        .iter()
        .map(|(_, v)| v["type"].as_str().unwrap_or("?").to_owned())
        .collect();
    let seen = seen.unwrap_or_else(|| {
        panic!(
            "nothing on NATS within {wait_s} s of a stalled carrier (events {types:?}, \
             queue gauge max {gauge_max} bytes); the door's socket 10 s into the stall:\n{midway}"
        )
    });
    assert!(
        !gauge.is_empty(),
        "the door exports no outbound queue gauge"
    );
    let at = o
        .events
        .lock()
        .expect("events")
        .iter()
        .find(|(_, v)| signal(v))
        .map(|(t, _)| t - stalled_at)
        .unwrap_or(f64::NAN);
    eprintln!(
        "{id}: {seen} {at:.2} s after the carrier stalled; events {types:?}; outbound queue gauge max {gauge_max} bytes"
    );
    // The first word is the explicit one: the bot audio it will not play.
    assert_eq!(seen["type"], "overload", "{seen}");
    assert_eq!(seen["source"], "bot_audio", "{seen}");
    assert_eq!(seen["reason"], "carrier_stalled", "{seen}");
    assert!(
        gauge_max <= OUT_MAX_BYTES,
        "the outbound queue exceeded its bound: {gauge_max}"
    );
    o.carrier.hang_up();
    drop(o.carrier);
}

/// The door's outbound queue gauge (bytes), summed over its samples; None when the
/// metric is absent.
async fn queue_gauge(bin: &Binary) -> Option<f64> {
    let (_, body) = support::http_get(bin.admin, "/metrics").await;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with(QUEUE_GAUGE))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// `ss -tnm` of the door's side of its connections (a diagnostic: the kernel's send
/// queue towards a carrier that stopped reading).
fn socket_queues(port: u16) -> String {
    std::process::Command::new("ss")
        .args(["-tnm", &format!("sport = :{port}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("(ss: {e})"))
}
