"""The event classes of `weir.consumer` (no NATS needed): immutable, compared and
hashed by value, matched by position (``__match_args__``), readable ``repr``."""

from __future__ import annotations

import pytest

import weir


def test_events_are_values():
    f = weir.Frame(b"\x00\x01", 3, 1, 1700000000000)
    assert f == weir.Frame(b"\x00\x01", 3, 1, 1700000000000)
    assert f != weir.Frame(b"\x00\x01", 4, 1, 1700000000000)
    assert f != (b"\x00\x01", 3, 1, 1700000000000)
    assert len({f, weir.Frame(b"\x00\x01", 3, 1, 1700000000000)}) == 1
    g = weir.Gap(4, 9, 6, None, "declared", "queue_full")
    assert g == weir.Gap(4, 9, 6, None, "declared", "queue_full")
    assert weir.End("producer") == weir.End("producer", None, None, None)
    d = weir.LossDeclared(1, 5, 5, 5, "unconfirmed_at_disconnect", 2)
    assert hash(d) == hash(weir.LossDeclared(1, 5, 5, 5, "unconfirmed_at_disconnect", 2))
    assert repr(g) == 'Gap(first_seq=4, last_seq=9, frames=6, samples=None, cause="declared", reason="queue_full")'
    assert repr(f).startswith("Frame(pcm=<2 bytes>, seq=3")


def test_events_are_frozen():
    f = weir.Frame(b"", 1, 0)
    with pytest.raises(AttributeError):
        f.seq = 2  # type: ignore[misc]
    assert f.captured_at_ms is None


def test_events_match_by_position():
    seen = []
    for ev in (weir.Frame(b"ab", 1, 1), weir.Gap(2, 3, 2, 640, "stale"),
               weir.LossDeclared(2, 3, 2, 2, "unconfirmed_at_disconnect", 0),
               weir.End("idle", None, None, 3)):
        match ev:
            case weir.Frame(pcm, seq):
                seen.append(("frame", pcm, seq))
            case weir.Gap(first, last, frames, samples, cause):
                seen.append(("gap", first, last, frames, samples, cause))
            case weir.LossDeclared(first, last):
                seen.append(("declared", first, last))
            case weir.End(cause, reason, seq, last_seq):
                seen.append(("end", cause, reason, seq, last_seq))
    assert seen == [("frame", b"ab", 1), ("gap", 2, 3, 2, 640, "stale"), ("declared", 2, 3),
                    ("end", "idle", None, None, 3)]
    assert weir.Frame.__match_args__ == ("pcm", "seq", "samples", "captured_at_ms")
