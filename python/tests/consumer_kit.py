"""Shared pieces of the consumer tests: WebSocket producers for the real audio-ingress, a
recording recogniser on `weir.Consumer`, and the per-stream timeline audit.

Every wait here is bounded; nothing re-implements protocol logic (the seqs, gaps and
ends come from the consumer core, the audit only checks that they add up).
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import websockets

import weir

FRAME_S = 0.02
FRAME_BYTES = 640


def pcm_of(i: int) -> bytes:
    """A 20 ms frame whose first 4 bytes carry the producer's frame index."""
    return struct.pack("<I", i) + bytes(FRAME_BYTES - 4)


@dataclass
class Produced:
    """What one WebSocket producer did."""

    stream: str
    sent: int = 0
    events: List[dict] = field(default_factory=list)
    close_code: Optional[int] = None

    @property
    def closed_event(self) -> Optional[dict]:
        return next((e for e in self.events if e.get("type") == "closed"), None)


async def produce(url: str, stream: str, seconds: float, *, deadline_s: float = 30.0) -> Produced:
    """Sends `seconds` of 20 ms frames at real time (absolute schedule), then `end`, and
    reads the server's events until it closes (bounded by `deadline_s`)."""
    out = Produced(stream)
    n = round(seconds / FRAME_S)
    async with websockets.connect(url, max_size=None, open_timeout=10, close_timeout=2) as ws:

        async def reader() -> None:
            try:
                async for msg in ws:
                    if isinstance(msg, str):
                        out.events.append(json.loads(msg))
            except websockets.ConnectionClosed:
                pass

        rd = asyncio.create_task(reader())
        t0 = time.monotonic()
        try:
            for i in range(n):
                delay = t0 + i * FRAME_S - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                await ws.send(pcm_of(i))
                out.sent += 1
            await ws.send(json.dumps({"type": "end"}))
        except websockets.ConnectionClosed:
            pass  # overloaded (close policy): the server closed the stream
        try:
            await asyncio.wait_for(rd, deadline_s)
        except asyncio.TimeoutError:
            rd.cancel()
        out.close_code = ws.close_code
    return out


@dataclass
class Received:
    """What the recogniser got for one stream instance."""

    stream: str
    frames: List[int] = field(default_factory=list)  # seqs
    indices: List[int] = field(default_factory=list)  # producer frame index in the pcm
    gaps: List[weir.Gap] = field(default_factory=list)
    timeline: List[object] = field(default_factory=list)  # Frame seqs and Gaps in order
    declared: List[weir.LossDeclared] = field(default_factory=list)
    end: Optional[weir.End] = None


async def recognise(stream: weir.Stream, into: Dict[str, Received]) -> None:
    """A stand-in recogniser: records each event as it comes (in order)."""
    rec = into.setdefault(stream.id, Received(stream.id))
    async for event in stream:
        match event:
            case weir.Frame(pcm, seq):
                rec.frames.append(seq)
                rec.indices.append(struct.unpack_from("<I", pcm)[0])
                rec.timeline.append(seq)
            case weir.Gap():
                rec.gaps.append(event)
                rec.timeline.append(event)
            case weir.LossDeclared():
                rec.declared.append(event)
            case weir.End():
                rec.end = event


async def serve(consumer: weir.Consumer, into: Dict[str, Received]) -> None:
    """Runs one recogniser task per new stream until the consumer closes."""
    tasks = set()
    async for stream in consumer:
        t = asyncio.create_task(recognise(stream, into))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=10)


def audit_timeline(rec: Received) -> int:
    """Checks that seqs 1..end-1 are each covered exactly once, in order, by a frame or
    a gap; returns the number of seqs covered. Raises AssertionError otherwise."""
    assert rec.end is not None, f"{rec.stream}: no End"
    last = (rec.end.seq - 1) if rec.end.seq is not None else (rec.end.last_seq or 0)
    expect = 1
    for item in rec.timeline:
        if isinstance(item, int):
            assert item == expect, f"{rec.stream}: frame {item}, expected seq {expect}"
            expect += 1
        else:
            assert item.first_seq == expect, f"{rec.stream}: {item!r}, expected seq {expect}"
            assert item.frames == item.last_seq - item.first_seq + 1
            expect = item.last_seq + 1
    assert expect - 1 == last, f"{rec.stream}: covered 1..{expect - 1}, stream ended at {last}"
    return last
