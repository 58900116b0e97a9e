"""A benchmark run again at another commit, in the same run: the baseline of the code before a change, measured on the
same machine minutes apart rather than quoted from an older results file (a shared VM's speed changes by the day).

    rates = at_commit("4edd3b0", "collector_ingest.py", ["--batches", "2000"])   # case -> value, as its file says

The commit is checked out into a temporary git worktree (with the fixtures the benchmarks read, under `tests/`), and
its own script runs there with its own code first on the path (the same virtual environment: the
commit must need no other packages); its results file goes to a temporary directory and is read back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from results import Result, figure  # bench/ is on sys.path when a script in it runs
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
_ROW = re.compile(r"^\| (?P<bench>[^|]+) \| (?P<case>[^|]+) \| (?P<value>[-\d,.e+]+) (?P<unit>[^|]*) \|")


def at_commit(ref: str, script: str, argv: list[str]) -> dict[str, float]:
    """Each case's value from `bench/SCRIPT` run at git `ref` with `argv`."""
    with tempfile.TemporaryDirectory(prefix="kvobs-baseline-") as tmp:
        tree, results = Path(tmp) / "tree", Path(tmp) / "results"
        git = ["git", "-C", str(ROOT)]
        subprocess.run([*git, "worktree", "add", "--detach", str(tree), ref], check=True, capture_output=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(tree), "KVOBS_BENCH_RESULTS_DIR": str(results)}
            tqdm.write(f"baseline: bench/{script} at {ref}")
            subprocess.run([sys.executable, str(tree / "bench" / script), *argv], cwd=tree, env=env, check=True)
            return parse(results / f"{Path(script).stem}.md")
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(tree)], check=False, capture_output=True)


def baseline_argv(flags: list[str]) -> list[str]:
    """This run's flags, less `--baseline REF` (or `--baseline=REF`): the baseline's own run of the same benchmark."""
    out, given = [], iter(flags)
    for flag in given:
        if flag == "--baseline":
            next(given, None)  # (and its value)
        elif not flag.startswith("--baseline="):
            out.append(flag)
    return out


def parse(results_file: Path) -> dict[str, float]:
    """A results file's table as case -> value (`results.table`'s rows)."""
    rates = {}
    for line in results_file.read_text().splitlines():
        found = _ROW.match(line)
        if found:
            rates[found["case"].strip()] = float(found["value"].replace(",", ""))
    return rates


def against(
    rows: list[Result], ref: str, found: dict[str, float], *, what: str, unit: str | None = None
) -> list[Result]:
    """Each row's value over REF's (`found`, measured in the same run), printed and in its results row; rows REF did not
    measure, or (with `unit`) in another unit, are kept as they were."""
    print(f"\n{what} against {ref}, measured in this run")
    print(f"{'case':<90} {'this commit':>12} {ref:>12} {'ratio':>7}")
    out = []
    for row in rows:
        base = found.get(row.case)
        if base is None or (unit is not None and row.unit != unit):
            out.append(row)
            continue
        ratio = row.value / max(base, 1e-12)
        print(f"{row.case:<90} {figure(row.value):>12} {figure(base):>12} {ratio:>6.2f}x")
        out.append(Result(row.benchmark, row.case, row.value, row.unit, ratio, f"{ref} ({figure(base)} {row.unit})"))
    return out
