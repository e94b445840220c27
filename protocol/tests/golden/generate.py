#!/usr/bin/env python3
"""Golden audio packets, written byte for byte the way the deployed Python producer
writes them (json.dumps(meta, ensure_ascii=False), struct.pack(">I", ...)).

    python3 generate.py            # (re)write the .bin files and vectors.json here
    python3 generate.py --check    # exit 1 if the committed files differ from this code

Standard library only. protocol/tests/python_golden.rs decodes every vector with the
Rust decoder and runs --check, so the committed bytes are provably Python's.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def deployed_packet(kind, seq, pcm=b"", session_id=None, **overrides):
    """Exactly the deployed producer's code path (plus optional field overrides for
    the refusal cases)."""
    meta = {"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2, "channels": 1}
    if session_id:
        meta["session_id"] = session_id
    meta.update(overrides)
    meta_bytes = json.dumps(meta, ensure_ascii=False).encode("utf-8")
    return struct.pack(">I", len(meta_bytes)) + meta_bytes + pcm


def pcm_ramp(samples, start=0):
    """Deterministic s16le samples: start, start+1, ... (wrapping in int16)."""
    vals = [((start + i + 32768) % 65536) - 32768 for i in range(samples)]
    return struct.pack("<%dh" % samples, *vals)


def vectors():
    """(name, bytes, expectation). An expectation is either the decoded fields or
    {"error": <decode error kind>}."""
    ok = []
    frame_pcm = pcm_ramp(320, start=-160)
    ok.append(("frame_plain", deployed_packet("frame", 1, frame_pcm),
               {"type": "frame", "seq": 1, "session_id": None, "samples": 320}, frame_pcm))
    ok.append(("frame_session_utf8", deployed_packet("frame", 2, frame_pcm, session_id="s-é1"),
               {"type": "frame", "seq": 2, "session_id": "s-é1", "samples": 320}, frame_pcm))
    tricky = 'caller "x" \\ tab\there 🎤 日本'
    ok.append(("frame_session_escapes", deployed_packet("frame", 3, frame_pcm[:8], session_id=tricky),
               {"type": "frame", "seq": 3, "session_id": tricky, "samples": 4}, frame_pcm[:8]))
    ok.append(("frame_empty_pcm", deployed_packet("frame", 4, b""),
               {"type": "frame", "seq": 4, "session_id": None, "samples": 0}, b""))
    big = pcm_ramp(1600, start=30000)
    ok.append(("frame_100ms_large_seq", deployed_packet("frame", 2 ** 40, big, session_id="call-9"),
               {"type": "frame", "seq": 2 ** 40, "session_id": "call-9", "samples": 1600}, big))
    ok.append(("frame_unknown_keys", deployed_packet("frame", 5, frame_pcm, future="x", ts=1.5),
               {"type": "frame", "seq": 5, "session_id": None, "samples": 320}, frame_pcm))
    # An empty session_id is falsy: the deployed code omits the key.
    ok.append(("frame_empty_session_omitted", deployed_packet("frame", 6, frame_pcm, session_id=""),
               {"type": "frame", "seq": 6, "session_id": None, "samples": 320}, frame_pcm))
    # The capture-time extension (weir producers that stamp capture time): the meta key captured_at_ms, Unix ms,
    # written after session_id. The deployed reader ignores it (json.loads + key
    # lookups); weir's decoder reads it, and treats a value of the wrong type as absent.
    ok.append(("frame_captured_at_ms",
               deployed_packet("frame", 10, frame_pcm, session_id="s-é1", captured_at_ms=1764500000123),
               {"type": "frame", "seq": 10, "session_id": "s-é1", "samples": 320,
                "captured_at_ms": 1764500000123}, frame_pcm))
    ok.append(("frame_captured_at_ms_no_session",
               deployed_packet("frame", 11, frame_pcm, captured_at_ms=0),
               {"type": "frame", "seq": 11, "session_id": None, "samples": 320,
                "captured_at_ms": 0}, frame_pcm))
    ok.append(("frame_captured_at_ms_string",
               deployed_packet("frame", 12, frame_pcm, captured_at_ms="1764500000123"),
               {"type": "frame", "seq": 12, "session_id": None, "samples": 320,
                "captured_at_ms": None}, frame_pcm))
    ok.append(("frame_captured_at_ms_float",
               deployed_packet("frame", 13, frame_pcm, captured_at_ms=1764500000123.5),
               {"type": "frame", "seq": 13, "session_id": None, "samples": 320,
                "captured_at_ms": None}, frame_pcm))
    ok.append(("end", deployed_packet("end", 26),
               {"type": "end", "seq": 26, "session_id": None, "samples": 0}, b""))
    ok.append(("end_with_session", deployed_packet("end", 7, session_id="s-é1"),
               {"type": "end", "seq": 7, "session_id": "s-é1", "samples": 0}, b""))

    bad = [
        ("bad_truncated", b"\x00\x00", "truncated"),
        ("bad_meta_length", deployed_packet("frame", 1, frame_pcm)[:4] + b"{}", "meta_length_out_of_range"),
        ("bad_odd_pcm", deployed_packet("frame", 1, frame_pcm[:3]), "partial_sample"),
        ("bad_sample_rate", deployed_packet("frame", 1, frame_pcm, sample_rate=8000), "unsupported_sample_rate"),
        ("bad_seq_zero", deployed_packet("frame", 0, frame_pcm), "invalid_seq"),
        ("bad_seq_string", deployed_packet("frame", "1", frame_pcm), "invalid_json"),
        ("bad_type", deployed_packet("audio", 1, frame_pcm), "unknown_type"),
        ("bad_end_with_pcm", deployed_packet("end", 2, frame_pcm), "unexpected_pcm"),
        ("bad_not_utf8", struct.pack(">I", 2) + b"\xff\xfe", "invalid_utf8"),
        ("bad_json_array", struct.pack(">I", 2) + b"[]", "invalid_json"),
    ]
    out = []
    for name, data, expect, pcm in ok:
        expect = dict({"captured_at_ms": None}, **expect)
        expect = dict(expect, pcm_hex=pcm.hex())
        out.append((name, data, expect))
    for name, data, kind in bad:
        out.append((name, data, {"error": kind}))
    return out


def manifest(vs):
    return json.dumps(
        [{"name": n, "file": n + ".bin", "expect": e} for n, _, e in vs],
        ensure_ascii=False, indent=1,
    ) + "\n"


def main():
    vs = vectors()
    files = {n + ".bin": d for n, d, _ in vs}
    files["vectors.json"] = manifest(vs).encode("utf-8")
    if "--check" in sys.argv:
        stale = []
        for name, data in files.items():
            path = os.path.join(HERE, name)
            if not os.path.exists(path) or open(path, "rb").read() != data:
                stale.append(name)
        if stale:
            print("golden files differ from generate.py: " + ", ".join(stale), file=sys.stderr)
            sys.exit(1)
        print("golden files match (%d vectors)" % len(vs))
        return
    for name, data in files.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(data)
    print("wrote %d vectors" % len(vs))


if __name__ == "__main__":
    main()
