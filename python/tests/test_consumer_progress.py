"""Lag, real-time factor and bounds are driven by the Python handler's own progress
(issue 29: "capacity and lag reporting ..., driven by the handler's own progress").

One consumer, three streams published at real time (50 frames/s, 2 s) by nats-py:
- ``fast``: read at once: every frame in order, lag stays small;
- ``slow``: its handler takes 50 ms per 20 ms frame (``await asyncio.sleep``): its lag
  in `Consumer.capacity()` grows past 300 ms, its own bound (500 ms) ends it with
  ``End(cause="overload")``, and the real-time factor p95 goes above 1;
- ``unread``: the `Stream` is held but not iterated: only its own queue overloads; once
  the core has ended it (``overload``), its slot is freed (``live_streams`` back to 0)
  although the `Stream` is still held and unread, and reading it afterwards yields the
  frames handed over before the end, in order, then ``End(cause="overload")``.

The other streams are not slowed down by either. Bounded: 2 s of frames, every wait
with a timeout.
"""

from __future__ import annotations

import asyncio
import gc
import json
import struct

import nats as nats_py

import weir


def packet(kind: str, seq: int, pcm: bytes = b"") -> bytes:
    meta = json.dumps({"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2,
                       "channels": 1}).encode()
    return struct.pack(">I", len(meta)) + meta + pcm


async def test_lag_and_bounds_follow_the_python_handler(nats_server):
    consumer = await weir.Consumer.connect(nats_server.url, subject="prog.x.{stream}",
                                           max_streams=8, max_pending_age_ms=500)
    nc = await nats_py.connect(nats_server.url)
    got = {"fast": [], "slow": []}
    ends = {}
    held = []
    max_lag = {"fast": 0, "slow": 0}

    async def read(stream: weir.Stream, delay: float) -> None:
        async for event in stream:
            if isinstance(event, weir.Frame):
                got[stream.id].append(event.seq)
                if delay:
                    await asyncio.sleep(delay)
            elif isinstance(event, weir.End):
                ends[stream.id] = event

    async def serve() -> None:
        async for stream in consumer:
            if stream.id == "unread":
                held.append(stream)  # held, never iterated
            else:
                asyncio.create_task(read(stream, 0.05 if stream.id == "slow" else 0.0))
            del stream  # `held` is the only reference to the unread one

    async def sample() -> None:
        while True:
            for s in consumer.capacity()["streams"]:
                if s["id"] in max_lag:
                    max_lag[s["id"]] = max(max_lag[s["id"]], s["lag_ms"])
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(serve()), asyncio.create_task(sample())]
    try:
        pcm = bytes(640)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for seq in range(1, 101):
            for sid in ("fast", "slow", "unread"):
                await nc.publish(f"prog.x.{sid}", packet("frame", seq, pcm))
            await asyncio.sleep(max(0.0, t0 + seq * 0.02 - loop.time()))
        for sid in ("fast", "slow", "unread"):
            await nc.publish(f"prog.x.{sid}", packet("end", 101))
        await nc.flush()
        async with asyncio.timeout(10):
            while len(ends) < 2:
                await asyncio.sleep(0.05)
        cap = consumer.capacity()
        stats = consumer.stats()
        unread = stats.stream("unread")[0]
        assert unread.overloads >= 1 and unread.ended_by == "overload", unread
        # Ended by the core: the slot is freed though the Stream is held and unread.
        async with asyncio.timeout(5):
            while consumer.capacity()["live_streams"] != 0:
                await asyncio.sleep(0.05)
        assert len(held) == 1
        # The reader comes late: what was handed over, in order, then the End.
        async with asyncio.timeout(5):
            late = [e async for e in held[0]]
        seqs = [e.seq for e in late if isinstance(e, weir.Frame)]
        assert seqs == list(range(1, len(seqs) + 1)) and 0 < len(seqs) < 100, seqs
        assert isinstance(late[-1], weir.End) and late[-1].cause == "overload", late[-1]
        assert all(not isinstance(e, weir.End) for e in late[:-1])
        held.clear()
        gc.collect()
    finally:
        for t in tasks:
            t.cancel()
        await nc.close()
        final = await consumer.close()

    assert got["fast"] == list(range(1, 101))
    assert ends["fast"] == weir.End("producer", None, 101, 101)
    assert ends["slow"].cause == "overload"
    assert got["slow"] == list(range(1, len(got["slow"]) + 1)) and len(got["slow"]) < 100
    assert max_lag["slow"] >= 300, max_lag
    assert max_lag["fast"] < 150, max_lag
    assert cap["rtf_p95"] > 1.0, cap
    assert final.totals.streams_overloaded >= 2
    print(f"max lag {max_lag}; rtf_p95 {cap['rtf_p95']}; slow handled {len(got['slow'])}/100")
