"""Joining an agent's LLM call to its server request: an id is taken only when a request seen in the call's window
has it; trace context next; timing only where exactly one request fits; otherwise none, with the reason. And the
step maker waits for a request span that has not arrived yet, holding the session's later calls behind it."""

from __future__ import annotations

import pandas as pd

from collectors.traces.agent_spans import LLM, TraceSpan
from collectors.traces.reply_ids import reply_ids
from collectors.traces.request_join import RequestJoin
from collectors.traces.span_steps import SpanSteps
from kvobs.analytics.steps.joins import join_rates
from kvobs.semconv.spans import StepJoin
from kvobs.store.rows import RequestRecord
from kvobs.store.writer import StoreWriter


def call(
    span_id: str,
    start: float,
    end: float,
    *,
    ids=(),
    prompt=None,
    completion=None,
    trace="t1",
    error=None,
    parent: str | None = None,
    role: str = LLM,
    name: str = "chat",
):
    """A span of session `s` (named on the root): an LLM call by default, else `role` (a tool: `name` is the tool's)."""
    return TraceSpan(
        trace_id=trace,
        span_id=span_id,
        parent_id=parent,
        name=name,
        start=start,
        end=end,
        role=role,
        convention="openinference",
        session_id="s" if parent is None else None,
        reply_ids=tuple(ids),
        prompt_tokens=prompt,
        completion_tokens=completion,
        error_type=error,
        tool_name=name,
    )


def request(rid: str, arrival: float, finished: float, *, prompt=100, completion=8, trace="other", parent=None):
    return RequestRecord(
        request_id=rid,
        instance="engine",
        arrival_ts=arrival,
        finished_ts=finished,
        trace_id=trace,
        parent_span_id=parent,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def test_a_reply_id_is_taken_only_when_a_request_in_the_calls_window_has_it():
    join = RequestJoin(slack_s=1.0)
    join.add([request("chatcmpl-1", 10.1, 11.0), request("chatcmpl-old", 1.0, 2.0)])
    found = join.find(call("a", 10.0, 11.2, ids=["lc_run--x", "chatcmpl-1"]))  # a run id first: not a request
    assert (found.request_id, found.method, found.instance) == ("chatcmpl-1", StepJoin.RESPONSE_ID, "engine")
    stale = join.find(call("b", 20.0, 21.0, ids=["chatcmpl-old"]))  # a request with that id, but long before
    assert (stale.request_id, stale.method) == (None, StepJoin.NO_REQUEST)


def test_trace_context_joins_the_calls_own_child_and_never_the_next_calls_request():
    join = RequestJoin(slack_s=2.0)
    # the next call's request arrives 0.4 s after this call ends (a short tool pause), in the same trace
    join.add([request("r1", 10.1, 10.9, trace="t1", parent="other"), request("r2", 11.4, 12.0, trace="t1")])
    assert join.find(call("a", 10.0, 11.0, prompt=100)).request_id == "r1"
    found = join.find(call("b", 11.3, 12.1))
    assert (found.request_id, found.method) == ("r2", StepJoin.TRACE)


def test_timing_joins_only_the_one_request_that_fits_its_window_and_counts():
    join = RequestJoin(slack_s=0.5)
    join.add([request("r1", 10.1, 10.9, prompt=294), request("r2", 10.2, 10.8, prompt=300)])
    found = join.find(call("a", 10.0, 11.0, prompt=294, completion=8))
    assert (found.request_id, found.method) == ("r1", StepJoin.TIMING)
    # two calls at once with the same prompt length: either request could be either call's, so neither is taken
    join.add([request("r3", 20.1, 20.9, prompt=120), request("r4", 20.2, 20.8, prompt=120)])
    assert join.find(call("b", 20.0, 21.0, prompt=120)).method == StepJoin.AMBIGUOUS
    # a request already taken (by its id, by another call) is never taken again by timing
    join.add([request("r5", 30.1, 30.9, prompt=50)])
    assert join.find(call("c", 30.0, 31.0, ids=["r5"])).method == StepJoin.RESPONSE_ID
    assert join.find(call("d", 30.0, 31.0, prompt=50)).method == StepJoin.NO_REQUEST
    # a call with no id and no counts cannot tell the requests of its window apart
    join.add([request("r6", 40.1, 40.9)])
    assert join.find(call("e", 40.0, 41.0)).method == StepJoin.NO_COUNTS
    assert join.find(call("f", 40.0, 41.0, error="400")).method == StepJoin.UNANSWERED
    # a refusal is a refusal even where no request span arrived at all: not a server that exports nothing
    assert join.find(call("g", 90.0, 91.0, error="400")).method == StepJoin.UNANSWERED


def test_a_request_named_by_another_calls_reply_is_not_taken_by_timing():
    join = RequestJoin(slack_s=0.5)
    join.name(call("named", 10.0, 11.0, ids=["r1"]))  # its span arrived; its request has not been decided yet
    join.add([request("r1", 10.1, 10.9, prompt=294)])
    assert join.find(call("other", 10.0, 11.0, prompt=294)).method == StepJoin.NO_REQUEST


def test_reply_ids_read_each_frameworks_shape():
    langchain = (
        '{"generations": [[{"text": "", "message": {"lc": 1, "type": "constructor", "kwargs": {"id": "lc_run--1", '
        '"response_metadata": {"id": "chatcmpl-9", "model_name": "m"}}}}]], "llm_output": {"id": "chatcmpl-9"}}'
    )
    assert reply_ids(langchain) == ("lc_run--1", "chatcmpl-9")  # the run id too: only a request's id is ever taken
    # a tool call's id is the call's, never the server's: not a candidate, wherever the library keeps the calls
    assert reply_ids('{"id": "chatcmpl-1", "choices": [{"message": {"tool_calls": [{"id": "call_1"}]}}]}') == (
        "chatcmpl-1",
    )
    tool_only = '{"messages": [{"kwargs": {"tool_calls": [{"id": "call_2", "name": "f"}], "invalid_tool_calls": []}}]}'
    assert reply_ids(tool_only) == ()
    assert reply_ids("Paris is the capital.") == () and reply_ids("{not json") == () and reply_ids(None) == ()


def test_the_step_maker_waits_for_a_late_request_span_and_holds_the_sessions_later_calls(store):
    now = [0.0]
    writer = StoreWriter(store)
    steps = SpanSteps(writer, join_wait_s=20.0, clock=lambda: now[0])
    steps.add([call("a", 10.0, 11.0, ids=["r1"]), call("b", 12.0, 13.0, ids=["r2"])])
    steps.add_requests([request("r2", 12.1, 12.9)])  # the second call's request came first
    assert steps.settle() == 0  # a's request is not seen yet: a waits, and b with it (indexes go in order)
    now[0] = 5.0
    steps.add_requests([request("r1", 10.1, 10.9)])
    assert steps.settle() == 2
    steps.add([call("c", 30.0, 31.0, ids=["r3"])])  # its request span never comes
    now[0] = 10.0
    assert steps.settle() == 0
    now[0] = 30.0
    assert steps.settle() == 1
    writer.close()
    made = store.reads.steps().sort_values("step_index")
    assert made["request_id"].fillna("-").tolist() == ["r1", "r2", "-"]
    assert made["request_join"].tolist() == ["response_id", "response_id", "no_request"]
    assert steps.joins == {("response_id", "openinference"): 2, ("no_request", "openinference"): 1}
    rates = join_rates(made)
    assert rates.loc["s", ["judged", "joined", "by_timing", "why"]].tolist() == [3, 2, 0, "no_request"]


def test_join_rates_say_not_measured_for_steps_nobody_judged():
    steps = pd.DataFrame({"session_id": ["sdk", "fw", "fw"], "request_join": [None, "timing", "no_request"]})
    rates = join_rates(steps)
    assert pd.isna(rates.loc["sdk", "rate"]) and rates.loc["sdk", "judged"] == 0 and rates.loc["sdk", "why"] is None
    assert rates.loc["fw", ["judged", "joined", "by_timing", "rate", "why"]].tolist() == [2, 1, 1, 0.5, "no_request"]


def test_a_convention_whose_steps_are_mostly_not_joined_is_said_in_a_log_line(store, caplog):
    now = [0.0]
    writer = StoreWriter(store)
    steps = SpanSteps(writer, join_wait_s=0.0, clock=lambda: now[0])
    steps.add([call(f"c{i}", 10.0 * i, 10.0 * i + 1, prompt=100) for i in range(5)])  # no server exports its spans
    with caplog.at_level("WARNING", logger="collectors.traces.span_steps"):
        assert steps.settle() == 5
        steps.add([call("c5", 60.0, 61.0, prompt=100)])
        now[0] = 10.0
        steps.settle()  # a second line waits for WARN_EVERY_S
    writer.close()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("5 of 5 steps made of openinference spans are tied to no server request") and (
        "no server request span arrived for the call's time window" in line
    )


def test_a_tool_call_recorded_twice_is_one_call_and_a_subagents_tools_stay_its_own():
    """An instrumentation's tool span with the framework's own tool span for the same call under it: one call. A tool
    that runs a sub-agent, whose LLM calls its own tools: the outer call and the sub-agent's calls, each once."""
    from collectors.traces.agent_spans import AGENT, TOOL
    from collectors.traces.agent_trace import Trace

    wrapped = Trace()
    for span in (
        call("root", 0.0, 10.0, parent=None, role=AGENT),
        call("outer", 1.0, 3.0, parent="root", role=TOOL, name="search"),
        call("inner", 1.1, 2.9, parent="outer", role=TOOL, name="search"),
    ):
        wrapped.spans[span.span_id] = span
    assert [t["name"] for t in wrapped.tools("s", 0.5, 9.0)] == ["search"]

    nested = Trace()
    for span in (
        call("root", 0.0, 10.0, parent=None, role=AGENT),
        call("outer", 1.0, 5.0, parent="root", role=TOOL, name="ask_expert"),
        call("sub", 1.1, 4.9, parent="outer", role=AGENT),
        call("subcall", 1.2, 2.0, parent="sub", role=LLM),
        call("subtool", 2.1, 3.0, parent="sub", role=TOOL, name="lookup"),
    ):
        nested.spans[span.span_id] = span
    assert [t["name"] for t in nested.tools("s", 0.5, 9.0)] == ["ask_expert", "lookup"]


def test_a_frameworks_own_exception_around_a_refused_call_reads_as_the_status_it_wraps():
    """A refused call as recorded (the smolagents fixture: the context window, the OpenAI client's 400) raised again
    as a framework's own class keeps the status its message names; pydantic-ai's ModelHTTPError likewise; an
    exception that names no status keeps its class."""
    import base64
    import json

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from collectors.traces.agent_spans import read_span
    from collectors.traces.span_ingest import attributes
    from tests.dashboard.test_app import FIXTURES

    failed = None
    for line in (FIXTURES / "agents" / "smolagents-openinference" / "otlp_traces.jsonl").read_text().splitlines():
        request = ExportTraceServiceRequest.FromString(base64.b64decode(json.loads(line)["body_b64"]))
        spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
        failed = failed or next((s for s in spans if any(e.name == "exception" for e in s.events)), None)
    assert failed is not None
    assert read_span(failed, attributes(failed.attributes)).error_type == "400"  # openai.BadRequestError, as recorded

    def raised_as(type_name: str, message: str | None = None) -> str | None:
        span = type(failed)()
        span.CopyFrom(failed)
        (event,) = [e for e in span.events if e.name == "exception"]
        for kv in event.attributes:
            if kv.key == "exception.type":
                kv.value.string_value = type_name
            if kv.key == "exception.message" and message is not None:
                kv.value.string_value = message
        return read_span(span, attributes(span.attributes)).error_type

    assert raised_as("smolagents.utils.AgentGenerationError") == "400"  # its message keeps the client's
    assert raised_as("pydantic_ai.exceptions.ModelHTTPError", "status_code: 429, model_name: m, body: {}") == "429"
    assert raised_as("myframework.AgentCrashed", "the agent ran out of steps") == "myframework.AgentCrashed"
