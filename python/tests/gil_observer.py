"""External observer of the GIL test (test_consumer_gil.py), run as its own process.

    python gil_observer.py <nats-url> <bucket> <frame-subject> <seconds>

Records, with this host's wall clock, every lease heartbeat on
``weir.lease.<bucket>.heartbeat`` and every write to the lease bucket (``$KV.<bucket>.>``,
the renewals), while publishing one 20 ms frame every 20 ms on <frame-subject> in the
deployed packet format (docs/protocol.md §1), then an ``end``. Prints one JSON object:
``{"heartbeats": [t, ...], "renewals": [t, ...], "frames": n}``. Bounded by <seconds>.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time

import nats


def packet(kind: str, seq: int, pcm: bytes = b"") -> bytes:
    meta = json.dumps({"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2,
                       "channels": 1}).encode()
    return struct.pack(">I", len(meta)) + meta + pcm


async def main(url: str, bucket: str, subject: str, seconds: float) -> None:
    nc = await nats.connect(url)
    heartbeats: list = []
    renewals: list = []

    async def on_hb(msg) -> None:
        heartbeats.append(time.time())

    async def on_kv(msg) -> None:
        renewals.append(time.time())

    await nc.subscribe(f"weir.lease.{bucket}.heartbeat", cb=on_hb)
    await nc.subscribe(f"$KV.{bucket}.>", cb=on_kv)
    await nc.flush()
    print("ready", flush=True)
    t0 = time.monotonic()
    seq = 0
    pcm = bytes(640)
    while time.monotonic() - t0 < seconds:
        seq += 1
        await nc.publish(subject, packet("frame", seq, pcm))
        delay = t0 + seq * 0.02 - time.monotonic()
        await asyncio.sleep(max(delay, 0))
    await nc.publish(subject, packet("end", seq + 1))
    await nc.flush()
    await asyncio.sleep(0.2)
    await nc.close()
    print(json.dumps({"heartbeats": heartbeats, "renewals": renewals, "frames": seq}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
