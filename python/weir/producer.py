"""`weir.Producer`: publish audio streams through weir's producer core, for Python
WebRTC or telephony servers that produce the frames themselves.

The core is the one `audio-ingress` runs (Rust, ``weir-audio-producer``): per stream a
queue bounded by bytes **and** age, a confirmation window that holds the bound up to
the NATS server, and an explicit overload — never a silent drop. This module is the
asyncio API over it; it re-implements none of that logic.

    producer = await weir.Producer.connect("nats://127.0.0.1:4222")
    stream = producer.open("call-42", session_id="s-7")
    try:
        seq = stream.push(pcm)          # sync, never blocks
    except weir.OverloadError as e:     # e.code: queue_full | max_age | publish_timeout | rate
        ...                             # e.details["ended"]: the stream is over
    summary = await stream.end()        # drains, publishes `end`
    await producer.close()

Events (``await stream.next_event()`` or ``async for ev in stream.events()``):
`Overloaded`, `GapSent`, then `Closed` (always last). Frames go out in the deployed
packet format (4-byte length, JSON meta, PCM) on ``inference.whisper.stream.{stream}``
by default: deployed consumers read them unchanged.

Invariants:
- `ProducerStream.push` never blocks and never drops silently: it returns the frame's
  seq (1, 2, 3, ... per stream) or raises `OverloadError`, `ClosedError` or
  `ConfigError` (``invalid_frame``).
- Configuration errors are raised by `Producer.connect` before any connection, as
  `ConfigError` whose ``details["key"]`` names the key.
- A cancelled ``await`` leaves no slot behind: `end` and `close` complete in Rust (the
  stream still ends and frees its id), `next_event` loses no event.
- A stream dropped without `end` ends with reason ``producer_gone`` (what is queued is
  still published, then the ``end``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Union

from . import _weir
from .errors import ConfigError

__all__ = [
    "Producer",
    "ProducerStream",
    "ProducerEvent",
    "Overloaded",
    "GapSent",
    "Closed",
    "StreamSummary",
    "ProducerStats",
    "StreamStatus",
]


@dataclass(frozen=True)
class Overloaded:
    """The stream overloaded (``close`` policy) and is over: no frame is admitted any
    more; its queue was dropped (counted) and its ``end`` carries this report.

    ``reason`` is the bound that tripped (``queue_full``, ``max_age``,
    ``publish_timeout``, ``rate``), the same as `OverloadError.code`. ``pending_bytes``
    were pending when it tripped; ``oldest_age_ms`` is the age of the oldest frame still
    pending (handed to NATS, unconfirmed) when the event was read. ``dropped_first_seq``
    .. ``dropped_last_seq`` are the admitted frames the overload dropped (``None`` when
    none was)."""

    reason: str
    pending_bytes: int
    max_bytes: int
    max_age_ms: int
    dropped_frames: int
    dropped_samples: int
    dropped_first_seq: Optional[int]
    dropped_last_seq: Optional[int]
    oldest_age_ms: float
    frames_published: int

    @property
    def bound(self) -> str:
        """The bound that tripped: the same as ``reason``."""
        return self.reason


@dataclass(frozen=True)
class GapSent:
    """The stream published a gap marker (``gap`` policy): frames ``first_seq ..
    last_seq`` were dropped on purpose, ``reason`` (``queue_full``, ``max_age``,
    ``publish_failed``, ``rate``). Markers published between two reads are reported as
    one event naming the last one; ``gaps_total`` counts them all."""

    first_seq: int
    last_seq: int
    frames: int
    samples: int
    reason: str
    gaps_total: int


@dataclass(frozen=True)
class Closed:
    """The stream is over: its publisher handed the ``end`` to NATS
    (``end_delivered``) or gave up. Always the last event. ``reason``: ``producer``
    (`ProducerStream.end`), ``overload``, ``shutdown`` (`Producer.close`),
    ``producer_gone`` (dropped without ``end``)."""

    reason: Optional[str]
    end_delivered: bool
    frames_published: int
    frames_dropped: int
    frames_possibly_lost: int
    gaps: int
    overload: Optional[Dict[str, Any]] = None


ProducerEvent = Union[Overloaded, GapSent, Closed]


@dataclass(frozen=True)
class StreamSummary:
    """What a finished stream did (`ProducerStream.end`).

    ``frames``: the core's counts — ``offered``, ``admitted``, ``published`` (confirmed
    by the server), ``possibly_lost``, ``unconfirmed`` and ``dropped`` by reason."""

    stream_id: str
    session_id: Optional[str]
    subject: str
    end_reason: Optional[str]
    end_delivered: bool
    finished: bool
    frames_offered: int
    frames_published: int
    frames_dropped: Dict[str, int]
    gaps: int
    overload: Optional[Dict[str, Any]]
    frames: Dict[str, Any] = field(repr=False)

    @property
    def frames_dropped_total(self) -> int:
        """All frames not published, whatever the reason."""
        return sum(self.frames_dropped.values())

    @classmethod
    def _from_json(cls, text: str) -> "StreamSummary":
        d = json.loads(text)
        frames = d.get("frames") or {}
        return cls(
            stream_id=d["stream_id"],
            session_id=d.get("session_id"),
            subject=d["subject"],
            end_reason=d.get("end_reason"),
            end_delivered=bool(d.get("end_delivered")),
            finished=bool(d.get("finished")),
            frames_offered=int(frames.get("offered", 0)),
            frames_published=int(frames.get("published", 0)),
            frames_dropped={k: int(v) for k, v in (frames.get("dropped") or {}).items() if v},
            gaps=int(d.get("gaps", 0)),
            overload=d.get("overload"),
            frames=frames,
        )


@dataclass(frozen=True)
class StreamStatus:
    """A stream's state now (`ProducerStream.status`): ``state`` (``open``,
    ``draining``, ``ending``, ``ended``), ``end_reason`` once it is ending, the
    ``overload`` report, gap markers published, whether the ``end`` went out and the
    publisher ``finished``; ``pending_bytes`` / ``oldest_age_ms`` of what is pending."""

    state: str
    end_reason: Optional[str]
    overload: Optional[Dict[str, Any]]
    gaps: int
    end_delivered: bool
    finished: bool
    ended: bool
    pending_bytes: int
    pending_frames: int
    oldest_age_ms: float
    frames: Dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class ProducerStats:
    """The producer's counters (`Producer.stats`, `Producer.close`): the fields of the
    ingress's ``/v1/stats`` and its active streams."""

    active_streams: int
    streams_total: int
    pending_bytes: int
    pending_frames: int
    oldest_frame_age_ms: float
    frames: Dict[str, Any]
    admission_rejects: int
    overloads: int
    gaps: int
    nats_connected: bool
    window: Optional[Dict[str, Any]]
    streams: List[Dict[str, Any]]
    closed: bool

    @classmethod
    def _from_json(cls, text: str) -> "ProducerStats":
        d = json.loads(text)
        return cls(
            active_streams=int(d.get("active_streams", 0)),
            streams_total=int(d.get("streams_total", 0)),
            pending_bytes=int(d.get("pending_bytes", 0)),
            pending_frames=int(d.get("pending_frames", 0)),
            oldest_frame_age_ms=float(d.get("oldest_frame_age_ms", 0.0)),
            frames=d.get("frames") or {},
            admission_rejects=int(d.get("admission_rejects", 0)),
            overloads=int(d.get("overloads", 0)),
            gaps=int(d.get("gaps", 0)),
            nats_connected=bool(d.get("nats_connected")),
            window=d.get("window"),
            streams=list(d.get("streams") or []),
            closed=bool(d.get("closed")),
        )


def _event(d: Dict[str, Any]) -> ProducerEvent:
    kind = d.pop("type")
    if kind == "overloaded":
        return Overloaded(**d)
    if kind == "gap_sent":
        return GapSent(**d)
    if kind == "closed":
        return Closed(**d)
    raise AssertionError(f"unknown producer event {kind!r}")  # pragma: no cover


class ProducerStream:
    """One open stream (from `Producer.open`). Not thread-safe to end from two
    threads; `push` may be called from any thread."""

    __slots__ = ("_inner", "_seen", "__weakref__")

    def __init__(self, inner: "_weir.ProducerStream") -> None:
        self._inner = inner
        # Index of the last event handed to the caller: the core keeps every later
        # one until a call passes a larger index (cancel safety, see next_event).
        self._seen = 0

    @property
    def id(self) -> str:
        """The stream id."""
        return self._inner.id

    @property
    def subject(self) -> str:
        """The NATS subject its packets go to."""
        return self._inner.subject

    @property
    def session_id(self) -> Optional[str]:
        """The session id it was opened with (in every packet's meta)."""
        return self._inner.session_id

    @property
    def ended(self) -> bool:
        """Whether `end` was called."""
        return self._inner.ended

    def push(self, pcm: Union[bytes, bytearray, memoryview]) -> int:
        """Offers one frame of 16 kHz s16le mono PCM (even length, 2 ..
        ``max_frame_bytes``; 640 bytes = 20 ms). Synchronous, never blocks.

        Returns the frame's seq (1, 2, 3, ...). Raises `OverloadError` when it is not
        admitted (``code``: ``queue_full`` — the byte budget is full now, the stream
        goes on, ``details["ended"]`` is False — or the reason the stream overloaded,
        ``details["ended"]`` True: open a new stream), `ClosedError` after `end` or
        once the stream ended otherwise, `ConfigError` (``invalid_frame``) for a frame
        that is not bytes-like, empty, odd or too large."""
        return self._inner.push(pcm)

    @property
    def status(self) -> StreamStatus:
        """The stream's state now."""
        d = json.loads(self._inner.status_json())
        snap = d.get("snapshot") or {}
        return StreamStatus(
            state=d["state"],
            end_reason=d.get("end_reason"),
            overload=d.get("overload"),
            gaps=int(d.get("gaps", 0)),
            end_delivered=bool(d.get("end_delivered")),
            finished=bool(d.get("finished")),
            ended=bool(d.get("ended")),
            pending_bytes=int(snap.get("pending_bytes", 0)),
            pending_frames=int(snap.get("pending_frames", 0)),
            oldest_age_ms=float(snap.get("oldest_frame_age_ms", 0.0)),
            frames=snap.get("frames") or {},
        )

    async def next_event(self) -> Optional[ProducerEvent]:
        """The next event (`Overloaded`, `GapSent`, `Closed`), waiting for it; ``None``
        after `Closed` was returned. Cancel-safe: a cancelled call loses no event (the
        core drops an event only when a later call shows it was received). Meant for
        one reader at a time: concurrent readers may get the same event."""
        text = await self._inner.next_event(self._seen)
        if text is None:
            return None
        d = json.loads(text)
        # No await between receiving the event and recording it.
        self._seen = max(self._seen, int(d.pop("index")))
        return _event(d)

    async def events(self) -> AsyncIterator[ProducerEvent]:
        """Every event until `Closed` (included)."""
        while True:
            ev = await self.next_event()
            if ev is None:
                return
            yield ev
            if isinstance(ev, Closed):
                return

    async def end(self) -> StreamSummary:
        """Ends the stream (reason ``producer``): what is queued is published, then the
        ``end``; returns once the publisher handed it to NATS (or gave up, bounded by
        the stream's ``end_timeout_ms``). A stream that already ended otherwise
        (overload, `Producer.close`) returns its summary with that ``end_reason``.
        A second call raises `ClosedError`. Cancelling the ``await`` does not stop the
        end: the stream still ends and frees its id."""
        return StreamSummary._from_json(await self._inner.end())

    def __repr__(self) -> str:
        return f"ProducerStream(id={self.id!r}, subject={self.subject!r}, ended={self.ended})"


def _json_arg(what: str, value: Mapping[str, Any]) -> str:
    try:
        return json.dumps(dict(value), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{what}: every value must be a str, number, bool, list or None ({e})",
                          code="invalid_config") from None


class Producer:
    """weir's producer core on one NATS connection. Create with `Producer.connect`;
    ``async with`` closes it."""

    __slots__ = ("_inner", "__weakref__")

    def __init__(self, inner: "_weir.Producer") -> None:
        self._inner = inner

    @classmethod
    async def connect(
        cls,
        servers: Union[str, Sequence[str]] = "nats://127.0.0.1:4222",
        *,
        nats: Optional[Mapping[str, Any]] = None,
        **config: Any,
    ) -> "Producer":
        """Connects to NATS and starts the producer core.

        ``servers``: a URL or a list of them. ``nats``: the other ``[nats]`` keys of
        every weir binary (``user``, ``password``, ``token``, ``nkey``, ``creds_file``,
        ``tls_required``, ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``,
        ``inbox_prefix``, ``connection_timeout_ms``, ``ping_interval_ms``,
        ``client_capacity``, ``retry_initial_connect``, ``name``). With
        ``retry_initial_connect`` (the default) a server that is down does not fail
        the call: it returns after ``connection_timeout_ms`` and the client keeps
        trying (`nats_connected`); set it False to get `ConnectError` instead.

        ``config``: the stream keys of ``audio-ingress serve``, same names and defaults
        (`config_defaults`): ``max_bytes``, ``max_age_ms``, ``max_wait_ms``, ``policy``,
        ``max_rate``, ``delivery``, ``confirm_window_ms``, ``subject``,
        ``partitions``, ... and ``max_streams``. Raises `ConfigError` naming the key
        (``details["key"]``) before connecting."""
        if isinstance(servers, str):
            server_list: Any = servers
        elif isinstance(servers, (list, tuple)):
            server_list = list(servers)
        else:
            raise ConfigError("servers must be a URL string or a list of them",
                              code="invalid_config", details={"key": "servers"})
        nats_keys = dict(nats or {})
        if "servers" in nats_keys or "url" in nats_keys:
            raise ConfigError("give the servers as the `servers` argument, not in nats=",
                              code="invalid_config", details={"key": "servers"})
        nats_keys["servers"] = server_list
        inner = await _weir.Producer.connect(_json_arg("nats options", nats_keys),
                                             _json_arg("producer options", config))
        return cls(inner)

    @staticmethod
    def config_defaults() -> Dict[str, Any]:
        """Every config key with its default (the ingress's)."""
        defaults: Dict[str, Any] = json.loads(_weir.producer_config_defaults())
        return defaults

    @staticmethod
    def config_keys() -> List[Dict[str, str]]:
        """Every config key with its allowed range and meaning."""
        keys: List[Dict[str, str]] = json.loads(_weir.producer_config_keys())
        return keys

    @property
    def config(self) -> Dict[str, Any]:
        """The validated configuration (every key)."""
        config: Dict[str, Any] = json.loads(self._inner.config_json())
        return config

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._inner.closed

    @property
    def nats_connected(self) -> bool:
        """Whether the NATS client is connected now."""
        return self._inner.nats_connected

    def open(self, stream_id: str, session_id: Optional[str] = None) -> ProducerStream:
        """Opens a stream (synchronous). ``stream_id`` is one NATS subject token: ASCII
        letters, digits and ``- _ : = @ +``, at most 128 bytes (docs/protocol.md § 4).

        Raises `ConfigError` (``invalid_stream_id``, ``invalid_session_id``),
        `RefusedError` (``already_active``: a stream with this id is open or still
        delivering its ``end``; ``max_streams``) or `ClosedError` after `close`."""
        return ProducerStream(self._inner.open(stream_id, session_id))

    def stats(self) -> ProducerStats:
        """The counters now."""
        return ProducerStats._from_json(self._inner.stats_json())

    async def close(self, grace_s: float = 2.0) -> ProducerStats:
        """Stops opening streams and ends every open one (reason ``shutdown``): queues
        drain within half of ``grace_s``, the ``end``s go out within the rest; then
        flushes the client. Returns the final stats. Idempotent. Cancelling the
        ``await`` does not stop the close."""
        return ProducerStats._from_json(await self._inner.close(grace_s))

    async def __aenter__(self) -> "Producer":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"Producer(closed={self.closed}, nats_connected={self.nats_connected})"
