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
  fires, the others go on) and, once the core ended it, frees its slot (see
  `Stream`); a `Stream` that is garbage-collected releases its handler.
- Lease mode: a fenced partition's streams end with ``End(cause="handover")`` and go
  on at the new owner.
- One pump task per consumer takes the hub's messages in batches (one await per batch)
  and dispatches them to the per-stream iterators and the new-stream queue.
- Cancellation-safe: cancelling an ``await`` on a stream or on the consumer loses
  nothing; the event or stream is returned by the next call.
- No GIL on the core: a handler that holds the GIL (a model call) delays only its own
  streams' events, never NATS I/O, heartbeats, lease renewals or announcements.

Errors are `weir.errors` classes: `ConfigError` (an unknown or invalid option, naming
the key), `ConnectError`, `ClosedError` (a closed consumer), `RefusedError`
(``concurrent_reader``: a second task reading one stream), `InternalError` (a bug).
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Union

from . import _weir
from .errors import ClosedError, ConfigError, InternalError, RefusedError

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
# Longest accepted close() grace period (the Rust side's bound too).
_MAX_GRACE_S = 3600.0


class _State:
    """The per-stream state the pump writes and the stream's iterator reads."""

    __slots__ = ("q", "waiter", "unacked", "done", "gone")

    def __init__(self) -> None:
        self.q: Deque[Event] = deque()
        self.waiter: Optional[asyncio.Future[None]] = None
        self.unacked = False  # an event was returned and not acked yet
        self.done = False  # End was returned
        self.gone = False  # the core's handler ended without an End


class _Dispatch:
    """What the pump, the streams and the `Consumer` share. Holds no reference to the
    `Consumer` itself, so that a `Consumer` dropped without `close()` is collected (its
    finalizer then shuts the core consumer down and the pump ends)."""

    __slots__ = ("core", "loop", "states", "new", "new_waiters", "acks", "ack_scheduled",
                 "pump_done", "pump_error", "closed")

    def __init__(self, core: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.core = core
        self.loop = loop
        self.states: Dict[int, _State] = {}
        self.new: Deque[Stream] = deque()
        self.new_waiters: Deque[asyncio.Future[None]] = deque()
        self.acks: List[Any] = []
        self.ack_scheduled = False
        self.pump_done = False
        self.pump_error: Optional[BaseException] = None
        self.closed = False

    def ack(self, link: Any) -> None:
        self.acks.append(link)
        if not self.ack_scheduled:
            self.ack_scheduled = True
            self.loop.call_soon(self.flush_acks)

    def flush_acks(self) -> None:
        acks, self.acks = self.acks, []
        self.ack_scheduled = False
        if acks:
            self.core.ack_many(acks)

    def check_pump(self) -> None:
        if self.pump_error is not None:
            raise InternalError(f"the consumer's pump failed: {self.pump_error!r}",
                                code="internal") from self.pump_error

    def wake_one(self) -> None:
        """Wakes the first `async for stream in consumer` waiter still waiting (done or
        cancelled waiters are skipped, so that no new stream is left unannounced)."""
        waiters = self.new_waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def open(self, link: Any) -> None:
        state = _State()
        self.states[link.instance] = state
        self.new.append(Stream(link, state, self))
        self.wake_one()


class Stream:
    """One stream instance: ``async for event in stream`` yields its events in order
    (`Frame`, `Gap`, `LossDeclared`, then exactly one `End`, after which the loop ends).

    Asking for the next event tells the core that the previous one is handled: the
    stream's lag and real-time factor are the handler's own. Read a stream from one
    task at a time: a second task asking while one waits gets
    `RefusedError(code="concurrent_reader")`. Dropping a `Stream` without reading it to
    its end releases its handler in the core (the rest of the stream is dropped there).

    A `Stream` held but not read: while the stream is live it holds its
    ``max_streams`` slot and only its own bounded queue fills (its policy fires).
    Once the core has ended it (producer end, idle timeout, ``overload`` under the
    ``close`` policy, a fence), the core waits at most ``max_pending_age_ms`` for each
    ask of the reader; then the events still queued (bounded by the stream's queue
    bound: nothing is queued after the end) and the `End` are handed to this iterator
    at once, the slot is freed (``capacity()["live_streams"]`` drops) and the reader
    gets them, in order, whenever it reads. Those events count as delivered in the
    stats. During `close`, the grace applies instead.

    How a stream ends: `End(cause=...)` is always the last event when the core ended
    it — ``producer``, ``idle``, ``overload``, ``restarted``, ``shutdown`` (`close`)
    or ``handover`` (lease mode: the partition was fenced — rebalanced to another
    worker, expired or stalled — and its streams go on at the new owner; the core
    aborts the fenced handlers, and the iterator gets a synthesized
    ``End(cause="handover", seq=None, last_seq=<last seq this iterator was handed>)``
    after the events already handed over). `ClosedError` instead of an `End` only when
    the consumer was aborted, or closed and its grace ran out before the iterator read
    its `End`; `InternalError` only for a bug (a handler in the core that panicked).
    """

    __slots__ = ("_link", "_state", "_d", "__weakref__")

    def __init__(self, link: _weir._StreamLink, state: _State, dispatch: _Dispatch) -> None:
        self._link = link
        self._state = state
        self._d = dispatch

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
        d = self._d
        w = st.waiter
        if w is not None and not w.done():
            raise RefusedError(f"stream {self.id!r} is already being read by another task",
                               code="concurrent_reader")
        if st.unacked:
            # Asking for the next event: the previous one is handled.
            st.unacked = False
            d.ack(self._link)
        q = st.q
        while not q:
            if st.done:
                raise StopAsyncIteration
            if st.gone and not d.closed:
                raise InternalError(
                    f"stream {self.id!r}: its handler in the core ended without an End "
                    "(a bug: please report it)", code="handler_gone")
            if d.pump_done or st.gone:
                d.check_pump()
                raise ClosedError(
                    f"stream {self.id!r}: the consumer is closed", code="closed")
            fut = d.loop.create_future()
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


def _grace(grace_s: object) -> float:
    """``grace_s`` as seconds, or `ConfigError` (``invalid_config``, key ``grace_s``)."""
    if isinstance(grace_s, bool) or not isinstance(grace_s, (int, float)):
        raise ConfigError(f"grace_s: a number of seconds, not {type(grace_s).__name__}",
                          code="invalid_config", details={"key": "grace_s"})
    try:
        value = float(grace_s)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or not 0.0 <= value <= _MAX_GRACE_S:
        raise ConfigError(f"grace_s: {grace_s!r}; allowed 0..={_MAX_GRACE_S:g} seconds",
                          code="invalid_config", details={"key": "grace_s"})
    return value


class Consumer:
    """A running consumer core (see the module docs). Create it with
    `Consumer.connect`; ``async for stream in consumer`` yields each new stream
    instance until the consumer closes; ``async with consumer`` closes it on exit.

    Several tasks may iterate one consumer: each new stream goes to exactly one of
    them. A `Consumer` that is garbage-collected without `close()` is shut down
    without grace (leases released, subscriptions and connection dropped)."""

    def __init__(self, core: Any) -> None:
        """Internal: use `Consumer.connect`."""
        if not isinstance(core, _weir._Consumer):
            raise ConfigError("use `await weir.Consumer.connect(...)`", code="invalid_argument")
        self._core = core
        self._d = _Dispatch(core, asyncio.get_running_loop())
        self._aborted = False
        self._final: Optional[ConsumerStats] = None
        # The pump holds only the dispatch state: this object can be collected, and
        # then the finalizer shuts the core consumer down, which ends the pump.
        self._pump_task = self._d.loop.create_task(_pump(self._d), name="weir-consumer-pump")
        self._finalizer = weakref.finalize(self, _discard, core, self._d)
        self._finalizer.atexit = False

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
          ``retry_initial_connect`` is refused (`ConfigError`, key
          ``nats.retry_initial_connect``): the consumer returns only once subscribed,
          so an unreachable server is a `ConnectError` to retry from the caller.
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
        if options.get("retry_initial_connect"):
            raise ConfigError(
                "nats.retry_initial_connect is not supported by the consumer: connect() "
                "returns once subscribed; retry a ConnectError instead",
                code="invalid_config", details={"key": "nats.retry_initial_connect"})
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
        if self._d.closed:
            raise ClosedError("the consumer is closed", code="closed")
        return self

    async def __anext__(self) -> Stream:
        """The next new stream instance; the iteration ends when the consumer closes.
        Several tasks may wait at once: each stream goes to one of them, and a waiter
        that is cancelled passes a stream it was woken for on to the next."""
        d = self._d
        while not d.new:
            d.check_pump()
            if d.pump_done:
                raise StopAsyncIteration
            fut = d.loop.create_future()
            d.new_waiters.append(fut)
            try:
                await fut
            except BaseException:
                try:
                    d.new_waiters.remove(fut)
                except ValueError:
                    pass
                if d.new:
                    # Woken (or not) and leaving: the stream waiting goes to another.
                    d.wake_one()
                raise
            try:
                d.new_waiters.remove(fut)
            except ValueError:
                pass
        return d.new.popleft()

    # -- reports -----------------------------------------------------------------------

    def stats(self) -> "ConsumerStats":
        """A snapshot of the core's stats. Never raises for a closed consumer: while
        `close` runs, the snapshot taken when it started; after it, the final stats;
        after `abort`, the snapshot taken at the abort."""
        if self._final is not None:
            return self._final
        return ConsumerStats.from_json(self._core.stats_json())

    def capacity(self) -> Dict[str, Any]:
        """What the next capacity announcement would say (docs/protocol.md §5.1):
        slots, live streams and their lag, real-time factor p95, partitions."""
        capacity: Dict[str, Any] = json.loads(self._core.capacity_json())
        return capacity

    def owned(self) -> List[int]:
        """The partitions delivered now (static ``owned``, or the leases held)."""
        return list(self._core.owned())

    def leases(self) -> List[Dict[str, Any]]:
        """Lease ownership: every partition's lease as this worker sees it
        (``partition``, ``owner``, ``revision``, ``held``, ``delivering``,
        ``expires_in`` ms). Empty with static ownership."""
        leases: List[Dict[str, Any]] = json.loads(self._core.leases_json())
        return leases

    @property
    def closed(self) -> bool:
        """Whether `close` or `abort` was called."""
        return self._d.closed

    # -- shutdown ----------------------------------------------------------------------

    async def close(self, grace_s: float = 2.0) -> "ConsumerStats":
        """Graceful shutdown: last (empty) capacity announcement, unsubscribe, every
        live stream ends with ``End(cause="shutdown")`` after its queued events,
        handlers get ``grace_s`` seconds to read them, leases are released. Returns
        the final stats.

        ``grace_s``: 0..=3600 seconds, else `ConfigError` (``invalid_config``) and
        the consumer is left running. Idempotent and cancel-safe: the first call
        starts the shutdown, which runs to its end even if that ``await`` is
        cancelled or times out; every call (concurrent, or a retry) awaits the same
        shutdown and returns the same stats (a later ``grace_s`` is ignored). After
        `abort`, a no-op returning the snapshot taken at the abort."""
        grace = _grace(grace_s)
        d = self._d
        d.closed = True
        self._finalizer.detach()
        text = await self._core.close(grace)
        if self._final is None:
            self._final = ConsumerStats.from_json(text)
        if not self._aborted:
            try:
                await asyncio.wait_for(asyncio.shield(self._pump_task), _PUMP_DRAIN_S)
            except asyncio.TimeoutError:
                self._pump_task.cancel()
        return self._final

    def abort(self) -> None:
        """A crash, for failover drills: no drain, no end to the streams, no lease
        released, no last announcement. Stream iterators get what was already handed
        over, then `ClosedError`. Idempotent; `close` afterwards (and leaving
        ``async with``) is a no-op."""
        self._d.closed = True
        self._aborted = True
        self._finalizer.detach()
        self._core.abort()


def _discard(core: Any, d: _Dispatch) -> None:
    """The finalizer of a `Consumer` collected without `close`: shuts the core consumer
    down without grace (leases released, subscriptions dropped); the pump then ends."""
    d.closed = True
    core.discard()


async def _pump(d: _Dispatch) -> None:
    """Takes the hub's messages in batches and dispatches them until the consumer is
    closed (the hub drained). Holds the dispatch state only, never the `Consumer`."""
    core = d.core
    states = d.states
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
                        d.open(event)
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
            del batch, it
            # Let the woken iterators run before the next batch.
            await asyncio.sleep(0)
    except Exception as e:  # a bug: surfaced to every iterator
        d.pump_error = e
    finally:
        d.pump_done = True
        for st in list(states.values()):
            w = st.waiter
            if w is not None and not w.done():
                w.set_result(None)
        for w in list(d.new_waiters):
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
