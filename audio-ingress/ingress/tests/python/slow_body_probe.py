#!/usr/bin/env python3
"""Slow WHIP bodies against the real `audio-ingress serve` (release build, defaults
plus `whip_udp_listen`), loopback only, bounded in time.

1. 200 connections from 127.0.0.2: `POST /v1/whip/{id}` announcing 60,000 bytes,
   then one body byte a second. How many the server closes, and when.
2. 4,096 of them from 127.0.0.2-5 (1,024 each), then a WebSocket producer from
   127.0.0.6 retrying on 503 (as a producer does, after `Retry-After`): when it is
   served (101), and the ingress's peak RSS against `weir_ingress_memory_bound_bytes`.

Usage: slow_body_probe.py AUDIO_INGRESS_BIN NATS_SERVER_BIN
"""

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time

BODY_DEADLINE_S = 10.0  # http_body_timeout_ms default
answers = {}  # first line of each answer -> count


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def http_get(addr, path):
    r, w = await asyncio.wait_for(asyncio.open_connection(*addr), 5)
    w.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await asyncio.wait_for(r.read(), 5)
    w.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode(errors="replace")


async def slow_body(ws, src, i, bound, opened):
    """One slow-body client; returns (closed_by_server, seconds from its head)."""
    try:
        r, w = await asyncio.wait_for(
            asyncio.open_connection(*ws, local_addr=(src, 0)), 10
        )
    except Exception:
        return None  # not connected
    head = (
        f"POST /v1/whip/slow-{src.replace('.', '-')}-{i} HTTP/1.1\r\nHost: x\r\n"
        "Content-Type: application/sdp\r\nContent-Length: 60000\r\n\r\nv"
    )
    t0 = time.monotonic()
    opened.append(t0)
    w.write(head.encode())

    async def trickle():
        while True:
            await asyncio.sleep(1.0)
            w.write(b"=")
            try:
                await w.drain()
            except Exception:
                return

    t = asyncio.ensure_future(trickle())
    closed = False
    try:
        async def until_eof():
            while True:
                chunk = await r.read(4096)
                if not chunk:
                    return
                answers.setdefault(chunk.split(b"\r\n", 1)[0].decode(errors="replace"), 0)
                answers[chunk.split(b"\r\n", 1)[0].decode(errors="replace")] += 1

        await asyncio.wait_for(until_eof(), bound)
        closed = True
    except asyncio.TimeoutError:
        pass
    except Exception:
        closed = True
    t.cancel()
    w.close()
    return closed, time.monotonic() - t0


async def producer(ws, src):
    """WebSocket upgrade from `src`, retried on 503: (status, attempts)."""
    attempts = 0
    while True:
        attempts += 1
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(*ws, local_addr=(src, 0)), 5
            )
            w.write(
                b"GET /v1/streams/fifth-address HTTP/1.1\r\nHost: x\r\n"
                b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                b"Sec-WebSocket-Version: 13\r\n\r\n"
            )
            line = await asyncio.wait_for(r.readline(), 5)
            w.close()
            status = int(line.split()[1]) if line else 0
        except Exception:
            status = 0
        if status == 101 or attempts >= 60:
            return status, attempts
        await asyncio.sleep(1.0)


async def main():
    ingress_bin, nats_bin = sys.argv[1], sys.argv[2]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    nats_port = free_port()
    nats = subprocess.Popen(
        [nats_bin, "-a", "127.0.0.1", "-p", str(nats_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ingress = subprocess.Popen(
        [
            ingress_bin, "serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
            "--nats-url", f"nats://127.0.0.1:{nats_port}",
            "--set", "whip_udp_listen=127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RUST_LOG": "warn"},
    )
    try:
        ready = json.loads(ingress.stdout.readline())
        h, p = ready["ws"].rsplit(":", 1)
        ws = (h, int(p))
        h, p = ready["admin"].rsplit(":", 1)
        admin = (h, int(p))
        for _ in range(100):
            try:
                if (await http_get(admin, "/readyz"))[0] == 200:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.1)
        _, metrics = await http_get(admin, "/metrics")
        bound = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("weir_ingress_memory_bound_bytes")
        )
        rss0 = rss_kib(ingress.pid)

        # 1. 200 slow bodies.
        opened = []
        ended = await asyncio.gather(
            *(slow_body(ws, "127.0.0.2", i, 40.0, opened) for i in range(200))
        )
        ended = [e for e in ended if e]
        closed = [e for e in ended if e[0]]
        slowest = max(e[1] for e in ended)
        print(
            f"200 slow bodies: {len(ended)} connected, {len(closed)} closed by the server, "
            f"slowest close {slowest:.2f} s after its head (body deadline {BODY_DEADLINE_S} s); "
            f"answers {answers}"
        )
        answers.clear()
        await asyncio.sleep(1.0)

        # 2. 4,096 from four addresses, then a producer from a fifth.
        peak = [rss_kib(ingress.pid)]

        async def sample():
            while True:
                peak.append(rss_kib(ingress.pid))
                await asyncio.sleep(0.1)

        sampler = asyncio.ensure_future(sample())
        opened = []
        t_attack = time.monotonic()
        attack = [
            asyncio.ensure_future(slow_body(ws, f"127.0.0.{2 + k}", i, 40.0, opened))
            for k in range(4)
            for i in range(1024)
        ]
        # Wait until every attacker has sent its head.
        while len(opened) < 4096 and time.monotonic() - t_attack < 20:
            await asyncio.sleep(0.05)
        t_all = time.monotonic() - t_attack
        status, attempts = await producer(ws, "127.0.0.6")
        served_after = time.monotonic() - t_attack
        ended = [e for e in await asyncio.gather(*attack) if e]
        sampler.cancel()
        closed = [e for e in ended if e[0]]
        slowest = max(e[1] for e in ended)
        print(
            f"4096 slow bodies from 127.0.0.2-5: {len(opened)} heads sent in {t_all:.1f} s, "
            f"{len(closed)} of {len(ended)} closed by the server, slowest {slowest:.2f} s; "
            f"answers {answers}"
        )
        print(
            f"producer from 127.0.0.6: status {status} after {attempts} attempt(s), "
            f"{served_after:.1f} s after the attack began"
        )
        print(
            f"ingress RSS: {rss0 / 1024:.0f} MiB idle, peak {max(peak) / 1024:.0f} MiB; "
            f"documented bound (weir_ingress_memory_bound_bytes) {bound / 2**20:.0f} MiB"
        )
    finally:
        ingress.terminate()
        nats.terminate()
        ingress.wait(10)
        nats.wait(10)


asyncio.run(main())
