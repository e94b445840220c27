//! The application side of the consumer: one handler per stream instance.
//!
//! The consumer calls [`HandlerFactory::open`] when a stream's first packet arrives and
//! then drives the handler from one task per stream: [`StreamHandler::on_event`] is
//! awaited for each event before the next one is handed over, so a handler sees its
//! stream strictly in order and never concurrently with itself. A slow handler only
//! fills its own stream's bounded queue; when that bound is exceeded the configured
//! policy fires (see [`super::ConsumerPolicy`]) — other streams are not slowed down.
//!
//! A handler that panics ends its task; the rest of its stream is dropped and counted
//! (`frames_dropped_handler_gone`), never queued without bound.

use std::future::Future;

use tokio::sync::mpsc;

use super::event::{StreamEvent, StreamInfo};

/// Receives one stream's events, in order.
pub trait StreamHandler: Send + 'static {
    /// Handles one event. The next event of this stream is delivered only after the
    /// returned future completes. The last event is always [`StreamEvent::End`].
    fn on_event(&mut self, event: StreamEvent) -> impl Future<Output = ()> + Send;
}

/// Creates the handler of each new stream instance.
pub trait HandlerFactory: Send + Sync + 'static {
    /// The handler type.
    type Handler: StreamHandler;
    /// Called from the subscription's dispatcher task when a stream's first packet
    /// arrives: keep it cheap and non-blocking.
    fn open(&self, info: &StreamInfo) -> Self::Handler;
}

impl<F, H> HandlerFactory for F
where
    F: Fn(&StreamInfo) -> H + Send + Sync + 'static,
    H: StreamHandler,
{
    type Handler = H;
    fn open(&self, info: &StreamInfo) -> H {
        self(info)
    }
}

/// A handler that forwards every event, tagged with its stream, into a bounded channel.
///
/// Sending waits for room, so a slow receiver fills the stream's own bounded queue and
/// trips its overload policy; it never buffers without bound. When the receiver is
/// gone, events are discarded (and still counted as delivered by the consumer).
#[derive(Debug, Clone)]
pub struct ChannelHandler {
    info: StreamInfo,
    tx: mpsc::Sender<(StreamInfo, StreamEvent)>,
}

impl StreamHandler for ChannelHandler {
    async fn on_event(&mut self, event: StreamEvent) {
        // A closed receiver means the application stopped listening: nothing to do.
        let _ = self.tx.send((self.info.clone(), event)).await;
    }
}

/// A [`HandlerFactory`] whose handlers forward into `tx` (see [`ChannelHandler`]).
pub fn channel_factory(
    tx: mpsc::Sender<(StreamInfo, StreamEvent)>,
) -> impl HandlerFactory<Handler = ChannelHandler> {
    move |info: &StreamInfo| ChannelHandler {
        info: info.clone(),
        tx: tx.clone(),
    }
}
