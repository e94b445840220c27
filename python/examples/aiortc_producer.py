"""An aiortc WebRTC server's audio, published through `weir.Producer`.

In the deployed WebRTC server a remote track arrives in `pc.on("track")` and each of
its frames became one `nats.publish` task. Here each track becomes one weir stream:
`pump()` reads the track, resamples it to weir's frame format (16 kHz mono s16le, with
`av.AudioResampler`), cuts 20 ms frames (640 bytes) and hands each to
`ProducerStream.push`, which never blocks: the producer core (Rust, the one
`audio-ingress` runs) queues it within the stream's byte and age bounds and publishes
it in order from one publisher per stream, confirmed by the server. A frame it cannot
admit raises `weir.OverloadError` (never a silent drop); the stream's events
(`Overloaded`, `GapSent`, `Closed`) are printed as they come.

Runs here without a browser: by default (`--via webrtc`) a local RTCPeerConnection pair
on loopback, the sender playing the source and the receiver handling `on("track")` as
the server does; `--via direct` pumps the source track without WebRTC. The source is a
file through aiortc's `MediaPlayer` (`--file call.wav`), or a generated tone.

    python aiortc_producer.py --nats nats://127.0.0.1:4222 --stream call-42 --seconds 3
    python aiortc_producer.py --file call.wav --stream call-43 --session s-7

Frames go to `inference.whisper.stream.{stream}` (the producer's default, what the
deployed recognisers and `whisper_node.py` read). Output: JSON lines on stdout: `event`
(a producer event), `overload` (a refused push), `summary` (the stream's end), `stats`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fractions
import json
import math
import sys
import time
from typing import Any, Awaitable, Callable, Optional

import av
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError

import weir
from weir.producer import ProducerStream

RATE = 16_000
FRAME_MS = 20
FRAME_BYTES = RATE * 2 * FRAME_MS // 1000  # 640: 20 ms of 16 kHz mono s16le


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}, default=str) + "\n")
    sys.stdout.flush()


def plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


class Tone(MediaStreamTrack):
    """A 440 Hz tone, 48 kHz stereo s16 (what a browser's Opus track decodes to), 20 ms
    frames paced in real time, for `seconds`."""

    kind = "audio"

    def __init__(self, seconds: float, rate: int = 48_000) -> None:
        super().__init__()
        self.rate = rate
        self.total = int(seconds * rate)
        self.sent = 0
        self.start: Optional[float] = None

    async def recv(self) -> av.AudioFrame:
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        if self.sent >= self.total:
            self.stop()
            raise MediaStreamError
        n = self.rate * FRAME_MS // 1000
        delay = self.start + self.sent / self.rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pcm = bytearray()
        for i in range(n):
            v = int(8000 * math.sin(2 * math.pi * 440 * (self.sent + i) / self.rate))
            sample = v.to_bytes(2, "little", signed=True)
            pcm += sample + sample  # left, right
        frame = av.AudioFrame(format="s16", layout="stereo", samples=n)
        frame.planes[0].update(bytes(pcm))
        frame.sample_rate = self.rate
        frame.pts = self.sent
        frame.time_base = fractions.Fraction(1, self.rate)
        self.sent += n
        return frame


async def pump(track: MediaStreamTrack, stream: ProducerStream,
               seconds: Optional[float] = None, idle_s: float = 1.0) -> int:
    """Pushes `track`'s audio into `stream` as 20 ms frames of 16 kHz mono s16le until
    the track ends, `seconds` of audio were pushed, or no audio came for `idle_s` (a
    remote track does not end when its sender stops); returns the frames admitted.
    Stops at the first overload that ends the stream (policy `close`)."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
    pending = bytearray()
    admitted = 0
    limit = None if seconds is None else int(seconds * 1000 / FRAME_MS)
    while limit is None or admitted < limit:
        try:
            frame = await asyncio.wait_for(track.recv(), idle_s)
        except (MediaStreamError, asyncio.TimeoutError):
            break
        if not isinstance(frame, av.AudioFrame):
            continue
        for out in resampler.resample(frame):
            # Packed s16 mono: plane 0 holds exactly samples * 2 meaningful bytes.
            pending += bytes(out.planes[0])[: out.samples * 2]
        while len(pending) >= FRAME_BYTES and (limit is None or admitted < limit):
            pcm = bytes(pending[:FRAME_BYTES])
            del pending[:FRAME_BYTES]
            try:
                stream.push(pcm)
                admitted += 1
            except weir.OverloadError as e:
                emit("overload", stream=stream.id, code=e.code, details=e.details)
                if e.details.get("ended"):
                    return admitted
    return admitted


async def report(stream: ProducerStream) -> None:
    """Prints the stream's events until `Closed`."""
    async for ev in stream.events():
        emit("producer_event", stream=stream.id, kind=type(ev).__name__, data=plain(ev))


async def via_webrtc(source: MediaStreamTrack,
                     on_track: Callable[[MediaStreamTrack], Awaitable[None]]) -> None:
    """A loopback RTCPeerConnection pair: `source` is sent, and the receiving side calls
    `on_track(track)` as a WebRTC server's `pc.on("track")` would; returns when it did."""
    import aioice.ice

    # Loopback only: aioice skips 127.0.0.1 when it gathers host candidates (a test
    # rig here; a real server uses its normal ICE configuration).
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]
    sender = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    receiver = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    done: "asyncio.Future[asyncio.Future[None]]" = asyncio.get_running_loop().create_future()

    @receiver.on("track")
    def _on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            task = asyncio.ensure_future(on_track(track))

            def finished(t: "asyncio.Future[None]") -> None:
                if not done.done():
                    done.set_result(t)

            task.add_done_callback(finished)

    sender.addTrack(source)
    try:
        await sender.setLocalDescription(await sender.createOffer())
        await receiver.setRemoteDescription(sender.localDescription)
        await receiver.setLocalDescription(await receiver.createAnswer())
        await sender.setRemoteDescription(receiver.localDescription)
        (await done).result()
    finally:
        await sender.close()
        await receiver.close()


async def run(args: argparse.Namespace) -> None:
    producer = await weir.Producer.connect(args.nats.split(","))
    try:
        source: MediaStreamTrack
        player = None
        if args.file:
            player = MediaPlayer(args.file)
            if player.audio is None:
                raise SystemExit(f"{args.file}: no audio track")
            source = player.audio
        else:
            source = Tone(args.seconds)

        async def on_track(track: MediaStreamTrack) -> None:
            stream = producer.open(args.stream, session_id=args.session)
            events = asyncio.create_task(report(stream))
            t0 = time.monotonic()
            admitted = await pump(track, stream, args.seconds)
            summary = await stream.end()
            await asyncio.wait_for(events, 5.0)
            emit("summary", stream=stream.id, admitted=admitted,
                 audio_s=admitted * FRAME_MS / 1000, wall_s=round(time.monotonic() - t0, 3),
                 summary=plain(summary))

        if args.via == "webrtc":
            await via_webrtc(source, on_track)
        else:
            await on_track(source)
        if player is not None and player.audio is not None:
            player.audio.stop()
    finally:
        emit("stats", stats=plain(await producer.close()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nats", default="nats://127.0.0.1:4222", help="URL, or a comma-separated list")
    ap.add_argument("--stream", default="call-42", help="stream id")
    ap.add_argument("--session", default=None, help="session id")
    ap.add_argument("--file", default=None, help="audio file (aiortc MediaPlayer); default: a tone")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="seconds of audio (the tone's length; at most this much of --file)")
    ap.add_argument("--via", choices=("webrtc", "direct"), default="webrtc")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
