"""`weir.llm`: the client of the weir LLM adapter, on the application's own nats-py connection.

It speaks the wire contract of docs/protocol.md sections 7-9 and docs/llm-adapter.md:
metadata in `Weir-*` NATS headers, the body passed unchanged, errors as the usual error
reply.

    import nats
    from weir import llm

    nc = await nats.connect("nats://127.0.0.1:4222")
    client = llm.LlmClient(nc)                        # subjects llm.infer, llm.cancel, llm.status
    reply = await client.request(b'{"messages": []}', timeout_ms=2000)
    async for ev in client.stream(b'{"stream": true, "messages": []}',
                                  request_id="call-42:turn-7", timeout_ms=20000):
        if isinstance(ev, llm.Queued):    print("position", ev.position)
        elif isinstance(ev, llm.Started): print("started after", ev.queue_ms, "ms")
        elif isinstance(ev, llm.Chunk):   handle(ev.data)   # SSE events, unchanged
        elif isinstance(ev, llm.End):     print("ttft", ev.ttft_ms, "ms")

Why a Python module and not a binding of the Rust client (`weir-llm-client`): this
client is a thin codec of headers over NATS request/reply; it keeps no protocol state
beyond one call (the chunk sequence it checks, the acknowledgement it sends back).
Keeping it on the application's nats-py connection keeps what belongs to the
application the application's: its authentication (user, creds, TLS), its
`inbox_prefix` (which decides whether a reply can reach it at all, see below), and its
asyncio loop, with no second NATS connection and no second runtime per process. The
stateful stream cores (`weir.Consumer`, `weir.Producer`: order, gaps, leases, windows,
confirmations) are the ones bound from Rust, because re-implementing them in Python
would be a second implementation of the protocol. The wire contract this module speaks
is checked against the adapter's JSON Schemas (protocol/tests/it/schemas.rs) and
against the real binary (llm-adapter/adapter/tests/it/python_client.rs, intake.rs,
deploy_kit.rs, and python/tests/test_llm_session_cap.py).

Every failure raises `LlmError` (a `weir.errors.WeirError`) with `code` (the adapter's
error code such as `queue_full`, or a client-side `timed_out`, `no_responders`,
`invalid_reply`, `transport`), `message`, `details` (the numbers: `limit`,
`retry_after_ms`, ...) and, when the request body was the deployed envelope,
`envelope` (the response envelope, `ok: false`).

Early-fail session cap (optional, off by default): `LlmClient(nc, session_cap=5)`, or
`await LlmClient.discover(nc)`, which reads the adapter's capabilities
(`llm.capabilities`: its subjects and its advertised `session.pending_cap`) and mirrors
that cap, as the Rust client's `LlmClient::discover` does. With a cap, a request that
names a session (`session_id=`) while this client already has `cap` requests of that
session in flight is refused locally, before anything is sent: `LlmError(code=
"session_queue_full", details={"limit", "pending"})` with `local == True`. Invariants:
- it counts only this client's own requests (other processes and other `LlmClient`s
  are not seen), so the adapter stays the authority: its own `session_queue_full`
  refusal still arrives as an `LlmError` (`local == False`);
- a slot is taken when the call starts (for `stream()`: at the first step of the
  iteration) and released exactly once: when the unary call returns or raises
  (including `asyncio.CancelledError`), and when a stream ends (`End`, an error, the
  budget, a cancelled step, or `aclose()` of an iterator left early: use
  `contextlib.aclosing` to release it at once rather than when it is collected);
- requests without `session_id` take no slot; `cancel()` and `status()` take none;
- the counts are plain state of the asyncio loop the connection runs on (no lock):
  use a client from that loop only, as nats-py requires anyway.

Inbox prefix: every reply subject this client uses (unary replies, streamed events,
the durable intake's `Weir-Reply-To`) is an inbox of the connection, so it follows
nats-py's `inbox_prefix`. Where the server lets each user subscribe only to its own
inboxes (deploy/nats-server.conf: user `caller`, `_INBOX.caller.>`), connect with that
prefix, or no reply can reach you:

    nc = await nats.connect(url, user="caller", password=secret,
                            inbox_prefix="_INBOX.caller")

Durable intake (the adapter's `intake = "jetstream"`): `LlmClient(nc,
intake_subject="llm.intake")` sends unary requests with a JetStream publish, so the
stream keeps each request until a replica answers it, also when the replica that took
it dies (docs/llm-adapter.md, durable intake). A retry with the same request id within
the stream's duplicate window is answered with the first answer (through the service
subject), not run again.

Iterating a stream acknowledges its chunks (the adapter's flow control, protocol 8.4):
a caller that stops iterating is aborted by the adapter after `stream.window` chunks
and `stream.ack_timeout_ms`. Leaving the `async for` early unsubscribes once the
iterator is closed (at once with `contextlib.aclosing`, else when it is collected),
which the adapter notices as well.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncGenerator, Dict, Optional, Union

from .errors import ConfigError, WeirError

if TYPE_CHECKING:  # nats-py is imported lazily at run time (the header codec needs none of it)
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg

__all__ = [
    "CallOptions",
    "LlmClient",
    "LlmError",
    "Reply",
    "Queued",
    "Started",
    "Chunk",
    "End",
    "Event",
]

# Seconds between publishes of a durable request the intake stream did not store.
_DURABLE_RETRY = 0.25

# Header names (protocol/src/llm/headers.rs, protocol/src/llm/stream.rs).
REQUEST_ID = "Weir-Request-Id"
SESSION_ID = "Weir-Session-Id"
TIMEOUT_MS = "Weir-Timeout-Ms"
DEADLINE_MS = "Weir-Deadline-Ms"
ADMISSION = "Weir-Admission"
CLIENT_KEY = "Weir-Client-Key"
QUEUE_MS = "Weir-Queue-Ms"
INFERENCE_MS = "Weir-Inference-Ms"
ERROR_CODE = "Weir-Error-Code"
NATS_SERVICE_ERROR = "Nats-Service-Error"
NATS_SERVICE_ERROR_CODE = "Nats-Service-Error-Code"
STREAM = "Weir-Stream"
STREAM_EVENT = "Weir-Stream-Event"
STREAM_SEQ = "Weir-Stream-Seq"
QUEUE_POSITION = "Weir-Queue-Position"
PREDICTED_START_MS = "Weir-Predicted-Start-Ms"
TTFT_MS = "Weir-Ttft-Ms"
STREAM_CHUNKS = "Weir-Stream-Chunks"
STREAM_BYTES = "Weir-Stream-Bytes"
STREAM_OUTCOME = "Weir-Stream-Outcome"
REPLY_TO = "Weir-Reply-To"
# W3C Trace Context: passed through as given (the adapter ignores a malformed one).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
NATS_MSG_ID = "Nats-Msg-Id"


class LlmError(WeirError):
    """A refusal or failure of an LLM call (a `weir.errors.WeirError`): `code` (the
    adapter's error code, e.g. `queue_full`, `session_queue_full`, `deadline_exceeded`,
    or the client's `timed_out`, `no_responders`, `invalid_reply`, `transport`),
    `message`, `details` (dict: `limit`, `pending`, `retry_after_ms`, ...), `envelope`
    (the response envelope when the request body was one), `nats_code` (the
    `Nats-Service-Error-Code`, e.g. 503) and `local` (True when this client refused the
    call itself, without a round trip: its early-fail session cap)."""

    code: str
    message: str
    details: Dict[str, Any]
    nats_code: Optional[int]
    envelope: Optional[Dict[str, Any]]
    local: bool

    def __init__(
        self,
        code: str,
        message: str,
        details: Optional[Dict[str, Any]] = None,
        nats_code: Optional[int] = None,
        envelope: Optional[Dict[str, Any]] = None,
        *,
        local: bool = False,
    ) -> None:
        super().__init__(message, code=code, details=details)
        self.nats_code = nats_code
        self.envelope = envelope
        self.local = local

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> Any:
        # Every attribute survives pickling (e.g. across a process pool), not only args.
        return (
            _rebuild_llm_error,
            (self.code, self.message, self.details, self.nats_code, self.envelope, self.local),
        )

    @property
    def retry_after_ms(self) -> Optional[int]:
        """The adapter's (or the backend's) retry hint, if any."""
        return self.details.get("retry_after_ms")


def _rebuild_llm_error(
    code: str,
    message: str,
    details: Dict[str, Any],
    nats_code: Optional[int],
    envelope: Optional[Dict[str, Any]],
    local: bool,
) -> LlmError:
    return LlmError(code, message, details, nats_code, envelope, local=local)


@dataclass(frozen=True)
class Reply:
    """A unary answer: the backend's body unchanged, the timings and every header."""

    body: bytes
    queue_ms: Optional[float]
    inference_ms: Optional[float]
    headers: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Queued:
    """Accepted and waiting: 1-based position (1 = next), predicted wait in ms."""

    position: int
    predicted_start_ms: Optional[float]


@dataclass(frozen=True)
class Started:
    """Inference started after `queue_ms`."""

    queue_ms: Optional[float]


@dataclass(frozen=True)
class Chunk:
    """Part of the body: one or more SSE events, unchanged. `seq` is 1, 2, 3, ..."""

    seq: int
    data: bytes


@dataclass(frozen=True)
class End:
    """The stream is complete (always its last event). `chunks` / `bytes`: what this
    caller received. `outcome` is "ok", or "joined" when this caller joined another
    caller's stream with the same request id (or found it cached): the request ran
    once, its text went to the first caller and is not kept."""

    queue_ms: Optional[float]
    inference_ms: Optional[float]
    ttft_ms: Optional[float]
    chunks: int
    bytes: int
    outcome: str = "ok"


Event = Union[Queued, Started, Chunk, End]


def _header(headers: Optional[Dict[str, str]], name: str) -> Optional[str]:
    if not headers:
        return None
    if name in headers:
        return headers[name]
    low = name.lower()
    for k, v in headers.items():
        if k.lower() == low:
            return v
    return None


def _ms(headers: Optional[Dict[str, str]], name: str) -> Optional[float]:
    v = _header(headers, name)
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def _int(headers: Optional[Dict[str, str]], name: str, default: int = 0) -> int:
    v = _header(headers, name)
    try:
        return int(v) if v is not None else default
    except ValueError:
        return default


def _is_no_responders(msg: "Msg") -> bool:
    return _header(msg.headers, "Status") == "503" and not msg.data


def _check_error(msg: "Msg") -> None:
    """Raises `LlmError` for an error reply (`Nats-Service-Error`)."""
    status = _header(msg.headers, NATS_SERVICE_ERROR)
    if status is None:
        return
    nats_code = _int(msg.headers, NATS_SERVICE_ERROR_CODE, 0) or None
    code = _header(msg.headers, ERROR_CODE) or "service_error"
    message: str = status
    details: Dict[str, Any] = {}
    envelope: Optional[Dict[str, Any]] = None
    try:
        body = json.loads(msg.data)
    except (ValueError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        err = body.get("error") if "ok" in body else body
        if "ok" in body:
            envelope = body
        if isinstance(err, dict):
            code = err.get("code", code)
            message = err.get("message", message)
            details = err.get("details") or {}
    raise LlmError(code, message, details, nats_code, envelope)


@dataclass(frozen=True)
class CallOptions:
    """The keyword arguments of `LlmClient.request` and `LlmClient.stream`, each sent in
    its header when given: `request_id`, `session_id`, `timeout_ms` (the budget; the
    client waits that long plus its margin), `client_key`, `admission` (`enqueue` or
    `reject`), and `traceparent` / `tracestate`: the caller's W3C trace context, sent as
    given (e.g. from opentelemetry's `propagate.inject`); the adapter joins that trace."""

    request_id: Optional[str] = None
    session_id: Optional[str] = None
    timeout_ms: Optional[int] = None
    client_key: Optional[str] = None
    admission: Optional[str] = None
    traceparent: Optional[str] = None
    tracestate: Optional[str] = None

    def headers(self) -> Dict[str, str]:
        h: Dict[str, str] = {}
        if self.traceparent is not None:
            h[TRACEPARENT] = self.traceparent
            if self.tracestate is not None:
                h[TRACESTATE] = self.tracestate
        for name, value in (
            (REQUEST_ID, self.request_id),
            (SESSION_ID, self.session_id),
            (TIMEOUT_MS, None if self.timeout_ms is None else str(int(self.timeout_ms))),
            (CLIENT_KEY, self.client_key),
            (ADMISSION, self.admission),
        ):
            if value is not None:
                h[name] = value
        return h


class _Slot:
    """One request's place in the local session cap; `release()` acts once only."""

    __slots__ = ("_pending", "_session", "_held")

    def __init__(self, pending: Dict[str, int], session: str) -> None:
        self._pending = pending
        self._session = session
        self._held = True

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        n = self._pending.get(self._session, 0) - 1
        if n > 0:
            self._pending[self._session] = n
        else:
            self._pending.pop(self._session, None)


class LlmClient:
    """A client of one adapter service on a nats-py connection (`nc`, the
    application's: its auth, inbox prefix and loop).

    `session_cap`: the optional early-fail session cap (None or 0 = off, the default):
    at most that many of this client's requests per session in flight; one more is
    refused locally with `LlmError(code="session_queue_full", local=True)`. Mirror the
    adapter's advertised `session.pending_cap` with `LlmClient.discover`."""

    def __init__(
        self,
        nc: "NatsClient",
        subject: str = "llm.infer",
        cancel_subject: str = "llm.cancel",
        status_subject: str = "llm.status",
        default_timeout: float = 30.0,
        margin: float = 0.25,
        intake_subject: Optional[str] = None,
        session_cap: Optional[int] = None,
    ) -> None:
        if session_cap is not None and (
            isinstance(session_cap, bool) or not isinstance(session_cap, int) or session_cap < 0
        ):
            raise ConfigError(
                f"session_cap must be a non-negative int or None, not {session_cap!r}",
                code="invalid_config",
            )
        self.nc = nc
        # The durable intake's stream subject (`jetstream.subject`); None = core
        # request/reply only.
        self.intake_subject = intake_subject
        self.subject = subject
        self.cancel_subject = cancel_subject
        self.status_subject = status_subject
        self.default_timeout = default_timeout
        self.margin = margin
        self._cap: Optional[int] = session_cap or None
        # session id -> this client's requests of it in flight (only while the cap is on;
        # an entry is removed when it reaches 0, so the map holds live sessions only).
        self._pending: Dict[str, int] = {}

    @classmethod
    async def discover(
        cls,
        nc: "NatsClient",
        capabilities_subject: str = "llm.capabilities",
        timeout: float = 1.0,
        *,
        local_session_cap: bool = True,
        **kwargs: Any,
    ) -> "LlmClient":
        """A client made from the adapter's capabilities (`capabilities_subject`): its
        service, cancel and status subjects and, with `local_session_cap` (the default,
        as the Rust client's `discover`), the early-fail cap mirroring its advertised
        `session.pending_cap` (none when the adapter advertises 0 or null). `kwargs`:
        the other constructor arguments (`default_timeout`, `intake_subject`, ...)."""
        import nats.errors

        try:
            msg = await nc.request(capabilities_subject, b"", timeout=timeout)
        except nats.errors.NoRespondersError as e:
            raise LlmError("no_responders", "capabilities: no adapter is listening") from e
        except nats.errors.TimeoutError as e:
            raise LlmError("timed_out", "capabilities: no reply in time") from e
        _check_error(msg)
        try:
            caps = json.loads(msg.data)
        except (ValueError, UnicodeDecodeError) as e:
            raise LlmError("invalid_reply", f"capabilities: not JSON: {e}") from e
        service = caps.get("service") if isinstance(caps, dict) else None
        if not isinstance(service, dict) or not isinstance(service.get("subject"), str):
            raise LlmError("invalid_reply", "capabilities: no service.subject")
        for key, arg in (
            ("subject", "subject"),
            ("cancel_subject", "cancel_subject"),
            ("status_subject", "status_subject"),
        ):
            if isinstance(service.get(key), str):
                kwargs.setdefault(arg, service[key])
        if local_session_cap:
            session = caps.get("session")
            cap = session.get("pending_cap") if isinstance(session, dict) else None
            if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                kwargs.setdefault("session_cap", cap)
        return cls(nc, **kwargs)

    @property
    def session_cap(self) -> Optional[int]:
        """The local early-fail session cap, or None when it is off."""
        return self._cap

    def pending(self, session_id: str) -> int:
        """This client's requests of `session_id` in flight, as the local cap counts
        them (0 when the cap is off)."""
        return self._pending.get(session_id, 0)

    def _take_slot(self, session_id: Optional[str]) -> Optional[_Slot]:
        """A local session slot, when the cap is on and the call names a session;
        raises `LlmError(session_queue_full, local=True)` when the session is full."""
        cap = self._cap
        if cap is None or session_id is None:
            return None
        n = self._pending.get(session_id, 0)
        if n >= cap:
            raise LlmError(
                "session_queue_full",
                f"this client has {n} requests pending for the session (local cap {cap})",
                {"limit": cap, "pending": n},
                local=True,
            )
        self._pending[session_id] = n + 1
        return _Slot(self._pending, session_id)

    def _wait(self, timeout_ms: Optional[int]) -> float:
        if timeout_ms is None:
            return self.default_timeout
        return timeout_ms / 1000.0 + self.margin

    async def request(self, body: bytes, **options: Any) -> Reply:
        """The unary call: waits for the whole answer (through the durable intake when
        the client was made with `intake_subject`). The options: `CallOptions`."""
        opts = CallOptions(**options)
        headers, wait = opts.headers(), self._wait(opts.timeout_ms)
        slot = self._take_slot(opts.session_id)
        try:
            if self.intake_subject is not None:
                msg = await self._durable(body, wait, headers)
            else:
                msg = await self._request(self.subject, body, wait, headers)
        finally:
            if slot is not None:
                slot.release()
        return Reply(
            body=msg.data,
            queue_ms=_ms(msg.headers, QUEUE_MS),
            inference_ms=_ms(msg.headers, INFERENCE_MS),
            headers=dict(msg.headers or {}),
        )

    async def stream(self, body: bytes, **options: Any) -> AsyncGenerator[Event, None]:
        """A streamed call (`Weir-Stream: 1`): yields `Queued`, `Started`, `Chunk` ... and
        finally `End`, or raises `LlmError`. The whole stream is bounded by the budget
        (`timeout_ms`, plus a margin) or the default timeout. The options: `CallOptions`.
        The local session slot (when the cap is on) is taken at the first step and
        released at `End`, on an error, or when the iterator is closed."""
        import nats.errors

        opts = CallOptions(**options)
        headers = opts.headers()
        headers[STREAM] = "1"
        slot = self._take_slot(opts.session_id)
        sub = None
        try:
            loop = asyncio.get_running_loop()
            until = loop.time() + self._wait(opts.timeout_ms) + self.margin
            inbox = self.nc.new_inbox()
            sub = await self.nc.subscribe(inbox)
            await self.nc.publish(self.subject, body, reply=inbox, headers=headers)
            expected = 1
            while True:
                left = until - loop.time()
                if left <= 0:
                    raise LlmError("timed_out", "stream did not end in time")
                try:
                    msg = await sub.next_msg(timeout=left)
                except nats.errors.TimeoutError as e:
                    raise LlmError("timed_out", "stream did not end in time") from e
                if _is_no_responders(msg):
                    raise LlmError("no_responders", "no adapter is listening on the subject")
                _check_error(msg)
                event = _header(msg.headers, STREAM_EVENT)
                if event == "queued":
                    yield Queued(
                        position=_int(msg.headers, QUEUE_POSITION),
                        predicted_start_ms=_ms(msg.headers, PREDICTED_START_MS),
                    )
                elif event == "started":
                    yield Started(queue_ms=_ms(msg.headers, QUEUE_MS))
                elif event == "chunk":
                    seq = _int(msg.headers, STREAM_SEQ)
                    if seq != expected:
                        raise LlmError(
                            "invalid_reply", f"chunk {seq} arrived, {expected} expected (lost)"
                        )
                    expected += 1
                    if msg.reply:
                        # Best effort: a lost acknowledgement is repaired by the next.
                        await self.nc.publish(msg.reply, str(seq).encode())
                    yield Chunk(seq=seq, data=msg.data)
                elif event == "end":
                    chunks = _int(msg.headers, STREAM_CHUNKS)
                    if chunks != expected - 1:
                        raise LlmError(
                            "invalid_reply", f"end says {chunks} chunks, {expected - 1} arrived"
                        )
                    # The adapter settled the request: the slot is free even while the
                    # caller still holds the iterator.
                    if slot is not None:
                        slot.release()
                    yield End(
                        queue_ms=_ms(msg.headers, QUEUE_MS),
                        inference_ms=_ms(msg.headers, INFERENCE_MS),
                        ttft_ms=_ms(msg.headers, TTFT_MS),
                        chunks=chunks,
                        bytes=_int(msg.headers, STREAM_BYTES),
                        outcome=_header(msg.headers, STREAM_OUTCOME) or "ok",
                    )
                    return
                # Anything else: an event of a newer adapter; skipped.
        finally:
            # Released first: nothing below can skip it (an unsubscribe that fails or
            # is cancelled).
            if slot is not None:
                slot.release()
            if sub is not None:
                try:
                    await sub.unsubscribe()
                except Exception:  # the connection may be closing; nothing to undo
                    pass

    async def _request(
        self, subject: str, body: bytes, timeout: float, headers: Dict[str, str]
    ) -> "Msg":
        """One NATS request; transport failures and error replies raise `LlmError`."""
        import nats.errors

        try:
            msg = await self.nc.request(subject, body, timeout=timeout, headers=headers)
        except nats.errors.NoRespondersError as e:
            raise LlmError("no_responders", "no adapter is listening") from e
        except nats.errors.TimeoutError as e:
            raise LlmError("timed_out", "no reply in time") from e
        _check_error(msg)
        return msg

    async def _durable(self, body: bytes, timeout: float, headers: Dict[str, str]) -> "Msg":
        """One request through the durable intake: subscribe the reply inbox, publish to
        the stream with `Nats-Msg-Id` = the request id and `Weir-Reply-To` = the inbox,
        wait for the stream's acknowledgement, then for the answer. A duplicate (the
        stream already has this id) asks the service subject, whose forwarding replica
        answers with the first copy's kept answer."""
        import nats.errors

        inbox = self.nc.new_inbox()
        request_id = headers.get(REQUEST_ID) or inbox.rsplit(".", 1)[-1]
        headers[REQUEST_ID] = request_id
        sub = await self.nc.subscribe(inbox, max_msgs=1)
        try:
            published = dict(headers)
            published[NATS_MSG_ID] = request_id
            published[REPLY_TO] = inbox
            # While the stream elects a new leader (a node died: 4.5-6.3 s measured on a
            # 3-node cluster) a publish times out or finds no responders: again with the
            # same Nats-Msg-Id (the stream drops a second copy), within the timeout.
            intake = self.intake_subject
            if intake is None:
                raise ConfigError("no intake_subject: not a durable client", code="invalid_config")
            loop = asyncio.get_running_loop()
            give_up = loop.time() + timeout - _DURABLE_RETRY
            while True:
                try:
                    ack = await self.nc.jetstream().publish(
                        intake,
                        body,
                        timeout=max(0.05, min(timeout, give_up - loop.time())),
                        headers=published,
                    )
                    break
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
                    if loop.time() + _DURABLE_RETRY < give_up:
                        await asyncio.sleep(_DURABLE_RETRY)
                        continue
                    if isinstance(e, nats.errors.TimeoutError):
                        raise LlmError(
                            "timed_out", "the durable intake did not confirm the request"
                        ) from e
                    raise LlmError("no_responders", "no stream on the intake subject") from e
                except Exception as e:  # nats.js.errors.APIError: not stored (full, ...)
                    raise LlmError("transport", f"durable intake: {e}") from e
            if getattr(ack, "duplicate", False):
                return await self._request(self.subject, body, timeout, headers)
            try:
                msg = await sub.next_msg(timeout=timeout)
            except nats.errors.TimeoutError as e:
                raise LlmError("timed_out", "no reply in time") from e
            _check_error(msg)
            return msg
        finally:
            try:
                await sub.unsubscribe()
            except Exception:  # already unsubscribed after its one message
                pass

    async def _by_id(self, subject: str, request_id: str, timeout: float) -> Dict[str, Any]:
        msg = await self._request(subject, b"", timeout, {REQUEST_ID: request_id})
        try:
            reply = json.loads(msg.data)
        except (ValueError, UnicodeDecodeError) as e:
            raise LlmError("invalid_reply", f"{subject}: not JSON: {e}") from e
        if not isinstance(reply, dict):
            raise LlmError("invalid_reply", f"{subject}: not a JSON object")
        return reply

    async def cancel(self, request_id: str, timeout: float = 2.0) -> Dict[str, Any]:
        """Cancels by request id: `{"request_id", "result": "queued"|"running"|"not_found"}`."""
        return await self._by_id(self.cancel_subject, request_id, timeout)

    async def status(self, request_id: str, timeout: float = 2.0) -> Dict[str, Any]:
        """Where a request is: `{"request_id", "status": "queued"|"running"|"done"|"not_found",
        "position", "predicted_start_ms", "waited_ms" | "elapsed_ms"}`."""
        return await self._by_id(self.status_subject, request_id, timeout)
