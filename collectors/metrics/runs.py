"""Each replica's runs, seen from its /metrics: a run starts with an empty KV cache (a start, a restart).

    watcher = RunWatcher(writer)
    watcher.on_scrape("vllm-a", parsed)      # a `runs` row the first time a start is seen

The start is what the replica says: `kvobs_engine_start_time_seconds` (`kvobs serve`'s own run, the one it records
itself), else `process_start_time_seconds` (vLLM's process), else the earliest `_created` time of its counters
(when they were made: the engine's start). A replica that says none of these has no recorded runs, and its pages
say so; a collector restart is not a run (the start it sees again is the same row). With the run come the cache
vLLM reports (`vllm:cache_config_info`: usable blocks, block size, the offload tier's blocks), the served model, and
the engine (`kvobs serve` by its own start time, else vLLM by its cache config), whose block rules the what-if
replays it by.
"""

from __future__ import annotations

import logging

from collectors.metrics.prom_text import ParsedMetrics
from kvobs.semconv.metrics import LABEL_MODEL_NAME, PROCESS_START_TIME, kvobs_metrics, vllm
from kvobs.semconv.spans import RunEngine, RunSource
from kvobs.store.rows import RunRecord, run_id
from kvobs.store.writer import StoreWriter

log = logging.getLogger(__name__)


class RunWatcher:
    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer
        self._starts: dict[str, str] = {}  # instance -> run id of the latest start seen

    def on_scrape(self, instance: str, parsed: ParsedMetrics) -> RunRecord | None:
        """The run this scrape shows, written when it is new to this collector; None when the replica says no
        start."""
        started_at = run_start(parsed)
        if started_at is None:
            return None
        rid = run_id(instance, started_at)
        if self._starts.get(instance) == rid:
            return None
        if instance in self._starts:
            log.info("%s restarted: a new run began at %.3f (its KV cache empty)", instance, started_at)
        self._starts[instance] = rid
        config = parsed.info.get(vllm.CACHE_CONFIG_INFO.name + "_info", {})
        blocks, size = config.get("num_gpu_blocks", ""), config.get("block_size", "")
        ours = parsed.gauge(kvobs_metrics.ENGINE_START_TIME.name) is not None
        run = RunRecord(
            rid,
            instance,
            started_at,
            RunSource.COLLECTOR.value,
            model=_model(parsed),
            num_blocks=int(blocks) - 1 if blocks.isdigit() else None,  # the null block is not usable
            block_size=int(size) if size.isdigit() else None,
            eviction_policy=config.get("eviction_policy"),
            offload_blocks=offload_blocks(config, ours=ours),
            # (vLLM's cache config without our start time: kvobs serve speaks both)
            engine=RunEngine.KVOBS.value if ours else RunEngine.VLLM.value if config else None,
        )
        self.writer.insert_missing(run)
        return run


def offload_blocks(config: dict[str, str], *, ours: bool) -> int | None:
    """The offload tier below the cache, in blocks, as `vllm:cache_config_info` says it: 0 where
    `kv_offloading_size` says there is none; `kvobs serve`'s (`ours`) in `num_cpu_blocks`; else None (a vLLM
    tier, whose size in blocks the metric does not say for sure, or an engine that does not say)."""
    size = config.get("kv_offloading_size")
    if size == "None":
        return 0
    blocks = config.get("num_cpu_blocks", "")
    return int(blocks) if ours and size is not None and blocks.isdigit() else None


def run_start(parsed: ParsedMetrics) -> float | None:
    """When the replica's current run began, by what its /metrics says (see the module's doc)."""
    for name in (kvobs_metrics.ENGINE_START_TIME.name, PROCESS_START_TIME):
        value = parsed.gauge(name)
        if value is not None and value > 0:
            return float(value)
    created = [c.created for c in parsed.counters.values() if c.created]
    created += [h.created for h in parsed.histograms.values() if h.created]
    return min(created) if created else None


def _model(parsed: ParsedMetrics) -> str | None:
    for (_, labels), _value in parsed.gauges.items():
        for key, value in labels:
            if key == LABEL_MODEL_NAME:
                return value
    return None
