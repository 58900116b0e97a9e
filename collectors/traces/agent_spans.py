"""One OTLP span of an agent's trace -> what a step is made of: an LLM call, a tool call, an agent, or a plain span
kept only to know its parent, read by the convention it was written in (`kvobs.semconv.agent_traces`).

    span = read_span(otlp_span)
    span.role        # "llm" | "tool" | "agent" | None
    span.convention  # "otel-genai" | "openinference" | "openllmetry" | "" (a plain span)

Which convention: OpenInference when `openinference.span.kind` is set, OpenLLMetry when a `traceloop.*` key or
`llm.request.type` is, OpenTelemetry GenAI when `gen_ai.operation.name` is (OpenLLMetry's LLM spans carry
`gen_ai.*` keys too, so it is asked first; its instrumentations used without its SDK write GenAI's names alone,
and are read as what they wrote). A session named on a span (`session.id`, `gen_ai.conversation.id`, a
Traceloop association property) is kept whatever the span is: frameworks put it on the agent or workflow span
only, or on every span. A failed span's `error_type` is its `error.type`, else its `exception` event's type; the
OpenAI client's status errors become the HTTP status (`BadRequestError` -> `400`), timeouts `timeout`, as the
kvobs SDK records them, and a framework's own exception class that wraps one becomes the status its message names
(`STATUS_IN_MESSAGE`); any other keeps its class. The kvobs SDK's own `agent_step` spans are marked (`sdk_step`,
with their index, TTFT and token totals): an SDK step is one step whatever calls it made, and where no recorder of
the SDK wrote it to a store (`kvobs.agent.recorded` false) the collector makes it of that span.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from collectors.traces.reply_ids import reply_ids
from collectors.values import count as _count
from collectors.values import text as _text
from kvobs.identifiers import clip_id
from kvobs.semconv import agent_traces as c
from kvobs.semconv import attributes as a
from kvobs.semconv.spans import SessionSource, SpanName, StepErrorType

LLM, TOOL, AGENT = "llm", "tool", "agent"
_OI_ROLES = {c.OI_LLM: LLM, c.OI_TOOL: TOOL, c.OI_AGENT: AGENT}
_TL_ROLES = {c.TL_TOOL: TOOL, c.TL_AGENT: AGENT, c.TL_WORKFLOW: AGENT}


@dataclass(slots=True)
class TraceSpan:
    """What a step needs of one span. Plain spans (`role` None) keep their ids, times and any session named."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start: float
    end: float
    role: str | None = None
    convention: str = ""  # "": a plain span
    session_id: str | None = None
    parent_session_id: str | None = None  # the session that started this one, where a span says so (the SDK's)
    agent_name: str | None = None
    tool_name: str | None = None
    reply_ids: tuple[str, ...] = ()  # ids the reply holds: the server request's among them (`reply_ids`)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    error_type: str | None = None  # None: the span did not fail
    sdk_step: bool = False  # a kvobs SDK `agent_step` span
    sdk_call: bool = False  # an LLM call the kvobs SDK made inside a step (never a step of its own)
    sdk_unrecorded: bool = False  # a kvobs SDK session or step span no recorder wrote: the collector makes it
    step_index: int | None = None  # an SDK step's own index
    ttft_s: float | None = None  # an SDK step's first call's TTFT


def read_span(span: Span, attrs: dict) -> TraceSpan:
    """`attrs`: the span's attributes as a plain dict (`collectors.traces.span_ingest.attributes`)."""
    out = TraceSpan(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex() or None,
        name=span.name,
        start=span.start_time_unix_nano / 1e9,
        end=span.end_time_unix_nano / 1e9,
    )
    out.sdk_step = span.name == SpanName.AGENT_STEP
    out.sdk_call = not out.sdk_step and a.AGENT_STEP_INDEX in attrs  # an LLM call of an SDK step: part of that step
    out.session_id = _text(_session(attrs))
    out.parent_session_id = _text(attrs.get(a.SESSION_PARENT_ID))
    if c.OPENINFERENCE_SPAN_KIND in attrs:
        _openinference(out, attrs)
    elif _is_openllmetry(attrs):
        _openllmetry(out, attrs)
    elif a.GEN_AI_OPERATION_NAME in attrs:
        _genai(out, attrs)
    out.sdk_unrecorded = attrs.get(a.AGENT_RECORDED) is False  # (absent: an SDK before the flag, which records)
    if out.sdk_step:
        _sdk_step(out, attrs)
    if (out.role is not None or out.sdk_step) and span.status.code == Status.STATUS_CODE_ERROR:
        out.error_type = _error_type(attrs, span)
    return out


def _sdk_step(out: TraceSpan, attrs: dict) -> None:
    """The kvobs SDK's step: its index, its first call's TTFT and its calls' token totals are on its span."""
    out.convention = SessionSource.SDK.value
    index = attrs.get(a.AGENT_STEP_INDEX)
    out.step_index = index if isinstance(index, int) and not isinstance(index, bool) else None
    ttft = attrs.get(a.AGENT_STEP_TTFT)
    out.ttft_s = float(ttft) if isinstance(ttft, int | float) and not isinstance(ttft, bool) else None
    _genai_usage(out, attrs)


def _session(attrs: dict):
    found = first_present(attrs, c.SESSION_KEYS)
    if found is not None:
        return found
    for key in c.TRACELOOP_SESSION_KEYS:
        if attrs.get(c.TRACELOOP_ASSOCIATION + key) is not None:
            return attrs[c.TRACELOOP_ASSOCIATION + key]
    return None


def _openinference(out: TraceSpan, attrs: dict) -> None:
    out.convention = SessionSource.OPENINFERENCE.value
    out.role = _OI_ROLES.get(attrs[c.OPENINFERENCE_SPAN_KIND])
    if out.role == LLM:
        out.reply_ids = reply_ids(attrs.get(c.OI_OUTPUT_VALUE))
        out.prompt_tokens = _count(attrs.get(c.OI_TOKENS_PROMPT))
        out.cached_tokens = _count(first_present(attrs, c.CACHE_READ_KEYS))
        out.completion_tokens = _count(attrs.get(c.OI_TOKENS_COMPLETION))
    elif out.role == TOOL:
        out.tool_name = _text(attrs.get(c.OI_TOOL_NAME)) or out.name
    elif out.role == AGENT:
        out.agent_name = _text(attrs.get(c.OI_AGENT_NAME)) or out.name


def _is_openllmetry(attrs: dict) -> bool:
    """Traceloop's own keys: its span kind, its LLM request type, or what its SDK copies onto every span."""
    return (
        c.TRACELOOP_SPAN_KIND in attrs
        or attrs.get(c.LLM_REQUEST_TYPE) in c.TL_LLM_REQUEST_TYPES
        or any(key.startswith(c.TRACELOOP_PREFIX) for key in attrs)
    )


def _openllmetry(out: TraceSpan, attrs: dict) -> None:
    out.convention = SessionSource.OPENLLMETRY.value
    if attrs.get(c.LLM_REQUEST_TYPE) in c.TL_LLM_REQUEST_TYPES or (
        attrs.get(a.GEN_AI_OPERATION_NAME) in c.GENAI_LLM_OPERATIONS
    ):
        out.role = LLM
        _genai_usage(out, attrs)
        return
    out.role = _TL_ROLES.get(attrs.get(c.TRACELOOP_SPAN_KIND) or "")
    name = _text(attrs.get(c.TRACELOOP_ENTITY_NAME)) or out.name
    if out.role == TOOL:
        out.tool_name = name
    elif out.role == AGENT:
        out.agent_name = name


def _genai(out: TraceSpan, attrs: dict) -> None:
    out.convention = SessionSource.OTEL_GENAI.value
    operation = attrs[a.GEN_AI_OPERATION_NAME]
    if operation in c.GENAI_LLM_OPERATIONS:
        out.role = LLM
        _genai_usage(out, attrs)
    elif operation == c.GENAI_TOOL_OPERATION:
        out.role, out.tool_name = TOOL, _text(attrs.get(a.GEN_AI_TOOL_NAME)) or out.name
    elif operation in c.GENAI_AGENT_OPERATIONS:
        out.role, out.agent_name = AGENT, _text(attrs.get(a.GEN_AI_AGENT_NAME)) or out.name


def _genai_usage(out: TraceSpan, attrs: dict) -> None:
    """GenAI's usage keys, else the older ones OpenLLMetry and vLLM still write."""
    response_id = _text(attrs.get(a.GEN_AI_RESPONSE_ID))
    out.reply_ids = (response_id,) if response_id else ()
    out.prompt_tokens = _count(attrs.get(a.GEN_AI_USAGE_INPUT_TOKENS, attrs.get(a.GEN_AI_USAGE_PROMPT_TOKENS)))
    out.completion_tokens = _count(attrs.get(a.GEN_AI_USAGE_OUTPUT_TOKENS, attrs.get(a.GEN_AI_USAGE_COMPLETION_TOKENS)))
    out.cached_tokens = _count(first_present(attrs, c.CACHE_READ_KEYS))


def _error_type(attrs: dict, span: Span) -> str:
    """What failed: `error.type`, else the `exception` event's type, else `error`; status errors as the status, a
    framework's own exception class as the HTTP status its message names where it wraps a client's error."""
    found, message = attrs.get(a.ERROR_TYPE), ""
    for event in span.events:
        if event.name == c.EXCEPTION_EVENT:
            values = {kv.key: kv.value.string_value for kv in event.attributes}
            found, message = found or values.get(c.EXCEPTION_TYPE), values.get(c.EXCEPTION_MESSAGE, "")
            break
    if found is None:
        return "error"
    name = str(found).rsplit(".", 1)[-1]  # "openai.BadRequestError" -> "BadRequestError"
    if name in c.OPENAI_STATUS_ERRORS:
        return c.OPENAI_STATUS_ERRORS[name]
    if "timeout" in name.lower():
        return StepErrorType.TIMEOUT.value
    for pattern in c.STATUS_IN_MESSAGE:
        status = re.search(pattern, message)
        if status:
            return status.group(1)
    return clip_id(str(found))


def first_key(attrs: dict, keys: tuple[str, ...]) -> str | None:
    """The first of `keys` the span carries a value for (the conventions' spellings of one thing, in order)."""
    return next((key for key in keys if attrs.get(key) is not None), None)


def first_present(attrs: dict, keys: tuple[str, ...]):
    key = first_key(attrs, keys)
    return None if key is None else attrs[key]
