#!/usr/bin/env python3
"""Measured runs of the llm-adapter edge against the real release binary.

Starts a nats-server (loopback, free port) and `target/release/llm-adapter serve` with
the DEFAULT configuration (only the NATS URL and a free admin port are given), then
drives it with a plain nats-py client:

  cache-rss  300 requests of ~1 MB each with distinct request ids, then the same 300
             again (retries within the 60 s window); prints the adapter's RSS before,
             after each round, and the cache figures from /v1/stats.
  burst N    N requests published at once on llm.infer (one connection, no waiting
             between them); counts answers (ok / refusal code) and compares with the
             adapter's counted client drops (`nats.not_taken`, `nats.dropped` in
             /v1/stats).

Usage: bash scripts/ensure-python-env && target/py/bin/python scripts/llm-edge-measure.py cache-rss
       target/py/bin/python scripts/llm-edge-measure.py burst 20000 [KEY=VALUE env ...]
Extra KEY=VALUE arguments are passed to the adapter's environment (e.g.
WEIR_LLM_QUEUE_CAPACITY=1000) to show which setting raises a limit.
"""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import nats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "llm-adapter")


def nats_server_bin():
    for p in (shutil.which("nats-server"), "/usr/sbin/nats-server"):
        if p and os.path.exists(p):
            return p
    sys.exit("nats-server not found (bash scripts/ensure-nats-server)")


def start_nats(tmp):
    proc = subprocess.Popen(
        [nats_server_bin(), "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", tmp],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        for f in os.listdir(tmp):
            if f.startswith("nats-server_") and f.endswith(".ports"):
                try:
                    ports = json.load(open(os.path.join(tmp, f)))
                    return proc, ports["nats"][0]
                except (ValueError, KeyError, IndexError):
                    pass
        time.sleep(0.05)
    proc.kill()
    sys.exit("nats-server did not start")


def start_adapter(url, extra_env):
    env = dict(os.environ)
    env.update(extra_env)
    env.setdefault("RUST_LOG", "warn")
    proc = subprocess.Popen(
        [BIN, "serve", "--nats-url", url, "--admin", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    line = proc.stdout.readline()
    admin = json.loads(line)["admin"]
    return proc, admin


def stop(proc):
    """SIGTERM, and SIGKILL if the process has not exited 15 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def stats(admin):
    with urllib.request.urlopen(f"http://{admin}/v1/stats", timeout=5) as r:
        return json.load(r)


async def cache_rss(url, proc, admin):
    nc = await nats.connect(url, max_reconnect_attempts=0)
    body = b"x" * 1_000_000
    before = rss_mb(proc.pid)
    print(f"rss before: {before:.1f} MB")
    sem = asyncio.Semaphore(int(os.environ.get("CONCURRENCY", "8")))

    async def one(i):
        async with sem:
            m = await nc.request(
                "llm.infer", body, timeout=30, headers={"Weir-Request-Id": f"rss-{i}"}
            )
            code = (m.headers or {}).get("Weir-Error-Code", "ok")
            return code

    for rnd in (1, 2):
        t0 = time.monotonic()
        codes = await asyncio.gather(*(one(i) for i in range(300)))
        took = time.monotonic() - t0
        s = stats(admin)
        by = {}
        for c in codes:
            by[c] = by.get(c, 0) + 1
        print(
            f"round {rnd}: {took:.1f} s, answers {by}, rss {rss_mb(proc.pid):.1f} MB, "
            f"cache {json.dumps(s.get('cache'))}, cached {s['cached']}"
        )
    await asyncio.sleep(1)
    after = rss_mb(proc.pid)
    s = stats(admin)
    limit = s["cache"]["max_bytes"] / 1024 / 1024
    grow = after - before
    print(
        f"rss after: {after:.1f} MB; growth {grow:.1f} MB; bound max_bytes+10% = "
        f"{limit * 1.1:.1f} MB -> {'PASS' if grow <= limit * 1.1 else 'FAIL'}"
    )
    await nc.close()


async def burst(url, proc, admin, n):
    nc = await nats.connect(url, max_reconnect_attempts=0, pending_size=1 << 30)
    inbox = nc.new_inbox()
    answers = {}
    done = asyncio.Event()
    got = 0

    async def on_reply(msg):
        nonlocal got
        code = (msg.headers or {}).get("Weir-Error-Code", "ok")
        answers[code] = answers.get(code, 0) + 1
        got += 1
        if got >= n:
            done.set()

    await nc.subscribe(inbox + ".*", cb=on_reply, pending_msgs_limit=n * 2)
    await nc.flush()
    body = b'{"prompt":"hi"}'
    t0 = time.monotonic()
    for i in range(n):
        await nc.publish("llm.infer", body, reply=f"{inbox}.{i}")
    await nc.flush()
    sent_s = time.monotonic() - t0
    try:
        await asyncio.wait_for(done.wait(), timeout=60)
    except asyncio.TimeoutError:
        pass
    # Settle: late answers still count.
    await asyncio.sleep(2)
    s = stats(admin)
    nt = s["nats"]
    dropped = nt["not_taken"]
    print(
        f"burst {n}: published in {sent_s:.2f} s; answered {got} {answers}; "
        f"adapter offered {s['offered']}; client drops: not_taken {dropped} "
        f"(in_messages {nt['in_messages']} - taken {nt['taken']}), slow-consumer events "
        f"{nt['dropped']}; answered + not_taken = {got + dropped} of {n} -> "
        f"{'ALL ACCOUNTED' if got + dropped == n else 'UNACCOUNTED ' + str(n - got - dropped)}"
    )
    await nc.close()


async def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    mode = sys.argv[1]
    rest = sys.argv[2:]
    n = 20000
    if mode == "burst" and rest and rest[0].isdigit():
        n = int(rest.pop(0))
    extra = dict(a.split("=", 1) for a in rest)
    tmp = tempfile.mkdtemp(prefix="weir-measure-")
    nproc, url = start_nats(tmp)
    aproc, admin = start_adapter(url, extra)
    try:
        if mode == "cache-rss":
            await cache_rss(url, aproc, admin)
        elif mode == "burst":
            await burst(url, aproc, admin, n)
        else:
            sys.exit(__doc__)
    finally:
        for proc in (aproc, nproc):
            stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
