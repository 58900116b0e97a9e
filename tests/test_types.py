"""The type checker over the four packages (kvobs, collectors, instrumented_engine, dashboard): clean, and it holds
each store backend to `kvobs.store.interface`.

A read missing on one backend, or taking other argument names, is a mypy error here, not an `AttributeError` on
a page; the contract suite (tests/store/test_contract.py) then holds the backends to equal answers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvobs.store.interface import Reads

ROOT = Path(__file__).resolve().parents[1]


def mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_package_type_checks():
    result = mypy()  # [tool.mypy] in pyproject.toml: files = the four packages
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


def test_a_backend_missing_a_read_is_a_type_error(tmp_path):
    """A backend whose reads lack `steps` and rename an argument of `kv_events`: both are reported where the store
    sets its `reads`, as they would be for a new backend in kvobs/store/. Every other read takes any arguments, so
    only the two faults can be reported."""
    others = sorted(name for name in _members(Reads) if name not in ("steps", "kv_events"))
    stubs = "".join(f"    def {name}(self, *args: Any, **kwargs: Any) -> Any: ...\n" for name in others)
    module = tmp_path / "half_backend.py"
    module.write_text(
        "from typing import Any\n\nfrom kvobs.store.interface import Reads\n\n\n"
        "class HalfReads:\n"
        f"{stubs}"
        "    def kv_events(self, since=None, until=None, *, kind=None, session_id=None, limit=None) -> Any: ...\n"
        "\n\nreads: Reads = HalfReads()\n"
    )
    result = mypy("--config-file", str(ROOT / "pyproject.toml"), str(module))
    assert result.returncode == 1, result.stdout
    assert 'Incompatible types in assignment (expression has type "HalfReads", variable has type "Reads")' in (
        result.stdout
    )
    assert '"HalfReads" is missing following "Reads" protocol member' in result.stdout, result.stdout
    assert "note:     steps" in result.stdout, result.stdout  # the read it lacks
    assert "kind: Any" in result.stdout, result.stdout  # kv_events' renamed argument (the protocol's is `kinds`)


def _members(protocol) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}
