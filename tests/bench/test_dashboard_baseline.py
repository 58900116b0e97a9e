"""`bench/dashboard_queries.py --baseline REF` at a small size, for real: REF checked out in a worktree of its own,
its script run there on the very store this run read, and each figure given against REF's."""

from __future__ import annotations

import re
from pathlib import Path

from tests.bench.running import run_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_baseline_reads_the_same_stores_from_its_worktree(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import dashboard_queries

    flags = ["--sizes", "sqlite:2000", "--dir", "stores", "--baseline", "abc1234", "--no-render", "--dir=x"]
    assert dashboard_queries.baseline_flags(flags, "stores") == [
        "--sizes",
        "sqlite:2000",
        "--no-render",
        "--dir",
        str(Path("stores").resolve()),  # (relative, it would name an empty store inside the baseline's worktree)
    ]


def test_each_figure_is_given_against_the_baseline_commit(tmp_path):
    """Run as its own process, as a user runs it (its pool's children then start from the script, not from pytest)."""
    results = tmp_path / "results"
    args = ["--sizes", "sqlite:2000", "--dir", "stores", "--no-render", "--repeats", "1", "--baseline", "HEAD"]
    out = run_bench("dashboard_queries.py", args, tmp_path, results=results)
    rows = [line.split(" | ") for line in (results / "dashboard_queries.md").read_text().splitlines()]
    rows = [row for row in rows if len(row) == 4 and row[0] == "| dashboard_queries"]
    assert rows
    for _, case, value, against in rows:
        found = re.fullmatch(r"([\d.]+)x HEAD \(([\d.e+-]+) s\) \|", against)
        assert found, (case, against)
        ratio, base = float(found[1]), float(found[2])
        assert abs(ratio - float(value.split()[0]) / base) <= 0.02 * ratio + 0.01  # (each figure printed to 3 digits)
    assert [p.name for p in (tmp_path / "stores").iterdir() if p.suffix == ".db"] == [
        "bench-dashboard-2000-20-step-sessions-1-instances.db"  # the one store, read by both runs
    ]
    assert "Pages, on the same stores (seconds: below 1x, faster) against HEAD, measured in this run" in out
