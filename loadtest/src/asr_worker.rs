//! The hidden `asr-worker` subcommand: one recognition worker as a process of its own,
//! so that `asr-churn` can SIGKILL it for real (see [`crate::scenario::asr::churn`]).
//!
//! The worker runs weir's consumer core with static ownership of `--owned`,
//! `max_streams` = `--slots`, the capacity announcements at their defaults, and a
//! handler that runs every frame on the process's GPU timeline ([`crate::gpu`]).
//!
//! Invariants: the process ends on SIGINT (graceful: its last announcement says it
//! delivers nothing), on SIGKILL, or after `--max-lifetime-s`, so that a worker whose
//! load test died does not stay behind.

use std::sync::Arc;
use std::time::Duration;

use weir_audio_consumer::{Consumer, ConsumerConfig, StreamEvent, StreamHandler, StreamInfo};

use crate::cli::AsrWorkerArgs;
use crate::error::{Error, ErrorKind};
use crate::gpu::{GpuModel, GpuTimeline};

struct GpuHandler {
    gpu: Arc<GpuTimeline>,
}

impl StreamHandler for GpuHandler {
    async fn on_event(&mut self, event: StreamEvent) {
        if let StreamEvent::Frame(_) = event {
            self.gpu.run_frame().await;
        }
    }
}

/// Runs the worker until SIGINT or its maximum lifetime.
pub async fn run(args: AsrWorkerArgs) -> Result<(), Error> {
    let settings = ConsumerConfig {
        max_streams: args.slots as usize,
        ..ConsumerConfig::partitioned(&args.subject, args.partitions, args.owned.clone())
    }
    .validate()
    .map_err(|e| Error::new(ErrorKind::Usage, e.to_string()))?;
    let gpu = Arc::new(GpuTimeline::new(GpuModel {
        slots: args.slots,
        rtf: args.rtf,
    }));
    let options = async_nats::ConnectOptions::new().connection_timeout(Duration::from_millis(500));
    let consumer = tokio::time::timeout(
        Duration::from_secs(10),
        Consumer::connect_with(options, &args.nats_url, settings, move |_: &StreamInfo| {
            GpuHandler { gpu: gpu.clone() }
        }),
    )
    .await
    .map_err(|_| Error::new(ErrorKind::Nats, "the consumer did not start within 10 s"))?
    .map_err(|e| Error::new(ErrorKind::Nats, e.to_string()))?;
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(args.max_lifetime_s)) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    consumer.shutdown(Duration::from_secs(2)).await;
    Ok(())
}
