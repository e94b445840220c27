"""The Python client (`weir.llm` of the installed `weir` package) as the example deploy
kit's `caller` user.

Run by `cargo test -p weir-llm-adapter --test it deploy_kit::` against a nats-server
loading deploy/nats-server.conf and `llm-adapter serve` as `llm-adapter`:

    python deploy_kit_caller.py --nats nats://127.0.0.1:PORT [--inbox-prefix P]

Connects as `caller` with the given nats-py `inbox_prefix` (the user's own,
`_INBOX.caller`, unless told otherwise), sends a unary request and a 40-token streamed
one (more chunks than the adapter's acknowledgement window of 16: the client's
acknowledgements must reach the adapter's inbox), and prints one JSON summary line:
`unary` (ok or the error code), `chunks`, `stream` (ok or the error code).
"""

import argparse
import asyncio
import json

import nats

from weir import llm as weir_llm


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nats", required=True)
    ap.add_argument("--inbox-prefix", default="_INBOX.caller")
    args = ap.parse_args()
    nc = await nats.connect(
        args.nats,
        user="caller",
        password="caller-secret",
        inbox_prefix=args.inbox_prefix,
        connect_timeout=2,
        max_reconnect_attempts=0,
    )
    llm = weir_llm.LlmClient(nc, default_timeout=3.0)
    out = {"unary": "ok", "stream": "ok", "chunks": 0}
    try:
        await llm.request(b"{}", timeout_ms=2000)
    except weir_llm.LlmError as e:
        out["unary"] = e.code
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 40}).encode()
    try:
        async for ev in llm.stream(body, timeout_ms=5000):
            if isinstance(ev, weir_llm.Chunk):
                out["chunks"] += 1
    except weir_llm.LlmError as e:
        out["stream"] = e.code
    await nc.close()
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
