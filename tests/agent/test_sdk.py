"""The agent SDK against the real server: both client kinds, failures with error.type, tools, the store."""

from __future__ import annotations

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy import select

from kvobs.agent import AgentSession, ChatError, StoreStepRecorder, tool
from kvobs.semconv import attributes as a
from kvobs.store import StoreWriter, open_store
from kvobs.store.schema import SessionRow, StepRow
from kvobs.telemetry import TelemetryConfig, setup_telemetry
from tests.server.conftest import SERVED, running_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def traced_server(smollm2_source):
    """A server whose spans land in memory (the OTLP path is covered by test_trace_tree)."""
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry(TelemetryConfig(span_exporters=[exporter], metrics=False))
    with running_server(smollm2_source, telemetry=telemetry) as server:
        yield server, telemetry, exporter


@pytest.fixture
def agent_spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.fixture
def recorder(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'agent.db'}")
    writer = StoreWriter(store)
    yield StoreStepRecorder(writer)
    writer.close()
    store.close()


def server_spans(telemetry, exporter):
    telemetry.force_flush()
    return exporter.get_finished_spans()


def test_openai_client_call_carries_the_trace_and_session(traced_server, agent_spans):
    server, telemetry, engine_exporter = traced_server
    provider, exporter = agent_spans
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    with AgentSession("geo", session_id="sdk-openai", tracer_provider=provider) as session, session.step() as step:
        reply = step.chat(client, model=SERVED, messages=QUESTION, max_tokens=8, temperature=0, top_k=1)
    assert "Paris" in reply.text and reply.prompt_tokens > 0 and reply.ttft_s > 0 and reply.finish_reason == "stop"
    (chat,) = [s for s in exporter.get_finished_spans() if s.name == f"chat {SERVED}"]
    assert chat.kind is SpanKind.CLIENT and chat.attributes[a.GEN_AI_USAGE_OUTPUT_TOKENS] == 8
    assert chat.attributes[a.SERVER_ADDRESS] == "127.0.0.1"
    assert chat.attributes[a.GEN_AI_CONVERSATION_ID] == "sdk-openai"
    (llm,) = [s for s in server_spans(telemetry, engine_exporter) if s.attributes.get(a.SESSION_ID) == "sdk-openai"]
    assert llm.parent.span_id == chat.context.span_id and llm.context.trace_id == chat.context.trace_id


def test_a_subagent_session_names_its_parent_to_the_server_and_the_store(traced_server, agent_spans, recorder):
    """`parent_session_id` goes out as `X-Parent-Session-ID` on every call, so the server's span names the parent;
    the recorder stores it on the session, and on its agent span."""
    server, telemetry, engine_exporter = traced_server
    provider, exporter = agent_spans
    client = httpx.Client(base_url=server.url + "/v1")
    with (
        AgentSession(
            "researcher",
            session_id="sdk-child",
            parent_session_id="sdk-parent",
            tracer_provider=provider,
            recorder=recorder,
        ) as session,
        session.step() as step,
    ):
        step.chat(client, model=SERVED, messages=QUESTION, max_tokens=2)
    (llm,) = [s for s in server_spans(telemetry, engine_exporter) if s.attributes.get(a.SESSION_ID) == "sdk-child"]
    assert llm.attributes[a.SESSION_PARENT_ID] == "sdk-parent"
    (agent,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent researcher"]
    assert agent.attributes[a.SESSION_PARENT_ID] == "sdk-parent"
    recorder.writer.flush()
    with recorder.writer.store.session() as db:
        assert db.scalar(select(SessionRow.parent_session_id).where(SessionRow.session_id == "sdk-child")) == (
            "sdk-parent"
        )


def test_failed_steps_record_error_type_and_the_session_goes_on(traced_server, agent_spans, recorder):
    server, _, _ = traced_server
    provider, exporter = agent_spans
    client = httpx.Client(base_url=server.url + "/v1", timeout=60)
    too_long = [{"role": "user", "content": "word " * 600}]
    with AgentSession("flaky", session_id="sdk-fail", tracer_provider=provider, recorder=recorder) as session:
        with pytest.raises(ChatError) as real, session.step() as step:  # the exception propagates
            step.chat(client, model=SERVED, messages=too_long, max_tokens=4)
        assert real.value.error_type == "400" and "maximum context length" in str(real.value)
        openai_client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(ChatError) as real, session.step() as step:
            step.chat(openai_client, model=SERVED, messages=too_long, max_tokens=4)
        assert real.value.error_type == "400" and "maximum context length" in str(real.value)
        with session.step(deadline_s=1e-6) as step:  # the deadline has passed before the call: a timeout
            with pytest.raises(ChatError) as late:
                step.chat(client, model=SERVED, messages=QUESTION, max_tokens=2)
            step.fail(late.value.error_type, str(late.value))
        with session.step() as step:
            reply = step.chat(client, model=SERVED, messages=QUESTION, max_tokens=2)
            if not reply.text.strip().startswith("{"):
                step.fail("invalid_response", "the agent wanted JSON")
        with session.step() as step:
            step.chat(client, model=SERVED, messages=QUESTION, max_tokens=2)
    recorder.writer.flush()
    with recorder.writer.store.session() as db:
        rows = db.scalars(select(StepRow).where(StepRow.session_id == "sdk-fail").order_by(StepRow.step_index)).all()
        expected = [("error", "400"), ("error", "400"), ("error", "timeout"), ("error", "invalid_response")]
        assert [(r.status, r.error_type) for r in rows] == [*expected, ("ok", None)]
        assert rows[-1].prompt_tokens > 0 and rows[-1].completion_tokens == 2
        row = db.get(SessionRow, "sdk-fail")
        assert (row.num_steps, row.num_failed_steps, row.source, row.agent_name) == (5, 4, "sdk", "flaky")
        assert row.ended_at >= row.started_at
    step_spans = [s for s in exporter.get_finished_spans() if s.name == "agent_step"]
    assert [s.attributes.get(a.ERROR_TYPE) for s in step_spans] == ["400", "400", "timeout", "invalid_response", None]
    assert [s.status.status_code for s in step_spans][:4] == [StatusCode.ERROR] * 4


def test_tools_as_context_managers_and_decorators(agent_spans):
    provider, exporter = agent_spans

    @tool("lookup")
    def lookup(key: str) -> str:
        if key == "missing":
            raise KeyError(key)
        return key.upper()

    with AgentSession("tools", tracer_provider=provider) as session:
        with session.step() as first:
            assert lookup("abc") == "ABC"
            assert first.call_tool("double", lambda x: 2 * x, 21) == 42
        with pytest.raises(KeyError), session.step() as second:
            lookup("missing")
    # each step keeps its own tool calls (steps.tools): their time is the step's tool time
    assert [(t["name"], t["status"], t["error_type"]) for t in first.tools] == [
        ("lookup", "ok", None),
        ("double", "ok", None),
    ]
    assert [(t["name"], t["status"], t["error_type"]) for t in second.tools] == [("lookup", "error", "KeyError")]
    assert all(first.started_at <= t["start"] <= t["end"] <= first.ended_at for t in first.tools)
    spans = exporter.get_finished_spans()
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    steps = [s for s in spans if s.name == "agent_step"]
    assert [t.name for t in tools] == ["execute_tool lookup", "execute_tool double", "execute_tool lookup"]
    assert [t.parent.span_id for t in tools] == [steps[0].context.span_id] * 2 + [steps[1].context.span_id]
    assert tools[2].attributes[a.ERROR_TYPE] == "KeyError" and steps[1].attributes[a.ERROR_TYPE] == "KeyError"
    assert session.num_failed_steps == 1


def test_as_step_decorator_runs_each_call_as_the_next_step(agent_spans):
    provider, exporter = agent_spans
    with AgentSession("deco", tracer_provider=provider) as session:

        @session.as_step
        def think(step, n):
            return step.index * 10 + n

        assert [think(1), think(2)] == [1, 12]
    steps = [s for s in exporter.get_finished_spans() if s.name == "agent_step"]
    assert [s.attributes[a.AGENT_STEP_INDEX] for s in steps] == [0, 1]


@pytest.mark.parametrize("kind", ["httpx", "openai"])
def test_a_deadline_cuts_the_call_and_the_server_aborts_it(smollm2_source, agent_spans, tmp_path, kind):
    """A step's deadline is a deadline: the call ends at it (not when the reply would have), the step is recorded as a
    timeout at it, and the server sees the client go: the request is aborted and its blocks freed."""
    from tests.server.test_lifecycle import aborted, assert_idle
    from tests.waiting import wait_for

    provider, _ = agent_spans
    url = f"sqlite:///{tmp_path / 'deadline.db'}"
    deadline_s = 0.5
    with running_server(smollm2_source, options={"store_url": url, "instance": "deadline"}) as server:
        store = open_store(url)
        writer = StoreWriter(store)
        if kind == "httpx":
            client = httpx.Client(base_url=server.url + "/v1", timeout=60)
        else:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        before = aborted(server.url)
        with (
            AgentSession("late", tracer_provider=provider, recorder=StoreStepRecorder(writer)) as session,
            pytest.raises(ChatError) as late,
            session.step(deadline_s=deadline_s) as step,
        ):  # 450 tokens take seconds on any CPU: only the deadline ends this call in time
            step.chat(client, model=SERVED, messages=QUESTION, max_tokens=450, ignore_eos=True, temperature=0)
        assert late.value.error_type == "timeout" and "deadline" in str(late.value)
        took = step.ended_at - step.started_at
        assert deadline_s <= took < deadline_s + 1.0, took  # cut at the deadline, not at the reply's end
        wait_for(lambda: aborted(server.url) == before + 1)  # the server saw the client go
        assert_idle(server)  # and freed its blocks
        writer.flush()
        wait_for(lambda: len(store.reads.requests()) == 1)
        request = store.reads.requests().iloc[0]
        assert request["finish_reason"] == "abort" and request["completion_tokens"] < 450
        assert request["finished_ts"] - step.started_at < deadline_s + 1.0
        (row,) = store.reads.steps().itertuples()
        assert (row.status, row.error_type) == ("error", "timeout")
        assert row.ended_at - row.started_at == pytest.approx(took)
        writer.close()
        store.close()
