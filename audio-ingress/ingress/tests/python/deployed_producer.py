#!/usr/bin/env python3
"""A producer written exactly like the deployed Python producers (nats-py).

    deployed_producer.py --url nats://127.0.0.1:4222 --streams a,b --frames 50
        [--subject inference.whisper.stream.{session}] [--session-id S]
        [--no-end STREAM,...] [--skip-seq N,...] [--interval-ms 0]

For each stream: frames with seq 1..=FRAMES (640 bytes of s16le each), then an `end`
with the next seq — except for streams listed in --no-end (a producer that vanishes).
--skip-seq leaves those seqs out (to simulate loss in transit). Prints one JSON line
with what it published and exits 0.
"""
import argparse
import asyncio
import json
import struct

import nats


def pcm_for(seq):
    # 320 samples of a deterministic ramp, so a reader can check the bytes.
    return struct.pack("<320h", *[((seq * 7 + i) % 2000) - 1000 for i in range(320)])


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--subject", default="inference.whisper.stream.{session}")
    ap.add_argument("--streams", required=True)
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--session-id", default=None)
    ap.add_argument("--no-end", default="")
    ap.add_argument("--skip-seq", default="")
    ap.add_argument("--interval-ms", type=float, default=0.0)
    args = ap.parse_args()
    streams = [s for s in args.streams.split(",") if s]
    no_end = set(s for s in args.no_end.split(",") if s)
    skip = set(int(s) for s in args.skip_seq.split(",") if s)

    nc = await nats.connect(args.url, connect_timeout=2, max_reconnect_attempts=0)
    published = {}
    for session in streams:
        session_id = args.session_id
        subject = args.subject.format(session=session)
        count = 0
        seq = 0
        for _ in range(args.frames):
            seq += 1
            if seq in skip:
                continue
            pcm = pcm_for(seq)
            # --- deployed producer code, verbatim ---
            meta = {"type": "frame", "seq": seq, "sample_rate": 16000, "sample_width": 2, "channels": 1}
            if session_id: meta["session_id"] = session_id
            meta_bytes = json.dumps(meta, ensure_ascii=False).encode("utf-8")
            packet = struct.pack(">I", len(meta_bytes)) + meta_bytes + pcm   # pcm: 640 bytes s16le
            await nc.publish(subject, packet)
            # ---
            count += 1
            if args.interval_ms:
                await asyncio.sleep(args.interval_ms / 1000.0)
        ended = session not in no_end
        if ended:
            seq += 1
            # --- deployed producer code, verbatim ---
            meta = {"type": "end", "seq": seq, "sample_rate": 16000, "sample_width": 2, "channels": 1}
            meta_bytes = json.dumps(meta, ensure_ascii=False).encode("utf-8")
            packet = struct.pack(">I", len(meta_bytes)) + meta_bytes + b""   # end: no PCM
            await nc.publish(subject, packet)
            # ---
        published[session] = {"subject": subject, "frames": count, "end_seq": seq if ended else None}
    await nc.flush(timeout=5)
    await nc.drain()
    print(json.dumps({"published": published}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
