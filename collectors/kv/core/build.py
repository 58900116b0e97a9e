"""Build the compiled ingest core (`chain_table.hpp` bound by `_chain_table.pyx`) with Cython and this machine's C++
compiler, into the Python environment it is for: `<prefix>/share/kvobs/kv_core/<sources' digest>/`, so a build of
other sources is never loaded, and two checkouts with their own virtual environments never share one. `scripts/
install.sh` runs it; `collectors.kv.core` loads what it built, and says the pure-Python path where none is.

    python -m collectors.kv.core.build       # build now; prints where and how long
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = [HERE / "chain_table.hpp", HERE / "_chain_table.pyx", HERE / "_rows.pxi"]
MODULE = "_chain_table"
CXX_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", "-DNDEBUG"]


def digest() -> str:
    """The sources' digest (and the Python's ABI): what names a build."""
    h = hashlib.sha256(sysconfig.get_config_var("EXT_SUFFIX").encode())
    for source in SOURCES:
        h.update(source.read_bytes())
    return h.hexdigest()[:16]


def build_directory(prefix: str | None = None) -> Path:
    """`<prefix>/share/kvobs/kv_core/<digest>` (`prefix`: `sys.prefix`), else, where that cannot be written, the
    user's cache."""
    for root in (Path(prefix or sys.prefix) / "share" / "kvobs", Path.home() / ".cache" / "kvobs"):
        folder = root / "kv_core" / digest()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise OSError(f"no folder to build the KV ingest core in (tried {sys.prefix} and the user's cache)")


def built(prefix: str | None = None) -> Path | None:
    """The build of these sources, if there is one."""
    for root in (Path(prefix or sys.prefix) / "share" / "kvobs", Path.home() / ".cache" / "kvobs"):
        path = root / "kv_core" / digest() / (MODULE + sysconfig.get_config_var("EXT_SUFFIX"))
        if path.is_file():
            return path
    return None


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def build(prefix: str | None = None) -> Path:
    """Compile the core; returns the module's path. Raises RuntimeError saying what is missing or what failed."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++; or $CXX)")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise RuntimeError(f"no Python headers in {include} (the python3-dev package)")
    try:
        import Cython  # noqa: F401  (the collectors extra brings it)
    except ImportError as e:
        raise RuntimeError("Cython is not installed (pip install 'kvobs[collectors]')") from e
    folder = build_directory(prefix)
    target = folder / (MODULE + sysconfig.get_config_var("EXT_SUFFIX"))
    with tempfile.TemporaryDirectory(prefix="kvobs-kv-core-") as tmp:
        cpp = Path(tmp) / f"{MODULE}.cpp"
        _run([sys.executable, "-m", "cython", "--cplus", "-3", str(HERE / f"{MODULE}.pyx"), "-o", str(cpp)])
        partial = Path(tmp) / target.name
        _run([cxx, *CXX_FLAGS, f"-I{include}", f"-I{HERE}", str(cpp), "-o", str(partial)])
        shutil.move(partial, target)  # (whole or not at all: a build killed half-way leaves nothing to load)
    return target


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{Path(command[0]).name} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def main() -> None:
    started = time.perf_counter()
    try:
        path = build()
    except (RuntimeError, OSError) as e:
        print(f"the compiled KV ingest core did not build: {e}", file=sys.stderr)
        sys.exit(1)
    print(f"built the compiled KV ingest core in {time.perf_counter() - started:.1f} s ({path})")


if __name__ == "__main__":
    main()
