"""A recognition worker process on `weir.Consumer` with lease ownership, for
test_consumer_leases.py (the Python counterpart of the Rust `loadtest lease-worker`).

    python lease_worker.py <urls,comma-separated> <worker-id> <log-path> <partitions> <bucket>

Writes one line per fact to <log-path>, line-buffered so that a SIGKILL loses at most
the line being written:

    S <unix-ms>                                  started (the consumer is up)
    F <stream> <seq>                             a frame handed to the handler
    G <stream> <first> <last> <cause>            a gap notice handed to the handler
    E <stream> <cause> <seq|->                   the stream's End
    L <unix-ms> <partition> <0|1> <revision>     a change of what it delivers (polled every 50 ms)

SIGTERM: close gracefully (leases released) and exit 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import weir


def now_ms() -> int:
    return int(time.time() * 1000)


async def main(urls: str, worker: str, path: str, partitions: int, bucket: str) -> None:
    log = open(path, "w", buffering=1)
    consumer = await weir.Consumer.connect(
        urls.split(","), subject="pyfail.{partition}.{stream}", partitions=partitions,
        idle_timeout_ms=60_000, max_frame_age_ms=0,
        ownership={"lease": {"bucket": bucket, "replicas": 3, "worker_id": worker}})
    log.write(f"S {now_ms()}\n")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def handle(stream: weir.Stream) -> None:
        async for event in stream:
            match event:
                case weir.Frame(_, seq):
                    log.write(f"F {stream.id} {seq}\n")
                case weir.Gap(first, last, _, _, cause):
                    log.write(f"G {stream.id} {first} {last} {cause}\n")
                case weir.End(cause, _, seq):
                    log.write(f"E {stream.id} {cause} {seq if seq is not None else '-'}\n")

    async def serve() -> None:
        async for stream in consumer:
            asyncio.create_task(handle(stream))

    async def watch_leases() -> None:
        held: dict = {}
        while True:
            for lease in consumer.leases():
                p, on = lease["partition"], bool(lease["delivering"])
                if held.get(p, False) != on:
                    held[p] = on
                    log.write(f"L {now_ms()} {p} {int(on)} {lease['revision'] or 0}\n")
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(serve()), asyncio.create_task(watch_leases())]
    await stop.wait()
    for t in tasks[1:]:
        t.cancel()
    await consumer.close(grace_s=2)
    log.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
