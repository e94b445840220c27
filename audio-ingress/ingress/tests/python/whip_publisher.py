"""A WHIP publisher built on aiortc (a WebRTC stack weir did not write), for the
interop tests in audio-ingress/ingress/tests/whip_aiortc.rs.

Publishes one or more streams to weir's WHIP endpoint: each stream is one
RTCPeerConnection with one audio track (a WAV file through aiortc's MediaPlayer, or a
generated tone) and a data channel labelled "weir" whose messages (weir's JSON events)
are printed. Everything it sees goes to stdout as one JSON object per line:

  {"event": "posted", "stream": ID, "status": 201, "location": "/v1/whip/...", "body": ...}
  {"event": "dc", "stream": ID, "data": {...}}           a message on the weir channel
  {"event": "state", "stream": ID, "state": "connected"}  connection state changes
  {"event": "deleted", "stream": ID, "status": 200}
  {"event": "done"}

Every line also has "t": the Unix time (seconds, float) it was written.

Loopback only: aioice skips 127.0.0.1 when it gathers host candidates, so
get_host_addresses is patched to return exactly ["127.0.0.1"], and no ICE server is
used (RFC 8445 forbids loopback candidates; this is a test rig).

Usage:
  whip_publisher.py --endpoint http://127.0.0.1:PORT/v1/whip --ids a,b
      [--wav FILE | --tone-seconds S] [--end delete|vanish|hold] [--hold-seconds S]
      [--token T]
"""

import argparse
import asyncio
import fractions
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request

import aioice.ice
import av
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.contrib.media import MediaPlayer
from aiortc.mediastreams import MediaStreamError

aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"]


def emit(**kv):
    kv["t"] = time.time()  # Unix seconds, to time events against the test's clock
    sys.stdout.write(json.dumps(kv) + "\n")
    sys.stdout.flush()


class Tone(MediaStreamTrack):
    """A 440 Hz tone, 48 kHz mono, 20 ms frames paced in real time, for `seconds`."""

    kind = "audio"

    def __init__(self, seconds):
        super().__init__()
        self.samples = int(seconds * 48000)
        self.sent = 0
        self.start = None

    async def recv(self):
        loop = asyncio.get_running_loop()
        if self.start is None:
            self.start = loop.time()
        if self.sent >= self.samples:
            self.stop()
            raise MediaStreamError
        n = 960
        due = self.start + self.sent / 48000
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pcm = bytearray()
        for i in range(n):
            t = (self.sent + i) / 48000
            v = int(8000 * math.sin(2 * math.pi * 440 * t))
            pcm += v.to_bytes(2, "little", signed=True)
        frame = av.AudioFrame(format="s16", layout="mono", samples=n)
        frame.planes[0].update(bytes(pcm))
        frame.sample_rate = 48000
        frame.pts = self.sent
        frame.time_base = fractions.Fraction(1, 48000)
        self.sent += n
        return frame


def http(method, url, body=None, token=None):
    headers = {}
    if body is not None:
        headers["Content-Type"] = "application/sdp"
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


async def publish(args, stream_id, base):
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    dc = pc.createDataChannel("weir")
    closed = asyncio.Event()

    @dc.on("message")
    def on_message(message):
        try:
            data = json.loads(message)
        except ValueError:
            data = {"raw": str(message)}
        emit(event="dc", stream=stream_id, data=data)
        if isinstance(data, dict) and data.get("type") == "closed":
            closed.set()

    @pc.on("connectionstatechange")
    def on_state():
        emit(event="state", stream=stream_id, state=pc.connectionState)

    if args.wav:
        player = MediaPlayer(args.wav)
        track = player.audio
    else:
        track = Tone(args.tone_seconds)
    pc.addTrack(track)
    ended = asyncio.Event()
    track.on("ended", ended.set)
    await pc.setLocalDescription(await pc.createOffer())
    loop = asyncio.get_running_loop()
    url = base + "/" + stream_id
    status, headers, body = await loop.run_in_executor(
        None, http, "POST", url, pc.localDescription.sdp.encode(), args.token
    )
    location = headers.get("Location") or headers.get("location")
    emit(event="posted", stream=stream_id, status=status, location=location,
         body=body if status != 201 else None)
    if status != 201:
        await pc.close()
        return None
    await pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
    return pc, track, ended, closed, location


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--wav")
    ap.add_argument("--tone-seconds", type=float, default=3.0)
    ap.add_argument("--end", choices=["delete", "vanish", "hold"], default="delete")
    ap.add_argument("--hold-seconds", type=float, default=0.0)
    ap.add_argument("--token")
    args = ap.parse_args()
    base = args.endpoint.rstrip("/")
    origin = base.split("/v1/")[0]
    ids = [i for i in args.ids.split(",") if i]
    sessions = await asyncio.gather(*(publish(args, i, base) for i in ids))
    live = [(i, s) for i, s in zip(ids, sessions) if s is not None]
    if not live:
        emit(event="done")
        return
    # Until every track has played out (or the hold for --end hold/vanish).
    if args.end == "delete":
        await asyncio.wait_for(
            asyncio.gather(*(s[2].wait() for _, s in live)), timeout=120
        )
        # The last packets are in flight: let them arrive before the DELETE.
        await asyncio.sleep(0.3)
    else:
        await asyncio.sleep(args.hold_seconds)
    if args.end == "vanish":
        emit(event="vanish")
        os._exit(0)  # no DELETE, no DTLS close, no RTCP BYE: the publisher just stops
    if args.end == "delete":
        loop = asyncio.get_running_loop()
        for stream_id, (pc, _, _, closed, location) in live:
            status, _, _ = await loop.run_in_executor(
                None, http, "DELETE", origin + location, None, args.token
            )
            emit(event="deleted", stream=stream_id, status=status)
            try:
                await asyncio.wait_for(closed.wait(), timeout=2)
            except asyncio.TimeoutError:
                pass
            status, _, _ = await loop.run_in_executor(
                None, http, "DELETE", origin + location, None, args.token
            )
            emit(event="deleted_again", stream=stream_id, status=status)
    for _, (pc, *_rest) in live:
        await pc.close()
    emit(event="done")


if __name__ == "__main__":
    asyncio.run(main())
