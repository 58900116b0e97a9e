"""Hits by tier from each engine's own counters (`kvobs.analytics.cache.hits_by_tier`), scraped by the collector's
scraper: the recorded vLLM 0.32 run (no tier: its scrapes are the truth), and SGLang's and LMCache's counters as their
sources define them (names, labels, and what is counted when), exposed by `prometheus_client` as those engines expose
them: SGLang 0.5.23's `TokenizerMetricsCollector.observe_one_finished_request`
(sglang/srt/observability/metrics_collector.py: `cache_source` device/host/storage, `total` where a request gave no
details). LMCache's are its own: its `PrometheusLogger` and stats monitor (lmcache 0.5.6, from `.venv-lmcache`). Our
engine's own tier is checked against its block manager's record in tests/server/test_offload_tier_served.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from collectors.drops import DropCounter
from collectors.metrics.scraper import Scraper, ScrapeTarget
from kvobs.analytics.cache.hits_by_tier import tier_hits
from kvobs.analytics.cache.routing import FLEET
from kvobs.store import open_store
from kvobs.store.writer import StoreWriter
from tests.collectors.agent_harness import ROOT
from tests.collectors.recorded import scrapes
from tests.collectors.replay import metrics_server
from tests.collectors.test_scraper import scrape_all

BY_SOURCE = "vllm:prompt_tokens_by_source_total"
VLLM_034 = ROOT / "tests" / "fixtures" / "vllm-0.34-metrics"
LMCACHE = ROOT / ".venv-lmcache"


def test_the_recorded_vllm_run_splits_its_prompt_tokens_as_vllm_counted_them(vllm_run):
    (row,) = tier_hits(vllm_run.store).to_dict("records")
    bodies = [body for _, body in scrapes()]

    def counted(source: str) -> float:  # from the first scrape to the last, as vLLM's own counter says
        name = BY_SOURCE + '{engine="0",model_name="smollm2",source="' + source + '"}'
        return sum(
            float(line.rsplit(" ", 1)[1]) * sign
            for sign, body in ((-1, bodies[0]), (1, bodies[-1]))
            for line in body.splitlines()
            if line.startswith(name)
        )

    assert row["counted_by"] == "vllm:prompt_tokens_by_source"
    assert row["cache_tokens"] == counted("local_cache_hit") > 0
    assert row["computed_tokens"] == counted("local_compute") > 0
    assert row["loaded_tokens"] == counted("external_kv_transfer") == 0 and row["tiers"] == ""
    assert row["prompt_tokens"] == row["cache_tokens"] + row["computed_tokens"]
    assert row["load_s"] is None  # no offload connector: its loads are not counted, not zero


class _SGLang:
    """SGLang's tokenizer counters, incremented as its `observe_one_finished_request` does."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine_type"]
        self.prompt = Counter(
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            [*labels, "is_streaming"],
            registry=self.registry,
        )
        self.cached = Counter(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*labels, "cache_source"],
            registry=self.registry,
        )
        self.labels = {"model_name": "smollm2", "engine_type": "unified"}

    def finished(self, prompt: int, cached: int, details: dict | None, *, streaming: bool = False) -> None:
        self.prompt.labels(**self.labels, is_streaming="true" if streaming else "false").inc(prompt)
        if cached <= 0:
            return
        if not details:
            self.cached.labels(**self.labels, cache_source="total").inc(cached)
            return
        for source in ("device", "host", "storage"):
            if details.get(source, 0) > 0:
                self.cached.labels(**self.labels, cache_source=source).inc(details[source])

    def body(self) -> str:
        return generate_latest(self.registry).decode()


def _scraped(tmp_path, bodies: list[str]):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    scrape_all(store, bodies)
    return store


def test_sglang_hicache_hits_by_tier_from_its_cache_source_counter(tmp_path):
    engine = _SGLang()
    engine.finished(100, 0, None)
    bodies = [engine.body()]  # the first scrape: where the increases start
    engine.finished(200, 96, {"device": 64, "host": 32}, streaming=True)
    engine.finished(300, 160, {"device": 32, "host": 64, "storage": 64})
    engine.finished(50, 0, None)
    bodies.append(engine.body())
    store = _scraped(tmp_path, bodies)
    series = store.reads.metric_series(["sglang:cached_tokens:increase"])
    assert sorted(labels["cache_source"] for labels in series["labels"]) == ["device", "host", "storage"]
    assert all(set(labels) == {"cache_source"} for labels in series["labels"])  # its model and engine labels: one count
    (row,) = tier_hits(store).to_dict("records")
    assert row["counted_by"] == "sglang:cached_tokens{cache_source}"
    assert (row["prompt_tokens"], row["cache_tokens"], row["loaded_tokens"]) == (550, 96, 160)
    assert row["computed_tokens"] == 550 - 256 and row["tiers"] == "CPU, STORAGE"
    assert row["loaded_share"] == pytest.approx(160 / 550) and row["load_s"] is None


def test_sglang_cached_tokens_without_their_sources_are_not_split(tmp_path):
    """A request whose cached tokens came without details is counted as `total`: how many, not where. The split is
    not measured (None), never read as all in the device cache."""
    engine = _SGLang()
    bodies = [engine.body()]
    engine.finished(200, 96, {"device": 64, "host": 32})
    engine.finished(300, 128, None)
    bodies.append(engine.body())
    (row,) = tier_hits(_scraped(tmp_path, bodies)).to_dict("records")
    assert row["cache_tokens"] is None and row["loaded_tokens"] is None and row["loaded_share"] != row["loaded_share"]
    assert row["computed_tokens"] == 500 - 224 and "not split" in row["counted_by"]


def _lmcache_bodies(*retrievals: str) -> list[str]:
    """LMCache's own counters, before and after `retrievals` ("tokens:hit:seconds"), from its `PrometheusLogger`
    and stats monitor in a process of their own (`tests/collectors/lmcache_metrics.py`)."""
    if not (LMCACHE / "lmcache").is_dir():
        pytest.fail(f"LMCache is not installed in {LMCACHE}: run `bash scripts/install.sh` (the test extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LMCACHE), str(ROOT)])}
    script = ROOT / "tests" / "collectors" / "lmcache_metrics.py"
    done = subprocess.run(
        [sys.executable, str(script), *retrievals], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_vllm_with_lmcache_names_the_tier_lmcache_and_its_retrieve_seconds(tmp_path):
    """vLLM counts LMCache's loads as `external_kv_transfer`; LMCache's own counters (its `PrometheusLogger`, on the
    same `/metrics`) say the tier is LMCache, and its `time_to_retrieve` histogram how long the loads took: the
    retrievals its monitor timed, from its one worker. Its model and role labels are not kept: one count a worker."""
    lmcache = _lmcache_bodies("256:256:0.2", "512:256:0.1")
    registry = CollectorRegistry()
    by_source = Counter(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        ["engine", "model_name", "source"],
        registry=registry,
    )
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        by_source.labels("0", "smollm2", source)
    before = generate_latest(registry).decode()
    by_source.labels("0", "smollm2", "local_compute").inc(400)
    by_source.labels("0", "smollm2", "local_cache_hit").inc(256)
    by_source.labels("0", "smollm2", "external_kv_transfer").inc(512)
    bodies = [before + lmcache[0], generate_latest(registry).decode() + lmcache[1]]  # one /metrics, as vLLM serves
    store = _scraped(tmp_path, bodies)
    hits = store.reads.metric_series(["lmcache:num_hit_tokens:increase"])
    assert list(hits["value"]) == [512.0] and list(hits["labels"]) == [{"worker_id": "0"}]
    (row,) = tier_hits(store).to_dict("records")
    assert (row["cache_tokens"], row["loaded_tokens"], row["computed_tokens"]) == (256, 512, 400)
    retrieved = store.reads.metric_series(["lmcache:time_to_retrieve:sum"])["value"].sum()
    assert row["tiers"] == "LMCache" and row["load_s"] == pytest.approx(retrieved) and 0.3 <= retrieved < 1.0


def test_a_replica_whose_engine_counts_no_sources_has_no_row(tmp_path):
    registry = CollectorRegistry()
    Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", registry=registry).inc(10)
    body = generate_latest(registry).decode()
    assert tier_hits(_scraped(tmp_path, [body, body])).empty


def test_a_fleets_row_sums_its_replicas(fleet_run):
    table = tier_hits(fleet_run.store).set_index("instance")
    assert list(table.index) == ["vllm-a", "vllm-b", "fleet"]
    for column in ("prompt_tokens", "cache_tokens", "loaded_tokens", "computed_tokens"):
        assert table.loc["fleet", column] == table.loc[["vllm-a", "vllm-b"], column].sum() > -1
    assert table.loc["fleet", "load_s"] is None  # neither replica counts loads: the fleet's are not said either


def test_vllm_0_34_says_which_tier_its_connector_s_tokens_came_from(tmp_path):
    """vLLM 0.34's own logger (its recording: tests/fixtures/vllm-0.34-metrics/record.py) counts cached tokens by the
    tier that supplied them: host (kvobs's CPU), p2p (another vLLM instance), disk, or not said (the connector's)."""
    bodies = [(VLLM_034 / f"scrape_{n}.txt").read_text() for n in (0, 1)]
    (row,) = tier_hits(_scraped(tmp_path, bodies)).to_dict("records")
    assert row["counted_by"] == "vllm:prompt_tokens_by_source, vllm:prompt_tokens_cached_by_source{source}"
    assert (row["cache_tokens"], row["loaded_tokens"], row["computed_tokens"]) == (448, 832, 892)
    assert row["tiers"] == "CPU, DISK, KV connector, P2P"
    assert row["tokens_by_tier"] == "CPU 416, P2P 192, DISK 128, KV connector 96"  # the sources' sum: the 832 loaded


def test_a_fleet_sums_its_replicas_tokens_by_tier(tmp_path):
    """Two vLLM 0.34 replicas sum tier by tier; a vLLM 0.32 that loaded nothing (no tier) adds nothing to any tier."""
    bodies = [(VLLM_034 / f"scrape_{n}.txt").read_text() for n in (0, 1)]
    recorded = [body for _, body in scrapes()[:2]]
    both = tier_hits(_two_scraped(tmp_path / "a", bodies, bodies)).set_index("instance")
    assert both.loc[FLEET, "tokens_by_tier"] == "CPU 832, P2P 384, DISK 256, KV connector 192"
    mixed = tier_hits(_two_scraped(tmp_path / "b", bodies, recorded)).set_index("instance")
    assert mixed.loc["b", "tokens_by_tier"] == "" and mixed.loc["b", "counted_by"] == "vllm:prompt_tokens_by_source"
    assert mixed.loc[FLEET, "tokens_by_tier"] == mixed.loc["a", "tokens_by_tier"]
    assert mixed.loc[FLEET, "loaded_tokens"] == 832


def _two_scraped(tmp_path, a: list[str], b: list[str]):
    """Replicas `a` and `b` scraped by one collector's scraper, each from a server of its own."""
    tmp_path.mkdir()
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    writer = StoreWriter(store)
    with metrics_server(a) as url_a, metrics_server(b) as url_b:
        targets = [ScrapeTarget.parse(f"a={url_a}"), ScrapeTarget.parse(f"b={url_b}")]
        scraper = Scraper(targets, writer, DropCounter())
        for _ in a:
            scraper.scrape_all()
    writer.close()
    return store
