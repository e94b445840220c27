"""Order and loss through the real audio-ingress (issue 29, "Order and loss").

50 WebSocket producers stream at real time through the real `audio-ingress serve`
binary into a real nats-server; a Python recogniser on `weir.Consumer` (default
subject, one partition) records every event.

- Steady run: every frame of every stream arrives, in order, with the producer's own
  PCM, and exactly one `End(cause="producer")` per stream.
- nats-server SIGSTOPped for 6 s mid-run: every seq of every stream is either a frame
  or inside a declared `Gap` (stale, possibly_lost, overload or lost), in order, and
  frames + gap frames = the seqs the ingress assigned; nothing is missing silently.

Bounds: producers run 3 s (steady) and 2 + 6 + 2 s (stall); every wait has a timeout.
"""

from __future__ import annotations

import asyncio
from typing import Dict

import weir
from consumer_kit import Received, audit_timeline, produce, serve

STREAMS = 50


async def run(nats, ingress, seconds: float, *, stall_at: float = 0.0, stall_s: float = 0.0):
    # The idle timeout outlasts the stall, so that each stream's `end` (sent by the
    # ingress once NATS is back) closes its timeline instead of the reaper.
    consumer = await weir.Consumer.connect(nats.url, max_streams=256, idle_timeout_ms=15_000)
    got: Dict[str, Received] = {}
    server = asyncio.create_task(serve(consumer, got))
    ids = [f"call-{i:03d}" for i in range(STREAMS)]
    producers = [asyncio.create_task(produce(ingress.ws_url(s), s, seconds)) for s in ids]
    if stall_s:
        await asyncio.sleep(stall_at)
        nats.pause()
        try:
            await asyncio.sleep(stall_s)
        finally:
            nats.resume()
    produced = await asyncio.wait_for(asyncio.gather(*producers), seconds + 30)

    async def all_ended() -> None:
        while not (len(got) >= STREAMS and all(r.end for r in got.values())):
            await asyncio.sleep(0.05)

    await asyncio.wait_for(all_ended(), 20)
    stats = await consumer.close()
    await asyncio.wait_for(server, 10)
    return {p.stream: p for p in produced}, got, stats


async def test_every_frame_of_50_streams_in_order(nats_server, ingress_factory):
    ingress = ingress_factory(nats_server.url)
    produced, got, stats = await run(nats_server, ingress, 3.0)
    assert sorted(got) == sorted(produced)
    for sid, rec in got.items():
        sent = produced[sid].sent
        assert sent == 150
        assert rec.frames == list(range(1, sent + 1)), sid
        assert rec.indices == list(range(sent)), sid  # the producer's PCM, in order
        assert rec.gaps == [] and rec.declared == []
        assert rec.end == weir.End("producer", rec.end.reason, sent + 1, sent + 1)
    assert stats.totals.frames_delivered == STREAMS * 150
    assert stats.totals.streams_started == STREAMS


async def test_a_6s_nats_stall_is_declared_frame_by_frame(nats_server, ingress_factory):
    ingress = ingress_factory(nats_server.url)
    produced, got, stats = await run(nats_server, ingress, 10.0, stall_at=2.0, stall_s=6.0)
    assert sorted(got) == sorted(produced)
    causes: Dict[str, int] = {}
    frames = gap_frames = covered = 0
    for sid, rec in got.items():
        n = audit_timeline(rec)  # every seq 1..end-1: a frame or a declared gap, in order
        covered += n
        frames += len(rec.frames)
        gap_frames += sum(g.frames for g in rec.gaps)
        for g in rec.gaps:
            causes[g.cause] = causes.get(g.cause, 0) + g.frames
        # The ingress assigns seqs only to frames it accepted from this producer.
        assert n <= produced[sid].sent
        # Every frame the ingress reports as confirmed by the server reached the
        # recogniser (fresh, or declared stale), or left a hole the consumer saw and
        # counted (`lost`): after the stall the server may drop part of its burst to a
        # consumer that is not keeping up, which is loss, never silence.
        closed = produced[sid].closed_event
        assert closed is not None, produced[sid].events
        stale = sum(g.frames for g in rec.gaps if g.cause == "stale")
        lost = sum(g.frames for g in rec.gaps if g.cause == "lost")
        assert len(rec.frames) + stale + lost >= closed["frames_published"], (sid, closed, lost)
        assert rec.indices == list(range(len(rec.indices))) or rec.indices == sorted(rec.indices)
    assert frames + gap_frames == covered
    assert set(causes) <= {"stale", "possibly_lost", "overload", "lost", "declared"}, causes
    assert gap_frames > 0, "a 6 s stall must cost frames"
    # The core's own identity: sent = frames + stale + lost + possibly lost + declared.
    t = stats.totals
    assert t.frames + t.stale_frames + t.lost_frames + t.possibly_lost_frames \
        + t.declared_gap_frames + t.leading_missing == covered
    print(f"stall: {covered} seqs, {frames} frames, gaps by cause {causes}")
