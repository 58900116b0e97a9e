"""`bench/ttft_by_source.py`, run for real at small prefixes: each case's lookup is checked against what it claims
(the engine's own PrefixLookup events: a miss finds nothing, a device hit its prefix in the cache, a tier hit its
prefix in the offload tier), and every case is recorded against a miss at its length."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.running import run_bench


def test_each_source_is_what_its_lookup_found_and_is_recorded(tmp_path):
    run_bench("ttft_by_source.py", ["--lengths", "32,64", "--repeats", "1"], tmp_path)
    recorded = (tmp_path / "results" / "ttft_by_source.md").read_text()
    rows = [line.split(" | ") for line in recorded.splitlines() if line.startswith("| ttft_by_source |")]
    cases = [row[1] for row in rows]
    assert cases == [
        f"TTFT, {n}-token prefix: {case}" for n in (32, 64) for case in ("miss", "device-cache hit", "offload-tier hit")
    ]
    assert all(float(row[2].split()[0].replace(",", "")) > 0 for row in rows)
    assert all(row[3].endswith("a miss at the same length |") for row in rows)
    assert [row[3].split("x")[0] for row in rows][::3] == ["1.00", "1.00"]  # (each length's baseline: its miss)


def test_a_case_whose_lookup_differs_stops_the_run(monkeypatch):
    """A prompt never seen, measured as a device hit: its lookup found nothing, so the bench refuses the figure."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    from ttft_by_source import DEVICE, MISS, measure

    from instrumented_engine import LLM

    llm = LLM(progress=False, num_blocks=16, block_size=16, max_model_len=64)
    prompt = list(range(1000, 1040))
    with pytest.raises(RuntimeError, match="found 0 tokens in the device cache and 0 in the offload tier, not 32"):
        measure(llm, prompt, DEVICE, 32)
    assert measure(llm, list(range(2000, 2040)), MISS, 32) > 0
