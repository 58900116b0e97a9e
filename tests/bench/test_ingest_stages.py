"""`bench/collector_ingest.py --stages WORD...`: the named stages only, beside each table's baseline, for a cheap A/B;
run for real at a small size."""

from __future__ import annotations

from pathlib import Path

from tests.bench.running import run_bench

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_words_pick_stages_and_the_baseline_stays_first(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from collector_ingest import SCRAPE_STAGES, chosen

    stages = ["decode", "decode + attribute", "decode + attribute + SQLite", "decode + attribute + chDB"]
    assert chosen(stages, None) == stages
    assert chosen(stages, ["CHDB"]) == ["decode", "decode + attribute + chDB"]
    assert chosen(stages, ["attribute +"]) == ["decode", "decode + attribute + SQLite", "decode + attribute + chDB"]
    assert chosen(stages, ["nothing"]) == ["decode"]
    assert chosen(SCRAPE_STAGES, ["derive"]) == ["prometheus_client parse", "parse_metrics + derive"]


def test_only_the_named_stages_run_and_are_recorded(tmp_path):
    args = ["--batches", "20", "--events", "20", "--repeats", "1", "--stages", "attribute + SQLite"]
    run_bench("collector_ingest.py", args, tmp_path)
    recorded = (tmp_path / "results" / "collector_ingest.md").read_text()
    cases = [line.split(" | ")[1] for line in recorded.splitlines() if line.startswith("| collector_ingest |")]
    assert cases == [
        "KV events: decode",
        "KV events: decode + attribute + SQLite",
        "KV events: decode + attribute + SQLite, pure Python",  # (the fallback beside the compiled core)
        "KV events: decode + attribute + SQLite, writes in a child process",
    ]
    assert "--stages 'attribute + SQLite'" in recorded.splitlines()[0]
