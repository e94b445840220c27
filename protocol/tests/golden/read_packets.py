#!/usr/bin/env python3
"""Reads packets the way the deployed Python ASR service does and prints what it sees.

    python3 read_packets.py FILE...   # one JSON line per file

Standard library only (struct + json), exactly the deployed reading code:
    (n,) = struct.unpack(">I", data[:4]); meta = json.loads(data[4:4+n].decode("utf-8"))
"""
import json
import struct
import sys


def read(data):
    (n,) = struct.unpack(">I", data[:4])
    meta = json.loads(data[4:4 + n].decode("utf-8"))
    pcm = data[4 + n:]
    return {"meta": meta, "meta_len": n, "pcm_hex": pcm.hex(),
            "samples": len(pcm) // (meta["sample_width"] * meta["channels"])}


for path in sys.argv[1:]:
    with open(path, "rb") as f:
        print(json.dumps(read(f.read()), ensure_ascii=False))
