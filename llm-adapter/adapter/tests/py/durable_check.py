"""The Python client's durable mode (`weir.llm` of the installed `weir` package) against
the adapter binary on the durable intake: a unary request through the stream, a retry
with the same id (the first answer, not a second run), a request without an id, a
refusal as `LlmError`. Prints one JSON summary."""

import argparse
import asyncio
import json

import nats

from weir import llm as weir_llm


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True)
    args = ap.parse_args()
    nc = await nats.connect(args.nats)
    llm = weir_llm.LlmClient(nc, intake_subject="llm.intake")
    out = {}
    r = await llm.request(b"hello", request_id="py-1", session_id="s", timeout_ms=3000)
    out["first"] = r.body.decode()
    r = await llm.request(b"hello", request_id="py-1", session_id="s", timeout_ms=3000)
    out["retry"] = r.body.decode()
    r = await llm.request(b"no id", timeout_ms=3000)
    out["no_id"] = r.body.decode()
    try:
        await llm.request(b"x", request_id="bad id", timeout_ms=3000)
        out["refusal"] = None
    except weir_llm.LlmError as e:
        out["refusal"] = e.code
    await nc.close()
    print(json.dumps(out))


asyncio.run(main())
