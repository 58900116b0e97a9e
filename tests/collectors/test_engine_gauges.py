"""An instance's usage and request counts from its engine's own gauges (`collectors.metrics.engine_gauges`), scraped
over HTTP by the collector's scraper into its snapshot: SGLang's scheduler gauges made as its
`SchedulerMetricsCollector` makes them (sglang 0.5.23: labels model_name, engine_type, tp_rank, pp_rank,
moe_ep_rank, dp_rank; one series per data-parallel rank, or per TP rank too with
--enable-metrics-for-all-schedulers), TensorRT-LLM's as its `MetricsCollector` sets them, and vLLM's with two
data-parallel engines."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from kvobs.store import open_store
from tests.collectors.test_scraper import scrape_all

SGLANG_LABELS = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"]


def _sglang(ranks: dict[tuple[int, int], tuple[float, int, int]]) -> str:
    """(dp_rank, tp_rank) -> (token usage, running, queued), each as the scheduler of that rank sets them."""
    registry = CollectorRegistry()
    usage = Gauge("sglang:token_usage", "The token usage.", SGLANG_LABELS, registry=registry)
    running = Gauge("sglang:num_running_reqs", "The number of running requests.", SGLANG_LABELS, registry=registry)
    queued = Gauge(
        "sglang:num_queue_reqs", "The number of requests in the waiting queue.", SGLANG_LABELS, registry=registry
    )
    for (dp, tp), (u, r, q) in ranks.items():
        labels = {"model_name": "smollm2", "engine_type": "unified", "tp_rank": tp, "pp_rank": 0, "moe_ep_rank": 0}
        labels["dp_rank"] = dp
        usage.labels(**labels).set(u)
        running.labels(**labels).set(r)
        queued.labels(**labels).set(q)
    return generate_latest(registry).decode()


def _snapshot(tmp_path, body: str):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    _, _, snapshots = scrape_all(store, [body])
    (snapshot,) = snapshots
    store.close()
    return snapshot


@pytest.mark.parametrize("every_scheduler", [False, True])
def test_sglangs_usage_and_requests_fill_the_snapshot(tmp_path, every_scheduler):
    ranks = {(0, 0): (0.25, 3, 1), (1, 2): (0.75, 5, 0)}  # two DP ranks (attention-TP rank 0 of each logs)
    if every_scheduler:  # every TP rank reports its DP rank's batch as well
        ranks |= {(0, 1): (0.25, 3, 1), (1, 3): (0.75, 5, 0)}
    snapshot = _snapshot(tmp_path, _sglang(ranks))
    assert snapshot.kv_usage == pytest.approx(0.5)  # each rank's cache its own: their mean
    assert (snapshot.num_running, snapshot.num_waiting) == (8, 1)  # the DP ranks' batches, each once
    assert snapshot.blocks_total is None and snapshot.blocks_free is None  # (SGLang counts no blocks: not measured)


def test_vllms_data_parallel_engines_usage_is_their_mean(tmp_path):
    registry = CollectorRegistry()
    labels = ["engine", "model_name"]
    usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=registry)
    running = Gauge(
        "vllm:num_requests_running", "Number of requests in model execution batches.", labels, registry=registry
    )
    for engine, (u, r) in enumerate(((0.5, 2), (0.7, 4))):
        usage.labels(engine=str(engine), model_name="smollm2").set(u)
        running.labels(engine=str(engine), model_name="smollm2").set(r)
    snapshot = _snapshot(tmp_path, generate_latest(registry).decode())
    assert snapshot.kv_usage == pytest.approx(0.6) and snapshot.num_running == 6
    assert snapshot.num_waiting is None  # (not exposed: not measured, not zero)


def test_trtllms_iteration_gauges_fill_the_snapshot(tmp_path):
    """As its `MetricsCollector.log_iteration_stats` sets them from one iteration's stats (`numActiveRequests`,
    `numQueuedRequests`, `kvCacheStats`; tensorrt_llm/metrics/collector.py, the 2026 revision with block gauges)."""
    registry = CollectorRegistry()
    labels = {"model_name": "smollm2", "engine_type": "trtllm"}
    stats = {"numActiveRequests": 4, "numQueuedRequests": 2}
    kv = {"maxNumBlocks": 1000, "freeNumBlocks": 700, "usedNumBlocks": 300}
    for name, doc, value in (
        ("trtllm_num_requests_running", "Number of active requests", stats["numActiveRequests"]),
        ("trtllm_num_requests_waiting", "Number of queued requests", stats["numQueuedRequests"]),
        ("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", kv["maxNumBlocks"]),
        ("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks", kv["freeNumBlocks"]),
        ("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", kv["usedNumBlocks"]),
        ("trtllm_kv_cache_utilization", "KV cache utilization", kv["usedNumBlocks"] / kv["maxNumBlocks"]),
    ):
        Gauge(name, doc, list(labels), registry=registry).labels(**labels).set(value)
    snapshot = _snapshot(tmp_path, generate_latest(registry).decode())
    assert snapshot.kv_usage == pytest.approx(0.3) and (snapshot.blocks_total, snapshot.blocks_free) == (1000, 700)
    assert (snapshot.num_running, snapshot.num_waiting) == (4, 2)


def test_an_engine_that_says_none_of_it_leaves_the_columns_empty(tmp_path):
    registry = CollectorRegistry()
    Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", registry=registry).set(0.4)  # not a usage
    snapshot = _snapshot(tmp_path, generate_latest(registry).decode())
    assert (snapshot.kv_usage, snapshot.num_running, snapshot.num_waiting) == (None, None, None)
    assert (snapshot.blocks_total, snapshot.blocks_free) == (None, None)
