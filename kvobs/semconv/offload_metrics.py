"""vLLM's KV offloading metrics: its offloading connector's (and its scheduler's connector counters) and its tiering
offload manager's, kept apart from `kvobs.semconv.metrics` and joined to its `vllm` names there.

Registered by an engine with an offload tier only, as vLLM registers them with a KV connector (a tier that is not
there has no zero to show); kvobs's engine has no tiering manager, so never the tiering ones.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvobs.semconv.metric_spec import metric_spec as _spec

LABEL_TIER = "tier"  # a tier as vLLM's tiering offload manager names it ("0:primary", "1:fs")

vllm_offload = SimpleNamespace()  # joined to `kvobs.semconv.metrics.vllm`
vllm_offload.EXTERNAL_PREFIX_CACHE_QUERIES = _spec(
    "vllm:external_prefix_cache_queries",
    "counter",
    "tokens",
    "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried "
    "tokens.",
)
vllm_offload.EXTERNAL_PREFIX_CACHE_HITS = _spec(
    "vllm:external_prefix_cache_hits",
    "counter",
    "tokens",
    "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
)
vllm_offload.KV_OFFLOAD_LOAD_BYTES = _spec(
    "vllm:kv_offload_load_bytes", "counter", "bytes", "Total bytes loaded from offload storage to GPU."
)
vllm_offload.KV_OFFLOAD_LOAD_TIME = _spec(
    "vllm:kv_offload_load_time", "counter", "s", "Total load time from offload storage to GPU, in seconds."
)
vllm_offload.KV_OFFLOAD_LOAD_SIZE = _spec(
    "vllm:kv_offload_load_size", "histogram", "bytes", "Histogram of KV offload load operation size, in bytes."
)
vllm_offload.KV_OFFLOAD_STORE_BYTES = _spec(
    "vllm:kv_offload_store_bytes", "counter", "bytes", "Total bytes stored from GPU to offload storage."
)
vllm_offload.KV_OFFLOAD_STORE_TIME = _spec(
    "vllm:kv_offload_store_time", "counter", "s", "Total store time from GPU to offload storage, in seconds."
)
vllm_offload.KV_OFFLOAD_STORE_SIZE = _spec(
    "vllm:kv_offload_store_size", "histogram", "bytes", "Histogram of KV offload store operation size, in bytes."
)
# vLLM's tiering offload manager (a primary CPU tier and secondary tiers under it): each tier's chunk lookups, by
# `tier` ("0:primary", then "N:<tier type>" per secondary tier in its order: "1:fs"); a secondary tier is asked only
# after the primary missed, each chunk once per request until it is allocated. kvobs's engine has no such tiers.
vllm_offload.KV_OFFLOAD_TIERING_CHUNK_QUERIES = _spec(
    "vllm:kv_offload_tiering_chunk_queries",
    "counter",
    "chunks",
    "Number of chunk lookup queries sent to a tier, labeled by tier.",
    LABEL_TIER,
)
vllm_offload.KV_OFFLOAD_TIERING_CHUNK_HITS = _spec(
    "vllm:kv_offload_tiering_chunk_hits",
    "counter",
    "chunks",
    "Number of chunk lookup hits in a tier, labeled by tier.",
    LABEL_TIER,
)
TIERING_METRICS = (vllm_offload.KV_OFFLOAD_TIERING_CHUNK_QUERIES, vllm_offload.KV_OFFLOAD_TIERING_CHUNK_HITS)
OFFLOAD_METRICS = (
    vllm_offload.EXTERNAL_PREFIX_CACHE_QUERIES,
    vllm_offload.EXTERNAL_PREFIX_CACHE_HITS,
    vllm_offload.KV_OFFLOAD_LOAD_BYTES,
    vllm_offload.KV_OFFLOAD_LOAD_TIME,
    vllm_offload.KV_OFFLOAD_LOAD_SIZE,
    vllm_offload.KV_OFFLOAD_STORE_BYTES,
    vllm_offload.KV_OFFLOAD_STORE_TIME,
    vllm_offload.KV_OFFLOAD_STORE_SIZE,
)
