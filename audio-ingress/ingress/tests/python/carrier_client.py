#!/usr/bin/env python3
"""A telephony carrier for weir's conformance tests (telephony_conformance.rs).

Written from the carriers' public documentation only — Twilio "Media Streams -
WebSocket Messages" and Telnyx "Stream call media over WebSocket" — not from weir's
code, so that the door is tested against what a carrier really sends and expects.

It plays the carrier's side of a bidirectional media stream:

- connects to the door's WebSocket URL and sends ``connected`` then ``start``
  (Twilio: ``streamSid``, ``callSid``, ``accountSid``, ``tracks``, ``mediaFormat``
  audio/x-mulaw 8000 1, ``customParameters``; Telnyx: ``stream_id``,
  ``start.call_control_id``, ``media_format`` PCMU/PCMA 8000 1,
  ``custom_parameters``), then one ``media`` message per 20 ms chunk (160 bytes of
  G.711, base64) with ``sequenceNumber``/``sequence_number``, ``chunk`` and
  ``timestamp`` as strings, as the docs show, then ``stop``;
- paces the chunks at 20 ms (or as fast as it can, ``--fast``), optionally permuted
  within a window (``--shuffle-ms``) or with some chunks late (``--delay-chunks``);
- receives the bot's audio like a carrier: every ``media`` message is recorded with
  its arrival time and played into a simulated playback buffer at real time; each
  ``mark`` is echoed back (same name) once the audio before it finished playing;
  ``clear`` empties the buffer and sends back every mark still pending — both
  carriers document this (Telnyx: "A clear frame also returns queued marks"; Twilio:
  clearing the buffered audio causes the pending mark messages to be sent back);
- ``--stall-after S`` stops reading the socket after S seconds (a stalled carrier),
  with a small receive buffer so that the door feels it soon.

Invariants: every wait is bounded (``--timeout`` bounds the whole call); the report
is written whatever happens once the process got as far as connecting; times are
given twice, ``mono`` (``time.monotonic()``, for intervals) and ``t`` (Unix seconds,
to compare with another process on the same machine).

Other modes (no network):

- ``--reference OUT.raw --audio IN --encoding PCMU|PCMA``: decodes G.711 8 kHz with
  PyAV/FFmpeg and resamples it with swresample to 16 kHz s16le mono — the reference
  of the correlation checks, independent of weir's codec;
- ``--make-fixture WAV --out-dir DIR``: resamples a WAV to 8 kHz mono with PyAV and
  encodes it to ``speech-8k.ulaw`` and ``speech-8k.alaw`` (raw G.711, no header).

Output: one JSON line per notable event on stdout (``{"event": ..., "t": ...}``) and,
last, the report line ``{"event": "report", ...}`` (also written to ``--report``).
Exit status: 0 when the call ran (whatever the door did), 2 when the connection
could not be made (the report says why), 1 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import os
import random
import signal
import socket
import sys
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Tuple

CHUNK_MS = 20
RATE = 8000
CHUNK_BYTES = RATE * CHUNK_MS // 1000  # 160 bytes of G.711 = 20 ms
# The byte of digital silence per encoding (G.711: µ-law 0xFF, A-law 0xD5).
SILENCE = {"PCMU": 0xFF, "PCMA": 0xD5}
CODEC = {"PCMU": "pcm_mulaw", "PCMA": "pcm_alaw"}
# Twilio names the format by MIME type; it documents only audio/x-mulaw.
TWILIO_ENCODING = {"PCMU": "audio/x-mulaw", "PCMA": "audio/x-alaw"}
# Bound on any single receive, so that no loop waits forever.
RECV_POLL_S = 0.25


def emit(event: str, **kv: Any) -> None:
    """Writes one JSON line to stdout: the event, its Unix time and monotonic time."""
    kv = {"event": event, "t": time.time(), "mono": time.monotonic(), **kv}
    sys.stdout.write(json.dumps(kv) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------
# Messages, as the carriers' docs show them
# --------------------------------------------------------------------------------


@dataclass
class Identity:
    """Who the call is: the ids a carrier puts in ``start``."""

    dialect: str  # "twilio" | "telnyx"
    stream_sid: str  # Twilio streamSid / Telnyx stream_id
    call_sid: str  # Twilio callSid / Telnyx call_control_id
    account_sid: str  # Twilio accountSid / Telnyx user_id
    encoding: str  # "PCMU" | "PCMA"
    custom: Dict[str, str]
    tracks: List[str]


class Carrier:
    """Builds the carrier's messages and numbers them (``sequenceNumber`` /
    ``sequence_number``: 1 for ``start``, then +1 for every message sent after it,
    media or not, as strings)."""

    def __init__(self, ident: Identity) -> None:
        self.ident = ident
        self.seq = 0

    def _next_seq(self) -> str:
        self.seq += 1
        return str(self.seq)

    def connected(self) -> Dict[str, Any]:
        """The first message of the connection."""
        if self.ident.dialect == "twilio":
            return {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        return {"event": "connected", "version": "1.0.0"}

    def start(self) -> Dict[str, Any]:
        """The stream's metadata, sent once, right after ``connected``."""
        i = self.ident
        if i.dialect == "twilio":
            return {
                "event": "start",
                "sequenceNumber": self._next_seq(),
                "start": {
                    "accountSid": i.account_sid,
                    "streamSid": i.stream_sid,
                    "callSid": i.call_sid,
                    "tracks": list(i.tracks),
                    "customParameters": dict(i.custom),
                    "mediaFormat": {
                        "encoding": TWILIO_ENCODING[i.encoding],
                        "sampleRate": RATE,
                        "channels": 1,
                    },
                },
                "streamSid": i.stream_sid,
            }
        return {
            "event": "start",
            "sequence_number": self._next_seq(),
            "stream_id": i.stream_sid,
            "start": {
                "user_id": i.account_sid,
                "call_control_id": i.call_sid,
                "call_session_id": "c0ffee00-0000-4000-8000-" + i.stream_sid[-12:].rjust(12, "0"),
                "from": "+13125550100",
                "to": "+13125550199",
                "tags": [],
                "client_state": base64.b64encode(b"weir-conformance").decode(),
                "custom_parameters": dict(i.custom),
                "media_format": {"encoding": i.encoding, "sample_rate": RATE, "channels": 1},
            },
        }

    def media(self, chunk: int, payload: bytes) -> Dict[str, Any]:
        """One inbound chunk; ``chunk`` counts from 1, ``timestamp`` is in ms from the
        stream's start."""
        media = {
            "track": "inbound",
            "chunk": str(chunk),
            "timestamp": str((chunk - 1) * CHUNK_MS),
            "payload": base64.b64encode(payload).decode(),
        }
        if self.ident.dialect == "twilio":
            return {
                "event": "media",
                "sequenceNumber": self._next_seq(),
                "media": media,
                "streamSid": self.ident.stream_sid,
            }
        return {
            "event": "media",
            "sequence_number": self._next_seq(),
            "stream_id": self.ident.stream_sid,
            "media": media,
        }

    def mark(self, name: str) -> Dict[str, Any]:
        """A mark sent back: the audio before it finished playing (or was cleared)."""
        if self.ident.dialect == "twilio":
            return {
                "event": "mark",
                "sequenceNumber": self._next_seq(),
                "streamSid": self.ident.stream_sid,
                "mark": {"name": name},
            }
        return {
            "event": "mark",
            "sequence_number": self._next_seq(),
            "stream_id": self.ident.stream_sid,
            "mark": {"name": name},
        }

    def stop(self) -> Dict[str, Any]:
        """The stream ended (the call hung up)."""
        i = self.ident
        if i.dialect == "twilio":
            return {
                "event": "stop",
                "sequenceNumber": self._next_seq(),
                "stop": {"accountSid": i.account_sid, "callSid": i.call_sid},
                "streamSid": i.stream_sid,
            }
        return {
            "event": "stop",
            "sequence_number": self._next_seq(),
            "stream_id": i.stream_sid,
            "stop": {"user_id": i.account_sid, "call_control_id": i.call_sid},
        }


# --------------------------------------------------------------------------------
# The inbound schedule: which chunk is sent when
# --------------------------------------------------------------------------------


def parse_delays(spec: str) -> Dict[int, float]:
    """``K:D[,K:D...]``: chunk K (from 1) is delivered D ms late."""
    out: Dict[int, float] = {}
    for part in filter(None, spec.split(",")):
        k, d = part.split(":", 1)
        if int(k) < 1 or float(d) < 0:
            raise ValueError(f"bad --delay-chunks item {part!r}")
        out[int(k)] = float(d)
    return out


def schedule(
    n_chunks: int, shuffle_ms: int, delays: Dict[int, float], seed: int, fast: bool
) -> List[Tuple[float, int]]:
    """(send offset in s from the first chunk, chunk number from 1), in send order.

    Slot s (0-based) is due at s × 20 ms. With ``shuffle_ms`` ≥ 40, the chunks of each
    block of ``shuffle_ms / 20`` consecutive slots are permuted (seeded), so no chunk
    is displaced by more than the window minus one slot. A delayed chunk keeps its
    slot's time plus its delay. ``fast``: no waiting, the same order (a delay of D ms
    moves a chunk ⌈D / 20⌉ slots later).
    """
    order = list(range(1, n_chunks + 1))
    block = max(1, shuffle_ms // CHUNK_MS)
    if block > 1:
        rng = random.Random(seed)
        for b in range(0, n_chunks, block):
            part = order[b : b + block]
            # A permutation that actually moves something when it can.
            for _ in range(8):
                rng.shuffle(part)
                if len(part) < 2 or part != sorted(part):
                    break
            order[b : b + block] = part
    timed = []
    for slot, chunk in enumerate(order):
        at = slot * CHUNK_MS + delays.get(chunk, 0.0)
        timed.append((at / 1000.0, slot, chunk))
    timed.sort(key=lambda x: (x[0], x[1]))
    if fast:
        return [(0.0, c) for _, _, c in timed]
    return [(at, c) for at, _, c in timed]


# --------------------------------------------------------------------------------
# The carrier's playback of the bot's audio
# --------------------------------------------------------------------------------


@dataclass
class Playback:
    """A simulated playback buffer that plays at real time (8 bytes of G.711 per ms).

    ``play_end`` is when everything received so far will have played. A mark received
    is due at the ``play_end`` of that moment (at once when nothing is playing)."""

    play_end: float = 0.0
    pending: Deque[Tuple[float, str]] = field(default_factory=deque)
    received_ms: float = 0.0
    discarded_ms: float = 0.0

    def add_audio(self, now: float, n_bytes: int) -> None:
        """Queues ``n_bytes`` of 8 kHz G.711 behind what is playing."""
        dur = n_bytes / RATE
        self.play_end = max(now, self.play_end) + dur
        self.received_ms += dur * 1000.0

    def add_mark(self, now: float, name: str) -> float:
        """Queues a mark after the audio so far; returns when it is due."""
        due = max(now, self.play_end)
        self.pending.append((due, name))
        return due

    def due_marks(self, now: float) -> List[str]:
        """The marks whose audio has finished playing by ``now``, in order."""
        out = []
        while self.pending and self.pending[0][0] <= now:
            out.append(self.pending.popleft()[1])
        return out

    def next_due(self) -> Optional[float]:
        """When the next pending mark is due (None: none pending)."""
        return self.pending[0][0] if self.pending else None

    def clear(self, now: float) -> Tuple[float, List[str]]:
        """Empties the buffer: (ms of audio discarded, marks still pending)."""
        discarded = max(0.0, self.play_end - now) * 1000.0
        self.discarded_ms += discarded
        self.play_end = now
        marks = [name for _, name in self.pending]
        self.pending.clear()
        return discarded, marks


@dataclass
class Report:
    """What the carrier saw; written as JSON at the end."""

    dialect: str
    url: str
    stream_sid: str
    call_sid: str
    connected: bool = False
    refused: Optional[Dict[str, Any]] = None
    chunks_sent: int = 0
    inbound_ms: int = 0
    send_order_head: List[int] = field(default_factory=list)
    first_media_sent_t: Optional[float] = None
    stop_sent_t: Optional[float] = None
    outbound_media: List[Dict[str, Any]] = field(default_factory=list)
    outbound_bytes: int = 0
    marks_received: List[Dict[str, Any]] = field(default_factory=list)
    marks_echoed: List[Dict[str, Any]] = field(default_factory=list)
    clears: List[Dict[str, Any]] = field(default_factory=list)
    played_ms: float = 0.0
    discarded_ms: float = 0.0
    errors: List[str] = field(default_factory=list)
    unknown_events: Dict[str, int] = field(default_factory=dict)
    stalled_at_t: Optional[float] = None
    closed: Optional[Dict[str, Any]] = None
    ended_by: str = ""

    def to_json(self) -> Dict[str, Any]:
        """The report, with the counts the tests read first."""
        d = dict(self.__dict__)
        d["outbound_media_count"] = len(self.outbound_media)
        d["marks_echoed_count"] = len(self.marks_echoed)
        d["clear_received_t"] = self.clears[0]["t"] if self.clears else None
        return d


# --------------------------------------------------------------------------------
# The call
# --------------------------------------------------------------------------------


class Call:
    """One call: the sender (inbound audio), the receiver (the bot's audio) and the
    mark clock, sharing one WebSocket."""

    def __init__(self, args: argparse.Namespace, ident: Identity, audio: bytes) -> None:
        self.args = args
        self.carrier = Carrier(ident)
        self.audio = audio
        self.play = Playback()
        self.report = Report(
            dialect=ident.dialect, url=args.url, stream_sid=ident.stream_sid, call_sid=ident.call_sid
        )
        self.send_lock = asyncio.Lock()
        self.stop_requested = asyncio.Event()
        self.done_sending = asyncio.Event()
        self.done_receiving = asyncio.Event()
        self.ws: Any = None
        self.save: Optional[Any] = None

    async def send(self, msg: Dict[str, Any]) -> bool:
        """Sends one JSON text message (bounded); False when the socket is gone."""
        try:
            async with self.send_lock:
                await asyncio.wait_for(self.ws.send(json.dumps(msg)), timeout=5.0)
            return True
        except Exception as e:  # noqa: BLE001 — any failure ends this side's sending
            self.report.errors.append(f"send {msg.get('event')}: {type(e).__name__}: {e}")
            return False

    def chunks(self) -> int:
        """How many 20 ms chunks the call sends: the audio, padded with silence up to
        ``--duration``."""
        n_audio = (len(self.audio) + CHUNK_BYTES - 1) // CHUNK_BYTES
        n_dur = int(round(self.args.duration * 1000 / CHUNK_MS)) if self.args.duration else 0
        return max(n_audio, n_dur)

    def payload(self, chunk: int) -> bytes:
        """The 160 bytes of chunk ``chunk`` (from 1), silence beyond the audio."""
        lo = (chunk - 1) * CHUNK_BYTES
        part = self.audio[lo : lo + CHUNK_BYTES]
        fill = SILENCE[self.carrier.ident.encoding]
        return part + bytes([fill]) * (CHUNK_BYTES - len(part))

    async def sender(self) -> None:
        """Sends connected, start, the media chunks on schedule, then stop."""
        a = self.args
        try:
            if not await self.send(self.carrier.connected()):
                return
            if not await self.send(self.carrier.start()):
                return
            emit("started", stream_sid=self.report.stream_sid)
            plan = schedule(
                self.chunks(), a.shuffle_ms, parse_delays(a.delay_chunks), a.seed, a.fast
            )
            self.report.send_order_head = [c for _, c in plan[:200]]
            t0 = time.monotonic()
            self.report.first_media_sent_t = time.time()
            for at, chunk in plan:
                if self.stop_requested.is_set():
                    break
                wait = t0 + at - time.monotonic()
                if wait > 0:
                    try:
                        await asyncio.wait_for(self.stop_requested.wait(), timeout=wait)
                        break
                    except asyncio.TimeoutError:
                        pass
                if not await self.send(self.carrier.media(chunk, self.payload(chunk))):
                    return
                self.report.chunks_sent += 1
            self.report.inbound_ms = self.report.chunks_sent * CHUNK_MS
            emit("media_done", chunks=self.report.chunks_sent)
            if a.hold_after > 0:
                try:
                    await asyncio.wait_for(self.stop_requested.wait(), timeout=a.hold_after)
                except asyncio.TimeoutError:
                    pass
            if self.report.closed is None and not a.no_stop and await self.send(self.carrier.stop()):
                self.report.stop_sent_t = time.time()
                emit("stop_sent")
        finally:
            self.done_sending.set()

    def on_message(self, raw: Any) -> None:
        """Handles one message from the door (the bot's side)."""
        now, wall = time.monotonic(), time.time()
        if isinstance(raw, bytes):
            self.report.errors.append(f"binary message of {len(raw)} bytes")
            return
        try:
            msg = json.loads(raw)
        except ValueError:
            self.report.errors.append(f"not JSON: {raw[:80]!r}")
            return
        if not isinstance(msg, dict):
            self.report.errors.append(f"not an object: {raw[:80]!r}")
            return
        event = msg.get("event")
        dialect = self.carrier.ident.dialect
        if dialect == "twilio" and event in ("media", "mark", "clear"):
            if msg.get("streamSid") != self.report.stream_sid:
                self.report.errors.append(f"{event}: streamSid {msg.get('streamSid')!r}")
        if event == "media":
            try:
                payload = base64.b64decode(msg["media"]["payload"], validate=True)
            except (KeyError, TypeError, binascii.Error) as e:
                self.report.errors.append(f"media: bad payload: {e}")
                return
            if not payload:
                self.report.errors.append("media: empty payload")
                return
            self.play.add_audio(now, len(payload))
            self.report.outbound_media.append({"mono": now, "t": wall, "bytes": len(payload)})
            self.report.outbound_bytes += len(payload)
            if self.save is not None:
                self.save.write(payload)
        elif event == "mark":
            name = (msg.get("mark") or {}).get("name")
            if not isinstance(name, str):
                self.report.errors.append(f"mark without a name: {raw[:80]!r}")
                return
            due = self.play.add_mark(now, name)
            self.report.marks_received.append({"name": name, "mono": now, "t": wall, "due_in_ms": (due - now) * 1000})
        elif event == "clear":
            discarded, marks = self.play.clear(now)
            self.report.clears.append(
                {"mono": now, "t": wall, "discarded_ms": discarded, "pending_marks": marks}
            )
            emit("clear", discarded_ms=discarded, pending_marks=marks)
            # Both carriers send the pending marks back when the buffer is cleared.
            for name in marks:
                self.echo(name, "cleared")
        else:
            key = str(event)
            self.report.unknown_events[key] = self.report.unknown_events.get(key, 0) + 1

    def echo(self, name: str, why: str) -> None:
        """Sends a mark back (in the background; order kept by the send lock's FIFO)."""
        self.report.marks_echoed.append({"name": name, "why": why, "mono": time.monotonic(), "t": time.time()})
        asyncio.get_running_loop().create_task(self.send(self.carrier.mark(name)))

    async def mark_clock(self) -> None:
        """Echoes each mark when the audio before it has finished playing."""
        while not self.done_receiving.is_set():
            for name in self.play.due_marks(time.monotonic()):
                self.echo(name, "played")
            nxt = self.play.next_due()
            sleep = RECV_POLL_S if nxt is None else min(RECV_POLL_S, max(0.0, nxt - time.monotonic()))
            await asyncio.sleep(max(sleep, 0.001))

    async def receiver(self) -> None:
        """Reads the door's messages until the socket closes, the call is over, or
        ``--stall-after`` (then it stops reading for good)."""
        try:
            await self._receive()
        finally:
            self.done_receiving.set()

    async def _receive(self) -> None:
        """The body of [`receiver`]."""
        stall_at = time.monotonic() + self.args.stall_after if self.args.stall_after else None
        linger_until: Optional[float] = None
        while True:
            if stall_at is not None and time.monotonic() >= stall_at:
                self.report.stalled_at_t = time.time()
                emit("stalled")
                return
            if self.done_sending.is_set():
                if linger_until is None:
                    # After stop: a bounded wait for the door's last words.
                    linger_until = time.monotonic() + self.args.linger
                if time.monotonic() >= linger_until:
                    return
            try:
                raw = await asyncio.wait_for(self.ws.recv(), timeout=RECV_POLL_S)
            except asyncio.TimeoutError:
                continue
            except Exception as e:  # noqa: BLE001 — the socket closed
                self.note_close(e)
                self.stop_requested.set()
                return
            self.on_message(raw)

    def note_close(self, e: BaseException) -> None:
        """Records how the socket closed."""
        rcvd = getattr(e, "rcvd", None)
        self.report.closed = {
            "by": "door" if rcvd is not None else "unknown",
            "code": getattr(rcvd, "code", None),
            "reason": getattr(rcvd, "reason", None),
            "t": time.time(),
            "error": type(e).__name__,
        }
        emit("closed", code=self.report.closed["code"], reason=self.report.closed["reason"])

    async def run(self) -> int:
        """Connects, runs the call, closes; the exit status."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus

        a = self.args
        # SIGTERM hangs up: the media stop, `stop` is sent, the report is written.
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.stop_requested.set)
        except (NotImplementedError, RuntimeError):
            pass
        headers = {"Authorization": f"Bearer {a.token}"} if a.token else None
        sock = None
        if a.stall_after or a.rcvbuf:
            # A small receive buffer, set before connecting (it sizes the TCP window),
            # so that a carrier that stops reading pushes back on the door soon.
            u = urllib.parse.urlsplit(a.url)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, a.rcvbuf or 4096)
            sock.settimeout(5.0)
            sock.connect((u.hostname or "127.0.0.1", u.port or 80))
            sock.setblocking(False)
        try:
            self.ws = await asyncio.wait_for(
                connect(
                    a.url,
                    additional_headers=headers,
                    sock=sock,
                    open_timeout=5,
                    close_timeout=2,
                    ping_interval=None,
                    max_size=1 << 20,
                    max_queue=4 if a.stall_after else 64,
                ),
                timeout=10.0,
            )
        except InvalidStatus as e:
            body = e.response.body.decode("utf-8", "replace") if e.response.body else ""
            self.report.refused = {"status": e.response.status_code, "body": body}
            self.report.ended_by = "refused"
            return 2
        except (OSError, asyncio.TimeoutError) as e:
            self.report.refused = {"status": 0, "body": f"{type(e).__name__}: {e}"}
            self.report.ended_by = "unreachable"
            return 2
        self.report.connected = True
        emit("connected")
        if a.save_outbound:
            self.save = open(a.save_outbound, "wb")
        tasks = [
            asyncio.create_task(self.sender()),
            asyncio.create_task(self.receiver()),
            asyncio.create_task(self.mark_clock()),
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=a.timeout)
            self.report.ended_by = "stop" if self.report.stop_sent_t else "door"
        except asyncio.TimeoutError:
            self.report.ended_by = "timeout"
            self.report.errors.append(f"call not over within --timeout {a.timeout} s")
        finally:
            for t in tasks:
                t.cancel()
            if self.report.closed is None:
                try:
                    await asyncio.wait_for(self.ws.close(), timeout=3.0)
                except Exception:  # noqa: BLE001 — closing is best effort
                    pass
            if self.save is not None:
                self.save.close()
            self.report.played_ms = self.play.received_ms - self.play.discarded_ms
            self.report.discarded_ms = self.play.discarded_ms
        return 0


# --------------------------------------------------------------------------------
# Fixtures and the reference decode (PyAV / FFmpeg)
# --------------------------------------------------------------------------------


def samples_of(frame: Any) -> bytes:
    """The s16 mono samples of an audio frame (its plane may be padded)."""
    return bytes(frame.planes[0])[: frame.samples * 2]


def reference(audio: bytes, encoding: str) -> bytes:
    """G.711 8 kHz → 16 kHz s16le mono, decoded by FFmpeg and resampled by
    swresample (independent of weir's codec)."""
    import av

    dec: Any = av.CodecContext.create(CODEC[encoding], "r")  # an AudioCodecContext
    dec.sample_rate = RATE
    dec.layout = "mono"
    res = av.AudioResampler(format="s16", layout="mono", rate=16000)
    out = bytearray()
    step = 1600  # 200 ms per packet
    for lo in range(0, len(audio), step):
        for fr in dec.decode(av.Packet(audio[lo : lo + step])):
            for r in res.resample(fr):
                out += samples_of(r)
    for r in res.resample(None):
        out += samples_of(r)
    return bytes(out)


def make_fixture(wav: str, out_dir: str) -> Dict[str, Any]:
    """Resamples ``wav`` to 8 kHz mono s16 and encodes it to raw µ-law and A-law."""
    import av

    pcm = bytearray()
    res = av.AudioResampler(format="s16", layout="mono", rate=RATE)
    with av.open(wav) as c:
        for fr in c.decode(audio=0):
            for r in res.resample(fr):
                pcm += samples_of(r)
    for r in res.resample(None):
        pcm += samples_of(r)
    made: Dict[str, Any] = {"samples": len(pcm) // 2, "seconds": len(pcm) / 2 / RATE}
    for enc, name in (("PCMU", "speech-8k.ulaw"), ("PCMA", "speech-8k.alaw")):
        ctx: Any = av.CodecContext.create(CODEC[enc], "w")  # an AudioCodecContext
        ctx.sample_rate = RATE
        ctx.layout = "mono"
        ctx.format = "s16"
        data = bytearray()
        step = 1600
        for lo in range(0, len(pcm), step * 2):
            chunk = bytes(pcm[lo : lo + step * 2])
            fr = av.AudioFrame(format="s16", layout="mono", samples=len(chunk) // 2)
            fr.planes[0].update(chunk + bytes(fr.planes[0].buffer_size - len(chunk)))
            fr.sample_rate = RATE
            for p in ctx.encode(fr):
                data += bytes(p)
        for p in ctx.encode(None):
            data += bytes(p)
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        made[name] = len(data)
    return made


# --------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------


def parse_args(argv: List[str]) -> argparse.Namespace:
    """The command line (see the module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="the door's WebSocket URL, ws://host:port/v1/telephony/twilio")
    ap.add_argument("--dialect", choices=["twilio", "telnyx"], default="twilio")
    ap.add_argument("--encoding", choices=["PCMU", "PCMA"], default="PCMU")
    ap.add_argument("--audio", help="raw G.711 8 kHz mono of the call (default: silence)")
    ap.add_argument("--duration", type=float, default=0.0, help="call length in s (audio padded with silence)")
    ap.add_argument("--stream-id", help="custom parameter stream_id (weir's stream id)")
    ap.add_argument("--session-id", help="custom parameter session_id")
    ap.add_argument("--custom", action="append", default=[], help="another custom parameter k=v")
    ap.add_argument("--stream-sid", help="Twilio streamSid / Telnyx stream_id (default: made up)")
    ap.add_argument("--call-sid", help="Twilio callSid / Telnyx call_control_id (default: made up)")
    ap.add_argument("--token", help="producer token, sent as Authorization: Bearer")
    ap.add_argument("--fast", action="store_true", help="send media as fast as possible")
    ap.add_argument("--shuffle-ms", type=int, default=0, help="permute chunks within windows of this many ms")
    ap.add_argument("--delay-chunks", default="", help="K:D[,K:D...] deliver chunk K D ms late")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--stall-after", type=float, default=0.0, help="stop reading after S s")
    ap.add_argument("--rcvbuf", type=int, default=0, help="SO_RCVBUF of the socket (bytes)")
    ap.add_argument("--hold-after", type=float, default=0.0, help="after the media, wait S s (or SIGTERM) before stop")
    ap.add_argument("--linger", type=float, default=1.0, help="after stop, read S s more")
    ap.add_argument("--no-stop", action="store_true", help="end without a stop message")
    ap.add_argument("--timeout", type=float, default=0.0, help="bound on the whole call, s")
    ap.add_argument("--save-outbound", help="write the bot's G.711 audio received here")
    ap.add_argument("--report", help="also write the report JSON to this file")
    ap.add_argument("--reference", metavar="OUT.raw", help="decode --audio with PyAV to 16 kHz s16le")
    ap.add_argument("--make-fixture", metavar="WAV", help="make speech-8k.ulaw/.alaw from WAV")
    ap.add_argument("--out-dir", default=".")
    return ap.parse_args(argv)


def main(argv: List[str]) -> int:
    """Runs the mode the arguments name; the exit status."""
    a = parse_args(argv)
    if a.make_fixture:
        emit("fixture", **make_fixture(a.make_fixture, a.out_dir))
        return 0
    if a.reference:
        if not a.audio:
            print("--reference needs --audio", file=sys.stderr)
            return 1
        with open(a.audio, "rb") as f:
            out = reference(f.read(), a.encoding)
        with open(a.reference, "wb") as f:
            f.write(out)
        emit("reference", samples=len(out) // 2)
        return 0
    if not a.url:
        print("--url is required for a call", file=sys.stderr)
        return 1
    audio = b""
    if a.audio:
        with open(a.audio, "rb") as f:
            audio = f.read()
    custom: Dict[str, str] = {}
    if a.stream_id:
        custom["stream_id"] = a.stream_id
    if a.session_id:
        custom["session_id"] = a.session_id
    for kv in a.custom:
        k, v = kv.split("=", 1)
        custom[k] = v
    tag = os.urandom(16).hex()
    if a.dialect == "twilio":
        stream_sid = a.stream_sid or "MZ" + tag
        call_sid = a.call_sid or "CA" + tag
        account = "AC" + "0" * 32
    else:
        stream_sid = a.stream_sid or "%s-%s-%s-%s-%s" % (tag[:8], tag[8:12], tag[12:16], tag[16:20], tag[20:32])
        call_sid = a.call_sid or "v3:" + tag
        account = "3e6f995f-85f7-4705-9741-53b116d28237"
    ident = Identity(a.dialect, stream_sid, call_sid, account, a.encoding, custom, ["inbound"])
    call = Call(a, ident, audio)
    if not a.timeout:
        a.timeout = call.chunks() * CHUNK_MS / 1000.0 + a.hold_after + a.linger + 30.0
    try:
        parse_delays(a.delay_chunks)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 1
    status = asyncio.run(call.run())
    rep = call.report.to_json()
    if a.report:
        with open(a.report, "w") as f:
            json.dump(rep, f)
    emit("report", **rep)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
