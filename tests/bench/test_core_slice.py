"""`bench/core_slice.py`, issue 72's decision: one slice of the collector's attribution (hash chains + block clock)
compiled three ways. Its comparison of every way's answers with the pure path's must catch a way that differs; and
the bench, built and run for real at a small size, gives every way the same answers and records each."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.running import run_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def core_slice(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import core_slice

    return core_slice


def test_the_random_stream_reaches_every_branch_of_the_chains(core_slice):
    """The stream the ways are compared on stores blocks again (by other sessions too), removes blocks never stored,
    restores lost ones within the horizon and past it, and stores blocks of no session."""
    from collectors.kv.chains import ChainTracker

    chains = ChainTracker()
    restores = owners_added = 0
    for kind, hashes, parent, session, ts in core_slice.random_events(20_000):
        if kind == core_slice.STORED:
            before = [chains.block(h) for h in hashes]
            owners_added += sum(b is not None and session not in b[1] for b in before)
            chains.stored(hashes, parent, session, ts)
            restores += chains.clock.came_back(hashes, ts) is not None
        else:
            stored_at = [None if b is None else b[2] for b in map(chains.removed, hashes)]
            assert len(chains.clock.lost(hashes, ts, stored_at)) == len(hashes)
    assert chains.num_repeated and chains.num_unknown_removed and restores and owners_added
    assert None in chains.footprints and len(chains.footprints) == 5


def test_a_way_that_answers_differently_stops_the_run(core_slice):
    from collectors.kv import chains

    events = core_slice.random_events(2_000)
    right = core_slice.python_way(chains)

    def wrong(events, keep=True):
        out, footprint = right(events, keep)
        out[-1] = (None, None, None)  # the last event answered otherwise
        return out, footprint

    core_slice.check_same({"pure Python": right, "a way": right}, events)
    with pytest.raises(SystemExit, match="a way differs from pure Python at event 1999"):
        core_slice.check_same({"pure Python": right, "a way": wrong}, events)


def test_every_way_is_built_and_gives_the_pure_paths_answers(tmp_path):
    args = ["--batches", "40", "--events", "25", "--repeats", "1", "--memory-blocks", "20000"]
    out = run_bench("core_slice.py", [*args, "--build-dir", str(tmp_path / "build")], tmp_path)
    assert "every way's answers the same" in out
    recorded = (tmp_path / "results" / "core_slice.md").read_text()
    cases = [line.split(" | ")[1] for line in recorded.splitlines() if line.startswith("| core_slice |")]
    ways = ["pure Python", "Cython, the Python as it is", "C++, pybind11", "C++, nanobind", "C++, Cython"]
    assert cases == [case for way in ways for case in (f"chains + clock: {way}", f"resident a block: {way}")] + [
        "chains + clock: the loop alone (calls that do nothing)"
    ]
