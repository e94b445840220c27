//! Test support (feature `testing`, never in a production build), shared by the
//! integration tests of `weir-audio-consumer` and `weir-audio-ingress`: a NATS client with short
//! timeouts, bounded publish and flush of test packets, and a [`Recorder`] handler that
//! writes every event a stream instance sees into a shared [`Book`].
//!
//! Every wait here is bounded: a helper that cannot finish in time panics with what it
//! was waiting for, so a broken test fails instead of hanging.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{StreamEvent, StreamHandler, StreamInfo};
use async_nats::HeaderMap;
use bytes::Bytes;
use weir_protocol::audio::Packet;

/// Short client timeouts, as NATS-FACTS asks for tests.
pub fn connect_options() -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .ping_interval(Duration::from_secs(1))
}

/// A plain client for publishing test packets.
pub async fn client(url: &str) -> async_nats::Client {
    tokio::time::timeout(Duration::from_secs(3), connect_options().connect(url))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// 640 bytes of PCM whose content depends on `seq`.
pub fn pcm(seq: u64) -> Bytes {
    Bytes::from(
        (0..640u64)
            .map(|i| ((seq * 7 + i) % 251) as u8)
            .collect::<Vec<u8>>(),
    )
}

/// Publishes one packet (bounded), with optional headers.
pub async fn publish(
    client: &async_nats::Client,
    subject: &str,
    packet: Packet,
    headers: &[(&str, &str)],
) {
    publish_raw(
        client,
        subject,
        packet.encode().expect("encodable"),
        headers,
    )
    .await;
}

/// Publishes raw bytes (bounded), with optional headers.
pub async fn publish_raw(
    client: &async_nats::Client,
    subject: &str,
    payload: Bytes,
    headers: &[(&str, &str)],
) {
    let subject = subject.to_owned();
    let fut = async {
        if headers.is_empty() {
            client.publish(subject, payload).await
        } else {
            let mut map = HeaderMap::new();
            for (k, v) in headers {
                map.insert(*k, *v);
            }
            client.publish_with_headers(subject, map, payload).await
        }
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .expect("publish in time")
        .expect("publish");
}

/// Flushes (bounded).
pub async fn flush(client: &async_nats::Client) {
    tokio::time::timeout(Duration::from_secs(3), client.flush())
        .await
        .expect("flush in time")
        .expect("flush");
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (at most 5 s) until every stream instance of `consumer` has been handled to
/// its end (its handler task finished), so that what the handlers recorded is complete.
pub async fn wait_handlers_done(consumer: &crate::Consumer) {
    let done = wait_until(Duration::from_secs(5), || {
        consumer.stats().totals.streams_active == 0
    })
    .await;
    assert!(done, "handlers still busy: {:?}", consumer.stats().totals);
}

/// What one handler saw.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Which consumer (test label).
    pub consumer: String,
    /// Stream info.
    pub info: Option<StreamInfo>,
    /// Frame seqs in delivery order.
    pub frames: Vec<u64>,
    /// Gap notices: (first seq, last seq, cause).
    pub gaps: Vec<(u64, u64, String)>,
    /// Loss declarations: (first seq, last seq, frames re-labelled).
    pub declared: Vec<(u64, u64, u64)>,
    /// Frame capture times (`captured_at_ms`), in delivery order.
    pub captured: Vec<Option<u64>>,
    /// Every event in order, short: `f7`, `Stale4-6`, `declared4-6:3`, `end:producer`.
    pub timeline: Vec<String>,
    /// The end cause name, once ended.
    pub end: Option<String>,
    /// Events after the end (must stay 0).
    pub after_end: u32,
}

/// Every handler's record, keyed by (stream id, instance).
pub type Book = Arc<Mutex<HashMap<(String, u64), Seen>>>;

/// A handler that writes what it sees into a shared [`Book`].
pub struct Recorder {
    key: (String, u64),
    book: Book,
}

impl Recorder {
    /// A factory labelled `consumer` writing into `book`.
    pub fn factory(
        consumer: &str,
        book: Book,
    ) -> impl Fn(&StreamInfo) -> Recorder + Send + Sync + 'static {
        let consumer = consumer.to_owned();
        move |info: &StreamInfo| {
            let key = (info.stream.clone(), info.instance);
            book.lock().expect("book").insert(
                key.clone(),
                Seen {
                    consumer: consumer.clone(),
                    info: Some(info.clone()),
                    ..Seen::default()
                },
            );
            Recorder {
                key,
                book: book.clone(),
            }
        }
    }
}

impl StreamHandler for Recorder {
    async fn on_event(&mut self, event: StreamEvent) {
        let mut book = self.book.lock().expect("book");
        let Some(seen) = book.get_mut(&self.key) else {
            return;
        };
        if seen.end.is_some() {
            seen.after_end += 1;
            return;
        }
        match event {
            StreamEvent::Frame(f) => {
                seen.timeline.push(format!("f{}", f.seq));
                seen.frames.push(f.seq);
                seen.captured.push(f.captured_at_ms);
            }
            StreamEvent::Gap(g) => {
                let cause = format!("{:?}", g.cause);
                seen.timeline
                    .push(format!("{cause}{}-{}", g.first_seq, g.last_seq));
                seen.gaps.push((g.first_seq, g.last_seq, cause))
            }
            StreamEvent::End(e) => {
                seen.timeline.push(format!("end:{}", e.cause.as_str()));
                seen.end = Some(e.cause.as_str().to_owned())
            }
            StreamEvent::LossDeclared(d) => {
                seen.timeline.push(format!(
                    "declared{}-{}:{}",
                    d.first_seq, d.last_seq, d.reclassified_frames
                ));
                seen.declared
                    .push((d.first_seq, d.last_seq, d.reclassified_frames))
            }
        }
    }
}

/// The Python with nats-py ([`weir_testkit::python::python`]). Panics with a clear
/// message when it cannot import nats: the interop check must not pass silently.
pub fn python() -> PathBuf {
    let py = weir_testkit::python::python();
    let check = Command::new(&py)
        .args(["-c", "import nats"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} ({e}); set WEIR_PYTHON", py.display()));
    assert!(
        check.status.success(),
        "{} cannot import nats (nats-py); run scripts/ensure-python-env: {}",
        py.display(),
        String::from_utf8_lossy(&check.stderr)
    );
    py
}
