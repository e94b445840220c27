"""The installed package itself: what `pip install` put into the environment."""

from __future__ import annotations

import importlib.metadata
import pathlib

import pytest

import weir
import weir._weir
from weir import errors


def test_installed_from_an_abi3_wheel_with_types() -> None:
    dist = importlib.metadata.distribution("weir")
    files = {str(f) for f in dist.files or []}
    assert "weir/py.typed" in files
    assert "weir/_weir.pyi" in files
    native = [f for f in files if f.startswith("weir/_weir") and f.endswith(".so")]
    assert native == ["weir/_weir.abi3.so"], native  # one binary for every CPython >= 3.11
    wheel = dist.read_text("WHEEL") or ""
    assert "cp311-abi3" in wheel, wheel
    assert weir.__version__ == dist.version


def test_the_error_hierarchy_carries_codes() -> None:
    for cls in (errors.ConfigError, errors.ConnectError, errors.ClosedError,
                errors.OverloadError, errors.RefusedError, errors.InternalError):
        assert issubclass(cls, errors.WeirError)
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.ConnectError, ConnectionError)
    e = errors.OverloadError("stream over its byte bound", code="queue_full", details={"limit": 3})
    assert (e.code, e.details, str(e)) == ("queue_full", {"limit": 3}, "stream over its byte bound [queue_full]")


def test_the_core_runs_on_its_own_threads() -> None:
    assert weir._weir.runtime_threads() == {"core": 1, "bridge": 1}


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError):
        weir.NoSuchThing  # noqa: B018
    assert set(weir.__all__) >= {"WeirError", "Consumer", "Producer"}
    assert set(weir.__all__) - {"__version__", "errors"} <= set(dir(weir))
    for name in weir.__all__:
        assert getattr(weir, name) is not None
    assert weir.llm.LlmClient is not None  # a submodule, loaded on first access


def test_sources_and_installed_package_match() -> None:
    # The tests run against the installed wheel, not the source tree: a stale
    # install would test old code. scripts/build-python-wheel reinstalls on any change.
    here = pathlib.Path(__file__).resolve().parents[1] / "weir" / "errors.py"
    installed = pathlib.Path(errors.__file__)
    assert installed.read_bytes() == here.read_bytes()
    assert "site-packages" in str(installed)


async def test_a_rust_panic_is_a_python_exception() -> None:
    # Awaited: the bridge catches it and raises InternalError (an Exception, code
    # "internal"), never pyo3's PanicException, a BaseException that `except Exception`
    # would let through.
    with pytest.raises(errors.InternalError) as info:
        await weir._weir._panic_probe(True)
    assert info.value.code == "internal" and "panic probe (awaited)" in info.value.message
    # Called: PyO3 turns it into its PanicException, raised by the call; the process
    # and the runtimes carry on.
    with pytest.raises(BaseException) as called:
        weir._weir._panic_probe(False)
    assert type(called.value).__name__ == "PanicException"
    assert weir._weir.runtime_threads()["core"] == 1


def test_partition_of_is_the_protocol_rule() -> None:
    # docs/protocol.md's FNV-1a-32 mod N, computed by weir-protocol (the golden values
    # are the Rust tests'): the one implementation, also for Python code.
    assert weir.partition_of("call-42", 1) == 0
    assert weir.partition_of("foobar", 4096) == 0xBF9CF968 % 4096
    assert weir.partition_of("a", 4096) == 0xE40C292C % 4096
    assert all(0 <= weir.partition_of(f"s{i}", 8) < 8 for i in range(100))
    assert len({weir.partition_of(f"s{i}", 8) for i in range(100)}) == 8
    for bad_id in ("a.b", "*", ">", ""):
        with pytest.raises(errors.ConfigError) as info:
            weir.partition_of(bad_id, 8)
        assert info.value.code == "invalid_stream_id"
    for bad_n in (0, -1, 4097, 2**40):
        with pytest.raises(errors.ConfigError) as info:
            weir.partition_of("x", bad_n)
        assert info.value.code == "invalid_config"
