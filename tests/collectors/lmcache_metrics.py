"""LMCache's own Prometheus counters, as vLLM's `/metrics` serves them (LMCache's multiprocess registry), for
tests/analytics/test_tier_hits.py. Run with `.venv-lmcache` on the path (tests/engines/lmcache.txt): prints a JSON
list of two expositions, before and after the retrievals given on the command line ("tokens:hit_tokens:seconds",
each timed by LMCache's own monitor around a sleep of that long)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="lmcache-prom-")  # before prometheus_client loads
os.environ["LMCACHE_TRACK_USAGE"] = "false"  # LMCache's usage telemetry would call out (no network here)

import torch  # noqa: E402
from lmcache.observability import LMCStatsMonitor, PrometheusLogger  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402


def exposition() -> str:
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return generate_latest(registry).decode()


def main(retrievals: list[str]) -> None:
    metadata = LMCacheMetadata(
        model_name="smollm2",
        world_size=1,
        local_world_size=1,
        worker_id=0,
        local_worker_id=0,
        kv_dtype=torch.float32,
        kv_shape=(30, 2, 256, 3, 64),
        role="worker",
    )
    prometheus, monitor = PrometheusLogger.GetOrCreate(metadata), LMCStatsMonitor.GetOrCreate()
    prometheus.log_prometheus(monitor.get_stats_and_clear())
    bodies = [exposition()]
    for spec in retrievals:
        tokens, hit, seconds = spec.split(":")
        stats = monitor.on_retrieve_request(int(tokens))
        time.sleep(float(seconds))
        monitor.on_retrieve_finished(stats, int(hit))
    prometheus.log_prometheus(monitor.get_stats_and_clear())
    bodies.append(exposition())
    print(json.dumps(bodies))
    shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
