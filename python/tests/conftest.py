"""pytest fixtures of the `weir` package's tests (see weirtest.py)."""

from __future__ import annotations

import pytest

from weirtest import Ingress, NatsCluster, NatsServer


@pytest.fixture
def nats_server():
    """A fresh nats-server (core NATS)."""
    server = NatsServer()
    yield server
    server.stop()


@pytest.fixture
def nats_js():
    """A fresh nats-server with JetStream."""
    server = NatsServer(jetstream=True)
    yield server
    server.stop()


@pytest.fixture
def nats_cluster():
    """A fresh 3-node JetStream cluster."""
    cluster = NatsCluster(3)
    yield cluster
    cluster.stop()


@pytest.fixture
def ingress_factory():
    """Starts `audio-ingress serve` binaries; all are stopped at teardown."""
    started = []

    def start(nats_url: str, **sets: object) -> Ingress:
        ing = Ingress(nats_url, {k.replace("__", "."): v for k, v in sets.items()})
        started.append(ing)
        return ing

    yield start
    for ing in started:
        ing.stop()
