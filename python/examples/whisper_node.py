"""A recogniser in the shape of the deployed `WhisperStreamNode`, rewritten on `weir.Consumer`.

The deployed node subscribes to `inference.whisper.stream.*` (a wildcard, no queue
group), keeps a RAM buffer per stream subject, and re-implements order, gaps and `end`
from the packet meta. Here the per-stream part stays as it was, a handler fed the
stream's frames (`WhisperStreamNode.feed`), and everything around it is weir's consumer
core (Rust): the subscription (partitions, static or lease ownership), per-stream order,
a bounded per-stream queue instead of the RAM buffer, the staleness guard, and every
missing frame declared as a `Gap`, never silently skipped.

The model is a stand-in so the example runs anywhere: every `--window-ms` of audio it
"transcribes" the window's energy (`speech(-18dBFS)` or `silence`), in a worker thread
as a real model call would run (`asyncio.to_thread`; the consumer's NATS I/O and leases
run on Rust threads that never take the GIL, so a slow model does not stall them).
Replace `StandInModel.transcribe` with the real model.

Run against the default `audio-ingress serve` (frames on `inference.whisper.stream.{stream}`):

    python whisper_node.py --nats nats://127.0.0.1:4222
    python whisper_node.py --nats nats://127.0.0.1:4222 \\
        --subject 'audio.{partition}.{stream}' --partitions 8 --owned 0,1,2,3

Output: one JSON object per line on stdout: `ready` (connected), `transcript` (one per
window: stream, text, first/last seq), `gap` (a declared hole), `end` (a stream ended:
cause, frames, gaps, its full transcript), and `stats` when it stops (after
`--seconds`, or on SIGINT/SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import signal
import sys
import time
from array import array
from typing import Any, Dict, List, Optional, Set

import weir
from weir.consumer import Stream

SAMPLE_RATE = 16_000  # weir's frames: 16 kHz mono s16le
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout."""
    fields = {"event": event, **fields}
    sys.stdout.write(json.dumps(fields, default=str) + "\n")
    sys.stdout.flush()


class StandInModel:
    """Stands in for Whisper: a window of PCM -> a one-word "transcript" of its energy.
    Synchronous and CPU-bound like a real model call (`delay_ms` adds a sleep)."""

    def __init__(self, delay_ms: int = 0, silence_dbfs: float = -50.0) -> None:
        self.delay_ms = delay_ms
        self.silence_dbfs = silence_dbfs

    def transcribe(self, pcm: bytes) -> str:
        samples = array("h")
        samples.frombytes(pcm[: len(pcm) - len(pcm) % 2])
        if sys.byteorder == "big":
            samples.byteswap()
        if self.delay_ms:
            time.sleep(self.delay_ms / 1000)
        if not samples:
            return "silence"
        rms = math.sqrt(sum(s * s for s in samples) / len(samples))
        dbfs = 20 * math.log10(rms / 32768) if rms > 0 else -120.0
        return "silence" if dbfs < self.silence_dbfs else f"speech({dbfs:.0f}dBFS)"


class WhisperStreamNode:
    """The per-stream recogniser of the deployed node: fed one stream's frames in
    order, it runs the model on every full window. Its buffer holds at most one window
    (the bound on what the stream may queue is the consumer core's, not this class's)."""

    def __init__(self, stream_id: str, model: StandInModel, window_ms: int) -> None:
        self.stream_id = stream_id
        self.model = model
        self.window_bytes = window_ms * BYTES_PER_MS
        self.buffer = bytearray()
        self.first_seq: Optional[int] = None
        self.last_seq: Optional[int] = None
        self.transcript: List[str] = []
        self.frames = 0

    async def feed(self, pcm: bytes, seq: int) -> None:
        """One frame, in order."""
        if self.first_seq is None:
            self.first_seq = seq
        self.last_seq = seq
        self.frames += 1
        self.buffer += pcm
        while len(self.buffer) >= self.window_bytes:
            window = bytes(self.buffer[: self.window_bytes])
            del self.buffer[: self.window_bytes]
            await self._recognise(window)

    def gap(self, frames: int) -> None:
        """A declared hole: the audio around it is not contiguous, so the partial window
        is dropped rather than glued to what follows."""
        self.buffer.clear()
        self.first_seq = None
        self.transcript.append(f"[gap:{frames}]")

    async def finish(self) -> str:
        """The stream ended: recognise what is left, return the whole transcript."""
        if self.buffer:
            window, self.buffer = bytes(self.buffer), bytearray()
            await self._recognise(window)
        return " ".join(self.transcript)

    async def _recognise(self, window: bytes) -> None:
        text = await asyncio.to_thread(self.model.transcribe, window)
        self.transcript.append(text)
        emit("transcript", stream=self.stream_id, text=text,
             first_seq=self.first_seq, last_seq=self.last_seq)
        self.first_seq = None


async def handle(stream: Stream, model: StandInModel, window_ms: int) -> None:
    """Feeds one stream instance to its node until the stream's `End`."""
    node = WhisperStreamNode(stream.id, model, window_ms)
    gaps = 0
    async for event in stream:
        if isinstance(event, weir.Frame):
            await node.feed(event.pcm, event.seq)
        elif isinstance(event, weir.Gap):
            gaps += 1
            node.gap(event.frames)
            emit("gap", stream=stream.id, first_seq=event.first_seq, last_seq=event.last_seq,
                 frames=event.frames, cause=event.cause, reason=event.reason)
        elif isinstance(event, weir.LossDeclared):
            emit("loss_declared", stream=stream.id, first_seq=event.first_seq,
                 last_seq=event.last_seq, frames=event.frames, reason=event.reason)
        elif isinstance(event, weir.End):
            text = await node.finish()
            emit("end", stream=stream.id, session_id=stream.session_id, cause=event.cause,
                 reason=event.reason, frames=node.frames, gaps=gaps, transcript=text)


def plain(value: Any) -> Any:
    """Stats dataclasses as JSON-ready dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


async def run(args: argparse.Namespace) -> None:
    config: Dict[str, Any] = {
        "subject": args.subject,
        "partitions": args.partitions,
        "max_streams": args.max_streams,
        "max_frame_age_ms": args.max_frame_age_ms,
    }
    if args.lease:
        config["ownership"] = {"lease": {}}
    else:
        config["owned"] = ([int(p) for p in args.owned.split(",")] if args.owned
                           else list(range(args.partitions)))
    consumer = await weir.Consumer.connect(args.nats.split(","), **config)
    model = StandInModel(delay_ms=args.model_delay_ms)
    handlers: "Set[asyncio.Task[None]]" = set()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.seconds:
        loop.call_later(args.seconds, stop.set)

    async def accept() -> None:
        async for stream in consumer:
            task = asyncio.create_task(handle(stream, model, args.window_ms))
            handlers.add(task)
            task.add_done_callback(handlers.discard)

    emit("ready", owned=consumer.owned())
    acceptor = asyncio.create_task(accept())
    await stop.wait()
    # Graceful: the core drains and ends every stream (each handler sees its `End`).
    stats = await consumer.close(grace_s=2.0)
    acceptor.cancel()
    if handlers:
        await asyncio.wait(handlers, timeout=5.0)
    emit("stats", stats=plain(stats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nats", default="nats://127.0.0.1:4222", help="URL, or a comma-separated list")
    ap.add_argument("--subject", default="inference.whisper.stream.{stream}",
                    help="subject template ({stream}, optional {partition})")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--owned", default="", help="comma-separated partitions (default: all)")
    ap.add_argument("--lease", action="store_true",
                    help="lease ownership (a JetStream KV bucket; needs a {partition} subject)")
    ap.add_argument("--max-streams", type=int, default=64)
    ap.add_argument("--max-frame-age-ms", type=int, default=1000)
    ap.add_argument("--window-ms", type=int, default=500, help="audio per transcript")
    ap.add_argument("--model-delay-ms", type=int, default=0, help="stand-in model latency")
    ap.add_argument("--seconds", type=float, default=0, help="stop after this long (0: until a signal)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
