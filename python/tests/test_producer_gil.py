"""The producer core does not need the GIL: while a Python thread holds it (a stand-in
for a model call), the core's NATS I/O and confirmations go on.

Frames are pushed while nats-server is SIGSTOPped (they wait in the client,
unconfirmed); then Python holds the GIL (about 1 s), and a separate shell process
SIGCONTs the server 0.1 s into the hold. Everything after that must happen during the
hold (of ~1 s), in the core, without the GIL: the client's writes reach the server, the
confirmation markers come back (the frames count as published), and a plain nats-py
subscriber in *another process* receives the frames.

How the GIL is held: ``sum(range(N))`` runs in C without the interpreter's periodic
GIL release. The test checks that itself: a Python ticker thread makes no progress
during it. Real nats-server; bounded (``asyncio.timeout`` and process timeouts).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import weir

HOLD_AT_LEAST_S = 0.3
RESUME_AFTER_S = 0.1
FRAMES = 10

# The subscriber process: prints one JSON line when subscribed, then one per packet
# (type, seq, wall-clock arrival), until the `end`.
SUBSCRIBER = r"""
import asyncio, json, struct, sys, time
import nats

async def main(url):
    nc = await nats.connect(url, connect_timeout=2)
    done = asyncio.Event()
    async def on_msg(msg):
        (n,) = struct.unpack(">I", msg.data[:4])
        meta = json.loads(msg.data[4:4 + n])
        print(json.dumps({"type": meta["type"], "seq": meta["seq"], "t": time.time()}), flush=True)
        if meta["type"] == "end":
            done.set()
    await nc.subscribe("inference.whisper.stream.>", cb=on_msg)
    await nc.flush()
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.wait_for(done.wait(), 20)
    await nc.close()

asyncio.run(main(sys.argv[1]))
"""


def calibrate() -> int:
    """N such that ``sum(range(N))`` takes about 3 × HOLD_AT_LEAST_S here (machines vary)."""
    t0 = time.perf_counter()
    sum(range(10**6))
    per_million = max(time.perf_counter() - t0, 1e-4)
    return int(3 * HOLD_AT_LEAST_S / per_million * 10**6)


def hold_gil(n: int) -> tuple[float, float]:
    """Holds the GIL in one C call; returns its wall-clock span."""
    t0 = time.time()
    sum(range(n))  # C loop: the GIL is not released inside
    return t0, time.time()


async def test_core_publishes_and_confirms_while_python_holds_the_gil(nats_server):
    async with asyncio.timeout(40):
        sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, nats_server.url],
                               stdout=subprocess.PIPE, text=True)
        try:
            ready = await asyncio.wait_for(asyncio.to_thread(sub.stdout.readline), 10)
            assert json.loads(ready) == {"ready": True}
            producer = await weir.Producer.connect(nats_server.url)
            stream = producer.open("gil-1")
            n = calibrate()
            ticks: list[float] = []
            stop = threading.Event()

            def ticker() -> None:
                while not stop.is_set():
                    ticks.append(time.time())
                    time.sleep(0.001)

            t = threading.Thread(target=ticker, daemon=True)
            t.start()
            await asyncio.sleep(0.05)
            await asyncio.to_thread(nats_server.pause)
            before = producer.stats().frames["published"]
            for _ in range(FRAMES):
                stream.push(bytes(640))
            end = asyncio.ensure_future(stream.end())  # not started until the loop runs
            # Resumes the server 0.1 s from now, without needing this process's GIL.
            cont = subprocess.Popen(["sh", "-c", f"sleep {RESUME_AFTER_S}; kill -CONT {nats_server.pid}"])
            held_from, held_to = hold_gil(n)
            # Read before anything else can run: what the core did meanwhile.
            published = producer.stats().frames["published"]
            stop.set()
            t.join(5)
            summary = await end
            lines = await asyncio.wait_for(asyncio.to_thread(sub.communicate), 20)
            packets = [json.loads(x) for x in lines[0].splitlines() if x.strip()]
            cont.wait(5)
            frames_during = [p for p in packets if p["type"] == "frame"
                             and held_from + RESUME_AFTER_S <= p["t"] <= held_to]
            # The GIL really was held: the ticker thread made no progress (allowing
            # one tick at each edge).
            inside = [x for x in ticks if held_from + 0.02 < x < held_to - 0.02]
            assert not inside, f"the GIL was released during the hold: {len(inside)} ticks"
            assert held_to - held_from >= HOLD_AT_LEAST_S
            # After the server resumed, the core's client delivered the frames, the
            # server confirmed them and the other process received them, all while
            # the GIL was held.
            assert before == 0
            assert published == FRAMES, published
            assert len(frames_during) == FRAMES, packets
            assert summary.frames_published == FRAMES and summary.end_delivered
            await producer.close()
        finally:
            if sub.poll() is None:
                sub.kill()
                sub.wait(5)
