"""Each tier's lookups as vLLM's tiering offload manager counts them (`kvobs.analytics.cache.lookups_by_tier`): its
scrapes as vLLM 0.32's own tracker and Prometheus metrics made them
(`tests/fixtures/vllm-tiers/record_tiering_metrics.py`), through the collector's scraper."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvobs.analytics.cache.lookups_by_tier import tier_lookups
from kvobs.store import open_store
from tests.collectors.test_scraper import scrape_all

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "vllm-tiers" / "tiering_metrics.json").read_text())


def test_each_tiers_chunk_lookups_as_vllms_tiering_manager_counts_them(tmp_path):
    """Between the scrapes two requests looked up 9 chunks in the primary tier and found 3; the 6 it missed went to
    the file-system tier, which found 3. The hit series first show after the first scrape: counted from 0."""
    assert RECORDED["vllm"] == "0.32.0"
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    scrape_all(store, RECORDED["scrapes"])
    table = tier_lookups(store)
    said = [(r["instance"], r["tier"], r["unit"], r["asked"], r["found"]) for r in table.to_dict("records")]
    assert said == [("vllm", "0:primary", "chunks", 9, 3), ("vllm", "1:fs", "chunks", 6, 3)]
    assert list(table["found_share"]) == pytest.approx([3 / 9, 3 / 6])
    assert set(table["counted_by"]) == {"vllm:kv_offload_tiering_chunk_queries, vllm:kv_offload_tiering_chunk_hits"}
    kept = store.reads.metric_series(["vllm:kv_offload_tiering_chunk_queries:increase"])
    assert all(set(labels) == {"tier"} for labels in kept["labels"])  # its engine and model labels not kept apart


def test_a_range_without_any_engine_counting_lookups_has_no_rows(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    assert tier_lookups(store).empty and list(tier_lookups(store).columns)[:2] == ["instance", "tier"]
