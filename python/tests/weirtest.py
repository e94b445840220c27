"""Test kit of the `weir` package's tests: real `nats-server` processes (one server or a
3-node JetStream cluster) and the real `audio-ingress` binary, like weir-testkit does for
the Rust tests.

- No port races for one server: it picks its own ports (``-p -1``) and reports them in
  a ports file. A cluster first probes free ports that way, then starts its nodes on
  them; a port taken in between fails that start, which is then tried again.
- Ready means ready: ``start`` returns after the server answered ``INFO`` (a cluster:
  after ``/healthz`` answers ok on every node); the ingress after ``/readyz`` answers 200.
- No orphans: every process is killed (after SIGCONT when paused) by ``stop()``, which
  the pytest fixtures call on teardown.
- Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 15.0


def nats_server_bin() -> str:
    """The nats-server the tests use: $NATS_SERVER_BIN, PATH, /usr/sbin/nats-server."""
    env = os.environ.get("NATS_SERVER_BIN")
    if env:
        return env
    found = shutil.which("nats-server")
    if found:
        return found
    if os.access("/usr/sbin/nats-server", os.X_OK):
        return "/usr/sbin/nats-server"
    raise RuntimeError("nats-server not found: run scripts/ensure-nats-server or set NATS_SERVER_BIN")


def binary(name: str) -> str:
    """A weir binary: $WEIR_BIN_DIR/<name>, else target/debug/<name>."""
    base = Path(os.environ.get("WEIR_BIN_DIR", ROOT / "target" / "debug"))
    path = base / name
    if not path.exists():
        raise RuntimeError(f"{path} not found: build it first (cargo build --workspace)")
    return str(path)


def _wait(cond, timeout: float, what: str, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what}")


def _info_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.25) as s:
            s.settimeout(0.25)
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


class NatsServer:
    """One nats-server on 127.0.0.1. ``url`` and ``port`` stay the same across
    ``restart``; JetStream data (``jetstream=True``) survives it."""

    def __init__(self, *, jetstream: bool = False, config: str = "", port: Optional[int] = None,
                 extra_args: Sequence[str] = ()) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="weir-nats-"))
        self.jetstream = jetstream
        self.config = config
        self.extra_args = list(extra_args)
        self.proc: Optional[subprocess.Popen] = None
        self.port = port or 0
        self.ports: Dict[str, List[str]] = {}
        self._launch()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _launch(self) -> None:
        ports_dir = self.dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for old in ports_dir.iterdir():
            old.unlink()
        args = [nats_server_bin(), "-a", "127.0.0.1", "-p", str(self.port or -1),
                "--ports_file_dir", str(ports_dir)]
        if self.jetstream:
            args += ["-js", "-sd", str(self.dir / "jetstream")]
        if self.config:
            conf = self.dir / "server.conf"
            conf.write_text(self.config)
            args += ["-c", str(conf)]
        args += self.extra_args
        log = open(self.dir / "server.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        pid = self.proc.pid

        def ports():
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log_tail()}")
            f = ports_dir / f"{Path(args[0]).name}_{pid}.ports"
            try:
                return json.loads(f.read_text())
            except (OSError, ValueError):
                return None

        self.ports = _wait(ports, STARTUP_TIMEOUT_S, "the nats-server ports file")
        self.port = int(self.ports["nats"][0].rsplit(":", 1)[1])
        _wait(lambda: _info_ok(self.port), STARTUP_TIMEOUT_S, "nats-server INFO")

    def client_subscriptions(self) -> int:
        """Subscriptions held by client connections (``-m`` monitoring port needed).
        The server's own (system account) are left out: it adds them asynchronously
        after it starts, so a count that includes them races with its start-up."""
        base = self.ports["monitoring"][0].rstrip("/")
        with urllib.request.urlopen(f"{base}/connz", timeout=1) as r:
            return sum(c.get("subscriptions", 0) for c in json.loads(r.read())["connections"])

    async def settled_subscriptions(self, want: int, attempts: int = 100) -> int:
        """The client subscriptions once they are ``want``, or the last count after
        ``attempts`` polls 20 ms apart. Just after a consumer's connect returns, the
        server may still count its start-up probe's subscription for a moment (seen:
        5 instead of 4), so a test of the steady state awaits it, bounded."""
        seen = self.client_subscriptions()
        for _ in range(attempts):
            if seen == want:
                break
            await asyncio.sleep(0.02)
            seen = self.client_subscriptions()
        return seen

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.dir / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def pause(self) -> None:
        """SIGSTOP; returns once Linux reports the process stopped."""
        os.kill(self.pid, signal.SIGSTOP)
        _wait(lambda: _proc_state(self.pid) == "T", 2.0, "nats-server stopped")

    def resume(self) -> None:
        """SIGCONT; returns once the process runs again."""
        os.kill(self.pid, signal.SIGCONT)
        _wait(lambda: _proc_state(self.pid) != "T", 2.0, "nats-server resumed")

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except OSError:
                pass
            self.proc.kill()
            self.proc.wait(timeout=5)

    def restart(self) -> None:
        """Kill, then start again on the same port (and JetStream store)."""
        self.kill()
        self._launch()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class NatsCluster:
    """A 3-node (or ``size``) JetStream cluster on loopback, ready when every node's
    ``/healthz`` says ok."""

    # The ports are probed by servers that pick their own and then stop; another
    # process may take one in between. Then a node fails with "address already in use"
    # and the whole start is tried again, with new ports (as weir-testkit does).
    LAUNCH_ATTEMPTS = 3

    def __init__(self, size: int = 3) -> None:
        for attempt in range(self.LAUNCH_ATTEMPTS):
            try:
                self._start(size)
                return
            except RuntimeError as e:
                if "address already in use" not in str(e) or attempt + 1 == self.LAUNCH_ATTEMPTS:
                    raise

    def _start(self, size: int) -> None:
        probes = []
        try:
            for i in range(size):
                probes.append(NatsServer(config=f'server_name: p{i}\ncluster {{ name: weir, listen: "127.0.0.1:-1" }}\nhttp: "127.0.0.1:-1"\n'))
            ports = [(p.port, _port_of(p.ports["cluster"][0]), _port_of(p.ports["monitoring"][0])) for p in probes]
        finally:
            for p in probes:
                p.stop()
        routes = ", ".join(f'"nats-route://127.0.0.1:{c}"' for _, c, _ in ports)
        self.monitoring = [m for _, _, m in ports]
        self.nodes: List[NatsServer] = []
        try:
            for i, (client, cluster, monitoring) in enumerate(ports):
                self.nodes.append(NatsServer(
                    jetstream=True, port=client,
                    config=(f'server_name: n{i}\nhttp: "127.0.0.1:{monitoring}"\n'
                            f'cluster {{\n  name: weir\n  listen: "127.0.0.1:{cluster}"\n  routes: [{routes}]\n}}\n')))
            _wait(self.healthy, 30.0, "cluster healthy", poll=0.1)
        except BaseException:
            self.stop()
            raise

    def healthy(self) -> bool:
        for m in self.monitoring:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{m}/healthz?js-enabled-only=true", timeout=1) as r:
                    if json.loads(r.read()).get("status") != "ok":
                        return False
            except (OSError, ValueError):
                return False
        return True

    @property
    def urls(self) -> List[str]:
        return [n.url for n in self.nodes]

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].rstrip("/"))


class Ingress:
    """The real ``audio-ingress serve`` binary: default configuration, free ports, the
    given NATS URL and ``--set key=value`` overrides; ready when ``/readyz`` is 200."""

    def __init__(self, nats_url: str, sets: Optional[Dict[str, object]] = None) -> None:
        args = [binary("audio-ingress"), "serve", "--listen", "127.0.0.1:0",
                "--admin", "127.0.0.1:0", "--nats-url", nats_url]
        for k, v in (sets or {}).items():
            args += ["--set", f"{k}={v}"]
        env = dict(os.environ, RUST_LOG="warn")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL, env=env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"audio-ingress exited without its ready line (rc={self.proc.wait(5)})")
        ready = json.loads(line)
        self.ws = ready["ws"]
        self.admin = ready["admin"]
        _wait(lambda: self._get("/readyz")[0] == 200, STARTUP_TIMEOUT_S, "audio-ingress /readyz", poll=0.05)

    def ws_url(self, stream: str, **query: object) -> str:
        q = "&".join(f"{k}={v}" for k, v in query.items())
        return f"ws://{self.ws}/v1/streams/{stream}" + (f"?{q}" if q else "")

    def _get(self, path: str):
        try:
            with urllib.request.urlopen(f"http://{self.admin}{path}", timeout=1) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return 0, b""

    def get_json(self, path: str):
        status, body = self._get(path)
        return status, (json.loads(body) if body else None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
