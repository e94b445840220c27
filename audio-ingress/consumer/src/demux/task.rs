//! One stream's handler task.
//!
//! Invariants: events reach the handler in queue order, one at a time; the handler
//! gets exactly one `End`, as its last event; when the task ends (normally or by
//! panic) its queue is emptied and refuses everything ([`ReceiverGuard`]).

use super::*;
use crate::capacity::rtf::StreamMeter;

/// One stream's handler task: pops events in order and awaits the handler on each.
pub(super) async fn run_stream<H: StreamHandler>(
    queue: Arc<StreamQueue>,
    mut handler: H,
    shared: Arc<Shared>,
    instance: u64,
    // Held until the handler has seen its end (or the task is aborted): a draining
    // handler still counts against `max_streams`.
    _slot: Arc<StreamSlot>,
    // Lease ownership: no frame or gap is handed over once it is closed (the end
    // still is: a handler always sees its end).
    fence: Option<Arc<Fence>>,
) {
    let on_gone_shared = shared.clone();
    // Set while the handler holds a frame: if the task is aborted (or the handler
    // panics) there, that frame was neither delivered nor queued.
    let frame_in_hand = AtomicBool::new(false);
    // Runs when this task ends, also by panic or abort: the queue refuses further
    // events and whatever it still held is counted as dropped.
    let _guard = ReceiverGuard::new(&queue, |discarded| {
        let lost = discarded as u64 + u64::from(frame_in_hand.load(Ordering::Relaxed));
        let mut reg = on_gone_shared.registry();
        if lost > 0 {
            reg.update(instance, |s| s.counters.frames_dropped_handler_gone += lost);
            metrics::counter!(m::CONSUMER_FRAMES_DROPPED_TOTAL, "reason" => "handler_gone")
                .increment(lost);
        }
        reg.finish(instance);
    });
    // Handler busy time over audio time, in this task's own variables: one ratio per
    // second of audio goes into the consumer's histogram (no lock per frame).
    let mut meter = StreamMeter::default();
    let rtf = &shared.capacity.rtf;
    while let Some(event) = queue.pop().await {
        let is_frame = matches!(event, StreamEvent::Frame(_));
        let is_end = matches!(event, StreamEvent::End(_));
        if !is_end
            && let Some(fence) = &fence
            && !fence.is_open(Instant::now())
        {
            if is_frame {
                shared
                    .registry()
                    .update(instance, |s| s.counters.frames_dropped_fenced += 1);
                metrics::counter!(m::CONSUMER_FRAMES_DROPPED_TOTAL, "reason" => "fenced")
                    .increment(1);
            }
            continue;
        }
        frame_in_hand.store(is_frame, Ordering::Relaxed);
        let audio = match &event {
            StreamEvent::Frame(f) => Some((f.samples, f.format.sample_rate)),
            _ => None,
        };
        let started = Instant::now();
        handler.on_event(event).await;
        frame_in_hand.store(false, Ordering::Relaxed);
        if let Some((samples, rate)) = audio
            && let Some(ratio) = meter.frame(started.elapsed(), samples, rate)
        {
            rtf.record(ratio);
        }
        if is_end && let Some(ratio) = meter.flush() {
            rtf.record(ratio);
        }
        if is_frame {
            // Per frame: the queue's own counter, not the consumer-wide registry lock.
            queue.count_delivered();
            shared.instruments.delivered.increment(1);
        }
        if is_end {
            break;
        }
    }
}
