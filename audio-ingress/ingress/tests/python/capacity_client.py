#!/usr/bin/env python3
"""The recognition-capacity loop from the Python side: a producer on the plain
`websockets` package and a recognition worker on nats-py, as deployed services are
written.

    capacity_client.py --ws ws://127.0.0.1:PORT --nats nats://127.0.0.1:4222 SCENARIO

SCENARIO:
- `silent`: a nats-py subscriber that announces nothing (today's recogniser) receives
  every frame of a websockets producer, then its `end`; the producer gets `closed`
  (reason `producer`, close 1000);
- `full`: a nats-py worker announces every slot taken; a new websockets producer is
  refused `503` with code `no_capacity` and a `Retry-After`;
- `refusal`: an admitted producer's stream is refused by the worker
  (`weir.capacity.refused.<stream>`); the producer gets `closed` with reason
  `no_capacity` and close code 1013.

- `worker-door`: against a real worker (the consumer core, one slot) that announces:
  a first producer streams; once the worker's announcement lists it, a second producer
  is refused `503 no_capacity` at the door (`capacity.mode = enforce`, the default);
- `worker-refusal`: the same worker with the door's check off (`capacity.mode = off`):
  the second producer is admitted, the worker refuses it for `max_streams`, and the
  producer gets `closed` with reason `no_capacity` and close code 1013 — never silence.

Prints one JSON line with what it saw and exits 0 when the scenario holds, 1 otherwise.
"""
import argparse
import asyncio
import json
import struct
import sys
import time

import nats
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

SUBJECT = "inference.whisper.stream.{stream}"
PREFIX = "weir.capacity"


def frame(seq):
    return struct.pack("<320h", *[((seq * 7 + i) % 2000) - 1000 for i in range(320)])


def read_packet(data):
    (n,) = struct.unpack(">I", data[:4])
    return json.loads(data[4:4 + n].decode("utf-8")), data[4 + n:]


def announcement(worker, seq, max_streams, live_streams):
    return {
        "v": 1, "worker": worker, "instance": worker + "-py", "seq": seq,
        "sent_at_ms": int(time.time() * 1000), "interval_ms": 200,
        "subject": SUBJECT, "partitions_total": 1, "ownership": "static",
        "partitions": [0], "max_streams": max_streams, "live_streams": live_streams,
        "lag_ms": 0, "rtf_p95": 0.5, "streams": [],
        "streams_truncated": live_streams > 0,
    }


async def events_until_close(ws):
    events = []
    try:
        while True:
            msg = await asyncio.wait_for(ws.recv(), timeout=5)
            if isinstance(msg, str):
                events.append(json.loads(msg))
    except ConnectionClosed as e:
        return events, (e.rcvd.code if e.rcvd else None)


async def silent(args, nc):
    got = []
    ended = asyncio.Event()

    async def on_msg(msg):
        meta, pcm = read_packet(msg.data)
        if pcm:
            got.append(pcm)
        else:
            ended.set()

    await nc.subscribe(SUBJECT.replace("{stream}", "*"), cb=on_msg)
    await nc.flush(timeout=5)
    frames = 25
    async with connect(args.ws + "/v1/streams/py-silent") as ws:
        for seq in range(1, frames + 1):
            await ws.send(frame(seq))
        await ws.send(json.dumps({"type": "end"}))
        events, code = await events_until_close(ws)
    await asyncio.wait_for(ended.wait(), timeout=5)
    ok = (got == [frame(s) for s in range(1, frames + 1)] and code == 1000
          and events and events[-1]["type"] == "closed"
          and events[-1]["reason"] == "producer")
    return ok, {"frames_received": len(got), "events": events, "close": code}


async def full(args, nc):
    seq = 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        seq += 1
        payload = json.dumps(announcement("py-worker", seq, 2, 2)).encode()
        await nc.publish(PREFIX + ".announce.py-worker", payload)
        await nc.flush(timeout=5)
        try:
            async with connect(args.ws + "/v1/streams/py-full") as ws:
                await ws.close()
        except InvalidStatus as e:
            r = e.response
            body = json.loads(r.body.decode("utf-8"))
            retry = r.headers.get("Retry-After")
            ok = (r.status_code == 503 and body["error"]["code"] == "no_capacity"
                  and retry is not None and int(retry) >= 1)
            return ok, {"status": r.status_code, "body": body, "retry_after": retry}
        await asyncio.sleep(0.05)
    return False, {"error": "never refused"}


async def refusal(args, nc):
    async with connect(args.ws + "/v1/streams/py-refused") as ws:
        await ws.send(frame(1))
        refusal = {"v": 1, "worker": "py-worker", "stream": "py-refused",
                   "reason": "max_streams", "max_streams": 4, "live_streams": 4,
                   "sent_at_ms": int(time.time() * 1000)}
        await nc.publish(PREFIX + ".refused.py-refused", json.dumps(refusal).encode())
        await nc.flush(timeout=5)
        events, code = await events_until_close(ws)
    closed = [e for e in events if e["type"] == "closed"]
    ok = code == 1013 and len(closed) == 1 and closed[0]["reason"] == "no_capacity"
    return ok, {"events": events, "close": code}


async def first_stream_announced(args, nc):
    """Opens the first producer, streams until the worker announces it live."""
    live = asyncio.Event()

    async def on_announcement(msg):
        if json.loads(msg.data).get("live_streams", 0) >= 1:
            live.set()

    sub = await nc.subscribe(PREFIX + ".announce.*", cb=on_announcement)
    ws = await connect(args.ws + "/v1/streams/py-first")
    seq = 0
    deadline = time.monotonic() + 5
    while not live.is_set() and time.monotonic() < deadline:
        seq += 1
        await ws.send(frame(seq))
        await asyncio.sleep(0.02)
    await sub.unsubscribe()
    return ws, live.is_set()


async def worker_door(args, nc):
    first, announced = await first_stream_announced(args, nc)
    try:
        async with connect(args.ws + "/v1/streams/py-second") as ws:
            await ws.close()
        seen = {"status": 101}
        ok = False
    except InvalidStatus as e:
        r = e.response
        body = json.loads(r.body.decode("utf-8"))
        retry = r.headers.get("Retry-After")
        seen = {"status": r.status_code, "body": body, "retry_after": retry}
        ok = r.status_code == 503 and body["error"]["code"] == "no_capacity" and retry
    await first.close()
    return bool(ok and announced), {"announced": announced, **seen}


async def worker_refusal(args, nc):
    first, announced = await first_stream_announced(args, nc)
    async with connect(args.ws + "/v1/streams/py-second") as ws:
        for seq in range(1, 6):
            await ws.send(frame(seq))
        events, code = await events_until_close(ws)
    await first.close()
    closed = [e for e in events if e["type"] == "closed"]
    ok = (announced and code == 1013 and len(closed) == 1
          and closed[0]["reason"] == "no_capacity")
    return ok, {"announced": announced, "events": events, "close": code}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ws", required=True)
    ap.add_argument("--nats", required=True)
    ap.add_argument("scenario", choices=["silent", "full", "refusal", "worker-door",
                                         "worker-refusal"])
    args = ap.parse_args()
    nc = await nats.connect(args.nats, connect_timeout=2, max_reconnect_attempts=0)
    run = {"silent": silent, "full": full, "refusal": refusal, "worker-door": worker_door,
           "worker-refusal": worker_refusal}[args.scenario]
    ok, seen = await run(args, nc)
    await nc.close()
    print(json.dumps({"scenario": args.scenario, "ok": ok, **seen}), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
