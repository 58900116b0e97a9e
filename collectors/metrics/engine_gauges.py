"""An instance's cache usage, block counts and request counts, read from its engine's own gauges for its snapshot
(the Cache pressure page): vLLM's (`vllm:kv_cache_usage_perc`, `vllm:num_requests_running`, `..._waiting`, its
cache config's blocks), else SGLang's (`sglang:token_usage`, `sglang:num_running_reqs`, `sglang:num_queue_reqs`),
else TensorRT-LLM's (`trtllm_kv_cache_{used,free,max}_blocks`, `trtllm_num_requests_{running,waiting}`).

All three mean the same thing: usage is the share of the cache held by running requests (vLLM's pinned blocks,
SGLang's tokens neither free nor evictable, TensorRT-LLM's allocated blocks), cached blocks no request holds
counting as free. Across an engine's series (vLLM's data-parallel engines, SGLang's ranks) the usage is their mean
(each rank's cache is its own, of one size), and the request counts their sum over data-parallel ranks; SGLang's
tensor-parallel ranks, which all report the same batch when every scheduler logs, count once. SGLang counts tokens,
not blocks: its block columns stay empty. An engine that says none of it leaves the columns empty (not measured).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import NamedTuple

from collectors.metrics.prom_text import ParsedMetrics
from kvobs.semconv.engine_metrics import LABEL_DP_RANK, sglang_gauges, trtllm_gauges
from kvobs.semconv.metrics import vllm

NULL_BLOCKS = 1  # vLLM's `num_gpu_blocks` counts its null block, which never holds KV


class CacheGauges(NamedTuple):
    usage: float | None
    blocks_total: int | None
    blocks_free: int | None
    running: float | None
    waiting: float | None


def read(parsed: ParsedMetrics) -> CacheGauges:
    """The engine's gauges, by the first engine whose usage gauge is there (vLLM, SGLang, TensorRT-LLM)."""
    if parsed.gauge_values(vllm.KV_CACHE_USAGE_PERC.name) or parsed.gauge(vllm.NUM_REQUESTS_RUNNING.name) is not None:
        return _vllm(parsed)
    if parsed.gauge_values(sglang_gauges.TOKEN_USAGE.name) or parsed.gauge_values(sglang_gauges.NUM_RUNNING_REQS.name):
        return _sglang(parsed)
    return _trtllm(parsed)


def _vllm(parsed: ParsedMetrics) -> CacheGauges:
    usage = _mean(parsed.gauge_values(vllm.KV_CACHE_USAGE_PERC.name))
    config = parsed.info.get(vllm.CACHE_CONFIG_INFO.name + "_info", {})
    total = int(config["num_gpu_blocks"]) - NULL_BLOCKS if config.get("num_gpu_blocks", "").isdigit() else None
    free = round((1 - usage) * total) if usage is not None and total is not None else None
    running, waiting = parsed.gauge(vllm.NUM_REQUESTS_RUNNING.name), parsed.gauge(vllm.NUM_REQUESTS_WAITING.name)
    return CacheGauges(usage, total, free, running, waiting)  # (requests: its data-parallel engines' summed)


def _sglang(parsed: ParsedMetrics) -> CacheGauges:
    usage = _mean(parsed.gauge_values(sglang_gauges.TOKEN_USAGE.name))
    running, waiting = (
        _per_rank(parsed, s.name) for s in (sglang_gauges.NUM_RUNNING_REQS, sglang_gauges.NUM_QUEUE_REQS)
    )
    return CacheGauges(usage, None, None, running, waiting)


def _trtllm(parsed: ParsedMetrics) -> CacheGauges:
    total, free = (
        parsed.gauge(trtllm_gauges.KV_CACHE_MAX_BLOCKS.name),
        parsed.gauge(trtllm_gauges.KV_CACHE_FREE_BLOCKS.name),
    )
    used = parsed.gauge(trtllm_gauges.KV_CACHE_USED_BLOCKS.name)
    usage = used / total if used is not None and total and math.isfinite(used / total) else None
    running = parsed.gauge(trtllm_gauges.NUM_REQUESTS_RUNNING.name)
    waiting = parsed.gauge(trtllm_gauges.NUM_REQUESTS_WAITING.name)
    return CacheGauges(usage, _int(total), _int(free), running, waiting)


def _mean(values: list[float]) -> float | None:
    mean = sum(values) / len(values) if values else None
    return mean if mean is not None and math.isfinite(mean) else None


def _int(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None


def _per_rank(parsed: ParsedMetrics, name: str) -> float | None:
    """SGLang's count summed over data-parallel ranks, each rank once (its TP ranks' series report one batch)."""
    by_rank: dict[str | None, float] = defaultdict(float)
    for (n, labels), value in parsed.gauges.items():
        if n == name:
            rank = dict(labels).get(LABEL_DP_RANK)
            by_rank[rank] = max(by_rank[rank], value)
    return sum(by_rank.values()) if by_rank else None
