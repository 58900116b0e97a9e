"""TensorRT-LLM's hits by cache level (`kvobs.analytics.cache.hits_by_tier`), scraped by the collector's scraper from
the counters `trtllm-serve` exposes on `/prometheus/metrics`, made and incremented as its `MetricsCollector` does
(tensorrt_llm/metrics/collector.py, NVIDIA/TensorRT-LLM main at 050f80d, read 2026-11-28; TensorRT-LLM does not install
without a GPU here): `trtllm_prompt_tokens_total` and `trtllm_prompt_cached_tokens_total` per finished request
(`return_perf_metrics`), `trtllm_prompt_cache_hit_tokens_total{cache_level,cache_tier}` per iteration from its
`iterCachedTokensByLevel` and `kvCacheLevelTiers` (`enable_iter_perf_stats`), each level's series made at the first
iteration report, then counted where a level served tokens."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from kvobs.analytics.cache.hits_by_tier import tier_hits
from kvobs.analytics.cache.lookups_by_tier import tier_lookups
from kvobs.analytics.cache.tier_health import tier_checks
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import KVEventRecord
from tests.collectors.test_scraper import scrape_all

LABELS = {"model_name": "smollm2", "engine_type": "trtllm"}


class _TRTLLM:
    """TensorRT-LLM's prompt-token counters, as its `MetricsCollector` defines and counts them."""

    def __init__(self, *, cached_counter: bool = True) -> None:
        """`cached_counter` False: a revision that counts no cached tokens per request (the one with block counters
        in the search index's copy, 2026)."""
        self.registry = CollectorRegistry()
        names = list(LABELS)
        self.prompt = Counter(
            "trtllm_prompt_tokens_total",
            "Cumulative number of prompt (input) tokens processed.",
            names,
            registry=self.registry,
        )
        self.cached = Counter(
            "trtllm_prompt_cached_tokens_total",
            "Process-lifetime total prompt tokens served from KV cache.",
            names,
            registry=self.registry if cached_counter else None,
        )
        if cached_counter:
            self.cached.labels(**LABELS)  # (made at start: a zero before the first hit)
        self.by_level = Counter(
            "trtllm_prompt_cache_hit_tokens_total",
            "Process-lifetime total prompt tokens served from each KV cache level.",
            [*names, "cache_level", "cache_tier"],
            registry=self.registry,
        )
        self.levels_made = False

    def iteration(self, cached_by_level: list[int], tiers: list[str]) -> None:
        """An iteration's stats: the cached tokens of the requests it admitted, by cache level."""
        if not self.levels_made:
            for level, tier in enumerate(tiers):
                self.by_level.labels(**LABELS, cache_level=str(level), cache_tier=tier)
            self.levels_made = True
        for level, count in enumerate(cached_by_level):
            if count > 0:
                self.by_level.labels(**LABELS, cache_level=str(level), cache_tier=tiers[level]).inc(count)

    def finished(self, prompt: int, cached: int) -> None:
        self.prompt.labels(**LABELS).inc(prompt)
        if cached > 0:
            self.cached.labels(**LABELS).inc(cached)

    def body(self) -> str:
        return generate_latest(self.registry).decode()


def _row_or_none(tmp_path, bodies: list[str]) -> tuple[dict | None, object]:
    """The replica's hits-by-tier row (None: its counters said none) and the store its scrapes went to."""
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    scrape_all(store, bodies)
    rows = tier_hits(store).to_dict("records")
    return (rows[0] if rows else None), store


def _row(tmp_path, bodies: list[str]) -> tuple[dict, object]:
    row, store = _row_or_none(tmp_path, bodies)
    assert row is not None
    return row, store


TIERS = ["gpu", "host", "disk"]


def test_tensorrt_llm_hits_by_cache_level_name_the_host_and_disk_tiers(tmp_path):
    engine = _TRTLLM()
    engine.iteration([0, 0, 0], TIERS)
    engine.finished(100, 0)
    bodies = [engine.body()]  # the first scrape: where the increases start
    engine.iteration([64, 32, 16], TIERS)
    engine.finished(200, 112)
    engine.iteration([32, 0, 0], TIERS)
    engine.finished(100, 32)
    bodies.append(engine.body())
    row, store = _row(tmp_path, bodies)
    series = store.reads.metric_series(["trtllm_prompt_cache_hit_tokens:increase"])
    assert all(set(labels) == {"cache_level", "cache_tier"} for labels in series["labels"])  # one count a level
    assert row["counted_by"] == "trtllm_prompt_cache_hit_tokens{cache_level}"
    assert (row["prompt_tokens"], row["cache_tokens"], row["loaded_tokens"]) == (300, 96, 48)
    assert row["computed_tokens"] == 300 - 144 and row["tiers"] == "CPU, DISK"
    assert row["loaded_share"] == pytest.approx(48 / 300)
    assert row["load_s"] is None  # TensorRT-LLM counts bytes moved, not the loads' time: not said
    assert tier_lookups(store).empty  # no block counters scraped: no lookups said


def test_a_cold_gpu_level_is_a_tier_below_the_primary_named_by_its_index(tmp_path):
    tiers = ["gpu", "gpu", "host"]  # a hot and a cold GPU level share the name `gpu`
    engine = _TRTLLM()
    engine.iteration([0, 0, 0], tiers)
    bodies = [engine.body()]
    engine.iteration([16, 48, 32], tiers)
    engine.finished(128, 96)
    bodies.append(engine.body())
    row, _ = _row(tmp_path, bodies)
    assert (row["cache_tokens"], row["loaded_tokens"], row["computed_tokens"]) == (16, 80, 32)
    assert row["tiers"] == "CPU, GPU level 1"


def test_without_iteration_stats_the_cached_tokens_are_not_split(tmp_path):
    """`enable_iter_perf_stats` off: only the per-request count of cached tokens, not from which level."""
    engine = _TRTLLM()
    bodies = [engine.body()]
    engine.finished(200, 64)
    engine.finished(100, 0)
    bodies.append(engine.body())
    row, _ = _row(tmp_path, bodies)
    assert row["cache_tokens"] is None and row["loaded_tokens"] is None and row["loaded_share"] != row["loaded_share"]
    assert row["computed_tokens"] == 300 - 64 and "not split" in row["counted_by"]


def test_a_range_that_holds_an_admission_but_not_its_finish_says_no_computed_tokens(tmp_path):
    """Cached tokens are counted when a request is admitted, its prompt tokens when it finishes: a range with more
    cached than prompt tokens cut a request between the two, and its computed tokens are not said (never negative)."""
    engine = _TRTLLM()
    engine.iteration([0, 0, 0], TIERS)
    bodies = [engine.body()]
    engine.iteration([64, 64, 0], TIERS)  # admitted, still running at the second scrape
    engine.finished(32, 0)
    bodies.append(engine.body())
    row, _ = _row(tmp_path, bodies)
    assert (row["prompt_tokens"], row["cache_tokens"], row["loaded_tokens"]) == (32, 64, 64)
    assert row["computed_tokens"] is None


def _blocks(registry: CollectorRegistry) -> tuple[Counter, Counter]:
    """Its block counters, each series made at its first increment (`_log_counter` with a positive delta of its
    iteration stats' `reusedBlocks` / `missedBlocks`)."""
    reused = Counter(
        "trtllm_kv_cache_reused_blocks",
        "Cumulative number of KV cache blocks reused (cache hits)",
        list(LABELS),
        registry=registry,
    )
    missed = Counter(
        "trtllm_kv_cache_missed_blocks",
        "Cumulative number of KV cache blocks missed (cache misses)",
        list(LABELS),
        registry=registry,
    )
    return reused, missed


def test_its_block_counters_are_its_lookups_in_blocks(tmp_path):
    """A revision whose `MetricsCollector` counts reused and missed blocks and no cached tokens: the hits by tier
    say its prompt tokens alone, not split; its lookups say the blocks, in blocks, over all its levels. A miss
    counter not made yet is none missed so far."""
    engine = _TRTLLM(cached_counter=False)
    reused, missed = _blocks(engine.registry)
    reused.labels(**LABELS).inc(3)
    bodies = [engine.body()]
    reused.labels(**LABELS).inc(5)
    engine.finished(96, 0)
    bodies.append(engine.body())
    missed.labels(**LABELS).inc(2)
    reused.labels(**LABELS).inc(1)
    bodies.append(engine.body())
    row, store = _row(tmp_path, bodies)
    assert row["counted_by"] == "trtllm_prompt_tokens (cached tokens not counted: not split)"
    assert row["prompt_tokens"] == 96 and row["cache_tokens"] is None and row["computed_tokens"] is None
    (lookup,) = tier_lookups(store).to_dict("records")
    assert (lookup["tier"], lookup["unit"], lookup["asked"], lookup["found"]) == ("all levels", "blocks", 8, 6)
    assert lookup["found_share"] == pytest.approx(6 / 8)

    (tmp_path / "b").mkdir()
    only_reused = _TRTLLM(cached_counter=False)
    reused, _ = _blocks(only_reused.registry)
    bodies = [only_reused.body()]
    reused.labels(**LABELS).inc(4)
    bodies.append(only_reused.body())
    _, store = _row_or_none(tmp_path / "b", bodies)
    (lookup,) = tier_lookups(store).to_dict("records")
    assert (lookup["asked"], lookup["found"]) == (4, 4)


def _moved(registry: CollectorRegistry) -> tuple[Counter, Counter]:
    """Its host pool's byte counters (incremented by each iteration's `iterOffloadBytes` / `iterOnboardBytes`)."""
    offload = Counter(
        "trtllm_kv_cache_offload_bytes_total",
        "Total bytes transferred from GPU to host (offload)",
        list(LABELS),
        registry=registry,
    )
    onboard = Counter(
        "trtllm_kv_cache_onboard_bytes_total",
        "Total bytes transferred from host to GPU (onboard)",
        list(LABELS),
        registry=registry,
    )
    return offload.labels(**LABELS), onboard.labels(**LABELS)


def test_doctor_names_a_host_pool_never_hit_and_its_events_missing_from_tensorrt_llms_bytes(tmp_path):
    engine = _TRTLLM()
    offload, onboard = _moved(engine.registry)
    bodies = [engine.body()]
    offload.inc(4 * 737_280)  # blocks copied to the host pool, none back
    bodies.append(engine.body())
    _, store = _row_or_none(tmp_path, bodies)
    checks = {check.words.split(":")[0]: check for check in tier_checks(store)}
    assert set(checks) == {"tier events missing", "tier stored but never hit"}
    assert not any(check.ok for check in checks.values())
    assert "(trtllm_kv_cache_offload_bytes)" in checks["tier events missing"].words
    assert "--kv-events endpoint" in checks["tier events missing"].words
    assert "(trtllm_kv_cache_onboard_bytes 0)" in checks["tier stored but never hit"].words


def test_a_host_pool_that_gives_blocks_back_and_whose_moves_came_passes(tmp_path):
    engine = _TRTLLM()
    offload, onboard = _moved(engine.registry)
    bodies = [engine.body()]
    offload.inc(4 * 737_280)
    onboard.inc(737_280)
    bodies.append(engine.body())
    _, store = _row_or_none(tmp_path, bodies)
    ts = float(store.reads.metric_series(["trtllm_kv_cache_offload_bytes:increase"])["ts"].max())
    writer = StoreWriter(store)  # a block moved to the host pool, as the adapter stores TensorRT-LLM's `updated`
    writer.add(KVEventRecord(ts=ts, instance="vllm", kind="tier_stored", block_hash=7, medium="CPU", first_owner=1))
    writer.close()
    (check,) = tier_checks(store)
    assert check.ok and check.words == "offload tier: 2,949,120 bytes stored, 737,280 loaded back"
