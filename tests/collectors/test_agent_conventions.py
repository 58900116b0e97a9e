"""How agent spans become steps, piece by piece: the conventions' names as their own packages define them, and the
step maker's waiting rules (parents that come later, parents that never come, the SDK's own steps, bounded
memory). Spans are made by the OpenTelemetry SDK and encoded to OTLP by its exporter's encoder, with attribute
names taken from the conventions' packages (`opentelemetry-semantic-conventions`, `openinference-semantic-
conventions`, `opentelemetry-semantic-conventions-ai`); the end-to-end runs with real instrumentations are in
`test_agent_openinference.py` and `test_agent_genai.py`."""

from __future__ import annotations

import json

from openinference.semconv.trace import OpenInferenceSpanKindValues, SpanAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as genai
from opentelemetry.semconv_ai import LLMRequestTypeValues, TraceloopSpanKindValues
from opentelemetry.semconv_ai import SpanAttributes as Traceloop
from opentelemetry.trace import Status, StatusCode
from sentry_sdk.consts import SPANDATA

from collectors.traces.agent_spans import read_span
from collectors.traces.span_ingest import SpanIngest, attributes
from collectors.traces.span_steps import SpanSteps
from kvobs.semconv import agent_traces as c
from kvobs.semconv import attributes as a
from kvobs.semconv.spans import SpanName
from kvobs.store.writer import StoreWriter


def test_the_names_read_are_the_conventions_own():
    assert c.OPENINFERENCE_SPAN_KIND == SpanAttributes.OPENINFERENCE_SPAN_KIND
    assert tuple(OpenInferenceSpanKindValues[k].value for k in ("LLM", "TOOL", "AGENT", "CHAIN")) == (
        c.OI_LLM,
        c.OI_TOOL,
        c.OI_AGENT,
        c.OI_CHAIN,
    )
    assert (c.OI_SESSION_ID, c.OI_OUTPUT_VALUE, c.OI_TOOL_NAME) == (
        SpanAttributes.SESSION_ID,
        SpanAttributes.OUTPUT_VALUE,
        SpanAttributes.TOOL_NAME,
    )
    assert (c.OI_TOKENS_PROMPT, c.OI_TOKENS_COMPLETION, c.OI_TOKENS_CACHE_READ) == (
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT,
        SpanAttributes.LLM_TOKEN_COUNT_COMPLETION,
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ,
    )
    assert (c.TRACELOOP_SPAN_KIND, c.LLM_REQUEST_TYPE, c.TRACELOOP_ENTITY_NAME) == (
        Traceloop.TRACELOOP_SPAN_KIND,
        Traceloop.LLM_REQUEST_TYPE,
        Traceloop.TRACELOOP_ENTITY_NAME,
    )
    assert c.TRACELOOP_ASSOCIATION == Traceloop.TRACELOOP_ASSOCIATION_PROPERTIES + "."
    assert tuple(TraceloopSpanKindValues[k].value for k in ("WORKFLOW", "TASK", "AGENT", "TOOL")) == (
        c.TL_WORKFLOW,
        c.TL_TASK,
        c.TL_AGENT,
        c.TL_TOOL,
    )
    assert {LLMRequestTypeValues.CHAT.value, LLMRequestTypeValues.COMPLETION.value} == c.TL_LLM_REQUEST_TYPES
    ops = genai.GenAiOperationNameValues
    assert {ops.CHAT.value, ops.TEXT_COMPLETION.value, ops.GENERATE_CONTENT.value} == c.GENAI_LLM_OPERATIONS
    assert ops.EXECUTE_TOOL.value == c.GENAI_TOOL_OPERATION
    assert {ops.INVOKE_AGENT.value, ops.CREATE_AGENT.value, ops.INVOKE_WORKFLOW.value} == c.GENAI_AGENT_OPERATIONS
    for ours, theirs in (
        (a.GEN_AI_OPERATION_NAME, genai.GEN_AI_OPERATION_NAME),
        (a.GEN_AI_CONVERSATION_ID, genai.GEN_AI_CONVERSATION_ID),
        (a.GEN_AI_RESPONSE_ID, genai.GEN_AI_RESPONSE_ID),
        (a.GEN_AI_TOOL_NAME, genai.GEN_AI_TOOL_NAME),
        (a.GEN_AI_USAGE_INPUT_TOKENS, genai.GEN_AI_USAGE_INPUT_TOKENS),
        (a.GEN_AI_USAGE_OUTPUT_TOKENS, genai.GEN_AI_USAGE_OUTPUT_TOKENS),
        (a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, genai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS),
    ):
        assert ours == theirs


def test_cached_tokens_are_read_by_every_name_their_emitters_write():
    """The registry's name, OpenLLMetry's earlier one (Strands Agents writes both), Sentry's, LiveKit Agents' (not
    installed here: its `telemetry/trace_types.py`) and OpenInference's, each taken from a span of each convention
    as the OpenTelemetry SDK encodes it; where a span carries two, the registry's wins."""
    assert c.CACHE_READ_KEYS == (
        genai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
        Traceloop.LLM_USAGE_CACHE_READ_INPUT_TOKENS,
        SPANDATA.GEN_AI_USAGE_INPUT_TOKENS_CACHED,
        "gen_ai.usage.input_cached_tokens",
        SpanAttributes.LLM_TOKEN_COUNT_PROMPT_DETAILS_CACHE_READ,
    )
    assert c.SESSION_KEYS == (SpanAttributes.SESSION_ID, genai.GEN_AI_CONVERSATION_ID)
    conventions = {
        "otel-genai": CHAT,
        "openllmetry": {Traceloop.LLM_REQUEST_TYPE: LLMRequestTypeValues.CHAT.value},
        "openinference": {SpanAttributes.OPENINFERENCE_SPAN_KIND: OpenInferenceSpanKindValues.LLM.value},
    }
    agent = Agent()
    for convention, kind in conventions.items():
        for i, key in enumerate(c.CACHE_READ_KEYS):
            agent.tracer.start_span(f"{convention} {i}", attributes={**kind, key: 16 * (i + 1)}).end()
        both = {**kind, c.CACHE_READ_KEYS[1]: 99, c.CACHE_READ_KEYS[0]: 48}
        agent.tracer.start_span(f"{convention} both", attributes=both).end()
    read = [read_span(s, attributes(s.attributes)) for s in _spans(agent.export())]
    assert {s.role for s in read} == {"llm"}
    by_convention = {name: [s.cached_tokens for s in read if s.convention == name] for name in conventions}
    assert by_convention == {name: [16, 32, 48, 64, 80, 48] for name in conventions}


def _spans(export):
    return [s for rs in export.resource_spans for ss in rs.scope_spans for s in ss.spans]


CHAT = {genai.GEN_AI_OPERATION_NAME: "chat"}


class Agent:
    """Spans made by the OpenTelemetry SDK, exported as OTLP requests one `export()` at a time."""

    def call_under(self, parent: str, parent_attributes: dict | None = None, name: str = "chat smollm2") -> None:
        """An LLM call (a GenAI `chat` span) inside a span named `parent`."""
        outer = self.tracer.start_as_current_span(parent, attributes=parent_attributes)
        with outer, self.tracer.start_as_current_span(name, attributes=CHAT):
            pass

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("agent")

    def export(self, *, only=None):
        """An OTLP request of the spans finished since the last export (of those named `only`, keeping the rest)."""
        spans = self.exporter.get_finished_spans()
        taken = [s for s in spans if only is None or s.name in only]
        self.exporter.clear()
        for s in spans:
            if s not in taken:
                self.exporter.export([s])
        return encode_spans(taken)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def steps_maker(store, **kwargs):
    writer, clock = StoreWriter(store), Clock()
    counts = lambda ids: store.lookups.session_step_counts(ids)  # noqa: E731
    # no server in these agents' runs: no request span to wait for (test_request_join.py waits for one)
    steps = SpanSteps(writer, clock=clock, step_counts=counts, **{"join_wait_s": 0.0, **kwargs})
    return SpanIngest(writer, steps=steps), steps, writer, clock


def test_openllmetry_sdk_spans_a_workflow_session_and_its_tools(store):
    """Traceloop's SDK copies its association properties onto every span under a workflow: the session is the
    `session_id` property, the source `openllmetry`, the tool span (`traceloop.span.kind` tool) is in the pause."""
    agent = Agent()
    session = {f"{Traceloop.TRACELOOP_ASSOCIATION_PROPERTIES}.session_id": "chat-42"}
    llm = {
        Traceloop.LLM_REQUEST_TYPE: LLMRequestTypeValues.CHAT.value,
        genai.GEN_AI_REQUEST_MODEL: "smollm2",
        genai.GEN_AI_USAGE_INPUT_TOKENS: 120,
        genai.GEN_AI_USAGE_OUTPUT_TOKENS: 8,
        **session,
    }
    workflow = {
        Traceloop.TRACELOOP_SPAN_KIND: TraceloopSpanKindValues.WORKFLOW.value,
        Traceloop.TRACELOOP_ENTITY_NAME: "trip_planner",
        **session,
    }
    tool = {
        Traceloop.TRACELOOP_SPAN_KIND: TraceloopSpanKindValues.TOOL.value,
        Traceloop.TRACELOOP_ENTITY_NAME: "search_flights",
        **session,
    }
    with agent.tracer.start_as_current_span("trip_planner.workflow", attributes=workflow):
        with agent.tracer.start_as_current_span("openai.chat", attributes={**llm, genai.GEN_AI_RESPONSE_ID: "r-1"}):
            pass
        with agent.tracer.start_as_current_span("search_flights.tool", attributes=tool) as failing:
            failing.set_status(Status(StatusCode.ERROR))
            failing.record_exception(TimeoutError("the flights API did not answer"))
        with agent.tracer.start_as_current_span("openai.chat", attributes=llm) as span:
            span.set_status(Status(StatusCode.ERROR, "Error code: 429"))
            span.set_attribute(a.ERROR_TYPE, "RateLimitError")
    ingest, steps, writer, _ = steps_maker(store)
    ingest.handle(agent.export())
    assert steps.settle() == 2  # every parent known: decided at once
    writer.close()
    sessions = store.reads.sessions()
    assert sessions[["session_id", "source", "agent_name", "num_steps", "num_failed_steps"]].values.tolist() == [
        ["chat-42", "openllmetry", "trip_planner", 2, 1]
    ]
    made = store.reads.steps().sort_values("step_index")
    assert made["status"].tolist() == ["ok", "error"] and made["error_type"].fillna("-").tolist() == ["-", "429"]
    assert made["response_id"].fillna("-").tolist() == ["r-1", "-"] and made["prompt_tokens"].tolist() == [120, 120]
    (tool_call,) = json.loads(made["tools"].iloc[1])
    assert (tool_call["name"], tool_call["status"], tool_call["error_type"]) == ("search_flights", "error", "timeout")


def test_a_call_waits_for_its_parents_and_takes_the_session_they_name(store):
    """Children are exported before their parents: a call under a conversation span not yet received waits, then
    takes the conversation the parent names; a call whose parent never comes is decided after `settle_s` as a
    session of its own trace."""
    agent = Agent()
    agent.call_under(
        "invoke_agent",
        {
            genai.GEN_AI_OPERATION_NAME: "invoke_agent",
            genai.GEN_AI_CONVERSATION_ID: "conv-7",
            genai.GEN_AI_AGENT_NAME: "planner",
        },
    )
    ingest, steps, writer, clock = steps_maker(store, settle_s=10.0)
    ingest.handle(agent.export(only={"chat smollm2"}))
    assert steps.settle() == 0  # its parent has not arrived
    ingest.handle(agent.export())
    assert steps.settle() == 1
    orphan = Agent()  # a call whose parent span lives in a process that exports elsewhere
    orphan.call_under("elsewhere")
    ingest.handle(orphan.export(only={"chat smollm2"}))
    clock.now = 9.9
    assert steps.settle() == 0
    clock.now = 10.0
    assert steps.settle() == 1
    writer.close()
    sessions = store.reads.sessions().set_index("session_id")
    orphan_trace = store.reads.steps().set_index("session_id").index.difference(["conv-7"])
    assert sessions.loc["conv-7", "agent_name"] == "planner" and len(orphan_trace) == 1
    assert len(orphan_trace[0]) == 32 and sessions.loc[orphan_trace[0], "source"] == "otel-genai"


def test_the_sdks_own_steps_are_left_to_the_sdk_and_memory_is_bounded(store):
    agent = Agent()
    agent.call_under(SpanName.AGENT_STEP, {genai.GEN_AI_CONVERSATION_ID: "s"})
    ingest, steps, writer, _ = steps_maker(store, max_traces=2)
    ingest.handle(agent.export())
    assert steps.settle() == 0 and steps.num_sdk_calls == 1
    assert ingest.agent_steps == {"ok": 1}  # still counted as the SDK's step
    for _ in range(3):  # three more traces, each a call whose parent never comes: the oldest is dropped, counted
        other = Agent()
        other.call_under("gone", name="chat")
        ingest.handle(other.export(only={"chat"}))
    assert steps.num_traces_dropped == 1 and len(steps._traces) == 2
    assert steps.settle(final=True) == 2
    writer.close()
    assert len(store.reads.steps()) == 2


def test_an_sdk_session_no_recorder_wrote_keeps_the_session_that_started_it(store):
    """A subagent's SDK session exported as spans only (no recorder, no server): the collector writes its session
    with its parent, as the recorder would have."""
    from kvobs.agent import AgentSession

    agent = Agent()
    with AgentSession("researcher", session_id="child", parent_session_id="planner", tracer_provider=agent.provider):
        pass
    ingest, steps, writer, _ = steps_maker(store)
    ingest.handle(agent.export())
    steps.settle(final=True)
    writer.close()
    assert store.reads.sessions().set_index("session_id")["parent_session_id"].to_dict() == {"child": "planner"}


def test_a_conversation_whose_agent_span_comes_late_is_one_session_and_gets_its_agent_name(store):
    """An `invoke_agent` span that lasts the whole conversation arrives after the calls inside it have waited
    `settle_s`: they are decided as the trace's session, and every later call of the trace joins them (the
    conversation is never split between the trace id and the conversation id); the agent's name is written when
    its span arrives."""
    agent = Agent()
    root_attributes = {
        genai.GEN_AI_OPERATION_NAME: "invoke_agent",
        genai.GEN_AI_CONVERSATION_ID: "conv-9",
        genai.GEN_AI_AGENT_NAME: "planner",
    }
    ingest, steps, writer, clock = steps_maker(store, settle_s=10.0)
    with agent.tracer.start_as_current_span("invoke_agent planner", attributes=root_attributes) as root:
        for _ in range(2):
            with agent.tracer.start_as_current_span("chat smollm2", attributes=CHAT):
                pass
            ingest.handle(agent.export(only={"chat smollm2"}))
            clock.now += 10.0
            assert steps.settle() == 1  # its parent has not come: decided after settle_s
    ingest.handle(agent.export())  # the agent span, at last
    with agent.tracer.start_as_current_span("chat smollm2", attributes=CHAT, context=None):
        pass  # (outside the agent span: a call of another trace, its own session)
    ingest.handle(agent.export())
    assert steps.settle() == 1
    writer.close()
    trace_id = format(root.get_span_context().trace_id, "032x")
    made = store.reads.steps()
    assert made.groupby("session_id")["step_index"].apply(list).to_dict()[trace_id] == [0, 1]
    assert "conv-9" not in set(made["session_id"])
    sessions = store.reads.sessions().set_index("session_id")
    assert sessions.loc[trace_id, "agent_name"] == "planner" and sessions.loc[trace_id, "num_steps"] == 2


def test_spans_of_traces_without_agent_spans_are_not_kept(store):
    """A server's or an HTTP client's own traces (no LLM call, tool or agent in them) never fill the buffer; a
    plain parent of a call, ending after it, is still kept."""
    ingest, steps, writer, _ = steps_maker(store, max_traces=3)
    for _ in range(10):
        other = Agent()
        with other.tracer.start_as_current_span("kvcache.evict"):
            pass
        ingest.handle(other.export())
    assert steps.num_plain_skipped == 10 and not steps._traces
    agent = Agent()
    agent.call_under("conversation")
    ingest.handle(agent.export())
    assert steps.settle() == 1 and steps.num_plain_skipped == 10  # the parent came with its child: kept, rooted
    writer.close()


def test_an_sdk_call_is_never_a_step_of_its_own_even_when_its_step_span_comes_late(store):
    """The SDK marks its LLM calls with their step's index: one whose `agent_step` span has not arrived when
    `settle_s` passes is still left to that step (the SDK's recorder, or its span, makes it)."""
    agent = Agent()
    session = agent.tracer.start_as_current_span("invoke_agent", attributes={genai.GEN_AI_CONVERSATION_ID: "s"})
    with session, agent.tracer.start_as_current_span(SpanName.AGENT_STEP):
        attributes = {**CHAT, a.AGENT_STEP_INDEX: 0, genai.GEN_AI_CONVERSATION_ID: "s"}
        with agent.tracer.start_as_current_span("chat smollm2", attributes=attributes):
            pass
    ingest, steps, writer, clock = steps_maker(store, settle_s=10.0)
    ingest.handle(agent.export(only={"chat smollm2"}))
    clock.now = 10.0
    assert steps.settle() == 0 and steps.num_sdk_calls == 1
    writer.close()
    assert store.reads.steps().empty
