"""Drives headless Chromium over the DevTools protocol for the publisher page's tests.

A small, dependency-light driver (only `websockets`, pinned in scripts/ensure-python-env)
instead of Playwright or Selenium: the tests need five things — open a tab, evaluate a
JS expression, wait until one holds, take a screenshot, serve a directory from another
origin — and Debian's own `chromium` package, not a browser a framework downloads.

The browser's microphone is a fake device that plays a WAV file once, then silence
(`--use-file-for-fake-audio-capture=FILE%noloop`), and the permission prompt is answered yes
(`--use-fake-ui-for-media-stream`).

Protocol: one JSON object per line on stdin, one JSON answer per line on stdout, in
order. Every answer has "ok"; a failed command has "error" too.

  {"cmd": "serve", "dir": D}                 -> {"ok": true, "origin": "http://127.0.0.1:P"}
  {"cmd": "open", "tab": T, "url": U}        -> {"ok": true}
  {"cmd": "eval", "tab": T, "expr": E}       -> {"ok": true, "value": V}
  {"cmd": "wait", "tab": T, "expr": E, "timeout_s": S}
                                             -> {"ok": true, "value": V, "after_s": A}
                                                (ok false, "error": "timeout", the last V)
  {"cmd": "screenshot", "tab": T, "path": P} -> {"ok": true, "bytes": N}
  {"cmd": "quit"}                            -> {"ok": true}, then exits

Every wait is bounded (a command's own timeout, 10 s for a DevTools call, 20 s for the
browser to start). The browser is killed when the driver exits, whatever the reason.

Usage: publish_driver.py --chromium PATH --wav FILE
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import http.server
import itertools
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import websockets

CALL_TIMEOUT_S = 10.0
START_TIMEOUT_S = 20.0


def chromium_args(chromium: str, wav: str, profile: str) -> list[str]:
    """The command line of the browser: headless, a fake microphone playing `wav`."""
    return [
        chromium,
        "--headless=new",
        "--no-sandbox",  # the tests may run as root, where the sandbox refuses to start
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--mute-audio",
        "--window-size=720,560",
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        # Played once (`%noloop`), then silence: the fake device's loop is not
        # sample-exact at the wrap, and the test compares what it sent with the file.
        f"--use-file-for-fake-audio-capture={wav}%noloop",
        # Host candidates on 127.0.0.1: the ingress keeps only the candidates on the
        # address the WHIP POST came from, which is loopback here.
        "--allow-loopback-in-peer-connection",
        # Several tabs publish at once: none may be throttled as a background tab.
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows",
        "about:blank",
    ]


class Cdp:
    """One DevTools WebSocket (the browser's or a tab's): calls with ids, events ignored."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str) -> "Cdp":
        ws = await asyncio.wait_for(
            websockets.connect(url, max_size=64 * 1024 * 1024), CALL_TIMEOUT_S
        )
        return cls(ws)

    async def _read(self) -> None:
        async for raw in self.ws:
            msg = json.loads(raw)
            fut = self.pending.pop(msg.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Sends one command; its result, or raises with the browser's error."""
        mid = next(self.ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[mid] = fut
        await self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        msg = await asyncio.wait_for(fut, CALL_TIMEOUT_S)
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        result: dict[str, Any] = msg.get("result", {})
        return result


class Driver:
    """The browser, its tabs by name, and the directories served from other origins."""

    def __init__(self, chromium: str, wav: str) -> None:
        self.profile = tempfile.TemporaryDirectory(prefix="weir-chromium-")
        self.proc = subprocess.Popen(
            chromium_args(chromium, wav, self.profile.name),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.browser: Cdp | None = None
        self.port = 0
        self.tabs: dict[str, Cdp] = {}
        self.servers: list[http.server.ThreadingHTTPServer] = []

    async def start(self) -> None:
        """Waits for the browser's DevTools address and connects to it."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.proc.stderr is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("chromium did not print its DevTools address in time")
            line = await asyncio.wait_for(loop.run_in_executor(None, self.proc.stderr.readline), left)
            if not line:
                raise RuntimeError(f"chromium exited ({self.proc.wait()}) before DevTools was up")
            m = re.search(r"DevTools listening on (ws://[^\s]+)", line)
            if m:
                break
        # Keep draining stderr so that the browser never blocks on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        url = m.group(1)
        self.port = int(url.split(":")[2].split("/")[0])
        self.browser = await Cdp.connect(url)

    def serve(self, directory: str) -> str:
        """Serves `directory` over HTTP on another loopback port: another origin."""
        handler = functools.partial(QuietHandler, directory=directory)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    async def open(self, tab: str, url: str) -> None:
        assert self.browser is not None
        target = await self.browser.call("Target.createTarget", url=url)
        self.tabs[tab] = await Cdp.connect(
            f"ws://127.0.0.1:{self.port}/devtools/page/{target['targetId']}"
        )

    async def eval(self, tab: str, expr: str) -> Any:
        r = await self.tabs[tab].call(
            "Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in r:
            raise RuntimeError(f"JS: {r['exceptionDetails'].get('text')}: {expr}")
        return r.get("result", {}).get("value")

    async def wait(self, tab: str, expr: str, timeout_s: float) -> dict[str, Any]:
        t0 = time.monotonic()
        value: Any = None
        while True:
            value = await self.eval(tab, expr)
            if value:
                return {"ok": True, "value": value, "after_s": round(time.monotonic() - t0, 3)}
            if time.monotonic() - t0 > timeout_s:
                return {"ok": False, "error": "timeout", "value": value}
            await asyncio.sleep(0.05)

    async def screenshot(self, tab: str, path: str) -> int:
        r = await self.tabs[tab].call("Page.captureScreenshot", format="png")
        data = base64.b64decode(r["data"])
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
        self.proc.kill()
        self.proc.wait()
        self.profile.cleanup()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server that logs nothing (stdout carries the protocol)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def run(driver: Driver, cmd: dict[str, Any]) -> dict[str, Any]:
    """Executes one command; its answer."""
    what = cmd.get("cmd")
    if what == "serve":
        return {"ok": True, "origin": driver.serve(cmd["dir"])}
    if what == "open":
        await driver.open(cmd["tab"], cmd["url"])
        return {"ok": True}
    if what == "eval":
        return {"ok": True, "value": await driver.eval(cmd["tab"], cmd["expr"])}
    if what == "wait":
        return await driver.wait(cmd["tab"], cmd["expr"], float(cmd.get("timeout_s", 10)))
    if what == "screenshot":
        return {"ok": True, "bytes": await driver.screenshot(cmd["tab"], cmd["path"])}
    if what == "quit":
        return {"ok": True}
    return {"ok": False, "error": f"unknown command {what!r}"}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chromium", required=True)
    parser.add_argument("--wav", required=True)
    args = parser.parse_args()
    driver = Driver(args.chromium, args.wav)
    try:
        await driver.start()
        print(json.dumps({"ok": True, "ready": True}), flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            try:
                cmd = json.loads(line)
                answer = await run(driver, cmd)
            except Exception as e:  # every failure is an answer, the driver goes on
                cmd, answer = {}, {"ok": False, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(answer), flush=True)
            if cmd.get("cmd") == "quit":
                break
    finally:
        driver.close()


if __name__ == "__main__":
    asyncio.run(main())
