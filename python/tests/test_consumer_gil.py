"""A handler that holds the GIL does not delay lease renewals or heartbeats (issue 29,
"GIL").

A lease-mode `weir.Consumer` (TTL 1 s, renewals every 300 ms, heartbeats every 100 ms)
gets a stream whose Python handler holds the GIL for 300 ms per frame, back to back,
with a C call that does not release it (libc ``usleep`` through ``ctypes.PyDLL``, which
keeps the GIL; ``time.sleep`` would release it). A sleeping hold is exact whatever the
machine's load, and leaves the CPU to the core's threads, as a model call waiting on a
GPU would.
Another process (tests/gil_observer.py, nats-py) publishes the frames and records, on
the shared wall clock, every heartbeat and every write to the lease bucket.

- Witness: a Python thread that wants the GIL every 5 ms is held off for about a hold
  at a time while the handler runs: the GIL really was taken for 300 ms stretches, so
  anything in the core that needed the GIL would have been held off as long.
- The core was not: the largest heartbeat interval seen by the other process during
  the busy window stays below 200 ms, halfway between the interval (100 ms) and a hold
  (a core that waited for the GIL would show ≥ 300 ms); renewals keep their 300 ms
  cadence (< 450 ms apart); and the lease is never lost (no frame fenced, no handover).

Bounded: 4 s of frames, every wait with a timeout.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import weir

HERE = Path(__file__).resolve().parent
HOLD_S = 0.3
BUSY_S = 4.0
HB_MS = 100
# libc's usleep called with the GIL held (PyDLL does not release it): a model call.
HOLD_GIL = ctypes.PyDLL(None).usleep


def max_gap(times, lo: float, hi: float) -> float:
    inside = [t for t in times if lo <= t <= hi]
    return max((b - a for a, b in zip(inside, inside[1:])), default=float("inf"))


async def test_a_gil_holding_handler_does_not_delay_heartbeats_or_renewals(nats_js):
    consumer = await weir.Consumer.connect(
        nats_js.url, subject="gil.{partition}.{stream}", partitions=1, policy="gap",
        ownership={"lease": {"bucket": "gil", "ttl_ms": 1000, "renew_interval_ms": 300,
                             "margin_ms": 100, "heartbeat_interval_ms": HB_MS,
                             "heartbeat_timeout_ms": 300}})
    observer = None
    try:
        async with asyncio.timeout(10):
            while consumer.owned() != [0]:
                await asyncio.sleep(0.05)
        observer = subprocess.Popen(
            [sys.executable, str(HERE / "gil_observer.py"), nats_js.url, "gil", "gil.0.g1",
             str(BUSY_S)], stdout=subprocess.PIPE, text=True)
        assert observer.stdout.readline().strip() == "ready"

        holds: list = []
        stop = threading.Event()
        witness: list = []

        def want_the_gil() -> None:
            last = time.monotonic()
            while not stop.is_set():
                time.sleep(0.005)
                now = time.monotonic()
                witness.append(now - last)
                last = now

        thread = threading.Thread(target=want_the_gil, daemon=True)
        thread.start()
        ends = []

        async def handle() -> None:
            async for stream in consumer:
                async for event in stream:
                    if isinstance(event, weir.Frame):
                        t = time.time()
                        HOLD_GIL(int(HOLD_S * 1e6))  # a model call: holds the GIL
                        holds.append((t, time.time()))
                    elif isinstance(event, weir.End):
                        ends.append(event)
                        return

        await asyncio.wait_for(handle(), BUSY_S + 15)
        stop.set()
        thread.join(2)
        out = await asyncio.to_thread(observer.communicate, timeout=15)
        seen = json.loads(out[0].strip().splitlines()[-1])
        stats = await consumer.close()
    finally:
        if observer is not None and observer.poll() is None:
            observer.kill()
        if not consumer.closed:
            consumer.abort()

    assert len(holds) >= 10, holds
    lo, hi = holds[0][0] + 0.3, holds[-1][1]
    held = statistics.median(b - a for a, b in holds)
    assert held >= 0.95 * HOLD_S, holds[:5]
    # A thread that wants the GIL waited about as long as a hold: the handler really
    # held it.
    assert max(witness) >= 0.85 * held, (
        f"the GIL was not held: longest wait {max(witness):.3f} s, hold {held:.3f} s")
    hb = max_gap(seen["heartbeats"], lo, hi)
    renew = max_gap(seen["renewals"], lo, hi)
    print(f"GIL held {len(holds)}×, median {held * 1000:.0f} ms; witness thread waited up to "
          f"{max(witness) * 1000:.0f} ms; heartbeat gap max {hb * 1000:.0f} ms "
          f"(interval {HB_MS}); renewal gap max {renew * 1000:.0f} ms (interval 300)")
    assert hb < (HB_MS / 1000 + HOLD_S) / 2, f"heartbeats delayed: {hb * 1000:.0f} ms"
    assert renew < 0.45, f"renewals delayed: {renew * 1000:.0f} ms"
    assert stats.totals.frames_dropped_fenced == 0
    assert [e.cause for e in ends] == ["producer"]
