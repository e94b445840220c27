"""Bad input to `weir.Producer` raises typed `weir.errors` exceptions with stable codes,
never a panic, a crash or a publish: wrong types, wrong frame sizes, invalid and
injection stream ids, pushes after ``end``, a double ``end``, a closed producer,
unknown or invalid config keys.

Each test runs against a fresh real nats-server and is bounded by ``asyncio.timeout``.
A plain nats-py subscriber on ``>`` checks that nothing reached a subject outside the
frame template (no injection through an id).
"""

from __future__ import annotations

import asyncio
from typing import List

import nats
import pytest

import weir
from weir.errors import ClosedError, ConfigError, ConnectError, OverloadError, RefusedError

FRAME = bytes(640)
BOUND_S = 30


async def spy(url: str):
    """A nats-py connection recording every subject published on the server."""
    nc = await asyncio.wait_for(nats.connect(url, connect_timeout=2), 5)
    subjects: List[str] = []

    async def on_msg(msg) -> None:
        subjects.append(msg.subject)

    await nc.subscribe(">", cb=on_msg)
    await asyncio.wait_for(nc.flush(), 5)
    return nc, subjects


def frame_subjects(subjects: List[str]) -> List[str]:
    """The subjects that are not the producer's own confirmation markers (inboxes)."""
    return [s for s in subjects if not s.startswith("_INBOX.")]


@pytest.mark.parametrize(
    "config, key",
    [
        ({"max_bytez": 1}, "max_bytez"),
        ({"max_age_ms": "500"}, "max_age_ms"),
        ({"max_age_ms": 5}, "max_age_ms"),
        ({"max_age_ms": 1.5}, "max_age_ms"),
        ({"max_bytes": -1}, "max_bytes"),
        ({"max_bytes": 100}, "max_bytes"),
        ({"policy": "drop"}, "policy"),
        ({"policy": "gap"}, "policy"),
        ({"max_rate": 0.5}, "max_rate"),
        ({"subject": "audio.*.{stream}"}, "subject"),
        ({"subject": "audio.{partition}.{stream}"}, "partitions"),
        ({"max_frame_bytes": 641}, "max_frame_bytes"),
        ({"delivery": "maybe"}, "delivery"),
        ({"max_streams": 0}, "max_streams"),
        ({"confirm_interval_ms": 1000}, "confirm_interval_ms"),
    ],
)
async def test_config_errors_name_the_key_before_connecting(config, key):
    """Unknown keys, wrong types and out-of-range values: ConfigError(invalid_config)
    with details["key"], raised before any connection (the URL is unreachable)."""
    async with asyncio.timeout(BOUND_S):
        with pytest.raises(ConfigError) as info:
            await weir.Producer.connect("nats://127.0.0.1:1", **config)
        assert info.value.code == "invalid_config"
        assert info.value.details.get("key") == key, info.value
        assert isinstance(info.value, ValueError)


async def test_nats_and_argument_errors():
    """Bad NATS keys, servers and non-JSON values are ConfigError; an unreachable server
    without retry is ConnectError."""
    async with asyncio.timeout(BOUND_S):
        for kwargs in (
            {"servers": 123},
            {"servers": "nats://127.0.0.1:1", "nats": {"bogus": 1}},
            {"servers": "nats://127.0.0.1:1", "nats": {"servers": ["x"]}},
            {"servers": "nats://127.0.0.1:1", "nats": {"connection_timeout_ms": "x"}},
            {"servers": "nats://127.0.0.1:1", "max_age_ms": object()},
            {"servers": "nats://127.0.0.1:1", "max_rate": float("nan")},
            {"servers": ["nats://127.0.0.1:1", 5]},
            # Empty means no server named, not the default one.
            {"servers": []},
            {"servers": ""},
            {"servers": ["nats://127.0.0.1:1", " "]},
        ):
            with pytest.raises(ConfigError):
                await weir.Producer.connect(**kwargs)
        with pytest.raises(ConnectError) as info:
            await weir.Producer.connect(
                "nats://127.0.0.1:1",
                nats={"retry_initial_connect": False, "connection_timeout_ms": 200},
            )
        assert info.value.code == "connect_failed"


INVALID_IDS = ["a.b", "*", ">", "a.>", "audio.*", "", " ", "a b", "x\n", "tab\t", "$SYS",
               "é", "x" * 129, "a/b", "a\x00b"]


async def test_invalid_and_injection_ids_are_refused(nats_server):
    """Ids that would change the subject's shape (or are not str) raise
    ConfigError(invalid_stream_id); invalid session ids ConfigError(invalid_session_id);
    nothing is published outside the template."""
    async with asyncio.timeout(BOUND_S):
        nc, subjects = await spy(nats_server.url)
        producer = await weir.Producer.connect(nats_server.url)
        try:
            for bad in INVALID_IDS + [123, None, b"abc", ["a"]]:
                with pytest.raises(ConfigError) as info:
                    producer.open(bad)  # type: ignore[arg-type]
                assert info.value.code == "invalid_stream_id", (bad, info.value)
            for bad_session in ["line\nbreak", "x" * 300, 5, b"s"]:
                with pytest.raises(ConfigError) as info:
                    producer.open("ok-1", session_id=bad_session)  # type: ignore[arg-type]
                assert info.value.code == "invalid_session_id", (bad_session, info.value)
            stream = producer.open("ok-1", session_id="tenant:call@1")
            assert stream.push(FRAME) == 1
            await stream.end()
            await asyncio.wait_for(nc.flush(), 5)
            await asyncio.sleep(0.2)
            assert frame_subjects(subjects) == ["inference.whisper.stream.ok-1"] * 2, subjects
            assert producer.stats().active_streams == 0
        finally:
            await producer.close()
            await nc.close()


async def test_open_refusals(nats_server):
    """A second open of an active id: RefusedError(already_active); over max_streams:
    RefusedError(max_streams) with the limit."""
    async with asyncio.timeout(BOUND_S):
        producer = await weir.Producer.connect(nats_server.url, max_streams=2)
        try:
            a = producer.open("a")
            with pytest.raises(RefusedError) as info:
                producer.open("a")
            assert info.value.code == "already_active"
            b = producer.open("b")
            with pytest.raises(RefusedError) as info:
                producer.open("c")
            assert info.value.code == "max_streams" and info.value.details["limit"] == 2
            await a.end()
            await b.end()
            producer.open("c")  # room again once the ends are out
        finally:
            await producer.close()


async def test_bad_frames_and_types(nats_server):
    """Frames of the wrong type or size: ConfigError(invalid_frame), no seq taken, the
    stream goes on; bytearray and memoryview are accepted."""
    async with asyncio.timeout(BOUND_S):
        producer = await weir.Producer.connect(nats_server.url)
        try:
            stream = producer.open("frames-1")
            for bad in ["text", 640, None, 1.5, [0] * 640, {"pcm": b""}, object()]:
                with pytest.raises(ConfigError) as info:
                    stream.push(bad)  # type: ignore[arg-type]
                assert info.value.code == "invalid_frame", bad
            for bad_len in (0, 3, 639, 3202, 32002):
                with pytest.raises(ConfigError) as info:
                    stream.push(bytes(bad_len))
                assert info.value.code == "invalid_frame"
                assert info.value.details["len"] == bad_len
            with pytest.raises(ConfigError) as info:
                stream.push(bytes(3202))
            assert info.value.details["max_frame_bytes"] == 3200
            # Invalid frames take no seq: the first good frame is 1.
            assert stream.push(FRAME) == 1
            assert stream.push(bytearray(640)) == 2
            assert stream.push(memoryview(bytes(1280))) == 3
            assert stream.push(bytes(2)) == 4
            summary = await stream.end()
            assert summary.frames_published == 4
            # The six wrong-size frames reached the core and are counted (refused,
            # reason invalid); the wrong types never became frames.
            assert summary.frames_dropped == {"invalid": 6}
        finally:
            await producer.close()


async def test_push_after_end_double_end_and_closed_producer(nats_server):
    """push after end and a second end: ClosedError. After close: open and push raise
    ClosedError, end returns the `shutdown` summary, close again is fine."""
    async with asyncio.timeout(BOUND_S):
        producer = await weir.Producer.connect(nats_server.url)
        stream = producer.open("end-1")
        stream.push(FRAME)
        await stream.end()
        assert stream.ended
        with pytest.raises(ClosedError):
            stream.push(FRAME)
        with pytest.raises(ClosedError):
            await stream.end()

        other = producer.open("end-2")
        other.push(FRAME)
        stats = await producer.close()
        assert stats.closed and stats.active_streams == 0
        assert producer.closed
        with pytest.raises(ClosedError):
            producer.open("end-3")
        with pytest.raises(ClosedError) as info:
            other.push(FRAME)
        assert info.value.details["end_reason"] == "shutdown"
        summary = await other.end()
        assert summary.end_reason == "shutdown" and summary.end_delivered
        assert summary.frames_published == 1
        again = await producer.close()
        assert again.closed
        with pytest.raises(ConfigError):
            await producer.close(grace_s=-1)
        with pytest.raises(ConfigError):
            await producer.close(grace_s="soon")  # type: ignore[arg-type]
        for grace in (True, float("nan"), float("inf"), 10**400):
            with pytest.raises(ConfigError):
                await producer.close(grace_s=grace)
        # OverloadError and friends stay WeirErrors.
        assert issubclass(OverloadError, weir.WeirError)
