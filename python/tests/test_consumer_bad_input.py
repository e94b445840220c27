"""Bad input to `weir.Consumer` (issue 29, "Bad input"): wrong types, unknown or invalid
options, invalid ids, a closed consumer, iterating after close and a cancelled connect
raise typed `weir.errors` exceptions (or leave nothing behind), never a panic.

Each case is bounded (connects to a real nats-server; every wait has a timeout).
"""

from __future__ import annotations

import asyncio
import json
import struct
import urllib.request

import nats as nats_py
import pytest

import weir
import weir.errors
from weir.errors import ClosedError, ConfigError, ConnectError, RefusedError
from weirtest import NatsServer

SUBJECT = "bad.{partition}.{stream}"


def packet(kind: str, seq: int, pcm: bytes = b"") -> bytes:
    """The deployed packet format (docs/protocol.md §1), as a test producer."""
    meta = json.dumps({"type": kind, "seq": seq, "sample_rate": 16000, "sample_width": 2,
                       "channels": 1}).encode()
    return struct.pack(">I", len(meta)) + meta + pcm


@pytest.mark.parametrize("config, key", [
    ({"bogus_key": 1}, "bogus_key"),
    ({"partitions": "eight"}, "partitions"),
    ({"max_streams": 0}, "max_streams"),
    ({"max_streams": -3}, "max_streams"),
    ({"partitions": 2, "owned": [5]}, "owned"),
    ({"subject": "audio.*.{stream}"}, "subject"),
    ({"max_frame_age_ms": 10}, "max_frame_age_ms"),
    ({"policy": "drop_everything"}, "policy"),
    ({"ownership": {"lease": {"worker_id": "not a valid id!"}}, "subject": SUBJECT,
      "partitions": 2}, "ownership.lease.worker_id"),
    ({"ownership": {"lease": {"ttl_ms": 5}}, "subject": SUBJECT, "partitions": 2},
     "ownership.lease.ttl_ms"),
    ({"capacity": {"worker_id": "a.b"}}, "capacity.worker_id"),
])
async def test_invalid_options_name_the_key(nats_server, config, key):
    with pytest.raises(ConfigError) as e:
        await asyncio.wait_for(weir.Consumer.connect(nats_server.url, **config), 10)
    assert e.value.code == "invalid_config"
    assert key in str(e.value) or e.value.details.get("key") == key, e.value
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("servers, nats", [
    (123, None),
    ([1, 2], None),
    ("nats://127.0.0.1:1", {"bogus": True}),
    ("nats://127.0.0.1:1", "user=me"),
    ("nats://127.0.0.1:1", {"servers": ["x"]}),
    ("nats://127.0.0.1:1", {"connection_timeout_ms": "soon"}),
])
async def test_invalid_nats_options(servers, nats):
    with pytest.raises(ConfigError):
        await asyncio.wait_for(weir.Consumer.connect(servers, nats=nats), 10)


async def test_options_must_be_json_values(nats_server):
    with pytest.raises(ConfigError):
        await weir.Consumer.connect(nats_server.url, owned={0})


async def test_unreachable_nats_is_a_connect_error():
    # Port 1 on loopback: privileged and unused, so nothing can race to bind it.
    with pytest.raises(ConnectError) as e:
        await asyncio.wait_for(weir.Consumer.connect("nats://127.0.0.1:1"), 15)
    assert e.value.code == "connect_failed"
    assert isinstance(e.value, ConnectionError)


async def test_direct_construction_and_wrong_argument_types(nats_server):
    with pytest.raises(ConfigError):
        weir.Consumer("not a core")
    consumer = await weir.Consumer.connect(nats_server.url)
    try:
        for bad in ("soon", -1, float("nan"), 10_000, True):
            with pytest.raises(ConfigError):
                await consumer.close(grace_s=bad)
        with pytest.raises(ConfigError):
            consumer._core.ack_many([1, "x"])
        with pytest.raises(TypeError):
            weir.Frame("not bytes", 1, 1)
        with pytest.raises(TypeError):
            weir.Gap(1, "two", 2, None, "lost")
    finally:
        await consumer.close()


async def test_a_closed_consumer(nats_server):
    consumer = await weir.Consumer.connect(nats_server.url)
    final = await consumer.close()
    assert consumer.closed
    assert await consumer.close() == final  # idempotent
    assert consumer.stats() == final
    with pytest.raises(ClosedError):
        consumer.capacity()
    with pytest.raises(ClosedError):
        consumer.owned()
    with pytest.raises(ClosedError):
        consumer.leases()
    with pytest.raises(ClosedError):
        async for _ in consumer:
            pass
    consumer.abort()  # no-op once closed


async def test_iterating_after_close_and_after_abort(nats_server):
    nc = await nats_py.connect(nats_server.url)
    try:
        for ending in ("close", "abort"):
            consumer = await weir.Consumer.connect(nats_server.url, subject="bad.x.{stream}")
            await nc.publish("bad.x.s1", packet("frame", 1, bytes(640)))
            await nc.publish("bad.x.s1", packet("frame", 2, bytes(640)))
            await nc.flush()
            stream = await asyncio.wait_for(anext(aiter(consumer)), 5)
            first = await asyncio.wait_for(anext(stream), 5)
            assert first.seq == 1
            if ending == "close":
                # Graceful: the queued frame, then End(shutdown), then the loop ends.
                closing = asyncio.create_task(consumer.close(grace_s=2))
                rest = [e async for e in stream]
                await asyncio.wait_for(closing, 10)
                assert [type(e) for e in rest] == [weir.Frame, weir.End]
                assert rest[-1].cause == "shutdown"
                with pytest.raises(StopAsyncIteration):
                    await anext(stream)
            else:
                consumer.abort()
                # What was handed over may still come; then ClosedError, never a hang.
                with pytest.raises(ClosedError):
                    async with asyncio.timeout(5):
                        async for _ in stream:
                            pass
                with pytest.raises(ClosedError):
                    async for _ in consumer:
                        pass
    finally:
        await nc.close()


async def test_a_cancelled_await_loses_nothing(nats_server):
    nc = await nats_py.connect(nats_server.url)
    consumer = await weir.Consumer.connect(nats_server.url, subject="bad.x.{stream}")
    try:
        # Cancel a wait for a new stream and a wait for an event: both come later.
        waiting = asyncio.create_task(anext(aiter(consumer)))
        await asyncio.sleep(0.1)
        waiting.cancel()
        await nc.publish("bad.x.s2", packet("frame", 1, bytes(640)))
        await nc.flush()
        await asyncio.sleep(0.2)
        stream = await asyncio.wait_for(anext(aiter(consumer)), 5)
        assert (await asyncio.wait_for(anext(stream), 5)).seq == 1
        waiting = asyncio.create_task(anext(stream))
        await asyncio.sleep(0.1)
        with pytest.raises(RefusedError) as refused:  # one reader per stream
            await anext(stream)
        assert refused.value.code == "concurrent_reader"
        assert isinstance(refused.value, weir.errors.WeirError)
        waiting.cancel()
        for seq in (2, 3):
            await nc.publish("bad.x.s2", packet("frame", seq, bytes(640)))
        await nc.publish("bad.x.s2", packet("end", 4))
        await nc.flush()
        rest = []
        async with asyncio.timeout(5):
            async for e in stream:
                rest.append(e)
        assert [getattr(e, "seq", None) for e in rest] == [2, 3, 4]
        assert rest[-1] == weir.End("producer", None, 4, 4)
    finally:
        await consumer.close()
        await nc.close()


async def test_a_cancelled_connect_leaves_no_subscription():
    server = NatsServer(extra_args=["-m", "-1"])
    try:
        monitoring = server.ports["monitoring"][0].rstrip("/")

        subscriptions = server.client_subscriptions
        live = await weir.Consumer.connect(server.url, subject=SUBJECT, partitions=4,
                                           owned=[0, 1, 2, 3], capacity={"announce": False})
        # What a consumer that is up holds: its four partitions.
        assert await server.settled_subscriptions(4) == 4
        await live.close()
        cancelled = 0
        for delay in (0, 0, 0.001, 0.003):
            task = asyncio.create_task(weir.Consumer.connect(
                server.url, subject=SUBJECT, partitions=4, owned=[0, 1, 2, 3]))
            await asyncio.sleep(delay)
            task.cancel()
            try:
                won = await task  # the connect finished before the cancel: close it
                await won.close()
            except asyncio.CancelledError:
                cancelled += 1
        assert cancelled >= 2

        def connections() -> int:
            with urllib.request.urlopen(f"{monitoring}/connz", timeout=1) as r:
                return json.loads(r.read())["num_connections"]

        # The cancelled connects finish on the core (a loopback connect takes
        # milliseconds), then shut themselves down: no subscription, no connection.
        await asyncio.sleep(1.0)
        async with asyncio.timeout(10):
            while subscriptions() != 0 or connections() != 0:
                await asyncio.sleep(0.05)
    finally:
        server.stop()
