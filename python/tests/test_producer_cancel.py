"""Cancellation and slots: a cancelled ``await`` on `weir.Producer` leaves no stream
slot behind and loses no event.

- ``await stream.end()`` cancelled while the server is stopped (the ``end`` cannot be
  confirmed yet): the stream still ends in Rust; once it has, its id opens again and
  ``stats().active_streams`` counts only the new stream; ``end()`` again raises
  `ClosedError`.
- ``await producer.close()`` cancelled mid-shutdown: the producer is closed at once
  (``open`` raises `ClosedError`), every stream still ends (``active_streams`` falls
  to 0), the subscriber sees every ``end``.
- ``await stream.next_event()`` cancelled over and over while the stream overloads (a
  stopped server): afterwards the events are `Overloaded` then `Closed`, each exactly
  once, then ``None``.
- A stream dropped without ``end()`` ends ``producer_gone`` (the subscriber sees that
  ``end``) and frees its id.

Real nats-server (SIGSTOP/SIGCONT); every wait bounded (``asyncio.timeout`` per test,
bounded polls).
"""

from __future__ import annotations

import asyncio
import gc
import json
import struct
import time
from typing import Dict, List

import nats

import weir
from weir.errors import ClosedError, RefusedError
from weir.producer import Closed, Overloaded

FRAME = bytes(640)
BOUND_S = 40
PREFIX = "inference.whisper.stream."


async def ends_spy(url: str):
    """A nats-py subscriber recording the `end` packets' reasons by stream id."""
    nc = await asyncio.wait_for(nats.connect(url, connect_timeout=2), 5)
    ends: Dict[str, str] = {}

    async def on_msg(msg) -> None:
        (n,) = struct.unpack(">I", msg.data[:4])
        meta = json.loads(msg.data[4 : 4 + n])
        if meta["type"] == "end":
            ends[msg.subject[len(PREFIX):]] = (msg.headers or {}).get("Weir-End-Reason", "")

    await nc.subscribe(PREFIX + ">", cb=on_msg)
    await asyncio.wait_for(nc.flush(), 5)
    return nc, ends


async def until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def reopen(producer: weir.Producer, stream_id: str, timeout: float) -> weir.ProducerStream:
    """Opens `stream_id` as soon as its previous instance has freed the id."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return producer.open(stream_id)
        except RefusedError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def test_cancelled_end_leaves_no_slot(nats_server):
    """Cancel `await stream.end()` mid-wait; the id opens again, stats stay consistent."""
    async with asyncio.timeout(BOUND_S):
        nc, ends = await ends_spy(nats_server.url)
        producer = await weir.Producer.connect(nats_server.url, end_timeout_ms=1000)
        try:
            stream = producer.open("cancel-end")
            for _ in range(5):
                stream.push(FRAME)
            await asyncio.to_thread(nats_server.pause)
            try:
                stream.push(FRAME)  # handed to the client, unconfirmed while stopped
                task = asyncio.create_task(stream.end())
                await asyncio.sleep(0.1)
                assert not task.done(), "end() cannot finish while the server is stopped"
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                assert task.cancelled()
            finally:
                await asyncio.to_thread(nats_server.resume)
            assert stream.ended
            try:
                await stream.end()
                raise AssertionError("a second end() must raise")
            except ClosedError:
                pass
            again = await reopen(producer, "cancel-end", 15)
            stats = producer.stats()
            assert stats.active_streams == 1 and stats.streams_total == 2
            assert [s["stream_id"] for s in stats.streams] == ["cancel-end"]
            summary = await again.end()
            assert summary.end_delivered
            await until(lambda: "cancel-end" in ends, 5, "the first instance's end")
            assert producer.stats().active_streams == 0
        finally:
            await producer.close()
            await nc.close()


async def test_cancelled_close_still_ends_every_stream(nats_server):
    """Cancel `await producer.close()` mid-shutdown; every stream still ends."""
    async with asyncio.timeout(BOUND_S):
        nc, ends = await ends_spy(nats_server.url)
        producer = await weir.Producer.connect(nats_server.url)
        ids = [f"cancel-close-{i}" for i in range(3)]
        streams = [producer.open(i) for i in ids]
        for s in streams:
            s.push(FRAME)
        await asyncio.to_thread(nats_server.pause)
        try:
            task = asyncio.create_task(producer.close(grace_s=1.0))
            await asyncio.sleep(0.1)
            assert not task.done()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            assert producer.closed
            try:
                producer.open("cancel-close-new")
                raise AssertionError("open after close must raise")
            except ClosedError:
                pass
        finally:
            await asyncio.to_thread(nats_server.resume)
        await until(lambda: producer.stats().active_streams == 0, 10, "every stream ended")
        for s in streams:
            try:
                s.push(FRAME)
                raise AssertionError("push after close must raise")
            except ClosedError as e:
                assert e.details["end_reason"] == "shutdown"
        await until(lambda: all(i in ends for i in ids), 5, "every end at the subscriber")
        assert {ends[i] for i in ids} == {"shutdown"}
        stats = await producer.close()  # idempotent: returns the final stats
        assert stats.active_streams == 0 and stats.streams_total == 3
        await nc.close()


async def test_cancelled_next_event_loses_no_event(nats_server):
    """Cancel `next_event()` repeatedly while the stream overloads: Overloaded then
    Closed still arrive, each once."""
    async with asyncio.timeout(BOUND_S):
        producer = await weir.Producer.connect(nats_server.url)
        try:
            stream = producer.open("cancel-events")
            stream.push(FRAME)
            events: List[object] = []  # every event received, in order
            cancelled = 0
            await asyncio.to_thread(nats_server.pause)
            try:
                t0 = time.monotonic()
                # Up to 1.2 s of pushes at the cadence while the server is stopped: the
                # stream overloads (max_age 500 ms); next_event() waits of 10 ms are
                # cancelled by wait_for again and again meanwhile.
                while time.monotonic() - t0 < 1.2 and stream.status.overload is None:
                    try:
                        stream.push(FRAME)
                    except (weir.OverloadError, ClosedError):
                        pass
                    try:
                        events.append(await asyncio.wait_for(stream.next_event(), 0.01))
                    except asyncio.TimeoutError:
                        cancelled += 1
                assert stream.status.overload is not None, "the stream overloaded"
                # Cancellations right after the call, with an event ready: the Rust side
                # may complete before the cancel lands; the event must not be lost.
                for _ in range(20):
                    task = asyncio.create_task(stream.next_event())
                    await asyncio.sleep(0)
                    task.cancel()
                    try:
                        ev = await task
                        if ev is not None:
                            events.append(ev)  # taken before the cancel landed: received
                    except asyncio.CancelledError:
                        cancelled += 1
            finally:
                await asyncio.to_thread(nats_server.resume)
            async for ev in stream.events():
                events.append(ev)
            assert cancelled >= 5
            assert [type(e) for e in events] == [Overloaded, Closed], events
            over, closed = events
            assert over.reason in ("max_age", "queue_full") and over.max_age_ms == 500
            assert over.bound == over.reason and over.pending_bytes > 0
            assert closed.reason == "overload"
            assert await asyncio.wait_for(stream.next_event(), 1) is None
        finally:
            await producer.close()


async def test_dropped_stream_ends_producer_gone(nats_server):
    """A ProducerStream dropped without end(): its end says producer_gone, the id is
    free again."""
    async with asyncio.timeout(BOUND_S):
        nc, ends = await ends_spy(nats_server.url)
        producer = await weir.Producer.connect(nats_server.url)
        try:
            stream = producer.open("dropped")
            stream.push(FRAME)
            del stream
            gc.collect()
            await until(lambda: "dropped" in ends, 5, "the dropped stream's end")
            assert ends["dropped"] == "producer_gone"
            s = await reopen(producer, "dropped", 5)
            await s.end()
        finally:
            await producer.close()
            await nc.close()
