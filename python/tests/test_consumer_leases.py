"""Leases across Python worker processes (issue 29, "Leases across processes"): the same
audit as the Rust `loadtest worker-failover`, applied to Python workers.

Two worker processes (tests/lease_worker.py, `weir.Consumer` in lease mode, bucket
with 3 replicas) on a real 3-node JetStream cluster share 8 partitions. This process
publishes 20 streams at 50 frames/s straight to NATS (the deployed packet format on
``pyfail.{partition}.{stream}``, partition = FNV-1a-32(id) mod 8 as docs/protocol.md
§5 gives it), SIGKILLs one worker 2 s in, keeps publishing 5 s, then ends every stream.

Audit, from the workers' line-buffered logs only:
- the survivor delivers every partition the killed worker held within 3 s of the kill;
- no (stream, seq) was handed to both workers;
- every seq 1..last of every stream was handed to a worker or covered by a gap notice
  one of them was handed (handover / lost): none is missing silently.

Bounded: cluster start, spread wait 20 s, 7 s of frames, end wait 15 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Set, Tuple

import nats as nats_py

import weir

HERE = Path(__file__).resolve().parent
PARTITIONS = 8
STREAMS = 20
BUCKET = "pyfail"



def packet(kind: str, seq: int, pcm: bytes = b"") -> bytes:
    meta = json.dumps({"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2,
                       "channels": 1}).encode()
    return struct.pack(">I", len(meta)) + meta + pcm


class Log:
    """A worker's log, parsed."""

    def __init__(self, path: Path) -> None:
        self.frames: Set[Tuple[str, int]] = set()
        self.gaps: List[Tuple[str, int, int, str]] = []
        self.ends: Dict[str, str] = {}
        self.leases: List[Tuple[int, int, bool]] = []  # (ms, partition, delivering)
        for line in path.read_text().splitlines():
            p = line.split(" ")
            try:
                if p[0] == "F":
                    self.frames.add((p[1], int(p[2])))
                elif p[0] == "G":
                    self.gaps.append((p[1], int(p[2]), int(p[3]), p[4]))
                elif p[0] == "E":
                    self.ends[p[1]] = p[2]
                elif p[0] == "L":
                    self.leases.append((int(p[1]), int(p[2]), p[3] == "1"))
            except (IndexError, ValueError):
                pass  # a line cut by SIGKILL

    def delivering(self, at_ms: float) -> Set[int]:
        held: Dict[int, bool] = {}
        for t, p, on in self.leases:
            if t <= at_ms:
                held[p] = on
        return {p for p, on in held.items() if on}


def start_worker(urls: List[str], name: str, log: Path) -> subprocess.Popen:
    err = open(log.with_suffix(".err"), "w")
    try:
        return subprocess.Popen(
            [sys.executable, str(HERE / "lease_worker.py"), ",".join(urls), name, str(log),
             str(PARTITIONS), BUCKET], stdin=subprocess.DEVNULL, stderr=err)
    finally:
        err.close()


def stderr_of(log: Path) -> str:
    try:
        return log.with_suffix(".err").read_text()[-2000:]
    except OSError:
        return ""


async def test_sigkill_one_python_worker(nats_cluster, tmp_path):
    urls = nats_cluster.urls
    logs = {w: tmp_path / f"{w}.log" for w in ("w1", "w2")}
    procs = {w: start_worker(urls, w, logs[w]) for w in logs}
    nc = None
    try:
        # Both workers up and the partitions spread over them.
        async with asyncio.timeout(30):
            while True:
                now = time.time() * 1000
                parsed = {w: Log(p) for w, p in logs.items() if p.exists()}
                held = [parsed[w].delivering(now) if w in parsed else set() for w in logs]
                if all(held) and held[0] | held[1] == set(range(PARTITIONS)) \
                        and not held[0] & held[1]:
                    break
                for w, pr in procs.items():
                    assert pr.poll() is None, \
                        f"{w} exited with {pr.returncode}: {stderr_of(logs[w])}"
                await asyncio.sleep(0.1)

        nc = await nats_py.connect(servers=urls)
        ids = [f"s{i:03d}" for i in range(STREAMS)]
        subjects = {s: f"pyfail.{weir.partition_of(s, PARTITIONS)}.{s}" for s in ids}
        pcm = bytes(640)
        t0 = time.monotonic()
        seq = 0
        kill_ms = None
        while time.monotonic() - t0 < 7.0:
            seq += 1
            data = packet("frame", seq, pcm)
            for s in ids:
                await nc.publish(subjects[s], data)
            if kill_ms is None and time.monotonic() - t0 >= 2.0:
                kill_ms = time.time() * 1000
                procs["w1"].send_signal(signal.SIGKILL)
            await asyncio.sleep(max(0.0, t0 + seq * 0.02 - time.monotonic()))
        last = seq
        end = packet("end", last + 1)
        for s in ids:
            await nc.publish(subjects[s], end)
        await nc.flush()
        assert procs["w1"].wait(5) == -signal.SIGKILL

        # The survivor sees every stream's end.
        async with asyncio.timeout(15):
            while len(Log(logs["w2"]).ends) < STREAMS:
                await asyncio.sleep(0.1)
        procs["w2"].send_signal(signal.SIGTERM)
        assert procs["w2"].wait(15) == 0
    finally:
        if nc is not None:
            await nc.close()
        for pr in procs.values():
            if pr.poll() is None:
                pr.kill()
                pr.wait(5)

    w1, w2 = Log(logs["w1"]), Log(logs["w2"])
    # 1. Takeover within 3 s.
    orphaned = w1.delivering(kill_ms)
    assert orphaned, "the killed worker held no partition"
    takeover = {}
    for p in orphaned:
        t = next((t for t, q, on in w2.leases if q == p and on and t >= kill_ms), None)
        assert t is not None, f"partition {p} never taken over"
        takeover[p] = t - kill_ms
    assert max(takeover.values()) <= 3000, takeover
    # 2. No double delivery.
    both = w1.frames & w2.frames
    assert not both, f"{len(both)} frames handed to both workers, e.g. {sorted(both)[:5]}"
    # 3. Every seq handed or declared.
    covered: Dict[str, Set[int]] = {s: set() for s in ids}
    causes: Dict[str, int] = {}
    for s, q in w1.frames | w2.frames:
        covered[s].add(q)
    for s, a, b, cause in w1.gaps + w2.gaps:
        covered[s].update(range(a, b + 1))
        causes[cause] = causes.get(cause, 0) + b - a + 1
    undeclared = {s: sorted(set(range(1, last + 1)) - c) for s, c in covered.items()}
    undeclared = {s: m for s, m in undeclared.items() if m}
    assert not undeclared, f"missing silently: {undeclared}"
    assert all(w2.ends.get(s) == "producer" for s in ids), w2.ends
    lost_after_kill = sum(n for c, n in causes.items())
    print(f"takeover ms {sorted(takeover.items())}; frames w1 {len(w1.frames)} w2 "
          f"{len(w2.frames)}; both 0; gaps by cause {causes} ({lost_after_kill} seqs); "
          f"undeclared 0 of {STREAMS * last}")
