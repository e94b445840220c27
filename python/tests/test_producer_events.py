"""`GapSent` events under the ``gap`` policy: a producer at the real cadence through a
1.5 s SIGSTOP of nats-server. The core drops what the stalled server could not take
into gap markers; the stream reports them as `GapSent` events (increasing, disjoint
ranges), then `Closed`; a plain nats-py subscriber sees every seq of the stream either
as a frame or inside a gap packet — nothing missing undeclared — and the ``end``.

Real nats-server; bounded by ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Any, List

import nats

import weir
from weir.producer import Closed, GapSent

PREFIX = "inference.whisper.stream."
FRAMES = 150
PAUSE_AT = 25
RESUME_AT = 100


async def test_gap_policy_reports_gap_sent_events(nats_server):
    async with asyncio.timeout(40):
        nc = await asyncio.wait_for(nats.connect(nats_server.url, connect_timeout=2), 5)
        packets: List[dict] = []

        async def on_msg(msg: Any) -> None:
            (n,) = struct.unpack(">I", msg.data[:4])
            packets.append(json.loads(msg.data[4 : 4 + n]))

        await nc.subscribe(PREFIX + "gappy", cb=on_msg)
        await asyncio.wait_for(nc.flush(), 5)
        producer = await weir.Producer.connect(nats_server.url, policy="gap", extended_consumers=True)
        try:
            stream = producer.open("gappy")
            events: List[object] = []

            async def watch() -> None:
                async for ev in stream.events():
                    events.append(ev)

            watcher = asyncio.create_task(watch())
            t0 = time.monotonic()
            for k in range(FRAMES):
                await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))
                if k == PAUSE_AT:
                    await asyncio.to_thread(nats_server.pause)
                if k == RESUME_AT:
                    await asyncio.to_thread(nats_server.resume)
                # The gap policy admits every frame (never an OverloadError).
                assert stream.push(bytes(640)) == k + 1
            summary = await stream.end()
            await asyncio.wait_for(watcher, 10)
        finally:
            await asyncio.to_thread(nats_server.resume)
            await producer.close()
        deadline = time.monotonic() + 5
        while not any(p["type"] == "end" for p in packets) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await nc.close()

    gaps = [e for e in events if isinstance(e, GapSent)]
    assert gaps, events
    assert isinstance(events[-1], Closed) and events[-1].reason == "producer"
    assert all(isinstance(e, GapSent) for e in events[:-1])
    for a, b in zip(gaps, gaps[1:]):
        assert a.last_seq < b.first_seq and a.gaps_total < b.gaps_total
    assert gaps[-1].gaps_total == summary.gaps == events[-1].gaps
    assert summary.frames_dropped_total > 0 and summary.end_delivered
    # Every seq is a frame or inside a gap packet, then the end.
    covered = []
    for p in packets:
        if p["type"] == "frame":
            covered.append(p["seq"])
        elif p["type"] == "gap":
            covered.extend(range(p["first_seq"], p["seq"] + 1))
    assert sorted(covered) == list(range(1, FRAMES + 1)), covered
    assert packets[-1]["type"] == "end" and packets[-1]["seq"] == FRAMES + 1
    declared = sum(p["frames"] for p in packets if p["type"] == "gap")
    assert declared == summary.frames_dropped_total
