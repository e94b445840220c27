"""The Python client (`weir.llm` of the installed `weir` package) against the real
adapter binary.

Run by `cargo test -p weir-llm-adapter --test it python_client::` (in the Python of
`weir_testkit::python::weir_python()`, where scripts/build-python-wheel installed the
package), which starts a nats-server and `llm-adapter serve` with `workers = 1`,
`queue_capacity = 1` and the sim backend streaming (10 ms to the first token,
200 tokens/s), then runs:

    python client_check.py --nats nats://127.0.0.1:PORT

Checks (assert) and prints one JSON summary line the Rust test checks again:
- a streamed request that has to wait: Queued(1) -> Started -> Chunk x N -> End, the
  chunks numbered without gaps, the SSE deltas unchanged, End.chunks = N;
- a refusal while the queue is full: LlmError("queue_full") with details.limit = 1, and
  with the deployed envelope as body the error carries the response envelope;
- llm.status: queued while waiting, done after, not_found for an unknown id;
- the unary call.
"""

import argparse
import asyncio
import json

import nats

from weir import llm as weir_llm


def stream_body(tokens: int) -> bytes:
    return json.dumps({"model": "m", "stream": True, "max_tokens": tokens}).encode()


def expected_text(tokens: int) -> bytes:
    deltas = "".join(
        'data: {"choices":[{"index":0,"delta":{"content":"tok%d "}}]}\n\n' % i
        for i in range(tokens)
    )
    return (deltas + "data: [DONE]\n\n").encode()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True)
    args = ap.parse_args()
    nc = await nats.connect(args.nats)
    llm = weir_llm.LlmClient(nc)
    out = {}

    # A holds the only worker (~200 ms).
    a = llm.stream(stream_body(40), request_id="py-a", timeout_ms=10000)
    first = await a.__anext__()
    if isinstance(first, weir_llm.Queued):
        first = await a.__anext__()
    assert isinstance(first, weir_llm.Started), first

    # B has to wait behind it.
    b_events = []

    async def run_b():
        async for ev in llm.stream(stream_body(10), request_id="py-b", timeout_ms=10000):
            b_events.append(ev)

    b_task = asyncio.create_task(run_b())
    for _ in range(200):
        if b_events:
            break
        await asyncio.sleep(0.005)
    assert b_events and isinstance(b_events[0], weir_llm.Queued), b_events
    st = await llm.status("py-b")
    out["status_waiting"] = st["status"]
    out["status_position"] = st.get("position")

    # The queue (capacity 1) is full: a refusal, as LlmError with the numbers.
    try:
        await llm.request(b"{}", timeout_ms=2000)
        raise AssertionError("expected queue_full")
    except weir_llm.LlmError as e:
        out["refusal_code"] = e.code
        out["refusal_limit"] = e.details.get("limit")
        out["refusal_nats_code"] = e.nats_code
    # The same refusal of a deployed-envelope body is a response envelope.
    envelope = {
        "trace_id": "tr-1",
        "request_id": "rq-1",
        "correlation_id": "co-1",
        "session_id": "se-1",
        "ts_ms": 1700000000000,
        "data": {"stream": True},
    }
    try:
        agen = llm.stream(json.dumps(envelope).encode(), timeout_ms=2000)
        async for ev in agen:
            raise AssertionError(f"expected a refusal, got {ev}")
    except weir_llm.LlmError as e:
        out["stream_refusal_code"] = e.code
        out["envelope_ok"] = e.envelope.get("ok") if e.envelope else None
        out["envelope_trace_id"] = e.envelope.get("trace_id") if e.envelope else None

    # Drain A (reading acknowledges its chunks), then B completes.
    a_events = [first]
    async for ev in a:
        a_events.append(ev)
    assert isinstance(a_events[-1], weir_llm.End), a_events[-1]
    await asyncio.wait_for(b_task, 10)

    names = [type(ev).__name__ for ev in b_events]
    out["b_events"] = names
    assert names[0] == "Queued" and names[1] == "Started" and names[-1] == "End", names
    assert b_events[0].position == 1, b_events[0]
    chunks = [ev for ev in b_events if isinstance(ev, weir_llm.Chunk)]
    assert [c.seq for c in chunks] == list(range(1, len(chunks) + 1))
    text = b"".join(c.data for c in chunks)
    assert text == expected_text(10), text
    end = b_events[-1]
    assert end.chunks == len(chunks) and end.bytes == len(text), end
    out["b_chunks"] = len(chunks)
    out["b_ttft_ms"] = end.ttft_ms
    out["b_queue_ms"] = b_events[1].queue_ms
    out["b_text_ok"] = text == expected_text(10)

    out["status_after"] = (await llm.status("py-b"))["status"]
    out["status_unknown"] = (await llm.status("nobody"))["status"]

    # A caller's W3C trace context is sent as given (the adapter accepts it).
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    reply = await llm.request(b'{"hello":1}', timeout_ms=2000, traceparent=tp)
    assert reply.body == b'{"hello":1}', reply
    out["unary_ok"] = reply.body == b'{"hello":1}' and reply.queue_ms is not None

    await nc.close()
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
