"""python/examples end to end, each for a few seconds against real nats-server and the
real binaries:

- whisper_node.py behind the real `audio-ingress serve`: two WebSocket streams (a tone
  and silence, 2 s each at real time) are recognised: every frame delivered in order
  or declared in a gap (all delivered on a quiet machine), the tone transcribed as
  speech and the silence as silence, each stream ended by its producer; SIGTERM stops
  the node gracefully (its stats line);
- aiortc_producer.py (a tone through a loopback WebRTC pair, resampled to 16 kHz mono
  20 ms frames, pushed through weir.Producer), read by a plain nats-py subscriber: the
  deployed packet format, seq 1..N in order, 640-byte frames, then `end`, exactly what
  the producer reports as published;
- aiortc_producer.py into whisper_node.py: every frame the producer admitted reaches
  the node in order (or is declared), and it transcribes speech.

The examples run as their own processes (as a user runs them), with the installed
`weir` package; their JSON lines are read with a bound on every wait.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import nats
import pytest
import websockets

from weirtest import Ingress, NatsServer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
WAIT_S = 20.0


class Example:
    """An example script as a subprocess; its stdout JSON lines collected by a thread."""

    def __init__(self, script: str, *args: str) -> None:
        self.lines: "queue.Queue[Dict[str, Any]]" = queue.Queue()
        self.seen: List[Dict[str, Any]] = []
        self.stderr: List[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(EXAMPLES / script), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.stderr.append(f"(stdout) {line}")

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def wait_for(self, pred: Callable[[Dict[str, Any]], bool], what: str,
                 timeout: float = WAIT_S) -> Dict[str, Any]:
        """The first line (from now on, or already seen) that matches `pred`."""
        for line in self.seen:
            if pred(line):
                return line
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what} within {timeout} s; seen {self.seen[-10:]}, "
                                     f"stderr {''.join(self.stderr)[-2000:]}")
            try:
                line = self.lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    time.sleep(0.2)  # let the reader thread hand over the last lines
                    if self.lines.empty():
                        raise AssertionError(
                            f"{what}: the example exited ({self.proc.returncode}); seen "
                            f"{self.seen[-10:]}, stderr {''.join(self.stderr)[-2000:]}")
                continue
            self.seen.append(line)
            if pred(line):
                return line

    def events(self, name: str, **match: Any) -> List[Dict[str, Any]]:
        return [l for l in self.seen
                if l.get("event") == name and all(l.get(k) == v for k, v in match.items())]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


StartExample = Callable[..., Example]


@pytest.fixture
def examples() -> Iterator[StartExample]:
    started: List[Example] = []

    def start(script: str, *args: str) -> Example:
        ex = Example(script, *args)
        started.append(ex)
        return ex

    yield start
    for ex in started:
        ex.stop()


def tone_frame(i: int, amplitude: int) -> bytes:
    """20 ms (320 samples) of a 440 Hz tone at 16 kHz, s16le."""
    out = bytearray()
    for n in range(320):
        v = int(amplitude * math.sin(2 * math.pi * 440 * (i * 320 + n) / 16000))
        out += v.to_bytes(2, "little", signed=True)
    return bytes(out)


async def send_ws(url: str, frames: int, amplitude: int) -> None:
    """`frames` 20 ms frames at real time, then `end`; waits for the server's close."""
    async with websockets.connect(url, open_timeout=5, close_timeout=5) as ws:
        t0 = time.monotonic()
        for i in range(frames):
            await ws.send(tone_frame(i, amplitude))
            delay = t0 + (i + 1) * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await ws.send(json.dumps({"type": "end"}))
        async for _ in ws:  # the server's messages until it closes (1000)
            pass


def check_stream(node: Example, stream: str, frames: int, word: str,
                 every_window: bool = True) -> Dict[str, Any]:
    """The node's `end` of `stream`: ended by its producer, each of the `frames` frames
    delivered or declared in a gap (on a quiet machine: all delivered; a machine loaded
    past the staleness guard or the queue bound declares the rest, never skips it), its
    windows in order and transcribed as `word` (every window, or most: Opus through
    WebRTC starts and ends softer than the tone)."""
    end = node.wait_for(lambda l: l.get("event") == "end" and l.get("stream") == stream,
                        f"end of {stream}")
    gaps = node.events("gap", stream=stream)
    declared = sum(g["frames"] for g in gaps)
    assert end["cause"] == "producer", end
    assert (end["frames"] + declared, end["gaps"]) == (frames, len(gaps)), (end, gaps)
    assert end["frames"] >= frames // 2, (end, gaps)
    windows = node.events("transcript", stream=stream)
    assert windows, f"no transcript of {stream}"
    seqs = [w["last_seq"] for w in windows if w["last_seq"] is not None]
    assert seqs == sorted(seqs), f"windows out of order: {seqs}"
    hits = sum(1 for w in windows if w["text"].startswith(word))
    if every_window:
        assert hits == len(windows), windows
    else:
        assert hits >= max(1, len(windows) // 2), windows
    return end


async def test_whisper_node_recognises_ingress_streams(
    nats_server: NatsServer, ingress_factory: Callable[..., Ingress], examples: StartExample
) -> None:
    ingress = ingress_factory(nats_server.url)
    node = examples("whisper_node.py", "--nats", nats_server.url, "--window-ms", "400",
                    "--model-delay-ms", "20")
    node.wait_for(lambda l: l.get("event") == "ready", "ready")
    frames = 100  # 2 s each, at real time
    await asyncio.wait_for(asyncio.gather(
        send_ws(ingress.ws_url("call-tone", session_id="s-1"), frames, 8000),
        send_ws(ingress.ws_url("call-quiet", session_id="s-2"), frames, 0),
    ), WAIT_S)
    tone = check_stream(node, "call-tone", frames, "speech")
    check_stream(node, "call-quiet", frames, "silence")
    assert tone["session_id"] == "s-1"
    node.proc.send_signal(signal.SIGTERM)
    node.wait_for(lambda l: l.get("event") == "stats", "stats after SIGTERM")
    assert node.proc.wait(timeout=10) == 0, "".join(node.stderr)


async def test_aiortc_producer_feeds_the_whisper_node(
    nats_server: NatsServer, examples: StartExample
) -> None:
    node = examples("whisper_node.py", "--nats", nats_server.url, "--window-ms", "400")
    node.wait_for(lambda l: l.get("event") == "ready", "ready")
    producer = examples("aiortc_producer.py", "--nats", nats_server.url, "--stream", "call-rtc",
                        "--session", "s-rtc", "--seconds", "2", "--via", "webrtc")
    summary = producer.wait_for(lambda l: l.get("event") == "summary", "the producer's summary")
    assert producer.proc.wait(timeout=10) == 0, "".join(producer.stderr)
    admitted = summary["admitted"]
    assert admitted >= 60, summary  # >= 1.2 s of the 2 s tone made it through WebRTC
    s = summary["summary"]
    assert (s["end_reason"], s["end_delivered"], s["frames_published"]) == (
        "producer", True, admitted), s
    assert not producer.events("overload")
    closed = [l for l in producer.events("producer_event") if l["kind"] == "Closed"]
    assert len(closed) == 1 and closed[0]["data"]["frames_published"] == admitted, closed
    end = check_stream(node, "call-rtc", admitted, "speech", every_window=False)
    assert end["session_id"] == "s-rtc"
    node.proc.send_signal(signal.SIGTERM)
    node.wait_for(lambda l: l.get("event") == "stats", "stats after SIGTERM")
    assert node.proc.wait(timeout=10) == 0, "".join(node.stderr)


async def test_aiortc_producer_publishes_deployed_packets(
    nats_server: NatsServer, examples: StartExample
) -> None:
    nc = await nats.connect(nats_server.url)
    packets: List[Dict[str, Any]] = []

    async def on_msg(msg: Any) -> None:
        n = int.from_bytes(msg.data[:4], "big")
        meta = json.loads(msg.data[4:4 + n])
        meta["pcm_bytes"] = len(msg.data) - 4 - n
        meta["subject"] = msg.subject
        packets.append(meta)

    try:
        await nc.subscribe("inference.whisper.stream.*", cb=on_msg)
        await nc.flush()
        producer = examples("aiortc_producer.py", "--nats", nats_server.url, "--stream", "call-pkt",
                            "--session", "s-pkt", "--seconds", "1.5", "--via", "webrtc")
        summary = producer.wait_for(lambda l: l.get("event") == "summary", "the producer's summary")
        assert producer.proc.wait(timeout=10) == 0, "".join(producer.stderr)
        deadline = time.monotonic() + WAIT_S
        while not any(p.get("type") == "end" for p in packets):
            assert time.monotonic() < deadline, f"no end packet: {packets[-3:]}"
            await asyncio.sleep(0.05)
    finally:
        await nc.close()
    admitted = summary["admitted"]
    assert admitted >= 45, summary  # >= 0.9 s of the 1.5 s tone made it through WebRTC
    frames = [p for p in packets if p.get("type") == "frame"]
    assert [p["seq"] for p in frames] == list(range(1, admitted + 1))
    assert {p["pcm_bytes"] for p in frames} == {640}
    assert {p["subject"] for p in packets} == {"inference.whisper.stream.call-pkt"}
    assert all(p.get("session_id") == "s-pkt" for p in packets)
    assert packets[-1]["type"] == "end" and packets[-1]["seq"] == admitted + 1, packets[-1]
    assert summary["summary"]["frames_published"] == admitted
