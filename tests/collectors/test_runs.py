"""A replica's runs from its /metrics: the recorded vLLM's start, a restart as a new run, a collector restart as
none, and the start a replica says in each dialect."""

from __future__ import annotations

import re

import pandas as pd

from collectors.metrics.prom_text import parse_metrics
from collectors.metrics.runs import RunWatcher, offload_blocks, run_start
from kvobs.store import StoreWriter
from kvobs.store.rows import RunRecord
from tests.collectors.recorded import scrapes


def _with_start(body: str, start: float) -> str:
    return re.sub(r"^process_start_time_seconds \S+$", f"process_start_time_seconds {start!r}", body, flags=re.M)


def test_the_recorded_vllm_run_starts_when_its_process_did(vllm_run):
    runs = vllm_run.store.reads.runs()
    first_body = scrapes()[0][1]
    start = float(re.search(r"^process_start_time_seconds (\S+)$", first_body, re.M).group(1))
    assert list(runs["started_at"]) == [start] and list(runs["source"]) == ["collector"]
    assert list(runs["num_blocks"]) == [31] and list(runs["block_size"]) == [128]  # 32 blocks, one reserved
    assert list(runs["model"]) == ["smollm2"]
    assert list(runs["offload_blocks"]) == [0]  # its cache_config_info: kv_offloading_size="None", no tier


def test_a_restart_is_a_new_run_and_a_collector_restart_is_not(store):
    body = scrapes()[5][1]
    writer = StoreWriter(store)
    watcher = RunWatcher(writer)
    assert watcher.on_scrape("vllm-a", parse_metrics(body)) is not None
    assert watcher.on_scrape("vllm-a", parse_metrics(body)) is None  # the same start: the same run
    restarted = watcher.on_scrape("vllm-a", parse_metrics(_with_start(body, 1.8e9)))
    assert restarted is not None and restarted.started_at == 1.8e9
    again = RunWatcher(writer)  # the collector restarted: it sees the same start, writes the same row
    assert again.on_scrape("vllm-a", parse_metrics(_with_start(body, 1.8e9))) is not None
    writer.close()
    runs = store.reads.runs()
    assert len(runs) == 2 and sorted(runs["started_at"])[-1] == 1.8e9
    assert list(runs["offload_blocks"]) == [0, 0]  # stored and read back on every backend


def test_what_a_replica_says_its_start_is():
    body = scrapes()[5][1]
    parsed = parse_metrics(body)
    assert run_start(parsed) == parsed.gauge("process_start_time_seconds")
    kvobs = body + "# TYPE kvobs_engine_start_time_seconds gauge\nkvobs_engine_start_time_seconds 1.7e9\n"
    assert run_start(parse_metrics(kvobs)) == 1.7e9  # kvobs serve's own run start wins
    bare = re.sub(r"^process_start_time_seconds.*\n", "", body, flags=re.M)
    created = [c.created for c in parse_metrics(bare).counters.values() if c.created]
    assert created and run_start(parse_metrics(bare)) == min(created)  # else when its counters were made


def test_the_offload_tier_a_replica_says_it_has():
    """`vllm:cache_config_info`: no tier where `kv_offloading_size` says "None"; kvobs serve's tier in
    `num_cpu_blocks`; a vLLM tier's size in blocks is not known from it (nor an engine's that says nothing)."""
    assert offload_blocks({"kv_offloading_size": "None", "num_cpu_blocks": "None"}, ours=False) == 0
    assert offload_blocks({"kv_offloading_size": "0.046875", "num_cpu_blocks": "64"}, ours=True) == 64
    assert offload_blocks({"kv_offloading_size": "8.0", "num_cpu_blocks": "64"}, ours=False) is None
    assert offload_blocks({"num_gpu_blocks": "32"}, ours=False) is None


def test_a_runs_tier_is_stored_and_read_back_on_every_backend(any_store):
    """`runs.offload_blocks` on SQLite, PostgreSQL and chDB: a tier's blocks, none, and not said stay apart."""
    writer = StoreWriter(any_store)
    for name, blocks in (("a", 64), ("b", 0), ("c", None)):
        writer.insert_missing(RunRecord(f"{name}@1.000", name, 1.0, "engine", num_blocks=12, offload_blocks=blocks))
    writer.close()
    runs = any_store.reads.runs().set_index("instance")["offload_blocks"]
    assert runs["a"] == 64 and runs["b"] == 0 and pd.isna(runs["c"])
