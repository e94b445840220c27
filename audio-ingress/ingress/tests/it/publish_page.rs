//! The reference browser publisher (`static/publish.html`, `publish_page = true`) in
//! headless Chromium (Debian's package; `scripts/ensure-chromium`), driven over the
//! DevTools protocol by `tests/python/publish_driver.py`, against the real
//! `audio-ingress serve` binary and a real `nats-server`, on loopback only.
//!
//! The browser's microphone is a fake device playing `tests/data/publish-speech.wav` once
//! (then silence): 4.08 s of speech made once with espeak-ng (`espeak-ng -s 170 -w` "Hello from the
//! browser. Weir carries this voice, frame by frame.", resampled to 16 kHz mono) and
//! checked in, so that the test needs no speech synthesiser.
//!
//! What the page must show, read from its DOM (`#state`, the `#events` items' `data-*`),
//! with a screenshot of each state (in `CARGO_TARGET_TMPDIR/publish-page/`; the docs'
//! `docs/images/publish-*.png` are copies):
//! - served from **another origin** (the driver's own HTTP server, `?ingress=` pointing
//!   at the ingress), with a producer token (`auth_required`; so the POST and the
//!   DELETE are preflighted with `Authorization`): "publishing", and the frames on NATS carry the WAV — the speech
//!   envelope (RMS over 20 ms, 10 ms hop) of what the subscriber got correlates ≥ 0.9
//!   with the WAV's (followed by silence) at the best offset; Stop → DELETE → `closed` (`producer`);
//! - served by the ingress at `/publish`, `max_streams = 1` reached: the refusal, its
//!   code and the `Retry-After` time;
//! - nats-server SIGSTOPped under a publishing page: the `overload` event, worded,
//!   then (after SIGCONT) `closed` with reason `overload`;
//! - a network blip: the WHIP UDP port dropped on loopback (nftables, root) until the
//!   page notices (3 s without a byte from the service), then let through: the page
//!   shows "reconnecting", resumes with its `Weir-Resume-Token` (a new WHIP session),
//!   shows `resumed` and the `resume` gap; on NATS the same stream goes on (seq
//!   continuing, one gap over the hole, one `end` at Stop).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use weir_testkit::NatsServer;

use crate::support::Binary;
use crate::whip_support::{record, wait_for};

/// The producer-token secret of the test's ingress (`auth_required`): the page sends
/// its token as `Authorization: Bearer`, so the cross-origin POST and DELETE need a
/// CORS preflight that allows it.
const SECRET: &str = "publish-page-test-secret-0123456789abcdef";

/// A producer token for every stream id starting with `page-`.
fn token() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_audio-ingress"))
        .args(["token", "--stream-prefix", "page-"])
        .env("WEIR_INGRESS_AUTH_HS256_SECRET", SECRET)
        .output()
        .expect("audio-ingress token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Speech envelope correlation the frames on NATS must reach against the WAV.
const MIN_ENVELOPE_CORRELATION: f64 = 0.9;

/// The checked-in speech the fake microphone plays.
fn speech_wav() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/publish-speech.wav")
}

/// Where the screenshots go.
fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("publish-page");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// Chromium: `CHROMIUM_BIN`, else what `scripts/ensure-chromium` finds or installs.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("CHROMIUM_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ensure-chromium");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/ensure-chromium failed (the publisher page's tests need Debian's chromium; \
         or set CHROMIUM_BIN):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The DevTools driver and its browser (both killed on drop).
struct Browser {
    child: Child,
    stdin: ChildStdin,
    answers: std::sync::mpsc::Receiver<Value>,
}

impl Browser {
    fn start(wav: &Path) -> Self {
        let mut child = Command::new(weir_audio_consumer::testing::python())
            .arg(crate::support::script("publish_driver.py"))
            .arg("--chromium")
            .arg(chromium())
            .arg("--wav")
            .arg(wav)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the DevTools driver");
        let stdin = child.stdin.take().expect("stdin");
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        // A reader thread, so that every answer is awaited with a bound.
        let (tx, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&line).unwrap_or(json!({"ok": false, "line": line}));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let mut b = Self {
            child,
            stdin,
            answers,
        };
        let ready = b.answer(Duration::from_secs(30));
        assert_eq!(ready["ready"], true, "the driver started chromium: {ready}");
        b
    }

    fn answer(&mut self, bound: Duration) -> Value {
        self.answers
            .recv_timeout(bound)
            .unwrap_or_else(|e| panic!("no answer from the DevTools driver within {bound:?}: {e}"))
    }

    /// Sends one command; its answer (asserted `ok`).
    fn cmd(&mut self, cmd: Value) -> Value {
        let bound = Duration::from_secs_f64(cmd["timeout_s"].as_f64().unwrap_or(0.0) + 15.0);
        writeln!(self.stdin, "{cmd}").expect("write to the driver");
        self.stdin.flush().expect("flush");
        let a = self.answer(bound);
        assert_eq!(a["ok"], true, "{cmd} -> {a}");
        a
    }

    fn serve(&mut self, dir: &Path) -> String {
        let a = self.cmd(json!({"cmd": "serve", "dir": dir}));
        a["origin"].as_str().expect("origin").to_owned()
    }

    fn open(&mut self, tab: &str, url: &str) {
        self.cmd(json!({"cmd": "open", "tab": tab, "url": url}));
        self.wait(
            tab,
            "document.readyState === 'complete' && !!document.getElementById('start')",
            10.0,
        );
    }

    fn eval(&mut self, tab: &str, expr: &str) -> Value {
        self.cmd(json!({"cmd": "eval", "tab": tab, "expr": expr}))["value"].clone()
    }

    /// Waits until `expr` is truthy in `tab`; panics with the page's state otherwise.
    fn wait(&mut self, tab: &str, expr: &str, timeout_s: f64) -> f64 {
        let cmd = json!({"cmd": "wait", "tab": tab, "expr": expr, "timeout_s": timeout_s});
        writeln!(self.stdin, "{cmd}").expect("write to the driver");
        self.stdin.flush().expect("flush");
        let a = self.answer(Duration::from_secs_f64(timeout_s + 15.0));
        if a["ok"] != true {
            let state = self.state(tab);
            let events = self.events(tab);
            panic!(
                "{tab}: `{expr}` not true within {timeout_s} s ({a}); state {state}, events {events:#?}"
            );
        }
        a["after_s"].as_f64().unwrap_or(0.0)
    }

    fn wait_state(&mut self, tab: &str, state: &str, timeout_s: f64) -> f64 {
        self.wait(
            tab,
            &format!("document.getElementById('state').dataset.state === {state:?}"),
            timeout_s,
        )
    }

    fn wait_event(&mut self, tab: &str, kind: &str, timeout_s: f64) -> f64 {
        self.wait(
            tab,
            &format!("!!document.querySelector('#events li[data-type={kind:?}]')"),
            timeout_s,
        )
    }

    fn state(&mut self, tab: &str) -> String {
        self.eval(tab, "document.getElementById('state').dataset.state")
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The page's event list, oldest first: type, code, retry_after, text.
    fn events(&mut self, tab: &str) -> Vec<Value> {
        let v = self.eval(
            tab,
            "[...document.querySelectorAll('#events li')].reverse().map(li => ({type: li.dataset.type, \
             code: li.dataset.code || null, retry_after: li.dataset.retryAfter || null, text: li.innerText}))",
        );
        v.as_array().cloned().unwrap_or_default()
    }

    fn event(&mut self, tab: &str, kind: &str) -> Value {
        let events = self.events(tab);
        events
            .iter()
            .find(|e| e["type"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("{tab}: no {kind} event: {events:#?}"))
    }

    fn click(&mut self, tab: &str, id: &str) {
        self.eval(
            tab,
            &format!("document.getElementById({id:?}).click(), true"),
        );
    }

    fn screenshot(&mut self, tab: &str, name: &str) -> PathBuf {
        let path = screenshots().join(format!("publish-{name}.png"));
        self.cmd(json!({"cmd": "screenshot", "tab": tab, "path": path}));
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"cmd": "quit"}));
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The samples of a 16-bit PCM mono WAV file, and its rate.
fn read_wav(path: &Path) -> (Vec<i16>, u32) {
    let b = std::fs::read(path).expect("read wav");
    assert_eq!(&b[0..4], b"RIFF", "not a WAV file");
    let (mut at, mut rate, mut pcm) = (12, 0, Vec::new());
    while at + 8 <= b.len() {
        let id = &b[at..at + 4];
        let len = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]) as usize;
        let body = &b[at + 8..(at + 8 + len).min(b.len())];
        if id == b"fmt " {
            assert_eq!(u16::from_le_bytes([body[0], body[1]]), 1, "PCM");
            assert_eq!(u16::from_le_bytes([body[2], body[3]]), 1, "mono");
            rate = u32::from_le_bytes([body[4], body[5], body[6], body[7]]);
            assert_eq!(u16::from_le_bytes([body[14], body[15]]), 16, "16-bit");
        } else if id == b"data" {
            pcm = body
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]))
                .collect();
        }
        at += 8 + len + (len & 1);
    }
    (pcm, rate)
}

/// RMS over 20 ms windows every 10 ms (16 kHz samples): the speech envelope.
fn envelope(pcm: &[i16]) -> Vec<f64> {
    const WINDOW: usize = 320;
    const HOP: usize = 160;
    (0..pcm.len().saturating_sub(WINDOW) / HOP)
        .map(|i| {
            let w = &pcm[i * HOP..i * HOP + WINDOW];
            (w.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / WINDOW as f64).sqrt()
        })
        .collect()
}

/// Pearson correlation of two equally long series.
fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut ab, mut aa, mut bb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        ab += (x - ma) * (y - mb);
        aa += (x - ma).powi(2);
        bb += (y - mb).powi(2);
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    ab / (aa * bb).sqrt()
}

/// The best envelope correlation of `got` against `source` played once from an unknown
/// point, then silence (the fake microphone plays its file once from when the page took
/// it, and the page starts sending a moment later): (correlation, offset into `source`
/// in 10 ms hops). Compared over `got`'s first [`COMPARED`] hops.
fn envelope_correlation(source: &[i16], got: &[i16]) -> (f64, usize) {
    let padded: Vec<i16> = source
        .iter()
        .copied()
        .chain(std::iter::repeat_n(0, got.len()))
        .collect();
    let (want, have) = (envelope(&padded), envelope(got));
    let have = &have[..have.len().min(COMPARED)];
    (0..source.len() / 160 / 2)
        .filter(|lag| lag + have.len() <= want.len())
        .map(|lag| (pearson(have, &want[lag..lag + have.len()]), lag))
        .fold((f64::MIN, 0), |b, c| if c.0 > b.0 { c } else { b })
}

/// The envelope hops compared: 4 s.
const COMPARED: usize = 400;

/// A directory holding the page, for the driver to serve from another origin.
fn page_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("publish.html"),
        weir_audio_ingress::publish::PAGE,
    )
    .expect("write the page");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_page_cross_origin_speech_refusal_and_overload_in_headless_chromium() {
    let t0 = Instant::now();
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[
            ("whip_udp_listen", "127.0.0.1:0"),
            ("publish_page", "true"),
            ("max_streams", "1"),
            ("auth_required", "true"),
            ("auth_hs256_secret", SECRET),
        ],
    )
    .await;
    let logs = record(nats.url()).await;
    let (source, rate) = read_wav(&speech_wav());
    assert_eq!(rate, 16_000, "the checked-in WAV is 16 kHz");
    let pages = page_dir();
    let ingress = format!("http://{}", bin.ws);
    let token = token();

    // The browser is blocking I/O: it runs on its own thread, the test's async side
    // (the NATS recorder, the ingress) on the runtime.
    let mut b = tokio::task::block_in_place(|| Browser::start(&speech_wav()));
    let origin = tokio::task::block_in_place(|| b.serve(pages.path()));
    assert_ne!(origin, ingress, "another origin");

    // 1. Cross-origin: publishing; the speech reaches NATS.
    tokio::task::block_in_place(|| {
        b.open(
            "a",
            &format!("{origin}/publish.html?stream=page-speech&token={token}&ingress={ingress}"),
        );
        b.click("a", "start");
        let after = b.wait_state("a", "publishing", 15.0);
        eprintln!("publishing {after:.2} s after Start");
    });
    // The WAV (4.08 s, from when the page took the microphone) and a little silence.
    assert!(
        wait_for(&logs, Duration::from_secs(15), |l| l
            .get("page-speech")
            .is_some_and(|s| s.frames.len() >= 225))
        .await,
        "4.5 s of the page's audio on NATS"
    );
    tokio::task::block_in_place(|| {
        b.screenshot("a", "publishing");
        let seconds: f64 = b
            .eval("a", "document.getElementById('seconds').textContent")
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        assert!(seconds >= 4.0, "seconds published shown: {seconds}");

        // 2. Same origin, from the ingress's /publish: refused, max_streams reached.
        b.open(
            "b",
            &format!("{ingress}/publish?stream=page-refused&token={token}"),
        );
        b.click("b", "start");
        b.wait_state("b", "refused", 15.0);
        let refused = b.event("b", "refused");
        assert_eq!(refused["code"], "max_streams", "{refused}");
        assert_eq!(refused["retry_after"], "1", "{refused}");
        let text = refused["text"].as_str().unwrap_or_default();
        assert!(
            text.contains("as many calls as it can") && text.contains("Try again in 1 s"),
            "{text}"
        );
        b.screenshot("b", "refused");

        // Stop: DELETE, `closed` with reason `producer`.
        b.click("a", "stop");
        b.wait_state("a", "stopped", 10.0);
        b.wait_event("a", "closed", 3.0);
        let closed = b.event("a", "closed");
        assert_eq!(closed["code"], "producer", "{closed}");
        b.screenshot("a", "stopped");
    });
    assert!(
        wait_for(&logs, Duration::from_secs(5), |l| l
            .get("page-speech")
            .is_some_and(|s| s.end.is_some()))
        .await,
        "the end reached NATS"
    );
    let log = logs.lock().expect("logs")["page-speech"].clone();
    assert_eq!(log.end.as_deref(), Some("producer"));
    let seqs: Vec<u64> = log.frames.iter().map(|(s, _)| *s).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "frames in order, no hole"
    );
    // The first 10 frames (the codec and the jitter buffer settling) are left out.
    let got: Vec<i16> = log.frames[10..]
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .collect();
    // Kept beside the screenshots, to listen to when the correlation fails.
    let raw: Vec<u8> = got.iter().flat_map(|s| s.to_le_bytes()).collect();
    std::fs::write(screenshots().join("page-speech.s16le"), raw).expect("write the PCM");
    let (corr, lag) = envelope_correlation(&source, &got);
    eprintln!(
        "page → WHIP → NATS: {} frames, speech envelope correlation {corr:.4} at {} ms into the WAV",
        log.frames.len(),
        lag * 10
    );
    assert!(
        corr >= MIN_ENVELOPE_CORRELATION,
        "the frames on NATS do not carry the WAV: envelope correlation {corr:.4}"
    );

    // 3. NATS stopped under a publishing page: the overload, worded.
    tokio::task::block_in_place(|| {
        b.eval(
            "a",
            "document.getElementById('stream').value = 'page-overload', true",
        );
        b.click("a", "start");
        b.wait_state("a", "publishing", 15.0);
    });
    assert!(
        wait_for(&logs, Duration::from_secs(10), |l| l
            .get("page-overload")
            .is_some_and(|s| s.frames.len() >= 25))
        .await,
        "half a second of audio first"
    );
    nats.pause().expect("SIGSTOP nats-server");
    let signalled = tokio::task::block_in_place(|| {
        let after = b.wait_event("a", "overload", 5.0);
        b.screenshot("a", "overload");
        (after, b.event("a", "overload"), b.state("a"))
    });
    nats.resume().expect("SIGCONT nats-server");
    let (after, overload, state) = signalled;
    eprintln!("overload shown {after:.2} s after SIGSTOP: {overload}");
    assert_eq!(state, "overloaded");
    let text = overload["text"].as_str().unwrap_or_default();
    assert!(
        ["queue_full", "max_age", "publish_timeout"]
            .contains(&overload["code"].as_str().unwrap_or_default()),
        "{overload}"
    );
    assert!(
        text.contains("ended rather than fall further behind"),
        "{text}"
    );
    tokio::task::block_in_place(|| {
        b.wait_event("a", "closed", 10.0);
        b.wait_state("a", "ended", 5.0);
        let closed = b
            .events("a")
            .into_iter()
            .rfind(|e| e["type"] == "closed")
            .expect("closed");
        assert_eq!(closed["code"], "overload", "{closed}");
    });
    eprintln!(
        "publisher page test: {:.1} s; screenshots in {}",
        t0.elapsed().as_secs_f64(),
        screenshots().display()
    );
}

/// nftables rules that drop the WHIP UDP port on loopback (both directions) while
/// held: a network blip for the page's one WebRTC connection, nothing else touched.
/// Needs root (`nft`, from Debian's nftables; `scripts/ensure-chromium` installs it).
struct Blip {
    table: String,
}

impl Blip {
    fn start(port: u16) -> Self {
        let table = format!("weir_blip_{}", std::process::id());
        let script = format!(
            "add table inet {table}\n\
             add chain inet {table} input {{ type filter hook input priority 0; policy accept; }}\n\
             add rule inet {table} input iifname \"lo\" udp dport {port} drop\n\
             add rule inet {table} input iifname \"lo\" udp sport {port} drop\n"
        );
        let mut nft = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .expect("run nft (root and Debian's nftables: scripts/ensure-chromium installs it)");
        nft.stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("write the rules");
        let status = nft.wait().expect("nft");
        assert!(
            status.success(),
            "nft refused the rules (root is needed): {status}"
        );
        Self { table }
    }
}

impl Drop for Blip {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_page_resumes_the_same_stream_after_a_network_blip_in_headless_chromium() {
    let t0 = Instant::now();
    let nats = NatsServer::start().expect("nats-server");
    let bin = Binary::start_ready(
        nats.url(),
        &[
            ("whip_udp_listen", "127.0.0.1:0"),
            ("publish_page", "true"),
            ("resume_window_ms", "10000"),
            ("extended_consumers", "true"),
        ],
    )
    .await;
    let (_, whip) = crate::support::http_get(bin.admin, "/v1/whip").await;
    let whip: Value = serde_json::from_str(&whip).expect("/v1/whip JSON");
    let port: u16 = whip["udp"]
        .as_str()
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.port())
        .expect("the WHIP UDP port");
    let logs = record(nats.url()).await;
    let mut b = tokio::task::block_in_place(|| Browser::start(&speech_wav()));
    tokio::task::block_in_place(|| {
        b.open(
            "r",
            &format!("http://{}/publish?stream=page-resume", bin.ws),
        );
        b.click("r", "start");
        b.wait_state("r", "publishing", 15.0);
    });
    assert!(
        wait_for(&logs, Duration::from_secs(10), |l| l
            .get("page-resume")
            .is_some_and(|s| s.frames.len() >= 50))
        .await,
        "a second of audio first"
    );
    // The blip lasts until the page noticed it (3 s without a byte from the service).
    let blip = Blip::start(port);
    let blipped = Instant::now();
    let (noticed, lost_at) = tokio::task::block_in_place(|| {
        let after = b.wait_state("r", "reconnecting", 10.0);
        b.screenshot("r", "reconnecting");
        (after, blipped.elapsed())
    });
    let frames_before = logs.lock().expect("logs")["page-resume"].frames.len();
    drop(blip);
    eprintln!(
        "blip: UDP {port} dropped for {:.2} s; the page noticed after {noticed:.2} s",
        lost_at.as_secs_f64()
    );
    let (resumed, gap) = tokio::task::block_in_place(|| {
        let back = b.wait_state("r", "publishing", 15.0);
        b.wait_event("r", "resumed", 5.0);
        // The loss is declared with the new session's first audio.
        b.wait(
            "r",
            "!!document.querySelector('#events li[data-type=\"gap\"][data-code=\"resume\"]')",
            5.0,
        );
        b.screenshot("r", "resumed");
        eprintln!("publishing again {back:.2} s after the blip ended");
        (b.event("r", "resumed"), b.event("r", "gap"))
    });
    eprintln!("page: {resumed}\npage: {gap}");
    assert!(
        gap["text"]
            .as_str()
            .is_some_and(|t| t.contains("because the connection dropped")),
        "{gap}"
    );
    assert!(
        wait_for(&logs, Duration::from_secs(10), |l| l
            .get("page-resume")
            .is_some_and(|s| s.frames.len() >= frames_before + 50))
        .await,
        "a second of audio after the resume, on the same stream"
    );
    tokio::task::block_in_place(|| {
        b.click("r", "stop");
        b.wait_state("r", "stopped", 10.0);
    });
    assert!(
        wait_for(&logs, Duration::from_secs(5), |l| l
            .get("page-resume")
            .is_some_and(|s| s.end.is_some()))
        .await,
        "the end reached NATS"
    );
    let log = logs.lock().expect("logs")["page-resume"].clone();
    assert_eq!(
        log.end.as_deref(),
        Some("producer"),
        "one stream, ended by Stop"
    );
    let seqs: Vec<u64> = log.frames.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs.first(), Some(&1));
    assert!(
        seqs.windows(2).all(|w| w[1] > w[0]),
        "seq continues across the resume (no restart, no duplicate)"
    );
    assert_eq!(
        log.gaps, 1,
        "the audio lost in the blip is declared as one gap"
    );
    let hole = seqs.windows(2).map(|w| w[1] - w[0] - 1).max().unwrap_or(0);
    assert!(
        hole >= 50,
        "the blip ({lost_at:?}) is a hole in seq, covered by the gap: {hole} frames"
    );
    eprintln!(
        "publisher page resume test: {:.1} s, {} frames, one gap of {hole} frames",
        t0.elapsed().as_secs_f64(),
        log.frames.len(),
    );
}
