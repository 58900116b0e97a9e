"""A benchmark script run for real, as its user runs it: in a directory of the test's own, its results file there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, args: list[str], tmp_path: Path, *, results: Path | None = None, timeout: int = 600) -> str:
    """The script's stdout once it exits 0 (else the test fails with its stderr's tail); its results file goes to
    `results` (`tmp_path / "results"` by default)."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={**os.environ, "KVOBS_BENCH_RESULTS_DIR": str(results or tmp_path / "results")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
