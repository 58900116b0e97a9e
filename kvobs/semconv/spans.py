"""Span names, span-event names and store event kinds.

Span names follow the OpenTelemetry GenAI conventions where they exist (`invoke_agent {agent}`,
`chat {model}`, `execute_tool {tool}`) and vLLM where it already has one (`llm_request`); the KV-cache
spans live under `kvcache.*`.

| span                      | kind     | emitted by                                        |
|---------------------------|----------|---------------------------------------------------|
| `invoke_agent {agent}`    | INTERNAL | agent SDK, one per session                        |
| `agent_step`              | INTERNAL | agent SDK, one per step                           |
| `chat {model}`            | CLIENT   | agent SDK, the LLM call (injects `traceparent`)   |
| `execute_tool {tool}`     | INTERNAL | agent SDK, a tool call (the pause the cache must survive) |
| `llm_request`             | SERVER   | engine, one per request, child of its `traceparent` |
| `kvcache.invalidate`      | INTERNAL | engine, one per invalidation, linked to the sessions it hit |
| `kvcache.evict`           | INTERNAL | engine, evictions no request caused (session release) |
| `kvcache.step`            | INTERNAL | engine, every Nth step when step sampling is on   |
"""

from __future__ import annotations

from kvobs.semconv.reasons import Name


class SpanName:
    INVOKE_AGENT = "invoke_agent"
    AGENT_STEP = "agent_step"
    CHAT = "chat"
    EXECUTE_TOOL = "execute_tool"
    LLM_REQUEST = "llm_request"
    KV_INVALIDATE = "kvcache.invalidate"
    KV_EVICT = "kvcache.evict"
    KV_STEP = "kvcache.step"


def invoke_agent_span(agent_name: str) -> str:
    return f"{SpanName.INVOKE_AGENT} {agent_name}"


def chat_span(model: str) -> str:
    return f"{SpanName.CHAT} {model}"


def execute_tool_span(tool_name: str) -> str:
    return f"{SpanName.EXECUTE_TOOL} {tool_name}"


class GenAIOperation(Name):
    """`gen_ai.operation.name` values."""

    INVOKE_AGENT = "invoke_agent"
    CHAT = "chat"
    EXECUTE_TOOL = "execute_tool"


class SpanEvent:
    """Span events on `llm_request`: what the cache did for (and because of) the request."""

    PREFIX_LOOKUP = "kvcache.prefix_lookup"  # query/hit tokens and blocks at admission (and re-admission)
    ALLOCATE = "kvcache.allocate"  # blocks taken this step, free blocks after
    EVICT = "kvcache.evict"  # cached blocks this request's allocation evicted: reasons, previous owners
    PREEMPT = "kvcache.preempt"  # the request lost its blocks to make room (recompute)
    RESUME = "kvcache.resume"  # re-admitted after a preemption
    FIRST_TOKEN = "kvcache.first_token"
    TIER_LOAD = "kvcache.tier_load"  # the request's prefix went on in an offload tier: blocks copied back, timed


class KVEventKind(Name):
    """`kv_events.kind` in the store. `stored`/`removed`/`cleared` mirror vLLM's KV events of the primary cache,
    `tier_stored`/`tier_removed` those of a tier below it; the rest are what only the instrumented engine can
    tell."""

    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"
    HIT = "hit"
    ALLOCATED = "allocated"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    INVALIDATED = "invalidated"
    # An offload tier below the primary cache (vLLM's offloading connector, SGLang's HiCache, ...): a copy of a block
    # reached it, left it, or was loaded back into the primary cache for a request. Apart from `stored`/`removed`, so
    # no count of the primary cache's blocks (nor "blocks lost") reads a tier's copy as a block of its own.
    TIER_STORED = "tier_stored"
    TIER_REMOVED = "tier_removed"
    TIER_LOADED = "tier_loaded"


# Kinds that end a cached block's content: the engine's `evicted`/`invalidated`, vLLM's `removed`.
BLOCK_LOSS_KINDS = (KVEventKind.EVICTED.value, KVEventKind.INVALIDATED.value, KVEventKind.REMOVED.value)
# What a block clock (`kvobs.block_clock`) is fed: a tier's stores, its losses, and clears of the whole cache.
CLOCK_KINDS = (
    KVEventKind.STORED.value,
    KVEventKind.TIER_STORED.value,
    *BLOCK_LOSS_KINDS,
    KVEventKind.TIER_REMOVED.value,
    KVEventKind.CLEARED.value,
)


class StepStatus(Name):
    OK = "ok"
    ERROR = "error"


class SessionSource(Name):
    """`sessions.source`: who recorded the session."""

    SDK = "sdk"
    ENGINE = "engine"
    VLLM = "vllm"
    OTEL_GENAI = "otel-genai"  # steps from OpenTelemetry GenAI spans (kvobs.semconv.agent_traces)
    OPENINFERENCE = "openinference"
    OPENLLMETRY = "openllmetry"
    DYNAMO = "dynamo"  # NVIDIA Dynamo's request trace (`kvobs import dynamo-trace`)


class RunSource(Name):
    """`runs.source`: who recorded the run."""

    ENGINE = "engine"  # kvobs serve, at its start
    COLLECTOR = "collector"  # kvobs collect, from the replica's /metrics (its process start)


class RunEngine(Name):
    """`runs.engine`: the engine a run was of, as its /metrics (or the engine itself) says; what the what-if's replay
    reads its block rules by (`instrumented_engine.whatif.replay.REGISTERS`)."""

    KVOBS = "kvobs"  # kvobs serve (`kvobs_engine_start_time_seconds` on its /metrics)
    VLLM = "vllm"  # vLLM (its `vllm:` metrics without ours)


class StepErrorType(Name):
    """`error.type` values the SDK sets itself (HTTP failures use the status code, others the exception type)."""

    TIMEOUT = "timeout"  # the step's deadline passed
    INVALID_RESPONSE = "invalid_response"  # the reply could not be parsed as the agent required


class StepJoin(Name):
    """`steps.request_join`: how the collector tied a step made of an agent's spans to its server request, or why
    it could not (`collectors/traces/request_join.py`). NULL on the SDK's steps (their trace context reaches the
    server)."""

    RESPONSE_ID = "response_id"  # an id in the reply is a request the collector saw in the call's time window
    TRACE = "trace"  # the call's trace context reached the server
    TIMING = "timing"  # the only request in the call's window with its prompt and completion token counts
    UNANSWERED = "unanswered"  # the call failed with no answer, and no request of its trace was seen
    NO_REQUEST = "no_request"  # no server request span arrived for the call's time window
    ID_NOT_SEEN = "id_not_seen"  # the reply names ids, none of a request seen in the call's window
    AMBIGUOUS = "ambiguous"  # several requests fit the call's window and token counts
    NO_COUNTS = "no_counts"  # requests in its window, but the call names no id and no token counts to tell them by


STEP_JOINED = frozenset({StepJoin.RESPONSE_ID.value, StepJoin.TRACE.value, StepJoin.TIMING.value})


class CachedFrom(Name):
    """`requests.cached_from`: where a request's `cached_tokens` came from. NULL where none is known (and on rows
    stored before schema 0024, whose counts were the server's own)."""

    SERVER = "server"  # the server's own record: its request span, or kvobs's engine
    REPLY = "reply"  # the reply's usage (`prompt_tokens_details.cached_tokens`) as the joined step's span recorded
    # it: the server's count all the same, read where the server's span carries none (vLLM's spans)


def server_cached_from(cached_tokens: int | None) -> str | None:
    """`requests.cached_from` of a count the server's own record gives (None where it gives none)."""
    return None if cached_tokens is None else CachedFrom.SERVER.value


class CachedFill(Name):
    """What became of a joined request's cached tokens where its own span said none
    (`kvobs_collector_requests_cached_filled_total{outcome}`)."""

    FILLED = "filled"  # the reply's count, stored on the request (`cached_from` reply)
    NO_COUNT = "no_count"  # the step's span holds none (prompt-token details off, or not kept): still unknown
    COUNTS_DIFFER = "counts_differ"  # the reply's prompt tokens are not the request's: not taken


class BlockTie(Name):
    """How the blocks a request stored were tied to it and to its session (`kvobs.analytics.cache.ownership`), or why
    they could not be."""

    HEADER = "header"  # its blocks name its session: `X-Session-ID` or `session_id` reached the server
    INFERENCE = "inference"  # the one chain on its instance, as deep as its tokens, stored while it ran
    STORED_NOTHING = "stored_nothing"  # no block as deep as its tokens was stored while it ran: all of it was cached
    AMBIGUOUS = "ambiguous"  # several chains fit its depth, its times and its session's earlier chain, or its one
    # tip is another request's one tip too (a prefix they prefilled together: either may have stored it)
    NO_CHAIN = "no_chain"  # the blocks that fit do not reach a chain's root in what was read
    NO_COUNTS = "no_counts"  # no token counts or times to tell its chain by, or no KV events of its instance
    NO_SESSION = "no_session"  # its blocks were found, but they name no session and no step named the request's


BLOCKS_TIED = frozenset({BlockTie.HEADER.value, BlockTie.INFERENCE.value})


class TraceJoin(Name):
    """How a Dynamo request-trace row was joined with the KV events of the worker that served it
    (`collectors.dynamo_join`), or why not."""

    JOINED = "joined"  # one stream held the most of the blocks it named: the request is that stream's
    NOT_HELD = "not_held"  # no stream held a block it named (its worker's events are not collected, or came late)
    AMBIGUOUS = "ambiguous"  # streams held as many of its blocks, and its worker was never told apart before
    NO_BLOCKS = "no_blocks"  # the row names no blocks (`replay.input_sequence_hashes`)
    BLOCK_SIZE_DIFFERS = "block_size_differs"  # its blocks are of another size than every stream's
