"""Span and event attribute keys.

`gen_ai.*` keys follow the OpenTelemetry GenAI conventions (status: Development); the `gen_ai.latency.*`
and `gen_ai.usage.prompt_tokens/completion_tokens` keys are the ones vLLM puts on its `llm_request`
span, kept so that a trace from vLLM and one from our engine read alike. Everything about the cache
is under `kvcache.*`. Block hashes are the low 64 bits, as vLLM publishes them, as ints.
"""

from __future__ import annotations

from functools import lru_cache

# ---- GenAI (OpenTelemetry) -----------------------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
SESSION_ID = "session.id"
SESSION_PARENT_ID = "kvobs.session.parent_id"  # the session that started this one (no convention names one yet)
# resource attributes: which replica exported a span (`OTEL_RESOURCE_ATTRIBUTES=service.instance.id=vllm-a`)
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"

# ---- vLLM's llm_request keys ---------------------------------------------------------------------
GEN_AI_REQUEST_ID = "gen_ai.request.id"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_N = "gen_ai.request.n"
GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"

# ---- kvobs agent -----------------------------------------------------------------------------
AGENT_STEP_INDEX = "kvobs.agent.step.index"
AGENT_STEP_DEADLINE = "kvobs.agent.step.deadline_s"
AGENT_STEP_TTFT = "kvobs.agent.step.ttft_s"  # the step's first LLM call's time to first token
# on the SDK's session and step spans: true when the SDK writes them to a store itself (a recorder), so the
# collector does not make them again from the spans
AGENT_RECORDED = "kvobs.agent.recorded"

# ---- KV cache ---------------------------------------------------------------------------------
KV_BLOCK_SIZE = "kvcache.block.size"
KV_BLOCK_HASH = "kvcache.block.hash"
KV_BLOCK_HASHES = "kvcache.block.hashes"
KV_BLOCKS_ALLOCATED = "kvcache.blocks.allocated"
KV_BLOCKS_EVICTED = "kvcache.blocks.evicted"
KV_BLOCKS_FREE = "kvcache.blocks.free"
KV_BLOCKS_RESIDENT = "kvcache.blocks.resident"
KV_BLOCKS_TOTAL = "kvcache.blocks.total"
KV_BLOCKS_HIT = "kvcache.blocks.hit"
KV_BLOCKS_FREED = "kvcache.blocks.freed"
KV_BLOCKS_INVALIDATED = "kvcache.blocks.invalidated"
KV_PREFIX_QUERY_TOKENS = "kvcache.prefix.query_tokens"
KV_PREFIX_HIT_TOKENS = "kvcache.prefix.hit_tokens"
KV_PREFIX_READMISSION = "kvcache.prefix.readmission"
KV_TIER_HIT_TOKENS = "kvcache.tier.hit_tokens"  # tokens after the cache's hits found in an offload tier (loaded)
KV_TIER_LOAD_SECONDS = "kvcache.tier.load_seconds"  # the copy back from the tier, as the engine timed it
KV_TOKENS_LOST = "kvcache.tokens.lost"  # computed tokens a preemption threw away (to recompute)
KV_EVICTION_REASON = "kvcache.eviction.reason"
KV_EVICTION_REASONS = "kvcache.eviction.reasons"
KV_INVALIDATION_REASON = "kvcache.invalidation.reason"
KV_PREEMPTION_REASON = "kvcache.preemption.reason"
KV_REQUEST_NUM_PREEMPTIONS = "kvcache.request.num_preemptions"
KV_SESSIONS_AFFECTED = "kvcache.sessions.affected"
KV_SESSIONS_PAUSED = "kvcache.sessions.paused"  # owners idle (between requests) when their blocks went
KV_LINK_RELATION = "kvcache.link.relation"  # on span links: why this span points at another one
KV_MEDIUM = "kvcache.medium"
KV_INSTANCE = "kvcache.instance"  # the engine or vLLM the cache belongs to (on spans the collector makes)
KV_BATCH_REQUESTS = "kvcache.batch.requests"
KV_BATCH_TOKENS = "kvcache.batch.tokens"
KV_REQUESTS_RUNNING = "kvcache.requests.running"
KV_REQUESTS_WAITING = "kvcache.requests.waiting"

# kvcache.link.relation values
LINK_EVICTED_FROM = "evicted_from"  # the linked session's blocks were evicted by this span's request
LINK_INVALIDATED = "invalidated"  # the linked session's blocks were invalidated by this span

MEDIUM_GPU = "GPU"  # vLLM's name for the primary KV cache, the one the model attends from, on any device
MEDIUM_CPU = "CPU"  # vLLM's name for its offloading connector's host-memory tier
# The tiers engines name (vLLM: GPU, CPU; its offloading: CPU, STORAGE; LMCache: cpu, Disk; SGLang's HiCache: GPU,
# CPU_PINNED, DISK, EXTERNAL; TensorRT-LLM's cache levels: gpu, host, disk), each stored and shown under one name:
# what a spelling means, lower-cased -> kvobs's
MEDIUMS = {
    "gpu": MEDIUM_GPU,
    "cpu": MEDIUM_CPU,
    "cpu_pinned": MEDIUM_CPU,  # SGLang's host tier (pinned host memory)
    "host": MEDIUM_CPU,  # TensorRT-LLM's host cache level (its secondary pool)
    "disk": "DISK",
    "storage": "STORAGE",
    "fs": "STORAGE",  # vLLM 0.26's storage backends, merged into STORAGE from 0.27
    "obj": "STORAGE",
    "shared_storage": "SHARED_STORAGE",
    "external": "EXTERNAL",  # SGLang's shared or remote pool (Mooncake, ...)
}


@lru_cache(maxsize=256)  # an engine names a few tiers, once per block event: the name is looked up, not rebuilt
def medium_name(medium: str | None) -> str | None:
    """The one name kvobs keeps for a tier an engine named `medium` (`Disk`, `cpu` -> `DISK`, `CPU`); a tier it
    does not know, as sent (upper-cased): its events are not read as any tier's (`is_known_medium`), and say so."""
    return None if medium is None else MEDIUMS.get(medium.strip().lower(), medium.strip().upper())


def is_known_medium(medium: str | None) -> bool:
    """Whether kvobs knows the tier (`MEDIUMS`; none: the engine's device cache)."""
    return medium is None or medium.strip().lower() in MEDIUMS


# vLLM's `locality` of a storage tier's events (0.26+): whether the storage is the publishing replica's own or not
# (a shared file system or object store); absent: unspecified, and vLLM never infers it
LOCALITY_LOCAL, LOCALITY_REMOTE = "LOCAL", "REMOTE"
REMOTE_PREFIX = "REMOTE_"  # a tier the replica named REMOTE: kvobs keeps it apart from its own (`tier_name`)
SHARED_TIERS = frozenset({"SHARED_STORAGE", "EXTERNAL"})  # tiers shared by name: a pool other replicas may read


OWNER_SEPARATOR = "/"  # between a tier's medium and the secondary tier that owns it (`tier_name`): CPU/kvcr
MAX_OWNER_CHARS = 16  # an owner's name kept up to this long, so a tier's name fits its column (`limits.MAX_TIER_CHARS`)


@lru_cache(maxsize=256)
def tier_name(medium: str | None, locality: str | None, ownership: str | None = None) -> tuple[str | None, bool]:
    """The tier an event names by `medium`, `locality` and `ownership`, as kvobs names it, and whether kvobs knows it.

    A tier below the device cache that the replica calls REMOTE is a place apart from its own (`REMOTE_STORAGE`):
    its copies are counted in that tier and never as the replica's own (`is_shared_tier`). LOCAL or no locality: the
    tier as `medium_name` names it. Any other locality, or REMOTE on the device cache, is not known (fails closed).
    A secondary tier that names itself (vLLM 0.32's `ownership`: KVCR's own CPU and storage pools) is a tier apart
    from the offloading connector's own of that medium, as vLLM keeps their residencies apart: `CPU/kvcr`."""
    name, known = medium_name(medium), is_known_medium(medium)
    place = None if locality is None else locality.strip().upper()
    if place is not None and place != LOCALITY_LOCAL:
        if not (place == LOCALITY_REMOTE and known and is_lower_tier(name)):
            return f"{name}@{place}", False
        name = f"{REMOTE_PREFIX}{name}"
    owner = None if ownership is None else ownership.strip()[:MAX_OWNER_CHARS]
    if owner and is_lower_tier(name):
        return f"{name}{OWNER_SEPARATOR}{owner}", known
    return name, known


@lru_cache(maxsize=256)  # once a KV event in the fleet's replay
def is_shared_tier(medium: str | None) -> bool:
    """Whether a tier, as kvobs names it, may be read by other replicas (one named REMOTE, a shared storage, SGLang's
    external pool): a copy there is not this replica's alone, so no routing loss is claimed for it."""
    return isinstance(medium, str) and (
        medium.startswith(REMOTE_PREFIX) or medium.partition(OWNER_SEPARATOR)[0] in SHARED_TIERS
    )


def is_lower_tier(medium: str | None) -> bool:
    """Whether a tier, as kvobs names it (`medium_name`), is one below the device cache (an offload tier: CPU,
    disk, storage, ...): its copies are stored as `tier_stored`/`tier_removed`, never as the cache's own blocks."""
    return medium is not None and medium != MEDIUM_GPU
