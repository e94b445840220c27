"""`weir.Consumer`: the consumer core for recognisers, as an asyncio API.

    consumer = await weir.Consumer.connect(
        "nats://127.0.0.1:4222",
        subject="audio.{partition}.{stream}", partitions=8, owned=[0, 1, 2, 3])
    async with consumer:
        async for stream in consumer:              # each new stream instance
            asyncio.create_task(recognise(stream))

    async def recognise(stream: weir.Stream) -> None:
        async for event in stream:                 # in seq order; End is the last
            match event:
                case weir.Frame(pcm, seq):  ...    # 20 ms of s16le 16 kHz mono
                case weir.Gap(first, last, frames, samples, cause): ...
                case weir.End(cause): ...

Everything that makes the stream trustworthy is the Rust core's (``weir_audio_consumer``):
partitioned subscriptions, static or lease ownership, per-stream order, the bounded
per-stream queue and its policy, loss / possible-loss / staleness / overload / handover
declarations, ``max_streams`` and capacity announcements. This module only carries
events from the core to the per-stream iterators:

- One hub. The core's handler of each stream hands one event at a time to Python and
  waits until that stream's iterator asks for the next one (``__anext__``), so the
  core's queue bound, lag and real-time factor measure the Python handler's own
  progress. A stream that is not read fills only its own bounded queue (its policy
  fires, the others go on); a `Stream` that is garbage-collected releases its handler.
- One pump task per consumer takes the hub's messages in batches (one await per batch)
  and dispatches them to the per-stream iterators and the new-stream queue.
- Cancellation-safe: cancelling an ``await`` on a stream or on the consumer loses
  nothing; the event or stream is returned by the next call.
- No GIL on the core: a handler that holds the GIL (a model call) delays only its own
  streams' events, never NATS I/O, heartbeats, lease renewals or announcements.

Errors are `weir.errors` classes: `ConfigError` (an unknown or invalid option, naming
the key), `ConnectError`, `ClosedError` (a closed consumer), `InternalError`.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Union

from . import _weir
from .errors import ClosedError, ConfigError, InternalError

Frame = _weir.Frame
Gap = _weir.Gap
End = _weir.End
LossDeclared = _weir.LossDeclared

#: One event of a stream.
Event = Union["_weir.Frame", "_weir.Gap", "_weir.End", "_weir.LossDeclared"]

__all__ = [
    "Consumer",
    "Stream",
    "Frame",
    "Gap",
    "End",
    "LossDeclared",
    "Event",
    "ConsumerStats",
    "Totals",
    "StreamStats",
]

# How long close() waits for the pump to hand over what is left, beyond the grace.
_PUMP_DRAIN_S = 5.0


class _State:
    """The per-stream state the pump writes and the stream's iterator reads."""

    __slots__ = ("q", "waiter", "unacked", "done", "gone")

    def __init__(self) -> None:
        self.q: Deque[Any] = deque()
        self.waiter: Optional[asyncio.Future[None]] = None
        self.unacked = False  # an event was returned and not acked yet
        self.done = False  # End was returned
        self.gone = False  # the core's handler ended without an End


class Stream:
    """One stream instance: ``async for event in stream`` yields its events in order
    (`Frame`, `Gap`, `LossDeclared`, then exactly one `End`, after which the loop ends).

    Asking for the next event tells the core that the previous one is handled: the
    stream's lag and real-time factor are the handler's own. Read a stream from one
    task at a time. Dropping a `Stream` without reading it to its end releases its
    handler in the core (the rest of the stream is dropped there).
    """

    __slots__ = ("_link", "_state", "_consumer", "__weakref__")

    def __init__(self, link: Any, state: _State, consumer: "Consumer") -> None:
        self._link = link
        self._state = state
        self._consumer = consumer

    @property
    def id(self) -> str:
        """The stream id (the ``{stream}`` token of the subject)."""
        return self._link.stream

    @property
    def partition(self) -> int:
        """Its partition."""
        return self._link.partition

    @property
    def instance(self) -> int:
        """Unique per stream instance within the consumer (a restarted id gets a new one)."""
        return self._link.instance

    @property
    def subject(self) -> str:
        """The subject of its first packet."""
        return self._link.subject

    @property
    def session_id(self) -> Optional[str]:
        """``session_id`` of its first packet, if any."""
        return self._link.session_id

    def __repr__(self) -> str:
        return f"Stream(id={self.id!r}, partition={self.partition}, instance={self.instance})"

    def __aiter__(self) -> "Stream":
        return self

    async def __anext__(self) -> Event:
        st = self._state
        if st.unacked:
            # Asking for the next event: the previous one is handled.
            st.unacked = False
            c = self._consumer
            c._acks.append(self._link)
            if not c._ack_scheduled:
                c._ack_scheduled = True
                c._loop.call_soon(c._flush_acks)
        q = st.q
        while not q:
            if st.done:
                raise StopAsyncIteration
            c = self._consumer
            if st.gone and not c._closed:
                raise InternalError(
                    f"stream {self.id!r}: its handler in the core ended without an End "
                    "(a bug: please report it)", code="handler_gone")
            if c._pump_done or st.gone:
                c._check_pump()
                raise ClosedError(
                    f"stream {self.id!r}: the consumer is closed", code="closed")
            w = st.waiter
            if w is not None and not w.done():
                raise RuntimeError(f"stream {self.id!r} is already being read by another task")
            fut = c._loop.create_future()
            st.waiter = fut
            try:
                await fut
            finally:
                if st.waiter is fut:
                    st.waiter = None
        event = q.popleft()
        if type(event) is End:
            st.done = True
        else:
            st.unacked = True
        return event


class Consumer:
    """A running consumer core (see the module docs). Create it with
    `Consumer.connect`; ``async for stream in consumer`` yields each new stream
    instance until the consumer closes; ``async with consumer`` closes it on exit."""

    def __init__(self, core: Any) -> None:
        """Internal: use `Consumer.connect`."""
        if not isinstance(core, _weir._Consumer):
            raise ConfigError("use `await weir.Consumer.connect(...)`", code="invalid_argument")
        self._core = core
        self._loop = asyncio.get_running_loop()
        self._states: Dict[int, _State] = {}
        self._new: Deque[Stream] = deque()
        self._new_waiters: List[asyncio.Future[None]] = []
        self._acks: List[Any] = []
        self._ack_scheduled = False
        self._pump_done = False
        self._pump_error: Optional[BaseException] = None
        self._closed = False
        self._final: Optional[ConsumerStats] = None
        self._pump_task = self._loop.create_task(self._pump(), name="weir-consumer-pump")

    @classmethod
    async def connect(
        cls,
        servers: Union[str, Sequence[str]],
        *,
        nats: Optional[Mapping[str, Any]] = None,
        **config: Any,
    ) -> "Consumer":
        """Connects to NATS and subscribes to the owned partitions (or starts the
        lease driver); returns once the server confirmed the subscriptions.

        - ``servers``: a URL or a list of URLs (tried in turn).
        - ``nats``: the other ``[nats]`` keys of every weir binary (``user``,
          ``password``, ``token``, ``nkey``, ``creds_file``, ``tls_required``,
          ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``, ``inbox_prefix``,
          ``connection_timeout_ms``, ``ping_interval_ms``, ``name``, ...).
        - ``**config``: the consumer core's keys (``subject``, ``partitions``,
          ``owned``, ``max_pending_bytes``, ``max_pending_age_ms``, ``policy``,
          ``idle_timeout_ms``, ``subscription_capacity``, ``max_streams``,
          ``max_frame_age_ms``, ``source``, ``ownership``, ``capacity``, ...), with
          the names and defaults of docs/audio-ingress.md's consumer section.

        Raises `ConfigError` (naming the key) before connecting, `ConnectError` when
        NATS cannot be reached or the subscriptions / lease bucket cannot be made. A
        cancelled ``await`` shuts the consumer down once it is up: no subscription or
        lease is left behind.
        """
        if nats is not None and not isinstance(nats, Mapping):
            raise ConfigError("nats: a dict of [nats] options", code="invalid_config",
                              details={"key": "nats"})
        options = dict(nats or {})
        if "servers" in options or "url" in options:
            raise ConfigError("give the servers as the first argument, not in nats=",
                              code="invalid_config", details={"key": "nats.servers"})
        options["servers"] = list(servers) if isinstance(servers, (list, tuple)) else servers
        try:
            nats_json = json.dumps(options)
            config_json = json.dumps(config)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"options must be JSON values: {e}", code="invalid_config") from None
        core = await _weir._Consumer.connect(nats_json, config_json)
        return cls(core)

    # -- context manager and iteration -------------------------------------------------

    async def __aenter__(self) -> "Consumer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> "Consumer":
        if self._closed:
            raise ClosedError("the consumer is closed", code="closed")
        return self

    async def __anext__(self) -> Stream:
        """The next new stream instance; the iteration ends when the consumer closes."""
        while not self._new:
            self._check_pump()
            if self._pump_done:
                raise StopAsyncIteration
            fut = self._loop.create_future()
            self._new_waiters.append(fut)
            try:
                await fut
            finally:
                try:
                    self._new_waiters.remove(fut)
                except ValueError:
                    pass
        return self._new.popleft()

    # -- reports -----------------------------------------------------------------------

    def stats(self) -> "ConsumerStats":
        """A snapshot of the core's stats (after `close`: the final stats)."""
        if self._final is not None:
            return self._final
        return ConsumerStats.from_json(self._core.stats_json())

    def capacity(self) -> Dict[str, Any]:
        """What the next capacity announcement would say (docs/protocol.md §5.1):
        slots, live streams and their lag, real-time factor p95, partitions."""
        return json.loads(self._core.capacity_json())

    def owned(self) -> List[int]:
        """The partitions delivered now (static ``owned``, or the leases held)."""
        return list(self._core.owned())

    def leases(self) -> List[Dict[str, Any]]:
        """Lease ownership: every partition's lease as this worker sees it
        (``partition``, ``owner``, ``revision``, ``held``, ``delivering``,
        ``expires_in`` ms). Empty with static ownership."""
        return json.loads(self._core.leases_json())

    @property
    def closed(self) -> bool:
        """Whether `close` or `abort` was called."""
        return self._closed

    # -- shutdown ----------------------------------------------------------------------

    async def close(self, grace_s: float = 2.0) -> "ConsumerStats":
        """Graceful shutdown: last (empty) capacity announcement, unsubscribe, every
        live stream ends with ``End(cause="shutdown")`` after its queued events,
        handlers get ``grace_s`` seconds to read them, leases are released. Returns
        the final stats. Idempotent."""
        if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)):
            raise ConfigError("grace_s: a number of seconds", code="invalid_argument",
                              details={"key": "grace_s"})
        self._closed = True
        text = await self._core.close(float(grace_s))
        self._final = ConsumerStats.from_json(text)
        try:
            await asyncio.wait_for(asyncio.shield(self._pump_task), _PUMP_DRAIN_S)
        except asyncio.TimeoutError:
            self._pump_task.cancel()
        return self._final

    def abort(self) -> None:
        """A crash, for failover drills: no drain, no end to the streams, no lease
        released, no last announcement. Stream iterators get what was already handed
        over, then `ClosedError`."""
        self._closed = True
        self._core.abort()

    # -- internals ---------------------------------------------------------------------

    def _ack(self, link: Any) -> None:
        self._acks.append(link)
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self._loop.call_soon(self._flush_acks)

    def _flush_acks(self) -> None:
        acks, self._acks = self._acks, []
        self._ack_scheduled = False
        if acks:
            self._core.ack_many(acks)

    def _check_pump(self) -> None:
        if self._pump_error is not None:
            raise InternalError(f"the consumer's pump failed: {self._pump_error!r}",
                                code="internal") from self._pump_error

    def _open(self, link: Any) -> None:
        state = _State()
        self._states[link.instance] = state
        self._new.append(Stream(link, state, self))
        waiters = self._new_waiters
        if waiters:
            w = waiters.pop(0)
            if not w.done():
                w.set_result(None)

    async def _pump(self) -> None:
        core = self._core
        states = self._states
        end_type = End
        try:
            while True:
                batch = core.poll_batch()
                if batch is None:
                    break
                if not batch:
                    batch = await core.next_batch()
                    if batch is None:
                        break
                it = iter(batch)
                for instance, event in zip(it, it):
                    st = states.get(instance)
                    if st is None:
                        if instance < 0:
                            self._open(event)
                        continue
                    if event is None:  # the handler ended without an End
                        del states[instance]
                        st.gone = True
                    else:
                        st.q.append(event)
                    if type(event) is end_type:
                        del states[instance]
                    w = st.waiter
                    if w is not None:
                        st.waiter = None
                        if not w.done():
                            w.set_result(None)
                # Let the woken iterators run before the next batch.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a bug: surfaced to every iterator
            self._pump_error = e
        finally:
            self._pump_done = True
            for st in list(states.values()):
                w = st.waiter
                if w is not None and not w.done():
                    w.set_result(None)
            for w in list(self._new_waiters):
                if not w.done():
                    w.set_result(None)


# -- stats -------------------------------------------------------------------------------


def _build(cls: Any, data: Mapping[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class _Counters:
    frames: int = 0
    samples: int = 0
    stale_frames: int = 0
    stale_samples: int = 0
    frames_delivered: int = 0
    frames_dropped_overload: int = 0
    frames_dropped_closed: int = 0
    frames_dropped_handler_gone: int = 0
    frames_dropped_fenced: int = 0
    leading_missing: int = 0
    handover_frames: int = 0
    lost_frames: int = 0
    possibly_lost_frames: int = 0
    loss_events: int = 0
    possible_loss_declarations: int = 0
    holes_forgotten: int = 0
    declarations_forgotten: int = 0
    declared_gaps: int = 0
    declared_gap_frames: int = 0
    declared_gap_samples: int = 0
    stale_packets: int = 0
    decode_errors: int = 0
    overloads: int = 0


@dataclass(frozen=True)
class StreamStats(_Counters):
    """One stream instance (the core's ``StreamStats``; counters flattened)."""

    stream: str = ""
    partition: int = 0
    instance: int = 0
    session_id: Optional[str] = None
    state: str = "active"
    first_seq: Optional[int] = None
    last_seq: Optional[int] = None
    end_seen: bool = False
    end_seq: Optional[int] = None
    end_reason: Optional[str] = None
    producer_overload: Optional[Dict[str, Any]] = None
    ended_by: Optional[str] = None
    reaped: bool = False
    pending_bytes: int = 0
    pending_frames: int = 0
    oldest_pending_ms: float = 0.0


@dataclass(frozen=True)
class Totals(_Counters):
    """The consumer's aggregates (the core's ``Totals``; counters flattened).

    Frames sent by producers = ``frames + stale_frames + lost_frames +
    possibly_lost_frames + declared_gap_frames + leading_missing + frames_refused``."""

    streams_started: int = 0
    streams_active: int = 0
    streams_end_seen: int = 0
    streams_reaped: int = 0
    streams_overloaded: int = 0
    messages: int = 0
    decode_errors_by_kind: Dict[str, int] = None  # type: ignore[assignment]
    unroutable_subjects: int = 0
    misrouted: int = 0
    slow_consumer_events: int = 0
    orphan_ends: int = 0
    streams_refused: Dict[str, int] = None  # type: ignore[assignment]
    frames_refused: int = 0
    pending_bytes: int = 0
    pending_frames: int = 0


@dataclass(frozen=True)
class ConsumerStats:
    """A snapshot of the consumer's stats: ``totals`` and ``streams`` (active ones and
    the most recently finished, sorted by stream id then instance)."""

    totals: Totals
    streams: List[StreamStats]

    @classmethod
    def from_json(cls, text: str) -> "ConsumerStats":
        data = json.loads(text)
        return cls(
            totals=_build(Totals, data.get("totals", {})),
            streams=[_build(StreamStats, s) for s in data.get("streams", [])],
        )

    def stream(self, stream_id: str) -> List[StreamStats]:
        """The records of ``stream_id`` (several if it restarted)."""
        return [s for s in self.streams if s.stream == stream_id]
