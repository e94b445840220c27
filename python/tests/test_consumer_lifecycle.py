"""`weir.Consumer`'s lifecycle (issue 29 review): a consumer collected without `close()`
is shut down; `close()` is one shutdown shared by every call (concurrent, retried after
a cancelled or timed-out await, after `abort()`); `grace_s` is validated before
anything closes; several tasks waiting for new streams lose none; options the consumer
cannot honour are refused.

Each case runs against a real nats-server; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import gc
import json
import struct
import urllib.request
import weakref

import nats as nats_py
import pytest

import weir
from weir.errors import ConfigError
from weirtest import NatsServer

SUBJECT = "life.{partition}.{stream}"


def packet(kind: str, seq: int, pcm: bytes = b"") -> bytes:
    """The deployed packet format (docs/protocol.md §1), as a test producer."""
    meta = json.dumps({"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2,
                       "channels": 1}).encode()
    return struct.pack(">I", len(meta)) + meta + pcm


def monitor(server: NatsServer, path: str, key: str) -> int:
    base = server.ports["monitoring"][0].rstrip("/")
    with urllib.request.urlopen(f"{base}/{path}", timeout=1) as r:
        return json.loads(r.read())[key]


async def test_a_dropped_consumer_is_shut_down():
    """Review finding 2: the pump must not keep a forgotten consumer alive."""
    server = NatsServer(extra_args=["-m", "-1"])
    try:
        consumer = await weir.Consumer.connect(server.url, subject=SUBJECT, partitions=4,
                                               owned=[0, 1, 2, 3], capacity={"announce": False})
        assert await server.settled_subscriptions(4) == 4
        assert monitor(server, "connz", "num_connections") == 1
        ref = weakref.ref(consumer)
        pump = consumer._pump_task
        del consumer
        gc.collect()
        assert ref() is None, "the consumer is still referenced (by its pump?)"
        async with asyncio.timeout(5):
            while (server.client_subscriptions() != 0
                   or monitor(server, "connz", "num_connections") != 0):
                await asyncio.sleep(0.05)
            await pump  # and the pump ended with it
    finally:
        server.stop()


async def test_a_dropped_lease_consumer_releases_its_leases(nats_js):
    nc = await nats_py.connect(nats_js.url)
    try:
        lease = {"bucket": "droplease", "worker_id": "w1", "ttl_ms": 30000}
        consumer = await weir.Consumer.connect(nats_js.url, subject=SUBJECT, partitions=2,
                                               ownership={"lease": lease},
                                               capacity={"announce": False})
        async with asyncio.timeout(10):
            while sorted(consumer.owned()) != [0, 1]:
                await asyncio.sleep(0.05)
        kv = await nc.jetstream().key_value("droplease")
        assert len(await kv.keys()) == 2
        del consumer
        gc.collect()

        async def held() -> int:
            try:
                keys = await kv.keys()
            except Exception:  # nats-py: no keys left
                return 0
            n = 0
            for k in keys:
                try:
                    e = await kv.get(k)
                    n += e.value is not None and e.operation is None
                except Exception:  # deleted
                    pass
            return n

        # Released long before the 30 s TTL.
        async with asyncio.timeout(5):
            while await held():
                await asyncio.sleep(0.05)
    finally:
        await nc.close()


async def test_invalid_grace_leaves_the_consumer_working(nats_server):
    nc = await nats_py.connect(nats_server.url)
    consumer = await weir.Consumer.connect(nats_server.url, subject="life.x.{stream}")
    try:
        for bad in (-1, 10**400, float("nan"), float("inf"), True, 3601, "2"):
            with pytest.raises(ConfigError) as e:
                await consumer.close(grace_s=bad)
            assert e.value.code == "invalid_config", bad
            assert e.value.details.get("key") == "grace_s"
        assert not consumer.closed
        await nc.publish("life.x.s1", packet("frame", 1, bytes(640)))
        await nc.flush()
        stream = await asyncio.wait_for(anext(aiter(consumer)), 5)
        assert (await asyncio.wait_for(anext(stream), 5)).seq == 1
    finally:
        await consumer.close()
        await nc.close()


async def test_concurrent_and_retried_close_share_one_shutdown(nats_server):
    nc = await nats_py.connect(nats_server.url)
    consumer = await weir.Consumer.connect(nats_server.url, subject="life.x.{stream}")
    try:
        # A stream handed over and never read: the shutdown waits its whole grace.
        await nc.publish("life.x.s1", packet("frame", 1, bytes(640)))
        await nc.publish("life.x.s1", packet("frame", 2, bytes(640)))
        await nc.flush()
        stream = await asyncio.wait_for(anext(aiter(consumer)), 5)
        assert (await asyncio.wait_for(anext(stream), 5)).seq == 1
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.close(grace_s=1.5), 0.2)
        assert consumer.closed
        during = consumer.stats()  # while the shutdown runs: no error
        assert during.totals.streams_started == 1
        first, second = await asyncio.wait_for(
            asyncio.gather(consumer.close(), consumer.close(grace_s=0)), 10)
        assert first == second
        assert first.totals.streams_started == 1
        assert await consumer.close() == first
        assert consumer.stats() == first
    finally:
        await consumer.close()
        await nc.close()


async def test_close_after_abort_is_a_no_op(nats_server):
    consumer = await weir.Consumer.connect(nats_server.url)
    async with consumer:
        consumer.abort()
        snapshot = consumer.stats()  # the abort's snapshot
    assert await consumer.close() == snapshot
    assert await consumer.close(grace_s=0) == snapshot
    with pytest.raises(ConfigError):
        await consumer.close(grace_s=-1)  # still validated


async def test_a_cancelled_waiter_passes_its_stream_on(nats_server):
    """Review finding 4: several tasks iterating one consumer; the first waiter is
    cancelled in the same tick a stream opens: the stream goes to the second."""

    class Link:  # what the pump hands `open` (an `_StreamLink`'s identity)
        instance = 10**6
        stream = "fake"
        partition = 0
        subject = "x"
        session_id = None

    consumer = await weir.Consumer.connect(nats_server.url, capacity={"announce": False})
    try:
        a = asyncio.create_task(anext(consumer))
        b = asyncio.create_task(anext(consumer))
        await asyncio.sleep(0.05)
        a.cancel()
        consumer._d.open(Link())  # as the pump does when a batch lands in that tick
        got = await asyncio.wait_for(b, 5)
        assert got.id == "fake"
        assert a.cancelled()
        consumer._d.states.pop(Link.instance, None)
        # And a cancelled waiter that had been woken passes the stream on too.
        a = asyncio.create_task(anext(consumer))
        b = asyncio.create_task(anext(consumer))
        await asyncio.sleep(0.05)
        consumer._d.open(Link())  # wakes a
        a.cancel()  # before a runs
        got = await asyncio.wait_for(b, 5)
        assert got.id == "fake" and a.cancelled()
        consumer._d.states.pop(Link.instance, None)
    finally:
        await consumer.close()


async def test_retry_initial_connect_is_refused(nats_server):
    """Review finding 6: refused, never silently ignored."""
    with pytest.raises(ConfigError) as e:
        await weir.Consumer.connect(nats_server.url, nats={"retry_initial_connect": True})
    assert e.value.details.get("key") == "nats.retry_initial_connect"
    # Also at the Rust boundary (a caller that skips the Python checks).
    with pytest.raises(ConfigError):
        await weir._weir._Consumer.connect(
            json.dumps({"servers": nats_server.url, "retry_initial_connect": True}), "{}")
    consumer = await weir.Consumer.connect(nats_server.url,
                                           nats={"retry_initial_connect": False})
    await consumer.close()


async def test_the_pump_does_not_swallow_base_exceptions(nats_server, monkeypatch):
    """Review finding 8: the pump surfaces an `Exception` to the iterators (a bug),
    but a `BaseException` that is not one (KeyboardInterrupt, SystemExit, ...) is not
    swallowed: it ends the pump task with it."""
    import weir.consumer as wc

    class Interrupt(BaseException):  # stands in for KeyboardInterrupt/SystemExit
        pass

    def explode(self, link):
        raise Interrupt()

    nc = await nats_py.connect(nats_server.url)
    consumer = await weir.Consumer.connect(nats_server.url, subject="life.x.{stream}")
    try:
        monkeypatch.setattr(wc._Dispatch, "open", explode)
        await nc.publish("life.x.s1", packet("frame", 1, bytes(640)))
        await nc.flush()
        with pytest.raises(Interrupt):
            await asyncio.wait_for(asyncio.shield(consumer._pump_task), 5)
        assert consumer._d.pump_error is None
        monkeypatch.undo()
    finally:
        consumer.abort()
        await nc.close()
