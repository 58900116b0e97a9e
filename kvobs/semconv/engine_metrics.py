"""The KV-cache counters other engines publish on their `/metrics`, under their own names (counters without
`_total`, as `kvobs.semconv.metrics` keeps vLLM's): SGLang's, LMCache's (LMCache's come out of the vLLM that runs
its connector) and TensorRT-LLM's (`trtllm-serve`'s `/prometheus/metrics`). The collector keeps them as it keeps
vLLM's (`collectors.metrics.derive`), by the labels named here only (SGLang's tp/dp/pp ranks would otherwise split
one count into series), and `kvobs.analytics.cache.hits_by_tier` reads each replica's hits by tier from them.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvobs.semconv.metric_spec import MetricSpec

LABEL_WORKER_ID = "worker_id"  # LMCache: the vLLM worker (tensor-parallel rank) whose connector counted it
LABEL_CACHE_SOURCE = "cache_source"  # SGLang: where a cached prompt token was found (device, host, storage_<backend>)
CACHE_SOURCE_DEVICE = "device"  # SGLang's device (GPU) radix cache: its primary tier
CACHE_SOURCE_HOST = "host"  # HiCache's host-memory tier (kvobs's CPU)
CACHE_SOURCE_STORAGE = "storage"  # HiCache's storage tier: `storage`, or `storage_<backend>` (mooncake, 3fs, file...)
# SGLang's count of a request whose cached tokens came without their sources (0.5.23); releases before the split
# give no `cache_source` at all: either way the tokens were cached, where is not said
CACHE_SOURCE_TOTAL = "total"
# TensorRT-LLM: the index of a cache level in its configured tier list (0: the primary pool the model attends from),
# and the memory backing it (`gpu`, `host`, `disk`; two GPU levels, hot and cold, share `gpu`)
LABEL_CACHE_LEVEL = "cache_level"
LABEL_CACHE_TIER = "cache_tier"
PRIMARY_CACHE_LEVEL = "0"

sglang = SimpleNamespace(
    PROMPT_TOKENS=MetricSpec("sglang:prompt_tokens", "counter", "tokens", "Number of prefill tokens processed."),
    CACHED_TOKENS=MetricSpec(
        "sglang:cached_tokens",
        "counter",
        "tokens",
        "Number of cached prompt tokens by source (device/host/storage; `total` where a request's sources were "
        "not given; releases before the split give no source).",
        (LABEL_CACHE_SOURCE,),
    ),
)

lmcache = SimpleNamespace(
    NUM_REQUESTED_TOKENS=MetricSpec(
        "lmcache:num_requested_tokens", "counter", "tokens", "Total number of tokens requested from lmcache."
    ),
    NUM_HIT_TOKENS=MetricSpec(
        "lmcache:num_hit_tokens",
        "counter",
        "tokens",
        "Total number of tokens hit in lmcache (each worker its own shard of them).",
        (LABEL_WORKER_ID,),
    ),
    NUM_RETRIEVE_REQUESTS=MetricSpec(
        "lmcache:num_retrieve_requests", "counter", "requests", "Total number of retrieve requests sent to lmcache."
    ),
    NUM_STORE_REQUESTS=MetricSpec(
        "lmcache:num_store_requests", "counter", "requests", "Total number of store requests sent to lmcache."
    ),
    TIME_TO_RETRIEVE=MetricSpec(
        "lmcache:time_to_retrieve", "histogram", "s", "Time to retrieve from lmcache (seconds)."
    ),
)

# TensorRT-LLM's `MetricsCollector` (tensorrt_llm/metrics/collector.py): prompt tokens and cached tokens are counted
# per finished request (`return_perf_metrics`), the tokens by cache level per iteration as requests are admitted
# (`enable_iter_perf_stats`), the tier copies' bytes per iteration
trtllm = SimpleNamespace(
    PROMPT_TOKENS=MetricSpec(
        "trtllm_prompt_tokens", "counter", "tokens", "Cumulative number of prompt (input) tokens processed."
    ),
    PROMPT_CACHED_TOKENS=MetricSpec(
        "trtllm_prompt_cached_tokens", "counter", "tokens", "Process-lifetime total prompt tokens served from KV cache."
    ),
    PROMPT_CACHE_HIT_TOKENS=MetricSpec(
        "trtllm_prompt_cache_hit_tokens",
        "counter",
        "tokens",
        "Process-lifetime total prompt tokens served from each KV cache level (`cache_level`: its index, 0 the "
        "primary; `cache_tier`: the memory backing it).",
        (LABEL_CACHE_LEVEL, LABEL_CACHE_TIER),
    ),
    # the blocks its lookups reused and missed (its `kvCacheStats` reusedBlocks and missedBlocks, per iteration):
    # blocks, not tokens, and not by level
    KV_CACHE_REUSED_BLOCKS=MetricSpec(
        "trtllm_kv_cache_reused_blocks", "counter", "blocks", "Cumulative number of KV cache blocks reused (cache hits)"
    ),
    KV_CACHE_MISSED_BLOCKS=MetricSpec(
        "trtllm_kv_cache_missed_blocks",
        "counter",
        "blocks",
        "Cumulative number of KV cache blocks missed (cache misses)",
    ),
    KV_CACHE_ONBOARD_BYTES=MetricSpec(
        "trtllm_kv_cache_onboard_bytes", "counter", "bytes", "Total bytes transferred from host to GPU (onboard)."
    ),
    KV_CACHE_OFFLOAD_BYTES=MetricSpec(
        "trtllm_kv_cache_offload_bytes", "counter", "bytes", "Total bytes transferred from GPU to host (offload)."
    ),
)

ENGINE_METRICS = (*vars(sglang).values(), *vars(lmcache).values(), *vars(trtllm).values())

# SGLang's scheduler gauges (`SchedulerMetricsCollector`, sglang/srt/observability/metrics_collector.py, 0.5.23): one
# series per data-parallel rank by default (attention-TP rank 0 logs; every TP rank with
# --enable-metrics-for-all-schedulers, each the same). Read into an instance's snapshot, not kept as samples.
LABEL_DP_RANK = "dp_rank"
sglang_gauges = SimpleNamespace(
    TOKEN_USAGE=MetricSpec(
        "sglang:token_usage",
        "gauge",
        "1",
        "The token usage: the pool's tokens neither free nor evictable (held by running requests) over its size, "
        "rounded to 0.01; the fullest pool's where a hybrid model has several.",
        (LABEL_DP_RANK,),
    ),
    NUM_RUNNING_REQS=MetricSpec(
        "sglang:num_running_reqs", "gauge", "requests", "The number of running requests.", (LABEL_DP_RANK,)
    ),
    NUM_QUEUE_REQS=MetricSpec(
        "sglang:num_queue_reqs", "gauge", "requests", "The number of requests in the waiting queue.", (LABEL_DP_RANK,)
    ),
)

# TensorRT-LLM's iteration gauges (`MetricsCollector.log_iteration_stats`, from its `kvCacheStats` and queue counts,
# with `enable_iter_perf_stats`): used blocks are those allocated to requests; a cached block none holds is free
trtllm_gauges = SimpleNamespace(
    KV_CACHE_MAX_BLOCKS=MetricSpec(
        "trtllm_kv_cache_max_blocks", "gauge", "blocks", "Maximum number of KV cache blocks"
    ),
    KV_CACHE_FREE_BLOCKS=MetricSpec("trtllm_kv_cache_free_blocks", "gauge", "blocks", "Number of free KV cache blocks"),
    KV_CACHE_USED_BLOCKS=MetricSpec("trtllm_kv_cache_used_blocks", "gauge", "blocks", "Number of used KV cache blocks"),
    NUM_REQUESTS_RUNNING=MetricSpec("trtllm_num_requests_running", "gauge", "requests", "Number of active requests"),
    NUM_REQUESTS_WAITING=MetricSpec("trtllm_num_requests_waiting", "gauge", "requests", "Number of queued requests"),
)


def storage_source(source: str) -> bool:
    """Whether an SGLang `cache_source` is a storage tier (`storage`, or `storage_<backend>`)."""
    return source == CACHE_SOURCE_STORAGE or source.startswith(CACHE_SOURCE_STORAGE + "_")
