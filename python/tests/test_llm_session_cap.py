"""`weir.llm`'s early-fail session cap against the real `llm-adapter` binary (sim backend)
and a real nats-server.

The adapter runs with `session.pending_cap = 2`, 8 workers and a simulated latency long
enough (600 ms) that requests stay in flight while a test looks. A spy connection
subscribes to the service subject (a plain subscription sees every request, beside the
adapter's queue group), so "without a round trip" is checked as "never published", and
once more with nats-server SIGSTOPped (a round trip would hang; the local refusal
returns at once).

Checked:
- `discover` mirrors the advertised cap; the (cap+1)-th concurrent request (unary or
  streamed) of one session is refused locally (`session_queue_full`, `local=True`,
  `limit`/`pending` details) and never published, while other sessions and requests
  without a session go through;
- the slot is released after completion, after `asyncio.CancelledError` (unary and a
  stream's step), after errors (the adapter's refusal, no responders, the client's
  timeout) and after an iterator left early and closed;
- off by default: `LlmClient(nc)` sends the third request, and the adapter's own
  `session_queue_full` arrives (`local=False`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Iterator, List, Optional, Tuple

import nats
import pytest
from nats.aio.client import Client as NatsClient

from weir import errors, llm
from weirtest import NatsServer, binary

CAP = 2
SIM_LATENCY_MS = 600
# Every wait in these tests is bounded by this.
WAIT_S = 10.0

CONFIG = f"""
workers = 8
[session]
pending_cap = {CAP}
ordering = false
[backend.sim]
latency_ms = {SIM_LATENCY_MS}
first_token_ms = 300
tokens_per_second = 20
"""


class Adapter:
    """`llm-adapter serve` (sim backend, CONFIG) on `nats_url`; ready after its ready line."""

    def __init__(self, nats_url: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="weir-llm-"))
        cfg = self.dir / "adapter.toml"
        cfg.write_text(CONFIG)
        self.proc = subprocess.Popen(
            [binary("llm-adapter"), "serve", "--admin", "127.0.0.1:0", "--nats-url", nats_url,
             "--config", str(cfg)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            env=dict(os.environ, RUST_LOG="error"),
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT_S)
        line = self.proc.stdout.readline() if ready else b""
        if b'"ready"' not in line:
            self.stop()
            raise RuntimeError(f"llm-adapter did not get ready: {line!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def adapter(nats_server: NatsServer) -> Iterator[Adapter]:
    a = Adapter(nats_server.url)
    yield a
    a.stop()


class Spy:
    """Counts what is published on the service subject (a plain subscription: every
    message, next to the adapter's queue group)."""

    def __init__(self) -> None:
        self.seen: List[Optional[str]] = []
        self.nc: Optional[NatsClient] = None

    async def start(self, url: str, subject: str = "llm.infer") -> "Spy":
        nc = self.nc = await nats.connect(url)

        async def on_msg(msg: Any) -> None:
            self.seen.append((msg.headers or {}).get(llm.SESSION_ID))

        await nc.subscribe(subject, cb=on_msg)
        await nc.flush()
        return self

    def count(self, session: Optional[str] = None) -> int:
        return sum(1 for s in self.seen if session is None or s == session)

    async def wait_for(self, n: int, session: Optional[str] = None,
                       detail: Callable[[], str] = lambda: "") -> None:
        """Until `n` requests (of `session`) were seen; `detail()` goes into the failure."""
        deadline = time.monotonic() + WAIT_S
        while self.count(session) < n:
            assert time.monotonic() < deadline, (
                f"spy saw {self.count(session)} < {n} ({session}): {self.seen} {detail()}")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


@contextlib.asynccontextmanager
async def connected(server: NatsServer) -> AsyncIterator[Tuple[NatsClient, Spy]]:
    nc = await nats.connect(server.url)
    spy = await Spy().start(server.url)
    try:
        yield nc, spy
    finally:
        await spy.close()
        await nc.close()


async def settle(nc: NatsClient) -> None:
    """Lets anything published reach the spy: flush, then a short grace."""
    await nc.flush()
    await asyncio.sleep(0.1)


def stream_body(tokens: int) -> bytes:
    return json.dumps({"model": "m", "stream": True, "max_tokens": tokens}).encode()


async def drain(agen: AsyncGenerator[llm.Event, None]) -> List[llm.Event]:
    return [ev async for ev in agen]


async def goes_out(client: llm.LlmClient, spy: Spy, session: str, body: bytes) -> llm.Reply:
    """A request of `session` after its local slots were released: it is published
    (never refused locally) and answered. The adapter may still count requests this
    client gave up on (it is the authority and finishes them): its own
    `session_queue_full` (`local=False`) is retried until they are done, bounded."""
    deadline = time.monotonic() + WAIT_S
    while True:
        before = spy.count(session)
        try:
            return await client.request(body, session_id=session, timeout_ms=5000)
        except llm.LlmError as e:
            assert not e.local and e.code == "session_queue_full", e
            await spy.wait_for(before + 1, session)
            assert time.monotonic() < deadline, "the adapter kept refusing"
            await asyncio.sleep(0.1)


async def test_discover_mirrors_the_cap_and_refuses_the_next_request_locally(
    nats_server: NatsServer, adapter: Adapter
) -> None:
    async with connected(nats_server) as (nc, spy):
        client = await llm.LlmClient.discover(nc)
        assert client.session_cap == CAP
        assert client.subject == "llm.infer" and client.status_subject == "llm.status"

        held = [asyncio.create_task(client.request(b"held-%d" % i, session_id="s1", timeout_ms=5000))
                for i in range(CAP)]
        await spy.wait_for(CAP, "s1")
        assert client.pending("s1") == CAP

        # The (cap+1)-th: refused locally, never published.
        with pytest.raises(llm.LlmError) as refused:
            await client.request(b"over", session_id="s1", timeout_ms=5000)
        e = refused.value
        assert isinstance(e, errors.WeirError)
        assert (e.code, e.local, e.details["limit"], e.details["pending"]) == (
            "session_queue_full", True, CAP, CAP)
        assert e.envelope is None and e.nats_code is None
        # A stream of the full session: refused at its first step, also unsent.
        with pytest.raises(llm.LlmError) as refused_stream:
            await drain(client.stream(stream_body(3), session_id="s1", timeout_ms=5000))
        assert (refused_stream.value.code, refused_stream.value.local) == ("session_queue_full", True)
        await settle(nc)
        assert spy.count("s1") == CAP, spy.seen
        assert client.pending("s1") == CAP

        # No round trip: with nats-server stopped, the refusal still returns at once.
        nats_server.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(llm.LlmError) as paused:
                await asyncio.wait_for(
                    client.request(b"over", session_id="s1", timeout_ms=5000), 1.0)
            refusal_ms = (time.monotonic() - t0) * 1000
        finally:
            nats_server.resume()
        assert paused.value.local and paused.value.code == "session_queue_full"
        assert refusal_ms < 100, refusal_ms

        # Other sessions and session-less requests are unaffected.
        other = await client.request(b"other", session_id="s2", timeout_ms=5000)
        assert other.body == b"other"
        none = await client.request(b"none", timeout_ms=5000)
        assert none.body == b"none"
        assert client.pending("s2") == 0

        # Completion releases both slots; the session takes requests again.
        replies = await asyncio.wait_for(asyncio.gather(*held), WAIT_S)
        assert sorted(r.body for r in replies) == [b"held-0", b"held-1"]
        assert client.pending("s1") == 0
        again = await client.request(b"again", session_id="s1", timeout_ms=5000)
        assert again.body == b"again"
        await settle(nc)
        assert spy.count("s1") == CAP + 1, spy.seen


async def test_streams_hold_a_slot_until_end_and_release_it_when_closed_early(
    nats_server: NatsServer, adapter: Adapter
) -> None:
    async with connected(nats_server) as (nc, spy):
        client = llm.LlmClient(nc, session_cap=1)
        events = await asyncio.wait_for(
            drain(client.stream(stream_body(3), session_id="s", timeout_ms=5000)), WAIT_S)
        chunks = [ev for ev in events if isinstance(ev, llm.Chunk)]
        assert isinstance(events[-1], llm.End) and events[-1].chunks == len(chunks) >= 1
        assert client.pending("s") == 0

        # Left early (after `Started`) and closed: the slot is free at once.
        async with contextlib.aclosing(
            client.stream(stream_body(20), session_id="s", timeout_ms=5000)
        ) as agen:
            async for ev in agen:
                assert client.pending("s") == 1
                if isinstance(ev, llm.Started):
                    break
        assert client.pending("s") == 0
        assert (await goes_out(client, spy, "s", b"next")).body == b"next"


async def test_cancellation_releases_the_slot(nats_server: NatsServer, adapter: Adapter) -> None:
    async with connected(nats_server) as (nc, spy):
        client = llm.LlmClient(nc, session_cap=1)

        # A unary call cancelled while it waits for its reply.
        task = asyncio.create_task(client.request(b"slow", session_id="s", timeout_ms=5000))

        def state() -> str:
            exc = task.exception() if task.done() and not task.cancelled() else None
            return (f"task done={task.done()} exception={exc!r} pending={client.pending('s')} "
                    f"connected={nc.is_connected}")

        await spy.wait_for(1, "s", state)
        assert client.pending("s") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert client.pending("s") == 0

        # A stream cancelled inside a step (waiting for its first event).
        async def consume() -> None:
            async for _ in client.stream(stream_body(20), session_id="s", timeout_ms=5000):
                pass

        stream_task = asyncio.create_task(consume())
        await spy.wait_for(2, "s")
        assert client.pending("s") == 1
        stream_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stream_task
        assert client.pending("s") == 0

        # A wait_for that gives up on the call (another session: the adapter still
        # counts the two requests of "s" given up above until they finish).
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.request(b"slow", session_id="t", timeout_ms=5000), 0.1)
        assert client.pending("t") == 0

        # The session takes a request again.
        assert (await goes_out(client, spy, "s", b"after")).body == b"after"


async def test_errors_release_the_slot(nats_server: NatsServer, adapter: Adapter) -> None:
    async with connected(nats_server) as (nc, spy):
        client = llm.LlmClient(nc, session_cap=1)

        # The adapter's refusal (an invalid request id).
        with pytest.raises(llm.LlmError) as bad:
            await client.request(b"x", request_id="bad id", session_id="s", timeout_ms=5000)
        assert bad.value.code == "invalid_request" and not bad.value.local
        assert client.pending("s") == 0

        # The client's own timeout (the budget plus the margin, shorter than the sim).
        short = llm.LlmClient(nc, session_cap=1, margin=0.0)
        with pytest.raises(llm.LlmError) as late:
            await short.request(b"x", session_id="s", timeout_ms=100)
        assert late.value.code in ("timed_out", "deadline_exceeded"), late.value
        assert short.pending("s") == 0

        # Nobody listens: no responders, unary and streamed.
        nobody = llm.LlmClient(nc, subject="llm.nobody", session_cap=1)
        with pytest.raises(llm.LlmError) as gone:
            await nobody.request(b"x", session_id="s", timeout_ms=1000)
        assert gone.value.code == "no_responders"
        assert nobody.pending("s") == 0
        with pytest.raises(llm.LlmError) as gone_stream:
            await drain(nobody.stream(stream_body(3), session_id="s", timeout_ms=500))
        assert gone_stream.value.code in ("no_responders", "timed_out")
        assert nobody.pending("s") == 0

        assert (await goes_out(client, spy, "s", b"fine")).body == b"fine"


async def test_off_by_default_the_adapter_refuses(nats_server: NatsServer, adapter: Adapter) -> None:
    async with connected(nats_server) as (nc, spy):
        client = llm.LlmClient(nc)
        assert client.session_cap is None
        assert (await llm.LlmClient.discover(nc, local_session_cap=False)).session_cap is None

        held = [asyncio.create_task(client.request(b"held", session_id="s", timeout_ms=5000))
                for _ in range(CAP)]
        await spy.wait_for(CAP, "s")
        with pytest.raises(llm.LlmError) as refused:
            await client.request(b"over", session_id="s", timeout_ms=5000)
        assert refused.value.code == "session_queue_full"
        assert refused.value.local is False and refused.value.nats_code is not None
        assert refused.value.details.get("limit") == CAP
        await settle(nc)
        assert spy.count("s") == CAP + 1, "the third request was sent (a round trip)"
        assert client.pending("s") == 0
        await asyncio.wait_for(asyncio.gather(*held), WAIT_S)


def test_invalid_cap_is_a_config_error() -> None:
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(errors.ConfigError):
            llm.LlmClient(NatsClient(), session_cap=bad)  # type: ignore[arg-type]
    assert llm.LlmClient(NatsClient(), session_cap=0).session_cap is None


def test_llm_error_is_a_weir_error_with_its_attributes() -> None:
    e = llm.LlmError("queue_full", "queue full", {"limit": 1, "retry_after_ms": 40}, 503,
                     {"ok": False}, local=False)
    assert isinstance(e, errors.WeirError) and not isinstance(e, errors.ConfigError)
    assert (e.code, e.message, e.details, e.nats_code, e.envelope, e.local, e.retry_after_ms) == (
        "queue_full", "queue full", {"limit": 1, "retry_after_ms": 40}, 503, {"ok": False}, False, 40)
    assert str(e) == "queue_full: queue full"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is llm.LlmError
    assert (back.code, back.details, back.nats_code, back.envelope, back.local) == (
        e.code, e.details, e.nats_code, e.envelope, e.local)
