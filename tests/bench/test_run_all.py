"""`bench/run_all.py --quick` runs every benchmark for real (small sizes) and prints one table with a row per
measured case, each against a baseline measured in the same run."""

from __future__ import annotations

from pathlib import Path

from tests.bench.running import run_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_run_all_quick_prints_one_table_over_every_benchmark(tmp_path):
    out = run_bench("run_all.py", ["--quick"], tmp_path, timeout=900)
    table = out[out.index("| benchmark | case | value | vs baseline |") :].splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table[2:] if line.startswith("| ")]
    assert {r[0] for r in rows} == {
        "engine_throughput",
        "ttft_by_source",
        "block_manager",
        "fleet_index",
        "telemetry_overhead",
        "collector_ingest",
        "ingest_profile",
        "core_slice",
        "collector_burst",
        "collector_workers",
        "span_steps",
        "ownership",
        "collector_memory",
        "block_registry",
        "rollup_writes",
        "dashboard_queries",
        "whatif_fidelity",
    }
    baselines = {(r[0], r[1]) for r in rows if r[3].startswith("1.00x")}
    assert ("engine_throughput", "kvobs serve (HTTP) (float32)") in {(r[0], r[1]) for r in rows}
    for case in [
        ("engine_throughput", "transformers generate (float32)"),
        ("telemetry_overhead", "telemetry off"),
        ("collector_ingest", "KV events: decode"),
        ("ingest_profile", "decode + attribute, unprofiled"),
        ("core_slice", "chains + clock: pure Python"),
        ("collector_workers", "2 streams into SQLite, --workers 1"),
        ("ttft_by_source", "TTFT, 64-token prefix: miss"),
    ]:
        assert case in baselines
    for row in rows:
        value = float(row[2].split()[0].replace(",", ""))
        if row[0] == "whatif_fidelity":  # a signed error (replay less observed): within the 2 points of evidence
            assert row[2].endswith(" points") and abs(value) <= 2 and float(row[3].split("x")[0]) >= 0, row
            continue
        assert value > 0 and float(row[3].split("x")[0]) > 0, row
    assert [p.name for p in tmp_path.iterdir()] == ["results"]  # --quick keeps its store in a temporary directory
    # each benchmark's results file: the command that reruns it, when, where, and its rows
    for name in {r[0] for r in rows}:
        text = (tmp_path / "results" / f"{name}.md").read_text()
        assert text.startswith(f"`.venv/bin/python bench/run_all.py --quick --only {name}`"), text
        assert "- date: " in text and "- machine: " in text and "logical cores" in text and "- commit: " in text
        assert sum(line.startswith(f"| {name} |") for line in text.splitlines()) == sum(r[0] == name for r in rows)
