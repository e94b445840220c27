"""weir for Python: bounded, explicit audio streaming and LLM calls over NATS.

- `weir.Consumer` (`weir.consumer`): for recognisers. Partitioned, per-stream ordered
  delivery with every missing frame declared (lost, stale, possibly lost, overload,
  handover), lease ownership across workers, capacity announcements.
  ``async for stream in consumer``, then ``async for event in stream``.
- `weir.Producer` (`weir.producer`): for WebRTC or telephony servers that publish
  frames themselves. A non-blocking ``push`` that admits a frame or raises
  `OverloadError`; the same queue, window, confirmation and declarations as the
  audio-ingress.
- `weir.llm`: the LLM adapter client (request, stream, cancel, status, durable intake).
- `weir.errors`: `WeirError` and its kinds, each with a stable ``code``.
- `weir.partition_of(stream_id, partitions)`: the partition of a stream (the protocol's
  FNV-1a rule, from Rust), for code that publishes or routes streams itself.

The protocol logic lives in Rust (the ``weir._weir`` native module, on weir's consumer
and producer cores); this package is the asyncio layer over it. The submodules load on
first use: ``import weir`` alone loads neither core.
"""

from __future__ import annotations

import atexit
import importlib
from typing import TYPE_CHECKING, Any

from . import _weir, errors
from ._weir import __version__, partition_of
from .errors import (
    ClosedError,
    ConfigError,
    ConnectError,
    InternalError,
    OverloadError,
    RefusedError,
    WeirError,
)

# Before the interpreter finalizes, stop the thread that completes asyncio futures:
# a thread that takes the GIL during finalization crashes the process.
atexit.register(_weir._shutdown)

if TYPE_CHECKING:
    from .consumer import Consumer, End, Frame, Gap, LossDeclared, Stream
    from . import consumer, llm, producer
    from .producer import Producer, ProducerStream

# Public name -> the submodule that defines it (loaded on first access).
_LAZY = {
    "Consumer": "consumer",
    "Stream": "consumer",
    "Frame": "consumer",
    "Gap": "consumer",
    "End": "consumer",
    "LossDeclared": "consumer",
    "Producer": "producer",
    "ProducerStream": "producer",
}

# Submodules loaded on first attribute access (``weir.llm``), like the names above.
_SUBMODULES = ("consumer", "producer", "llm")

__all__ = [
    "__version__",
    "errors",
    "partition_of",
    "WeirError",
    "ConfigError",
    "ConnectError",
    "ClosedError",
    "OverloadError",
    "RefusedError",
    "InternalError",
    "Consumer",
    "Stream",
    "Frame",
    "Gap",
    "End",
    "LossDeclared",
    "Producer",
    "ProducerStream",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'weir' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_SUBMODULES])
