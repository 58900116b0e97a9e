"""Issue 72's decision, measured: which compiled core, on one slice of the collector's attribution.

The slice is one tier's hash chains and block clock (`collectors/kv/chains.py`'s ChainTracker and
`kvobs/block_clock.py`'s BlockClock, as `KVIngest` calls them for the device tier): per stored event the blocks new or
announced again and their restores; per removed event each block's parent, owners and lifetime; the footprints. It is
run on the KV events of `bench/collector_ingest.py`'s workload four ways, each built here from this checkout:

- pure Python (the baseline: the collector as it is);
- the same two modules compiled as they are by Cython (no source change);
- one C++ table (`bench/core_slice/chain_table.hpp`) bound with pybind11;
- the same C++ table bound with nanobind;
- the same C++ table bound with Cython (`cdef extern`).

Every way's answers are compared with the pure path's, event for event, before any time is taken, on the workload and
on a random stream made to hit every branch (blocks announced again by other sessions, removals of blocks never
stored, restores within and past the clock's horizon, stores naming no session): a way that differs fails the run.
Time is CPU time a wire event, the median of `--repeats`, with the floor beside it (the same loop and calls answering
nothing); memory is the process's resident growth a tracked block, `--memory-blocks` stored in chains of four over
many sessions.

    python bench/core_slice.py [--batches 2000] [--events 50] [--memory-blocks 1000000] [--build-dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from collector_ingest import synthetic_payloads, workload_arguments  # bench/ is on sys.path
from results import Result, detail, record

from kvobs.block_events import Removed, Stored
from kvobs.vllm.normalize import decode

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "core_slice"
ROOT = HERE.parent
STORED, REMOVED = 0, 1
Event = tuple  # (STORED, hashes, parent, session, ts) or (REMOVED, hashes, None, None, ts)


def slice_events(payloads: list[bytes]) -> list[Event]:
    """The device tier's stores and removals of the payloads, as `KVIngest` hands them to its chains."""
    events: list[Event] = []
    for payload in payloads:
        batch = decode(payload).batch
        for event in batch.events:
            if type(event) is Stored:
                events.append((STORED, event.hashes, event.parent, event.session_id, batch.ts))
            elif type(event) is Removed:
                events.append((REMOVED, event.hashes, None, None, batch.ts))
    return events


def python_way(chains_module) -> Callable[..., tuple[list, Callable]]:
    """The slice through `ChainTracker` (a module of it: the source, or its Cython build); `keep` False: each
    event's answers dropped once made, as the ingest drops them once its rows are made (timed so)."""

    def run(events: list[Event], keep: bool = True) -> tuple[list, Callable]:
        chains = chains_module.ChainTracker()
        stored, removed, lost, at = chains.stored, chains.removed, chains.clock.lost, chains_module.STORED_AT
        came_back, out = chains.clock.came_back, _Answers(keep)
        for kind, hashes, parent, session, ts in events:
            if kind == STORED:
                firsts = stored(hashes, parent, session, ts)
                out.append((firsts, came_back(hashes, ts)))
            else:
                blocks = [removed(h, True) for h in hashes]
                lifetimes = lost(hashes, ts, [None if b is None else b[at] for b in blocks])
                parents = [None if b is None else b[0] for b in blocks]
                out.append((parents, [(None,) if b is None else b[1] for b in blocks], lifetimes))

        def footprint(session):
            fp = chains.footprints.get(session)
            return None if fp is None else (fp.resident, fp.stored, fp.removed)

        return out, footprint

    return run


def compiled_way(table_class) -> Callable[..., tuple[list, Callable]]:
    """The slice through a compiled table (`stored` and `removed` a whole event at a time)."""

    def run(events: list[Event], keep: bool = True) -> tuple[list, Callable]:
        table = table_class()
        stored, removed, out = table.stored, table.removed, _Answers(keep)
        for kind, hashes, parent, session, ts in events:
            out.append(stored(hashes, parent, session, ts) if kind == STORED else removed(hashes, True, ts))
        return out, table.footprint

    return run


class _NoOp:
    """The harness's own cost: the same loop and calls, answering nothing (the floor of any core called a event)."""

    def stored(self, hashes, parent, session, ts):
        return None

    def removed(self, hashes, lost, ts):
        return None

    def footprint(self, session):
        return None


FLOOR = "the loop alone (calls that do nothing)"


class _Answers(list):
    """Each event's answers, kept, or only the last (a timed run: no answer outlives its event, as in the ingest)."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.last = None
        if not keep:
            self.append = self._last  # type: ignore[method-assign]

    def _last(self, answer) -> None:
        self.last = answer


# ---- building the ways ---------------------------------------------------------------------------------------------
def build(build_dir: Path) -> dict[str, float]:
    """Build the three compiled ways into `build_dir` (on sys.path after); each one's build time in seconds."""
    build_dir.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    took: dict[str, float] = {}
    # the pure modules as they are, under their own names (their one import of each other renamed to match)
    started = time.perf_counter()
    clock = (ROOT / "kvobs" / "block_clock.py").read_text()
    chains = (ROOT / "collectors" / "kv" / "chains.py").read_text()
    (build_dir / "asis_block_clock.py").write_text(clock)
    renamed = re.sub(r"from kvobs\.block_clock import", "from asis_block_clock import", chains)
    (build_dir / "asis_chains.py").write_text(renamed)
    cythonize = [python, "-m", "Cython.Build.Cythonize", "-i", "-3", "-q", "-X", "annotation_typing=False"]
    _run([*cythonize, "asis_block_clock.py", "asis_chains.py"], build_dir)
    took["Cython, the Python as it is"] = time.perf_counter() - started
    started = time.perf_counter()
    import pybind11

    flags = ["-O2", "-shared", "-std=c++17", "-fPIC", "-fvisibility=hidden", f"-I{pybind11.get_include()}"]
    flags += [f"-I{sysconfig.get_paths()['include']}", f"-I{SOURCES}"]
    _run(["g++", *flags, str(SOURCES / "pybind_chain_table.cpp"), "-o", f"pybind_chain_table{suffix}"], build_dir)
    took["C++, pybind11"] = time.perf_counter() - started
    started = time.perf_counter()
    import nanobind

    nb = Path(nanobind.__file__).parent
    flags = ["-O2", "-shared", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-DNDEBUG", f"-I{nb / 'include'}"]
    flags += [f"-I{nb / 'ext' / 'robin_map' / 'include'}", f"-I{sysconfig.get_paths()['include']}", f"-I{SOURCES}"]
    sources = [str(SOURCES / "nanobind_chain_table.cpp"), str(nb / "src" / "nb_combined.cpp")]
    _run(["g++", *flags, *sources, "-o", f"nanobind_chain_table{suffix}"], build_dir)
    took["C++, nanobind"] = time.perf_counter() - started
    started = time.perf_counter()
    for name in ("cython_chain_table.pyx", "chain_table.hpp"):
        shutil.copy(SOURCES / name, build_dir / name)
    _run([python, "-m", "Cython.Build.Cythonize", "-i", "-q", "cython_chain_table.pyx"], build_dir)
    took["C++, Cython"] = time.perf_counter() - started
    return took


def _run(command: list[str], cwd: Path) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"build failed: {' '.join(command)}\n{done.stderr[-3000:]}")


def ways(build_dir: Path) -> dict[str, Callable]:
    sys.path.insert(0, str(build_dir))
    import collectors.kv.chains as source

    return {
        "pure Python": python_way(source),
        "Cython, the Python as it is": python_way(importlib.import_module("asis_chains")),
        "C++, pybind11": compiled_way(importlib.import_module("pybind_chain_table").ChainTable),
        "C++, nanobind": compiled_way(importlib.import_module("nanobind_chain_table").ChainTable),
        "C++, Cython": compiled_way(importlib.import_module("cython_chain_table").CyChainTable),
        FLOOR: compiled_way(_NoOp),
    }


# ---- the same answers, then the time and memory --------------------------------------------------------------------
def normalized(out: list) -> list:
    """Each event's answers as plain lists (a binding may give a tuple where Python gives a list)."""
    return [tuple(None if part is None else list(part) for part in answer) for answer in out]


def random_events(n: int, seed: int = 0) -> list[Event]:
    """A stream that hits every branch: hashes drawn from a small pool (stored again, by other sessions, removed when
    never stored, restored), sessions sometimes None, time jumping past the clock's horizon now and then."""
    from random import Random

    rng, ts, events = Random(seed), 0.0, []
    pool = [rng.getrandbits(64) for _ in range(300)]
    sessions = [None, "a", "b", "c", "d"]
    for _ in range(n):
        ts += 5000.0 if rng.random() < 0.01 else rng.random()
        hashes = rng.sample(pool, rng.randint(1, 5))
        if rng.random() < 0.55:
            parent = rng.choice([None, rng.choice(pool)])
            events.append((STORED, hashes, parent, rng.choice(sessions), ts))
        else:
            events.append((REMOVED, hashes, None, None, ts))
    return events


def check_same(runs: dict[str, Callable], events: list[Event]) -> None:
    """Every way gives the pure path's answers and footprints, event for event; else the run stops naming the first
    difference."""
    expected, footprint = runs["pure Python"](events)
    expected = normalized(expected)
    sessions = {event[3] for event in events}
    want = {s: footprint(s) for s in sessions}
    for name, run in runs.items():
        if name == FLOOR:
            continue
        got, got_footprint = run(events)
        got = normalized(got)
        for i, (a, b) in enumerate(zip(expected, got)):
            if a != b:
                raise SystemExit(f"{name} differs from pure Python at event {i}: {b!r} != {a!r}")
        if len(got) != len(expected):
            raise SystemExit(f"{name} answered {len(got)} events of {len(expected)}")
        differ = [s for s in sessions if got_footprint(s) != want[s]]
        if differ:
            raise SystemExit(f"{name}'s footprint of {differ[0]!r}: {got_footprint(differ[0])} != {want[differ[0]]}")


def cpu_us(run: Callable, events: list[Event], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        started = time.process_time()
        run(events, keep=False)
        times.append(time.process_time() - started)
    return statistics.median(times) / len(events) * 1e6


def memory_bytes(way: str, build_dir: Path, blocks: int) -> float:
    """Resident growth a tracked block, in a fresh process (so that one way's heap does not hold the next's)."""
    script = (
        "import os, sys; sys.path[:0] = [os.environ['KVOBS_BENCH'], os.environ['KVOBS_BUILD']]\n"
        "import core_slice\n"
        f"print(core_slice.resident_growth({way!r}, {blocks}))\n"
    )
    env = {**os.environ, "KVOBS_BENCH": str(HERE), "KVOBS_BUILD": str(build_dir)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"memory of {way} failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.split()[-1]) / blocks


def resident_growth(way: str, blocks: int) -> int:
    """Bytes the process grew by with `blocks` stored through `way`, in chains of four over 10,000 sessions."""
    from random import Random

    build_dir = Path(os.environ["KVOBS_BUILD"])
    rng = Random(0)
    hashes = [rng.getrandbits(64) for _ in range(blocks)]
    sessions = [f"sess-{i:05d}" for i in range(10_000)]
    table = _table(way, build_dir)
    before = _rss()
    for i in range(0, blocks, 4):
        table(hashes[i : i + 4], hashes[i - 1] if i else None, sessions[(i // 4) % len(sessions)], float(i))
    return _rss() - before


def _table(way: str, build_dir: Path) -> Callable:
    sys.path.insert(0, str(build_dir))
    if way == "pure Python":
        from collectors.kv.chains import ChainTracker

        return ChainTracker(max_blocks=1 << 62).stored
    if way == "Cython, the Python as it is":
        return importlib.import_module("asis_chains").ChainTracker(max_blocks=1 << 62).stored
    if way == "C++, pybind11":
        return importlib.import_module("pybind_chain_table").ChainTable().stored
    if way == "C++, nanobind":
        return importlib.import_module("nanobind_chain_table").ChainTable().stored
    return importlib.import_module("cython_chain_table").CyChainTable().stored


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_arguments(parser)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-blocks", type=int, default=1_000_000, help="0: no memory measure")
    parser.add_argument("--build-dir", type=Path, help="where the compiled ways are built (default: a temporary one)")
    args = parser.parse_args(argv)
    build_dir = args.build_dir or Path(tempfile.mkdtemp(prefix="kvobs-core-slice-"))
    took = build(build_dir)
    runs = ways(build_dir)
    payloads, _ = synthetic_payloads(args.batches, args.events, args.sessions)
    events = slice_events(payloads)
    check_same(runs, random_events(20_000))
    check_same(runs, events)
    print(f"\nThe slice (chains + block clock, device tier): {len(events):,} wire events, every way's answers the same")
    header = f"{'way':<40} {'CPU us/event':>13} {'vs pure':>8} {'bytes/block':>12} {'build s':>8}"
    print(header)
    results, lines = [], ["| way | CPU µs a wire event | vs pure Python | resident bytes a block | build |"]
    lines.append("|---|---|---|---|---|")
    base = base_bytes = None
    for name, run in runs.items():
        us = cpu_us(run, events, args.repeats)
        base = base or us
        measured = args.memory_blocks and name != FLOOR
        per_block = memory_bytes(name, build_dir, args.memory_blocks) if measured else float("nan")
        base_bytes = base_bytes or per_block
        built = took.get(name)
        print(f"{name:<40} {us:>13.3f} {base / us:>7.2f}x {per_block:>12,.0f} {built or 0:>8.1f}")
        results.append(Result("core_slice", f"chains + clock: {name}", us, "µs/event", us / base, "pure Python"))
        if measured:
            ratio = per_block / base_bytes
            results.append(Result("core_slice", f"resident a block: {name}", per_block, "bytes", ratio, "pure Python"))
        said_built = "-" if built is None else f"{built:.1f} s"
        said_bytes = f"{per_block:,.0f}" if measured else "-"
        lines.append(f"| {name} | {us:.3f} | {base / us:.2f}x | {said_bytes} | {said_built} |")
    detail("core_slice", "\n".join(lines))
    return results


if __name__ == "__main__":
    record(main)
