"""Throughput benchmark of `weir.Consumer` (issue 29, "Throughput"): a benchmark, not a
timed test.

    target/py/bin/python python/bench/consumer_throughput.py [--streams 1000] [--fps 50]
        [--rounds 3] [--warmup 3] [--window 10]

Per round, on one real nats-server:
- a publisher process (nats-py) publishes ``--streams`` streams × ``--fps`` frames/s in
  the deployed packet format (docs/protocol.md §1) on ``bench.{partition}.{stream}``
  (8 partitions, FNV-1a as §5);
- two subscriber processes run side by side on the same messages:
  - ``weir``: `weir.Consumer` owning all 8 partitions, one trivial Python handler per
    stream (``async for event in stream``: count the frames);
  - ``plain``: a plain nats-py subscriber on ``bench.>`` doing only the decode
    (``struct`` + ``json``, like the deployed recogniser);
- each subscriber measures its own process CPU time (all threads: for weir, the Rust
  core and bridge threads too) and the frames it handled over the same window, after a
  warm-up; weir also reports its CPU by thread (``/proc/self/task``).

The start order of the two subscribers alternates between rounds; the summary gives
medians over rounds of the CPU per frame of each and their ratio (target: weir ≤ 1.0×
plain). Use a release wheel for figures: ``scripts/build-python-wheel --release``.
Every wait is bounded.

Measured (release wheel, 2-core machine shared with other work, 1,000 streams × 50
frames/s, 5 alternating 10 s rounds per run; no frame lost or dropped in any round):

| run | weir µs/frame | plain µs/frame | ratio rounds | ratio median |
|---|---:|---:|---|---:|
| A | 8.30 | 8.11 | 0.96 0.93 1.02 1.05 0.93 | 0.963 |
| B | 8.29 | 7.88 | 1.01 1.07 0.95 1.05 1.08 | 1.049 |
| C (own asyncio bridge, ended-stream slot release) | 8.53 | 8.11 | 1.01 1.03 1.04 1.06 1.04 | 1.043 |
| D (C with one core thread, the default now) | 6.98 | 7.93 | 0.86 0.92 0.90 0.89 0.87 | **0.888** |
| E (D again, same commit) | 6.43 | 7.70 | | **0.840** |

weir's CPU by thread: run C (two core threads) Python ~4.3, core ~3.9, bridge ~0.3
µs/frame; run D (one) Python ~3.7, core ~2.9, bridge ~0.4. With two core threads a
frame's way (demultiplexer → handler task → hub → acker → handler) crossed threads, each
crossing a futex wake-up; with one it does not. What is left: asyncio's wake of each
stream's task per event (a Future, a Handle, a task step: ~2 µs of the Python share,
inherent in one task per stream) and, on the core, the handler task's second wake per
frame (it returns from its call only when the Python iterator asks for the next event).
A variant
that returned at once and waited for the ack before the *next* send measured 0.94×, but
it would hand a frame to Python after its lease was fenced and would measure the
real-time factor on the send alone, so it is not used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import weir

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

PARTITIONS = 8
TICK = os.sysconf("SC_CLK_TCK")



def packet(kind: str, seq: int, pcm: bytes = b"") -> bytes:
    meta = json.dumps({"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2,
                       "channels": 1}).encode()
    return struct.pack(">I", len(meta)) + meta + pcm


def subjects(n: int) -> List[str]:
    ids = [f"b{i:05d}" for i in range(n)]
    return [f"bench.{weir.partition_of(s, PARTITIONS)}.{s}" for s in ids]


def thread_cpu() -> Dict[str, float]:
    """CPU seconds of this process by thread name."""
    out: Dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICK
        key = name.rstrip("0123456789-") or name
        out[key] = out.get(key, 0.0) + cpu
    return out


async def measure(counter, warmup: float, window: float) -> dict:
    """Waits for the first frame, warms up, then measures frames and CPU over `window`."""
    async with asyncio.timeout(30):
        while counter() == 0:
            await asyncio.sleep(0.05)
    await asyncio.sleep(warmup)
    c0, p0, t0, th0 = counter(), time.process_time(), time.monotonic(), thread_cpu()
    await asyncio.sleep(window)
    c1, p1, t1, th1 = counter(), time.process_time(), time.monotonic(), thread_cpu()
    frames = c1 - c0
    return {
        "frames": frames,
        "seconds": t1 - t0,
        "fps": frames / (t1 - t0),
        "cpu_s": p1 - p0,
        "us_per_frame": (p1 - p0) / max(frames, 1) * 1e6,
        "threads_us_per_frame": {k: round((th1.get(k, 0) - th0.get(k, 0)) / max(frames, 1) * 1e6, 2)
                                 for k in th1 if th1.get(k, 0) - th0.get(k, 0) > 0},
    }


async def role_weir(url: str, warmup: float, window: float, streams: int) -> None:
    import weir

    consumer = await weir.Consumer.connect(
        url, subject="bench.{partition}.{stream}", partitions=PARTITIONS,
        owned=list(range(PARTITIONS)), max_streams=max(2 * streams, 64),
        idle_timeout_ms=30_000)
    count = 0

    async def handle(stream: weir.Stream) -> None:
        nonlocal count
        try:
            async for event in stream:
                if type(event) is weir.Frame:  # the trivial handler
                    count += 1
        except weir.ClosedError:
            pass  # the benchmark closes without a grace period

    async def serve() -> None:
        async for stream in consumer:
            asyncio.create_task(handle(stream))

    task = asyncio.create_task(serve())
    print("ready", flush=True)
    result = await measure(lambda: count, warmup, window)
    stats = consumer.stats().totals
    result["lost_or_dropped"] = {k: getattr(stats, k) for k in (
        "lost_frames", "frames_dropped_overload", "frames_dropped_closed",
        "slow_consumer_events", "streams_overloaded")}
    print(json.dumps(result), flush=True)
    await consumer.close(grace_s=0)
    task.cancel()


async def role_plain(url: str, warmup: float, window: float, streams: int) -> None:
    import nats

    nc = await nats.connect(url)
    count = 0
    buffers: Dict[str, bytes] = {}

    async def on_msg(msg) -> None:
        nonlocal count
        data = msg.data
        (n,) = struct.unpack(">I", data[:4])
        meta = json.loads(data[4:4 + n].decode("utf-8"))
        if meta["type"] == "frame":
            buffers[msg.subject] = data[4 + n:]
            count += 1

    await nc.subscribe("bench.>", cb=on_msg, pending_msgs_limit=1_000_000,
                       pending_bytes_limit=1 << 30)
    await nc.flush()
    print("ready", flush=True)
    result = await measure(lambda: count, warmup, window)
    print(json.dumps(result), flush=True)
    await nc.close()


async def role_publisher(url: str, streams: int, fps: int, seconds: float) -> None:
    import nats

    nc = await nats.connect(url, pending_size=64 << 20)
    subs = subjects(streams)
    pcm = bytes(640)
    period = 1.0 / fps
    t0 = time.monotonic()
    seq = 0
    late = 0
    while time.monotonic() - t0 < seconds:
        seq += 1
        data = packet("frame", seq, pcm)
        for s in subs:
            await nc.publish(s, data)
        delay = t0 + seq * period - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            late += 1
            await asyncio.sleep(0)
    end = packet("end", seq + 1)
    for s in subs:
        await nc.publish(s, end)
    await nc.flush(timeout=10)
    await nc.close()
    print(json.dumps({"ticks": seq, "late_ticks": late}), flush=True)


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE,
                            text=True)


def run_round(url: str, a: argparse.Namespace, order: List[str]) -> Dict[str, dict]:
    common = ["--url", url, "--warmup", str(a.warmup), "--window", str(a.window),
              "--streams", str(a.streams), "--fps", str(a.fps)]
    subs = {}
    for role in order:
        subs[role] = spawn("--role", role, *common)
        line = subs[role].stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"{role} did not start: {line!r}")
    pub = spawn("--role", "publisher", *common,
                "--seconds", str(a.warmup + a.window + 6))
    results = {}
    try:
        for role, p in subs.items():
            out, _ = p.communicate(timeout=a.warmup + a.window + 60)
            results[role] = json.loads(out.strip().splitlines()[-1])
        out, _ = pub.communicate(timeout=30)
        results["publisher"] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in [*subs.values(), pub]:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=["orchestrate", "weir", "plain", "publisher"],
                    default="orchestrate")
    ap.add_argument("--url", default="")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--fps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=0.0)
    a = ap.parse_args()
    if a.role == "weir":
        return asyncio.run(role_weir(a.url, a.warmup, a.window, a.streams))
    if a.role == "plain":
        return asyncio.run(role_plain(a.url, a.warmup, a.window, a.streams))
    if a.role == "publisher":
        return asyncio.run(role_publisher(a.url, a.streams, a.fps, a.seconds))

    import weir
    from weirtest import NatsServer

    wheel = Path(weir.__file__).parent
    print(f"weir {weir.__version__} from {wheel}; {a.streams} streams × {a.fps} fps; "
          f"{a.rounds} rounds, warm-up {a.warmup} s, window {a.window} s", flush=True)
    server = NatsServer()
    rows = []
    try:
        for r in range(a.rounds):
            order = ["weir", "plain"] if r % 2 == 0 else ["plain", "weir"]
            res = run_round(server.url, a, order)
            w, p = res["weir"], res["plain"]
            ratio = w["us_per_frame"] / p["us_per_frame"]
            rows.append((w, p, ratio))
            print(f"round {r + 1} (start order {'/'.join(order)}): "
                  f"weir {w['us_per_frame']:.2f} µs/frame ({w['fps']:.0f} frames/s, threads "
                  f"{w['threads_us_per_frame']}, {w['lost_or_dropped']}) | plain "
                  f"{p['us_per_frame']:.2f} µs/frame ({p['fps']:.0f} frames/s) | ratio "
                  f"{ratio:.2f} | publisher {res['publisher']}", flush=True)
    finally:
        server.stop()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    print(json.dumps({
        "streams": a.streams, "fps": a.fps, "rounds": a.rounds,
        "weir_us_per_frame_median": round(med([w["us_per_frame"] for w, _, _ in rows]), 2),
        "plain_us_per_frame_median": round(med([p["us_per_frame"] for _, p, _ in rows]), 2),
        "ratio_median": round(med([x for _, _, x in rows]), 3),
        "weir_frames_per_s_median": round(med([w["fps"] for w, _, _ in rows])),
        "plain_frames_per_s_median": round(med([p["fps"] for _, p, _ in rows])),
    }))


if __name__ == "__main__":
    main()
