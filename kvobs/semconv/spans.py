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


class KVEventKind(Name):
    """`kv_events.kind` in the store. `stored`/`removed`/`cleared` mirror vLLM's KV events; the rest
    are what only the instrumented engine can tell."""

    STORED = "stored"
    REMOVED = "removed"
    CLEARED = "cleared"
    HIT = "hit"
    ALLOCATED = "allocated"
    EVICTED = "evicted"
    PREEMPTED = "preempted"
    INVALIDATED = "invalidated"


# Kinds that end a cached block's content: the engine's `evicted`/`invalidated`, vLLM's `removed`.
BLOCK_LOSS_KINDS = (KVEventKind.EVICTED.value, KVEventKind.INVALIDATED.value, KVEventKind.REMOVED.value)


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


class RunSource(Name):
    """`runs.source`: who recorded the run."""

    ENGINE = "engine"  # kvobs serve, at its start
    COLLECTOR = "collector"  # kvobs collect, from the replica's /metrics (its process start)


class StepErrorType(Name):
    """`error.type` values the SDK sets itself (HTTP failures use the status code, others the exception type)."""

    TIMEOUT = "timeout"  # the step's deadline passed
    INVALID_RESPONSE = "invalid_response"  # the reply could not be parsed as the agent required
