//! The naive recogniser, as deployed: a wildcard subscriber that keeps every stream's
//! audio in an unbounded RAM buffer and feeds it, in order, to the recogniser.
//!
//! `workers` processes' worth of it (one NATS connection each, library defaults):
//! worker `w` subscribes `weir.audio.<p>.*` for every partition `p` with
//! `p mod workers == w` — the same split as weir's fleet ([`crate::fleet`]), so both
//! designs give each worker the same streams. Each subscriber reads every packet at
//! once into the stream's buffer (an unbounded channel); one task per stream takes the
//! frames out in order and runs each on the worker's GPU timeline ([`crate::gpu`]).
//! Nothing is ever refused or dropped, however old: a recogniser slower than real time
//! lets the buffer and the lag grow for as long as the call lasts — the failure the
//! load test shows. An `end` finishes the stream once its buffer is empty.
//!
//! Invariants: every frame received is counted as buffered until the GPU started it;
//! dropping the recogniser aborts its subscribers and, with them, its stream tasks.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use tokio::sync::mpsc;
use weir_protocol::audio::extension::headers;
use weir_protocol::audio::{DecodeOptions, PacketBody, decode};

use crate::counters::counters;
use crate::error::{Error, nats};
use crate::gpu::{AsrMeter, GpuModel, GpuTimeline};

counters! {
    /// The naive recognisers' counters.
    struct Counters;
    /// What the naive recognisers saw.
    pub struct NaiveAsrSnapshot {
        /// Frames in the RAM buffers now (received, not yet started by the GPU).
        buffered_frames,
        /// Most frames the RAM buffers held at once.
        buffered_frames_max,
        ;
    }
}

/// Running naive recognisers.
#[derive(Debug)]
pub struct NaiveAsr {
    workers: Vec<tokio::task::JoinHandle<()>>,
    counters: Arc<Counters>,
}

/// One stream's buffered item: a frame's capture time, or its end.
enum Item {
    Frame(Option<u64>),
    End,
}

impl NaiveAsr {
    /// Connects and subscribes every worker; returns once the server confirmed the
    /// subscriptions. `template` is the audio subject (`{partition}`, `{stream}`).
    pub async fn start(
        nats_url: &str,
        template: &str,
        partitions: u32,
        workers: u32,
        model: GpuModel,
        meter: Arc<AsrMeter>,
    ) -> Result<Self, Error> {
        let counters = Arc::new(Counters::default());
        let workers = workers.clamp(1, partitions.max(1));
        let mut tasks = Vec::new();
        for w in 0..workers {
            let client = async_nats::connect(nats_url)
                .await
                .map_err(|e| nats("naive recogniser: cannot connect", e))?;
            let mut subs = Vec::new();
            for p in (0..partitions).filter(|p| p % workers == w) {
                let subject = template
                    .replace("{partition}", &p.to_string())
                    .replace("{stream}", "*");
                subs.push(
                    client
                        .subscribe(subject)
                        .await
                        .map_err(|e| nats("naive recogniser: cannot subscribe", e))?,
                );
            }
            client
                .flush()
                .await
                .map_err(|e| nats("naive recogniser: cannot flush", e))?;
            let gpu = Arc::new(GpuTimeline::new(model));
            tasks.push(tokio::spawn(worker(
                client,
                futures::stream::select_all(subs),
                gpu,
                meter.clone(),
                counters.clone(),
            )));
        }
        Ok(Self {
            workers: tasks,
            counters,
        })
    }

    /// Frames received and not yet started by the GPU.
    pub fn buffered_frames(&self) -> u64 {
        self.counters.buffered_frames.load(Ordering::Relaxed)
    }

    /// A copy of the counters.
    pub fn snapshot(&self) -> NaiveAsrSnapshot {
        self.counters.snapshot()
    }
}

impl Drop for NaiveAsr {
    fn drop(&mut self) {
        for w in &self.workers {
            w.abort();
        }
    }
}

/// One worker: reads every packet into its stream's buffer; a task per stream feeds
/// the GPU. Ends when the subscriptions end (the worker is aborted on drop).
async fn worker(
    _client: async_nats::Client,
    mut messages: futures::stream::SelectAll<async_nats::Subscriber>,
    gpu: Arc<GpuTimeline>,
    meter: Arc<AsrMeter>,
    counters: Arc<Counters>,
) {
    let opts = DecodeOptions::default();
    let mut buffers: HashMap<String, mpsc::UnboundedSender<Item>> = HashMap::new();
    // Dropped (aborting every stream task) when the worker ends or is aborted.
    let mut streams = tokio::task::JoinSet::new();
    while let Some(msg) = messages.next().await {
        let Some(stream) = msg.subject.as_str().rsplit('.').next().map(str::to_owned) else {
            continue;
        };
        let Ok(packet) = decode(&msg.payload, &opts) else {
            continue;
        };
        let header_capture = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(headers::CAPTURED_AT_MS))
            .and_then(|v| v.as_str().parse::<u64>().ok());
        let item = match packet.body {
            PacketBody::Frame { .. } => {
                let now = counters.buffered_frames.fetch_add(1, Ordering::Relaxed) + 1;
                counters
                    .buffered_frames_max
                    .fetch_max(now, Ordering::Relaxed);
                Item::Frame(packet.captured_at_ms.or(header_capture))
            }
            PacketBody::End => Item::End,
            PacketBody::Gap(_) => continue,
        };
        let is_end = matches!(item, Item::End);
        let tx = buffers.entry(stream.clone()).or_insert_with(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            streams.spawn(feed(rx, gpu.clone(), meter.clone(), counters.clone()));
            tx
        });
        let _ = tx.send(item);
        if is_end {
            // The stream's task finishes its buffer, then ends.
            buffers.remove(&stream);
        }
        // Reap finished stream tasks as they come.
        while streams.try_join_next().is_some() {}
    }
}

/// One stream: its buffered frames, in order, on the worker's GPU.
async fn feed(
    mut rx: mpsc::UnboundedReceiver<Item>,
    gpu: Arc<GpuTimeline>,
    meter: Arc<AsrMeter>,
    counters: Arc<Counters>,
) {
    while let Some(item) = rx.recv().await {
        match item {
            Item::Frame(captured_at_ms) => {
                meter.run_frame(&gpu, captured_at_ms).await;
                counters.buffered_frames.fetch_sub(1, Ordering::Relaxed);
            }
            Item::End => return,
        }
    }
}
