"""A lease fence ends a stream's Python iterator with `End(cause="handover")` (issue 29
review, finding 1).

Worker A (lease mode) holds both partitions of 6 live streams and reads them with a
slow Python handler (40 ms per 20 ms frame: its core handler is nearly always parked
on the Python ack, which is exactly when a fence aborts it). Worker B joins; the
rebalance moves one partition to B. Every stream of the moved partition must end on A
with `End(cause="handover")` — not an `InternalError`, not a hang — and go on at B
(frames, then the producer's end); no frame is handed to both; the streams A kept end
with the producer's end.

Real nats-server with JetStream; bounded: rebalance wait 15 s, ~5 s of frames, ends 10 s.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from typing import Dict, List, Set, Tuple

import nats as nats_py

import weir

PARTITIONS = 2
LEASE = {"bucket": "handover", "ttl_ms": 2000, "renew_interval_ms": 500, "margin_ms": 200,
         "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 500}



def packet(kind: str, seq: int, pcm: bytes = b"") -> bytes:
    meta = json.dumps({"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2,
                       "channels": 1}).encode()
    return struct.pack(">I", len(meta)) + meta + pcm


async def worker(url: str, name: str) -> weir.Consumer:
    return await weir.Consumer.connect(
        url, subject="ho.{partition}.{stream}", partitions=PARTITIONS, max_frame_age_ms=0,
        idle_timeout_ms=60000, policy="gap", max_pending_age_ms=10000,
        capacity={"announce": False}, ownership={"lease": dict(LEASE, worker_id=name)})


async def test_a_fenced_stream_ends_with_handover(nats_js):
    frames: Dict[Tuple[str, str], Set[int]] = {}
    ends: Dict[Tuple[str, str], weir.End] = {}
    errors: Dict[Tuple[str, str], str] = {}

    async def read(stream: weir.Stream, who: str, delay: float) -> None:
        key = (who, stream.id)
        got = frames.setdefault(key, set())
        try:
            async for ev in stream:
                if isinstance(ev, weir.Frame):
                    got.add(ev.seq)
                    if delay:
                        await asyncio.sleep(delay)
                elif isinstance(ev, weir.End):
                    ends[key] = ev
        except Exception as e:  # noqa: BLE001 - what the test reports
            errors[key] = f"{type(e).__name__}: {e}"

    readers: List[asyncio.Task] = []

    async def serve(c: weir.Consumer, who: str, delay: float) -> None:
        async for s in c:
            readers.append(asyncio.create_task(read(s, who, delay)))

    a = await worker(nats_js.url, "wa")
    b = None
    nc = await nats_py.connect(nats_js.url)
    tasks = [asyncio.create_task(serve(a, "A", 0.04))]
    stop = asyncio.Event()
    ids = [f"s{i}" for i in range(6)]
    subjects = {s: f"ho.{weir.partition_of(s, PARTITIONS)}.{s}" for s in ids}
    assert {subjects[s].split(".")[1] for s in ids} == {"0", "1"}
    last = 0

    async def publish() -> None:
        nonlocal last
        t0 = time.monotonic()
        while not stop.is_set():
            last += 1
            for s in ids:
                await nc.publish(subjects[s], packet("frame", last, bytes(640)))
            await asyncio.sleep(max(0.0, t0 + last * 0.02 - time.monotonic()))
        for s in ids:
            await nc.publish(subjects[s], packet("end", last + 1))
        await nc.flush()

    try:
        async with asyncio.timeout(10):
            while sorted(a.owned()) != [0, 1]:
                await asyncio.sleep(0.05)
        pub = asyncio.create_task(publish())
        await asyncio.sleep(1.5)
        b = await worker(nats_js.url, "wb")
        tasks.append(asyncio.create_task(serve(b, "B", 0.0)))
        async with asyncio.timeout(15):
            while not (len(a.owned()) == 1 and len(b.owned()) == 1):
                await asyncio.sleep(0.05)
        moved = set(b.owned())
        await asyncio.sleep(1.5)
        stop.set()
        await asyncio.wait_for(pub, 5)
        moved_ids = [s for s in ids if int(subjects[s].split(".")[1]) in moved]
        kept_ids = [s for s in ids if s not in moved_ids]
        assert moved_ids and kept_ids
        async with asyncio.timeout(10):
            while not (all(("A", s) in ends or ("A", s) in errors for s in moved_ids)
                       and all(("B", s) in ends for s in moved_ids)):
                await asyncio.sleep(0.05)
        for s in moved_ids:
            assert ("A", s) not in errors, errors[("A", s)]
            end = ends[("A", s)]
            assert end.cause == "handover", (s, end)
            mine = frames[("A", s)]
            if end.last_seq is not None and mine:
                assert end.last_seq >= max(mine), (s, end, max(mine))
            theirs = frames.get(("B", s), set())
            assert theirs, f"{s} did not go on at B"
            assert ends[("B", s)].cause == "producer", ends[("B", s)]
            assert not mine & theirs, f"{s}: frames handed to both workers"
        # A kept the other partition (the reader is slow: the rest may still be queued,
        # but nothing of it went wrong).
        for s in kept_ids:
            assert ("A", s) not in errors, errors[("A", s)]
            assert ("B", s) not in frames
    finally:
        for t in tasks + readers:
            t.cancel()
        await a.close(grace_s=0.5)
        if b is not None:
            await b.close(grace_s=0.5)
        await nc.close()
