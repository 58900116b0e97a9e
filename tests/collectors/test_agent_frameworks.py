"""Agents built on frameworks, traced by their own instrumentation packages with no kvobs code and no header in the
agent, calling a real `kvobs serve` and exporting OTLP/HTTP to a real `kvobs collect`: every answered step is
joined to the request the server made of it (the truth: the ids the framework handed back to the agent), the
refused one says why not, and the collector counts the joins."""

from __future__ import annotations

import json

import pytest
from prometheus_client import generate_latest

from tests.collectors.agent_harness import served_and_collected
from tests.collectors.test_agent_openinference import step_page


@pytest.mark.parametrize("scenario", ["langchain", "llamaindex"])
def test_an_agent_whose_llm_spans_hold_the_framework_result_is_joined_by_the_id_in_it(smollm2_source, store, scenario):
    """LangChain's result holds the server's id at `generations[0][0].message.kwargs.response_metadata.id` (never
    its `lc_run--` run id); LlamaIndex's `ChatResponse` at `raw.id`, on the outer of the two LLM spans it makes of one
    call (run from its own environment: its OpenAI package pins `openai<3`)."""
    record = f"{scenario}-openinference"
    with served_and_collected(smollm2_source, store, service=f"{scenario}-agent", record=record) as h:
        answered = h.agent(scenario, conversations=["trip-a", "trip-b"], too_long="trip-b")["answered"]
    exposed = generate_latest(h.collector.registry).decode()

    sessions = store.reads.sessions().set_index("session_id")
    assert sorted(sessions.index) == ["trip-a", "trip-b"] and set(sessions["source"]) == {"openinference"}
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert steps["status"].tolist() == ["ok"] * 5 + ["error"] and steps["error_type"].tolist()[-1] == "400"
    ok = steps[steps["status"] == "ok"]
    assert ok.groupby("session_id")["request_id"].apply(list).to_dict() == answered
    assert set(ok["request_join"]) == {"response_id"} and steps["request_join"].tolist()[-1] == "unanswered"
    requests = store.reads.requests()
    assert set(ok["request_id"]) <= set(requests["request_id"])
    assert 'kvobs_collector_steps_joined_total{method="response_id",source="openinference"} 5.0' in exposed
    tools = [t for t in steps["tools"].dropna()]
    assert len(tools) == 4  # each tool call is in the pause before the next step


def test_an_openai_agents_sdk_agent_is_joined_by_timing_where_its_spans_hold_no_id(smollm2_source, store, monkeypatch):
    """The Agents SDK's generation spans (chat-completions model) carry the messages and usage, never the reply's
    id, and no trace context reaches the server: each step is joined by timing, the only request in its window with
    its token counts, and that is exactly the request the agent's own client was answered by."""
    with served_and_collected(smollm2_source, store, service="agents-sdk", record="openai-agents-openinference") as h:
        answered = h.agent("openai_agents", conversations=["trip-a", "trip-b"], too_long="trip-b")["answered"]

    sessions = store.reads.sessions().set_index("session_id")
    assert sorted(sessions.index) == ["trip-a", "trip-b"] and set(sessions["source"]) == {"openinference"}
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    ok = steps[steps["status"] == "ok"]
    assert ok.groupby("session_id")["request_id"].apply(list).to_dict() == answered
    assert set(ok["request_join"]) == {"timing"} and len(ok) == 5
    assert steps["status"].tolist()[-1] == "error" and steps["request_join"].tolist()[-1] == "unanswered"
    told = step_page(monkeypatch, store, "trip-a", 1)
    assert any("joined by timing" in c.value for c in told.caption), [c.value for c in told.caption]


def test_a_smolagents_model_and_tools_traced_by_openinference_are_joined_by_timing(smollm2_source, store):
    """smolagents' LLM spans keep the reply's text and token counts but not its id: each step is joined by timing,
    and that is the request the agent's own client was answered by; its tools are in the pauses."""
    with served_and_collected(smollm2_source, store, service="smolagents", record="smolagents-openinference") as h:
        answered = h.agent("smolagents", conversations=["trip-a", "trip-b"], too_long="trip-b")["answered"]

    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert steps.groupby("session_id").size().to_dict() == {"trip-a": 3, "trip-b": 3}
    ok = steps[steps["status"] == "ok"]
    assert ok.groupby("session_id")["request_id"].apply(list).to_dict() == answered
    assert set(ok["request_join"]) == {"timing"} and len(ok) == 5
    assert steps["request_join"].tolist()[-1] == "unanswered"
    assert len(steps["tools"].dropna()) == 4


def test_an_agno_model_and_function_calls_traced_by_openinference_are_joined_by_timing(smollm2_source, store):
    """Agno (a framework none of the others shares code with), traced by its own OpenInference package: its LLM
    spans keep the reply's text and token counts but not its id, so each step is joined by timing, and that is the
    request the agent's own client was answered by; its function calls are tool spans in the pauses; the refusal,
    Agno's `ModelProviderError` wrapping the server's 400, is read as the 400."""
    with served_and_collected(smollm2_source, store, service="agno", record="agno-openinference") as h:
        answered = h.agent("agno", conversations=["trip-a", "trip-b"], too_long="trip-b")["answered"]

    sessions = store.reads.sessions().set_index("session_id")
    assert sorted(sessions.index) == ["trip-a", "trip-b"] and set(sessions["source"]) == {"openinference"}
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert steps.groupby("session_id").size().to_dict() == {"trip-a": 3, "trip-b": 3}
    ok = steps[steps["status"] == "ok"]
    assert ok.groupby("session_id")["request_id"].apply(list).to_dict() == answered
    assert set(ok["request_join"]) == {"timing"} and len(ok) == 5
    assert steps["status"].tolist()[-1] == "error" and steps["error_type"].tolist()[-1] == "400"
    assert steps["request_join"].tolist()[-1] == "unanswered"
    tools = [json.loads(t) for t in steps["tools"].dropna()]
    assert len(tools) == 4 and all(len(t) == 1 for t in tools)  # one call a pause, counted once
