//! The application side of the consumer: one handler per stream instance.
//!
//! The consumer calls [`HandlerFactory::open`] when a stream's first packet arrives and
//! then drives the handler from one task per stream: [`StreamHandler::on_event`] is
//! awaited for each event before the next one is handed over, so a handler sees its
//! stream strictly in order and never concurrently with itself. A slow handler only
//! fills its own stream's bounded queue; when that bound is exceeded the configured
//! policy fires (see [`super::ConsumerPolicy`]) — other streams are not slowed down.
//!
//! A factory that needs to know when the consumer has ended a stream *while its
//! handler is still busy with an earlier event* (a handler that waits on something
//! external, such as a binding waiting for another language's reader) implements
//! [`HandlerFactory::open_with`] and awaits [`StreamEnded::ended`] beside its work.
//!
//! A handler that panics ends its task; the rest of its stream is dropped and counted
//! (`frames_dropped_handler_gone`), never queued without bound.

use std::future::Future;

use tokio::sync::mpsc;

use std::sync::Arc;

use super::event::{StreamEvent, StreamInfo};
use super::queue::StreamQueue;

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

    /// What the consumer calls: [`Self::open`], plus the stream's [`StreamEnded`]
    /// signal for factories that want it (the default ignores it).
    fn open_with(&self, info: &StreamInfo, ended: StreamEnded) -> Self::Handler {
        let _ = ended;
        self.open(info)
    }
}

/// Tells a handler that the consumer has ended its stream instance: the stream's
/// `End` is queued behind whatever is still pending (the producer's end, the idle
/// timeout, an overload under the `close` policy, shutdown or a fence), or the
/// handler task is gone. Nothing more will be queued for it; the pending events and
/// the `End` are still delivered in order, as always.
#[derive(Clone)]
pub struct StreamEnded(pub(crate) Arc<StreamQueue>);

impl std::fmt::Debug for StreamEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamEnded")
            .field("ended", &self.is_ended())
            .finish()
    }
}

impl StreamEnded {
    /// Whether the stream has been ended (see the type's docs).
    pub fn is_ended(&self) -> bool {
        self.0.is_ended()
    }

    /// Resolves once the stream has been ended (at once if it already was).
    /// Cancel-safe.
    pub async fn ended(&self) {
        self.0.ended().await;
    }
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
