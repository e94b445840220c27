"""The installed package type-checks: `mypy --strict` on `weir` as a user's checker sees
it (site-packages, the `_weir.pyi` stubs and `py.typed`), so the stubs and the public
annotations agree with each other."""

from __future__ import annotations

import subprocess
import sys


def test_the_installed_package_passes_mypy_strict(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir", str(tmp_path / "cache"), "-p", "weir"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success: no issues found" in out.stdout
