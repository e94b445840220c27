"""`weir.Producer.connect(**config)` takes the stream keys of ``audio-ingress serve``
with the same names and defaults: compared with the real binary's ``--list-keys``
table (key, type, default), and with the producer core's own key table. Also: the
validated configuration a connected producer reports is the one it was given.

Bounded: the binary runs with a 20 s timeout; the connect test by ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any, Dict

import weir
from weirtest import binary


def ingress_defaults() -> Dict[str, str]:
    """key -> default, as `audio-ingress serve --list-keys` prints them."""
    out = subprocess.run([binary("audio-ingress"), "serve", "--list-keys"], capture_output=True,
                         text=True, timeout=20, check=True).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "default":
            table[parts[0]] = parts[3]
    return table


def shown(value: Any) -> str:
    """A default as the key table prints it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "":
        return "(unset)"
    return str(value)


def test_same_keys_and_defaults_as_the_ingress():
    defaults = weir.Producer.config_defaults()
    keys = [k["name"] for k in weir.Producer.config_keys()]
    assert set(keys) == set(defaults), "the key table and the defaults name the same keys"
    table = ingress_defaults()
    assert len(table) > 30, "the ingress printed its key table"
    for key, value in defaults.items():
        assert key in table, f"{key} is not an audio-ingress key"
        assert shown(value) == table[key], (key, value, table[key])


async def test_connected_producer_reports_its_validated_config(nats_server):
    async with asyncio.timeout(20):
        producer = await weir.Producer.connect(
            nats_server.url, max_age_ms=800, policy="gap", extended_consumers=True,
            subject="audio.{partition}.{stream}", partitions=4, max_rate=2.5)
        try:
            config = producer.config
            assert config["max_age_ms"] == 800 and config["policy"] == "gap"
            assert config["partitions"] == 4 and config["max_rate"] == 2.5
            assert config["max_bytes"] == weir.Producer.config_defaults()["max_bytes"]
            stream = producer.open("cfg-1")
            assert stream.subject.startswith("audio.") and stream.subject.endswith(".cfg-1")
            assert 0 <= int(stream.subject.split(".")[1]) < 4
            await stream.end()
        finally:
            await producer.close()
