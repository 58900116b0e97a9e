"""`bench/dashboard_queries.py --baseline REF` at a small size, for real: REF checked out in a worktree of its own,
its script run there on the very store this run read, and each figure given against REF's."""

from __future__ import annotations

import re
import sys
from pathlib import Path

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


def test_each_figure_is_given_against_the_baseline_commit(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["dashboard_queries.py"])
    import dashboard_queries

    rows = dashboard_queries.main(
        ["--sizes", "sqlite:2000", "--dir", "stores", "--no-render", "--repeats", "1", "--baseline", "HEAD"]
    )
    assert rows and all(re.fullmatch(r"HEAD \([\d.e+-]+ s\)", row.baseline) for row in rows)
    for row in rows:
        base = float(row.baseline.split("(")[1].split(" s)")[0])
        assert abs(row.ratio - row.value / base) <= 0.01 * row.ratio + 1e-9  # (the baseline's printed to 3 digits)
    assert [p.name for p in (tmp_path / "stores").iterdir() if p.suffix == ".db"] == [
        "bench-dashboard-2000-20-step-sessions-1-instances.db"  # the one store, read by both runs
    ]
    assert (
        "Pages, on the same stores (seconds: below 1x, faster) against HEAD, measured in this run"
        in capsys.readouterr().out
    )
