"""Attributes of the engine's `llm_request` span: vLLM's `gen_ai.*` keys plus the cache's `kvcache.*` ones."""

from __future__ import annotations

from collections.abc import Iterable

from instrumented_engine.engine.stats import RequestOutput
from kvobs.semconv import attributes as a
from kvobs.telemetry.kv_spans import MAX_LISTED


def request_attributes(
    out: RequestOutput,
    *,
    model_name: str,
    block_size: int,
    medium: str,
    query_tokens: int,
    hit_tokens: int,
    blocks_allocated: int,
    blocks_evicted: int,
) -> dict:
    """A finished request's span attributes (`query_tokens`...: what its KV events told)."""
    completion = len(out.output_token_ids)
    attrs = {
        a.GEN_AI_REQUEST_ID: out.request_id,
        a.GEN_AI_RESPONSE_MODEL: model_name,
        a.GEN_AI_REQUEST_N: 1,
        a.GEN_AI_USAGE_PROMPT_TOKENS: out.num_prompt_tokens,
        a.GEN_AI_USAGE_COMPLETION_TOKENS: completion,
        a.GEN_AI_USAGE_INPUT_TOKENS: out.num_prompt_tokens,
        a.GEN_AI_USAGE_OUTPUT_TOKENS: completion,
        a.GEN_AI_RESPONSE_FINISH_REASONS: [out.finish_reason or "abort"],
        a.KV_PREFIX_QUERY_TOKENS: query_tokens,
        a.KV_PREFIX_HIT_TOKENS: hit_tokens,
        a.KV_BLOCKS_ALLOCATED: blocks_allocated,
        a.KV_BLOCKS_EVICTED: blocks_evicted,
        a.KV_REQUEST_NUM_PREEMPTIONS: out.num_preemptions,
        a.KV_BLOCK_SIZE: block_size,
        a.KV_MEDIUM: medium,
    }
    optional = {
        a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: out.num_cached_tokens,  # none: never admitted, nothing looked up
        a.GEN_AI_REQUEST_MAX_TOKENS: out.max_tokens,
        a.GEN_AI_REQUEST_TEMPERATURE: out.temperature,
        a.GEN_AI_REQUEST_TOP_P: out.top_p,
        a.SESSION_ID: out.session_id,
        a.SESSION_PARENT_ID: out.parent_session_id,
    }
    attrs.update((k, v) for k, v in optional.items() if v is not None)
    attrs.update(latencies(out))
    return attrs


def extend_unique(attrs: dict, key: str, values: Iterable[str]) -> None:
    """Append the values not yet in the list attribute `attrs[key]`, up to `MAX_LISTED`."""
    listed = attrs[key]
    for value in values:
        if value not in listed and len(listed) < MAX_LISTED:
            listed.append(value)


def latencies(out: RequestOutput) -> dict[str, float]:
    """vLLM's `gen_ai.latency.*` attributes, for the phases the request reached."""
    lat = out.latencies()
    values = {
        a.GEN_AI_LATENCY_E2E: lat.e2e,
        a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: lat.ttft,
        a.GEN_AI_LATENCY_TIME_IN_QUEUE: lat.queue,
        a.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: lat.inference,
        a.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: lat.prefill,
        a.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: lat.decode,
    }
    return {key: value for key, value in values.items() if value is not None}
