"""The KV ingest's core, a tier's hash chains and block clock: compiled (C++ bound by Cython, `chain_table.hpp`,
built by `python -m collectors.kv.core.build`, which `scripts/install.sh` runs) where it is built, else the pure
Python (`collectors.kv.chains.ChainTracker` over `kvobs.block_clock.BlockClock`), which gives the same rows
(tests/collectors/test_kv_core.py holds them together). Which one runs is said at start and on `/metrics`
(`kvobs_collector_kv_core_compiled`). `KVOBS_KV_CORE=python` chooses the pure path on purpose.

    core = load()
    chains = core.new_chains()           # what KVIngest keeps a tier in
    core.compiled, core.why              # True, "" / False, why not
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from collectors.kv import chains
from collectors.kv.batch_rows import BatchRows
from kvobs.block_clock import BlockClock

log = logging.getLogger(__name__)

CHOICE_ENV = "KVOBS_KV_CORE"  # "compiled" (the default where built) or "python"


@dataclass(frozen=True)
class Core:
    compiled: bool
    new_chains: Callable  # (max_blocks=..., clock=None) -> a tier's chains
    new_clock: Callable  # (max_blocks=..., horizon_s=...) -> a tier's block clock
    new_rows: Callable  # () -> a batch's rows, which its chains' `store_rows` and `remove_rows` fill
    why: str = ""  # why the pure path runs ("" when compiled)

    @property
    def name(self) -> str:
        return "compiled (C++)" if self.compiled else "pure Python"


@cache
def compiled_module():
    """The compiled core's module, loaded from its build; None when it is not built."""
    from collectors.kv.core import build  # (not at import: `python -m collectors.kv.core.build` runs it as main)

    path = build.built()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(f"{__name__}.{build.MODULE}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(choice: str | None = None) -> Core:
    """The core to run: `choice` ("compiled" / "python"), by default `KVOBS_KV_CORE`'s, else the compiled one
    where it is built."""
    choice = (choice or os.environ.get(CHOICE_ENV) or "compiled").lower()
    if choice == "python":
        return _python(f"{CHOICE_ENV}=python")
    if choice != "compiled":
        raise ValueError(f"{CHOICE_ENV} is 'compiled' or 'python', not {choice!r}")
    try:
        module = compiled_module()
    except ImportError as e:  # (a build for another interpreter, or a broken one)
        return _python(f"its build did not load ({e})")
    if module is None:
        return _python("it is not built (python -m collectors.kv.core.build)")
    return Core(True, module.CompiledChains, module.CompiledClock, module.CompiledRows)


def _python(why: str) -> Core:
    return Core(False, chains.ChainTracker, BlockClock, BatchRows, why)


def say(core: Core) -> None:
    """The log line a collector starts with."""
    if core.compiled:
        log.info("KV ingest core: compiled (C++, %s)", compiled_module().__file__)
    else:
        log.warning(
            "KV ingest core: pure Python, as %s: the compiled core is the faster (bench/results/collector_ingest.md)",
            core.why,
        )
