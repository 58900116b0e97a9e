"""vLLM's V1 metric names with vLLM's meaning (release 0.33): what its exporter serves and what our engine serves
under the same names, so that dashboards, alert rules and scrapers written for vLLM read either unchanged. Kept apart
from `kvobs.semconv.metrics`, which joins them (and vLLM's offloading names) to its `vllm` namespace.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvobs.semconv.metric_spec import metric_spec as _spec

LABEL_FINISHED_REASON = "finished_reason"
LABEL_SOURCE = "source"
# `vllm:prompt_tokens_by_source{source}`'s values, as vLLM names them
PROMPT_SOURCE_COMPUTED, PROMPT_SOURCE_CACHED, PROMPT_SOURCE_EXTERNAL = (
    "local_compute",
    "local_cache_hit",
    "external_kv_transfer",
)
# `vllm:prompt_tokens_cached_by_source{source}`'s values (vLLM 0.34, `CacheHitSource`): the tier each cached token
# came from, the device cache or, through a KV connector, host memory, another vLLM instance, disk, or not said
CACHED_SOURCE_DEVICE, CACHED_SOURCE_HOST, CACHED_SOURCE_P2P, CACHED_SOURCE_DISK, CACHED_SOURCE_UNSPECIFIED = (
    "device",
    "host",
    "p2p",
    "disk",
    "external_unspecified",
)
CACHED_SOURCES = (
    CACHED_SOURCE_DEVICE,
    CACHED_SOURCE_HOST,
    CACHED_SOURCE_P2P,
    CACHED_SOURCE_DISK,
    CACHED_SOURCE_UNSPECIFIED,
)

vllm = SimpleNamespace(
    NUM_REQUESTS_RUNNING=_spec(
        "vllm:num_requests_running", "gauge", "requests", "Number of requests in model execution batches."
    ),
    NUM_REQUESTS_WAITING=_spec(
        "vllm:num_requests_waiting", "gauge", "requests", "Number of requests waiting to be processed."
    ),
    KV_CACHE_USAGE_PERC=_spec(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "1",
        "KV-cache usage. 1 means 100 percent usage (pinned blocks; cached free blocks count as free).",
    ),
    PREFIX_CACHE_QUERIES=_spec(
        "vllm:prefix_cache_queries",
        "counter",
        "tokens",
        "Prefix cache queries, in terms of number of queried tokens (once per request, at admission).",
    ),
    PREFIX_CACHE_HITS=_spec(
        "vllm:prefix_cache_hits", "counter", "tokens", "Prefix cache hits, in terms of number of cached tokens."
    ),
    NUM_PREEMPTIONS=_spec("vllm:num_preemptions", "counter", "preemptions", "Cumulative number of preemptions."),
    PROMPT_TOKENS=_spec("vllm:prompt_tokens", "counter", "tokens", "Number of prefill tokens processed."),
    PROMPT_TOKENS_CACHED=_spec(
        "vllm:prompt_tokens_cached", "counter", "tokens", "Number of cached prompt tokens (local prefix cache hits)."
    ),
    PROMPT_TOKENS_BY_SOURCE=_spec(
        "vllm:prompt_tokens_by_source",
        "counter",
        "tokens",
        "Number of prompt tokens by source: computed here (local_compute), found in the local prefix cache "
        "(local_cache_hit), or transferred from an external KV cache (external_kv_transfer).",
        LABEL_SOURCE,
    ),
    PROMPT_TOKENS_CACHED_BY_SOURCE=_spec(
        "vllm:prompt_tokens_cached_by_source",
        "counter",
        "tokens",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), "
        "disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission (vLLM 0.34).",
        LABEL_SOURCE,
    ),
    GENERATION_TOKENS=_spec("vllm:generation_tokens", "counter", "tokens", "Number of generation tokens processed."),
    REQUEST_SUCCESS=_spec(
        "vllm:request_success",
        "counter",
        "requests",
        "Count of successfully processed requests.",
        LABEL_FINISHED_REASON,
    ),
    CACHE_CONFIG_INFO=_spec("vllm:cache_config", "info", "1", "Information of the LLMEngine CacheConfig"),
    TIME_TO_FIRST_TOKEN=_spec(
        "vllm:time_to_first_token_seconds", "histogram", "s", "Histogram of time to first token in seconds."
    ),
    INTER_TOKEN_LATENCY=_spec(
        "vllm:inter_token_latency_seconds", "histogram", "s", "Histogram of inter-token latency in seconds."
    ),
    REQUEST_TIME_PER_OUTPUT_TOKEN=_spec(
        "vllm:request_time_per_output_token_seconds",
        "histogram",
        "s",
        "Histogram of time_per_output_token_seconds per request.",
    ),
    E2E_REQUEST_LATENCY=_spec(
        "vllm:e2e_request_latency_seconds", "histogram", "s", "Histogram of e2e request latency in seconds."
    ),
    REQUEST_QUEUE_TIME=_spec(
        "vllm:request_queue_time_seconds", "histogram", "s", "Histogram of time spent in WAITING phase for request."
    ),
    REQUEST_PREFILL_TIME=_spec(
        "vllm:request_prefill_time_seconds", "histogram", "s", "Histogram of time spent in PREFILL phase for request."
    ),
    REQUEST_DECODE_TIME=_spec(
        "vllm:request_decode_time_seconds", "histogram", "s", "Histogram of time spent in DECODE phase for request."
    ),
    REQUEST_INFERENCE_TIME=_spec(
        "vllm:request_inference_time_seconds", "histogram", "s", "Histogram of time spent in RUNNING phase for request."
    ),
    REQUEST_PROMPT_TOKENS=_spec(
        "vllm:request_prompt_tokens", "histogram", "tokens", "Number of prefill tokens processed."
    ),
    REQUEST_GENERATION_TOKENS=_spec(
        "vllm:request_generation_tokens", "histogram", "tokens", "Number of generation tokens processed."
    ),
    REQUEST_NUM_PREEMPTIONS=_spec(
        "vllm:request_num_preemptions", "histogram", "preemptions", "Number of preemptions per request."
    ),
    ITERATION_TOKENS=_spec(
        "vllm:iteration_tokens_total", "histogram", "tokens", "Histogram of number of tokens per engine_step."
    ),
    KV_BLOCK_LIFETIME=_spec(
        "vllm:kv_block_lifetime_seconds",
        "histogram",
        "s",
        "Histogram of KV cache block lifetime from allocation to eviction.",
    ),
    KV_BLOCK_IDLE_BEFORE_EVICT=_spec(
        "vllm:kv_block_idle_before_evict_seconds",
        "histogram",
        "s",
        "Histogram of idle time before KV cache block eviction.",
    ),
    KV_BLOCK_REUSE_GAP=_spec(
        "vllm:kv_block_reuse_gap_seconds",
        "histogram",
        "s",
        "Histogram of time gaps between consecutive KV cache block accesses.",
    ),
)
