"""The exceptions of the `weir` package: one base class, a few kinds, each with a code.

Every failure raised by `weir` is a `WeirError`. Its `code` is a stable snake_case
string: the wire error code where the protocol has one (``queue_full``,
``session_queue_full``, ``no_capacity``, ...), otherwise a code of the package's own
(``invalid_config``, ``closed``, ``internal``). ``details`` holds the numbers that go
with it (``limit``, ``retry_after_ms``, ...).

    WeirError
    ├── ConfigError    (also ValueError)       invalid option, id, frame or argument
    ├── ConnectError   (also ConnectionError)  NATS unreachable or refused
    ├── ClosedError                            the object was closed / the stream ended
    ├── OverloadError                          a frame was not admitted (explicit overload)
    ├── RefusedError                           a stream was not opened
    ├── InternalError                          a bug inside weir (a Rust panic)
    └── LlmError       (weir.llm)              the LLM adapter refused or failed a request
"""

from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = [
    "WeirError",
    "ConfigError",
    "ConnectError",
    "ClosedError",
    "OverloadError",
    "RefusedError",
    "InternalError",
]


class WeirError(Exception):
    """Base class of every error `weir` raises."""

    code: str
    message: str
    details: Dict[str, Any]

    def __init__(
        self, message: str, *, code: str = "error", details: Optional[Dict[str, Any]] = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = dict(details or {})

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r}, details={self.details!r})"


class ConfigError(WeirError, ValueError):
    """An invalid option, stream id, session id, frame or argument; nothing was changed."""


class ConnectError(WeirError, ConnectionError):
    """NATS could not be reached, or refused the connection."""


class ClosedError(WeirError):
    """The object was closed, or the stream already ended."""


class OverloadError(WeirError):
    """A frame was not admitted: ``code`` is the reason (the stream's byte or age bound,
    its rate bound, or a stream that is already ending). Never a silent drop."""


class RefusedError(WeirError):
    """A stream was not opened (``code``: e.g. the id is already active, or too many
    streams)."""


class InternalError(WeirError):
    """A bug inside weir (a Rust panic, a failed task): please report it."""
