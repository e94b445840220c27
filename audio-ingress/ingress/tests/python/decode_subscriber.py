#!/usr/bin/env python3
"""Subscribes like the deployed Python ASR service and decodes every packet with the
deployed reading code (struct + json), to check that what weir publishes is readable.

    decode_subscriber.py --url nats://127.0.0.1:4222 --subject 'audio.*.*' --count N
        [--timeout 10]

Prints `READY` once the subscription is registered on the server, then one JSON line
per message: {"subject", "meta", "pcm_len", "samples", "pcm_ok", "headers"} (or
{"subject", "error"} if it cannot be read), then exits 0 after N messages, or 2 on
timeout.
"""
import argparse
import asyncio
import json
import struct
import sys

import nats


def read_packet(data):
    (n,) = struct.unpack(">I", data[:4])
    meta = json.loads(data[4:4 + n].decode("utf-8"))
    pcm = data[4 + n:]
    return meta, pcm


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--subject", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args()

    nc = await nats.connect(args.url, connect_timeout=2, max_reconnect_attempts=0)
    done = asyncio.Event()
    seen = 0

    async def on_msg(msg):
        nonlocal seen
        try:
            meta, pcm = read_packet(msg.data)
            width = meta["sample_width"] * meta["channels"]
            line = {"subject": msg.subject, "meta": meta, "pcm_len": len(pcm),
                    "samples": len(pcm) // width, "pcm_ok": len(pcm) % width == 0,
                    "headers": dict(msg.headers or {})}
        except Exception as e:  # report, keep going
            line = {"subject": msg.subject, "error": repr(e)}
        print(json.dumps(line, ensure_ascii=False), flush=True)
        seen += 1
        if seen >= args.count:
            done.set()

    await nc.subscribe(args.subject, cb=on_msg)
    await nc.flush(timeout=5)
    print("READY", flush=True)
    try:
        await asyncio.wait_for(done.wait(), timeout=args.timeout)
    except asyncio.TimeoutError:
        print(json.dumps({"timeout": True, "seen": seen}), flush=True)
        await nc.close()
        sys.exit(2)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
