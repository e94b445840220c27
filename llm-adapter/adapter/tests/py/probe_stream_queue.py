"""A unary request behind a running stream, from outside: the adapter (`llm-adapter
serve` at its defaults: 8 workers, sim backend) runs one 12 s stream (600 tokens at
50/s, every chunk acknowledged); meanwhile unary requests, one after another every
50 ms, report their Weir-Queue-Ms. Prints one JSON line.

    nats-server -a 127.0.0.1 -p 14322 &
    llm-adapter serve --nats-url nats://127.0.0.1:14322 --admin 127.0.0.1:0 &
    python llm-adapter/adapter/tests/py/probe_stream_queue.py nats://127.0.0.1:14322
"""
import asyncio, json, sys, time
import nats

async def main(url):
    nc = await nats.connect(url)
    inbox = nc.new_inbox()
    done = asyncio.Event()
    chunks = 0
    async def on_msg(msg):
        nonlocal chunks
        ev = (msg.headers or {}).get("Weir-Stream-Event")
        if ev == "chunk":
            chunks += 1
            await nc.publish(msg.reply, msg.headers["Weir-Stream-Seq"].encode())
        elif ev in ("end", "error") or (msg.headers or {}).get("Nats-Service-Error"):
            done.set()
    await nc.subscribe(inbox, cb=on_msg)
    # Let the workers go idle and wait, as in a service that has run for a while.
    for _ in range(20):
        await nc.request("llm.infer", b"{}", timeout=5)
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    await nc.publish("llm.infer", json.dumps({"max_tokens": 600}).encode(), reply=inbox,
                     headers={"Weir-Stream": "1"})
    await asyncio.sleep(0.3)
    q = []
    while not done.is_set() and time.monotonic() - t0 < 11:
        r = await nc.request("llm.infer", b"{}", timeout=20)
        q.append(float(r.headers["Weir-Queue-Ms"]))
        await asyncio.sleep(0.05)
    await asyncio.wait_for(done.wait(), 30)
    took = time.monotonic() - t0
    q.sort()
    print(json.dumps({"stream_s": round(took, 2), "stream_chunks": chunks, "unary": len(q),
                      "queue_ms_max": q[-1], "queue_ms_p50": q[len(q)//2],
                      "over_5ms": sum(1 for x in q if x > 5.0)}))
    await nc.close()

asyncio.run(main(sys.argv[1]))
