"""The adapter's overload headline check, from outside the process, with a plain nats-py caller.

Starts a `nats-server` on a free loopback port and the real `llm-adapter serve` binary
with the DEFAULT configuration except `workers = 1` and the sim backend at a fixed
50 ms (capacity 20 req/s), then offers `--rate` requests per second (default 40, 2x
capacity) for `--secs` seconds (default 30). Every request carries
`Weir-Timeout-Ms: 2000` and uses a 2 s NATS request timeout.

Prints one JSON object: what the callers saw (ok within the budget, refusals by code,
refusal latency p50/p99 measured by the caller from send to reply, caller timeouts)
and what the adapter reports in /v1/stats (useful backend share, refusal latency
after receipt, the service-time estimate).

Run (see docs/llm-adapter.md, "Checking the defaults from outside"):

    PY="$(scripts/ensure-python-env)"
    cargo build --release -p weir-llm-adapter --bin llm-adapter
    "$PY" llm-adapter/adapter/tests/py/overload_caller.py --adapter target/release/llm-adapter
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import nats
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    i = min(len(v) - 1, max(0, int(round(q * len(v) + 0.5)) - 1))
    return round(v[i], 2)


async def offer(url, subject, rate, secs, budget_ms, timeout_s):
    nc = await nats.connect(url)
    results = []  # (code, latency_ms)
    tasks = []
    headers = {"Weir-Timeout-Ms": str(budget_ms)}
    payload = b'{"prompt":"x"}'

    async def one():
        t = time.monotonic()
        try:
            msg = await nc.request(subject, payload, timeout=timeout_s, headers=headers)
            took = (time.monotonic() - t) * 1000.0
            code = (msg.headers or {}).get("Weir-Error-Code", "ok")
            results.append((code, took))
        except NatsTimeout:
            results.append(("caller_timeout", (time.monotonic() - t) * 1000.0))
        except NoRespondersError:
            results.append(("no_responders", (time.monotonic() - t) * 1000.0))

    loop = asyncio.get_running_loop()
    start = loop.time()
    n = int(rate * secs)
    for i in range(n):
        at = start + i / rate
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    sent_for = loop.time() - start
    await asyncio.gather(*tasks)
    await nc.close()
    return results, sent_for


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", default="target/release/llm-adapter")
    ap.add_argument("--nats-server", default="nats-server")
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--secs", type=float, default=30.0)
    ap.add_argument("--budget-ms", type=int, default=2000)
    ap.add_argument("--latency-ms", type=int, default=50)
    ap.add_argument("--distribution", default="fixed", choices=["fixed", "lognormal"])
    ap.add_argument("--p99-ms", type=int, default=150)
    args = ap.parse_args()

    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    server = subprocess.Popen(
        [args.nats_server, "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    adapter = None
    try:
        tmp = tempfile.mkdtemp(prefix="weir-overload-")
        cfg = os.path.join(tmp, "adapter.toml")
        sim = f"latency_ms = {args.latency_ms}\n"
        if args.distribution == "lognormal":
            sim += f'distribution = "lognormal"\np99_ms = {args.p99_ms}\n'
        # The default configuration, except the worker count and the sim's latency.
        with open(cfg, "w") as f:
            f.write(f"workers = 1\n[backend.sim]\n{sim}")
        # Wait for the server's port.
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        adapter = subprocess.Popen(
            [args.adapter, "serve", "--config", cfg, "--admin", "127.0.0.1:0", "--nats-url", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn"},
            text=True,
        )
        ready = json.loads(adapter.stdout.readline())
        admin = ready["admin"]
        results, sent_for = asyncio.run(
            offer(url, "llm.infer", args.rate, args.secs, args.budget_ms, args.budget_ms / 1000.0)
        )
        with urllib.request.urlopen(f"http://{admin}/v1/stats", timeout=5) as r:
            stats = json.load(r)
        with urllib.request.urlopen(f"http://{admin}/v1/capabilities", timeout=5) as r:
            caps = json.load(r)
    finally:
        if adapter is not None:
            adapter.terminate()
            try:
                adapter.wait(timeout=15)
            except subprocess.TimeoutExpired:
                adapter.kill()
        server.terminate()
        server.wait(timeout=5)

    codes = {}
    for code, _ in results:
        codes[code] = codes.get(code, 0) + 1
    ok_in_time = sum(1 for c, t in results if c == "ok" and t <= args.budget_ms)
    refusal_lat = [t for c, t in results if c not in ("ok", "caller_timeout", "no_responders")]
    ok_lat = [t for c, t in results if c == "ok"]
    capacity = 1000.0 / args.latency_ms
    busy = stats.get("backend_busy_ms", 0.0)
    out = {
        "setup": {
            "config": "defaults + workers = 1, backend.sim latency_ms = %d (%s)"
            % (args.latency_ms, args.distribution),
            "offered_rps": args.rate,
            "secs": args.secs,
            "sent": len(results),
            "sent_over_s": round(sent_for, 2),
            "budget_ms": args.budget_ms,
            "possible_ok": int(capacity * args.secs),
        },
        "caller": {
            "ok_within_budget": ok_in_time,
            "codes": codes,
            "caller_timeouts": codes.get("caller_timeout", 0),
            "refusal_ms_p50": pct(refusal_lat, 0.50),
            "refusal_ms_p99": pct(refusal_lat, 0.99),
            "refusal_ms_max": round(max(refusal_lat), 2) if refusal_lat else None,
            "ok_ms_p50": pct(ok_lat, 0.50),
            "ok_ms_p99": pct(ok_lat, 0.99),
            "ok_ms_max": round(max(ok_lat), 2) if ok_lat else None,
        },
        "adapter": {
            "useful_backend_share": round(stats["backend_useful_ms"] / busy, 4) if busy else None,
            "backend_busy_ms": round(busy, 1),
            "refusal_after_receipt_ms": stats.get("refusal_ms"),
            "refused": stats.get("refused"),
            "started_after_deadline": stats.get("started_after_deadline"),
            "service_estimate": stats.get("service_estimate"),
            "capabilities_deadline": caps.get("deadline"),
        },
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
