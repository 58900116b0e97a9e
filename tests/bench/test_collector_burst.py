"""`bench/collector_burst.py`: a real collector absorbs a publisher's burst; every row is counted until committed."""

from __future__ import annotations

from pathlib import Path

from tests.bench.running import run_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_a_burst_is_absorbed_without_loss_and_recorded(tmp_path):
    out = run_bench("collector_burst.py", ["--rate", "1000", "--burst-s", "2", "--calm-s", "1"], tmp_path)
    assert "every block row stored" in out  # (the run fails unless the store holds every block row)
    recorded = (tmp_path / "results" / "collector_burst.md").read_text()
    assert "| units that found the store queue full / rows dropped / batches lost | 0 / 0 / 0 |" in recorded
    cases = [line.split(" | ")[1] for line in recorded.splitlines() if line.startswith("| collector_burst |")]
    assert cases == [
        "10x burst for 2 s into SQLite: offered window over achieved",
        "10x burst for 2 s into SQLite: longest wait in the store writer",
    ]
