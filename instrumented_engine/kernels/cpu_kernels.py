"""The C++ CPU operations (`csrc/`: the paged decode kernel, `paged_decode_cpu.cpp`, and the fused elementwise
layers, `fused_cpu.cpp`): built once per environment with `torch.utils.cpp_extension` (`scripts/install.sh` builds
it; otherwise the first engine start does) and loaded from there after that. The build lives in the Python
environment it was made for (`build_directory`: under `sys.prefix`, named by torch's version and the CPU's vector
instructions), so two checkouts, each with its virtual environment, never rebuild or wait on each other's; a
prefix that cannot be written (a system Python) uses torch's own extension cache under the same name. Where it
cannot be built (no C++ compiler) the engine uses the pure-torch reference and fused.py's torch layers, and says
why. `KVOBS_CPU_KERNEL=torch` chooses them on purpose.

    python -m instrumented_engine.kernels.cpu_kernels      # build now; prints where and how long
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = [CSRC / name for name in ("paged_decode_cpu.cpp", "fused_cpu.cpp", "bindings.cpp")]
CHOICE_ENV = "KVOBS_CPU_KERNEL"  # "cpp" (default) or "torch"
# Vector flags by what torch found the CPU to have; the build is named after them, so a cache shared between
# machines never loads code built for instructions this one lacks.
ARCH_FLAGS = {"AVX512": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl"], "AVX2": ["-mavx2", "-mfma"]}
# -ffast-math lets the compiler vectorise the dot products (sums in another order: float32 rounding, tested) and
# exp (glibc's vector math); the kernel never meets an infinity or a NaN of its own making.
MATH_FLAGS = ["-O3", "-ffast-math"]
STALE_LOCK_S = 600.0  # a build takes a minute or two: a lock this old was left by one that was killed

_loaded: dict[str, object] = {}


def build_name() -> str:
    """The build's name: torch's version and the CPU's vector capability (a build for one never loads for another)."""
    version = re.sub(r"[^0-9A-Za-z]+", "_", torch.__version__)
    return f"kvobs_cpu_ops_{torch.backends.cpu.get_cpu_capability().lower()}_torch{version}"


def build_directory(name: str | None = None, prefix: str | None = None) -> Path:
    """Where this environment builds and loads the operations: `<prefix>/share/kvobs/torch_extensions/<name>`
    (`prefix`: `sys.prefix`, the virtual environment), else, when that cannot be written, torch's extension
    cache."""
    from torch.utils.cpp_extension import _get_build_directory

    name = name or build_name()
    folder = Path(prefix or sys.prefix) / "share" / "kvobs" / "torch_extensions" / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    return Path(_get_build_directory(name, False))


def _build(verbose: bool = False):
    from torch.utils.cpp_extension import load

    flags = ARCH_FLAGS.get(torch.backends.cpu.get_cpu_capability(), [])
    name = build_name()
    folder = build_directory(name)
    clear_stale_lock(folder / "lock")
    return load(
        name=name,
        sources=[str(s) for s in SOURCES],
        extra_cflags=MATH_FLAGS + flags,
        build_directory=str(folder),
        verbose=verbose,
    )


def clear_stale_lock(lock: Path, *, stale_after_s: float = STALE_LOCK_S) -> bool:
    """torch's extension build holds `lock` while it compiles and waits, without end or word, while the file
    exists; a build killed midway (Ctrl-C, a killed install) leaves it behind. A lock older than any build takes is
    removed, and said; a younger one is said, since its build may be running. Returns whether it was removed."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < stale_after_s:
        log.warning(
            "another build of the C++ CPU operations holds %s (since %.0f s): waiting for it; if no build is "
            "running, delete that file",
            lock,
            age,
        )
        return False
    lock.unlink(missing_ok=True)
    log.warning("removed %s, left %.0f s ago by a build that did not finish (killed?); building again", lock, age)
    return True


def load_ops():
    """(the built module, "cpp") or (None, why the torch versions are used instead)."""
    if os.environ.get(CHOICE_ENV, "cpp") == "torch":
        return None, f"{CHOICE_ENV}=torch"
    if "module" not in _loaded:
        try:
            _loaded["module"] = _build()
        except Exception as exc:  # no compiler, no headers: the reference runs everywhere
            _loaded["module"] = None
            _loaded["why"] = f"the C++ operations could not be built ({str(exc).splitlines()[0][:200]})"
            log.warning("%s: decode attention and the fused layers run on pure torch", _loaded["why"])
    module = _loaded["module"]
    return (module, "cpp") if module is not None else (None, _loaded["why"])


def load_decode() -> tuple[Callable[..., torch.Tensor] | None, str]:
    """(the C++ decode attention, "cpp") or (None, why the reference is used instead)."""
    module, why = load_ops()
    return (module.paged_decode_attention, why) if module is not None else (None, why)


def main() -> None:
    started = time.perf_counter()
    module = _build(verbose=False)
    print(f"built {module.__name__} in {time.perf_counter() - started:.1f} s ({module.__file__})")


if __name__ == "__main__":
    main()
