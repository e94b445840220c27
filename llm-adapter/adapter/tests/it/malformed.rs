//! Malformed messages cost the adapter nothing, over a real nats-server: a client
//! allowed to publish sends messages whose framing is valid but whose content no NATS
//! client library would write (a non-UTF-8 reply subject, a header block that is not
//! one, a non-UTF-8 header value, a non-UTF-8 subject under a wildcard service
//! subject), while callers keep the adapter busy. nats-server relays them unchecked;
//! async-nats 0.51 dropped its connection on each, losing every request in flight
//! (docs/operations.md, "A malformed message and the NATS client"). With the vendored
//! client (vendor/README.md) the adapter keeps its connection: 0 disconnects, every
//! caller answered, each bad message counted in `nats.malformed`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{STEP, eventually};
use weir_llm_adapter::{AdapterHandle, Config};
use weir_testkit::NatsServer;
use weir_testkit::raw::{RawConnection, malformed_messages, non_utf8_subject};

/// Requests the callers send during one case, at least (they go on until the last
/// malformed message was sent).
const REQUESTS: u64 = 400;
/// Callers sending at once (each waits for its answer before the next request).
const CALLERS: u64 = 20;
/// Malformed messages injected during one case.
const MALFORMED: usize = 10;
/// A caller's bound on one request (every answer takes milliseconds here).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

async fn adapter(server: &NatsServer, toml: &str) -> AdapterHandle {
    let config = Config::from_toml_str(toml).expect("valid config");
    common::adapter_like_the_binary(server, config, Duration::from_millis(1)).await
}

/// What one case measured.
#[derive(Debug)]
struct Outcome {
    sent: u64,
    answered: u64,
    lost: u64,
    disconnects: u64,
    malformed: u64,
}

/// Starts the adapter on `toml`, runs [`REQUESTS`] requests to `subject` from
/// [`CALLERS`] callers and meanwhile sends [`MALFORMED`] messages, cycling through
/// `bad`, from a raw connection.
async fn under_load(toml: &str, subject: &'static str, bad: Vec<Vec<u8>>) -> Outcome {
    let server = NatsServer::start().expect("nats-server");
    let a = adapter(&server, toml).await;
    let caller = common::connect(server.url()).await;
    let answered = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let injected = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let (caller, answered, lost) = (caller.clone(), answered.clone(), lost.clone());
        let injected = injected.clone();
        callers.push(tokio::spawn(async move {
            let mut sent = 0;
            // Bounded: the injector takes about MALFORMED × 20 ms.
            while sent < REQUESTS / CALLERS || (!injected.load(Ordering::Relaxed) && sent < 10_000)
            {
                sent += 1;
                let request = caller.request(subject, Bytes::from_static(b"{}"));
                match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
                    Ok(Ok(_)) => answered.fetch_add(1, Ordering::Relaxed),
                    _ => lost.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    // Inject while the callers run: after the first answers, one message every 20 ms.
    eventually(STEP, || answered.load(Ordering::Relaxed) >= CALLERS).await;
    let port = server.port();
    let injector = tokio::task::spawn_blocking(move || {
        let mut raw = RawConnection::connect(port, None).expect("raw connection");
        for m in bad.iter().cycle().take(MALFORMED) {
            raw.send(m).expect("send");
            std::thread::sleep(Duration::from_millis(20));
        }
        raw.ping().expect("the server took every message")
    });
    let seen = injector.await.expect("injector");
    injected.store(true, Ordering::Relaxed);
    assert!(
        !seen.contains("-ERR"),
        "the server refused a message: {seen}"
    );
    for c in callers {
        tokio::time::timeout(STEP * 3, c)
            .await
            .expect("callers finish")
            .expect("caller task");
    }
    eventually(STEP, || a.stats().nats.malformed >= MALFORMED as u64).await;
    let nats = a.stats().nats;
    let (answered, lost) = (
        answered.load(Ordering::Relaxed),
        lost.load(Ordering::Relaxed),
    );
    let outcome = Outcome {
        sent: answered + lost,
        answered,
        lost,
        disconnects: nats.disconnects,
        malformed: nats.malformed,
    };
    eprintln!("{subject}: {outcome:?}");
    a.shutdown().await;
    outcome
}

fn assert_cost_nothing(o: &Outcome) {
    assert_eq!(o.disconnects, 0, "{o:?}");
    assert_eq!(o.lost, 0, "{o:?}");
    assert!(o.answered >= REQUESTS && o.answered == o.sent, "{o:?}");
    assert_eq!(
        o.malformed, MALFORMED as u64,
        "each bad message counted once: {o:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reply_subjects_and_header_blocks_on_the_service_subject_lose_nothing() {
    let o = under_load("", "llm.infer", malformed_messages("llm.infer")).await;
    assert_cost_nothing(&o);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_utf8_subject_under_a_wildcard_service_subject_loses_nothing() {
    let o = under_load(
        "[service]\nsubject = \"wild.*\"\n",
        "wild.a",
        vec![non_utf8_subject("wild")],
    )
    .await;
    assert_cost_nothing(&o);
}

/// A request whose header block the client cannot read arrives without headers and is
/// answered like any request without them (as nats.go passes such a message through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_a_broken_header_block_is_answered_without_its_headers() {
    let server = NatsServer::start().expect("nats-server");
    let a = adapter(&server, "").await;
    let watcher = common::connect(server.url()).await;
    let mut replies = watcher.subscribe("_INBOX.watch").await.expect("subscribe");
    watcher.flush().await.expect("flush");
    let port = server.port();
    tokio::task::spawn_blocking(move || {
        let mut raw = RawConnection::connect(port, None).expect("raw connection");
        raw.send(b"HPUB llm.infer _INBOX.watch 12 14\r\nGARBAGE\xff\r\n\r\n{}\r\n")
            .expect("send");
        raw.ping().expect("pong")
    })
    .await
    .expect("raw");
    let reply = tokio::time::timeout(STEP, futures::StreamExt::next(&mut replies))
        .await
        .expect("answered in time")
        .expect("a reply");
    assert!(
        reply
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Service-Error-Code"))
            .is_none(),
        "served like a request without headers: {reply:?}"
    );
    assert_eq!(a.stats().nats.disconnects, 0);
    assert_eq!(a.stats().nats.malformed, 1);
    a.shutdown().await;
}
