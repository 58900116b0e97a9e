"""Agents traced by the OpenTelemetry GenAI conventions, calling a real `kvobs serve` from processes of their own
and exporting OTLP/HTTP to a real `kvobs collect`: a pydantic-ai agent (its own instrumentation: `invoke_agent` and
`chat` spans, the conversation in `gen_ai.conversation.id`) and a plain loop over the official OpenAI client
instrumented by `opentelemetry-instrumentation-openai-v2` or by OpenLLMetry's `opentelemetry-instrumentation-openai`.
None sends a session header: each step is joined to its request by the response id (OpenLLMetry's
instrumentation also sends the call's `traceparent`)."""

from __future__ import annotations

import pytest

from kvobs.analytics.cache.chains import with_sessions
from kvobs.analytics.steps.attribution import attribute_steps
from tests.collectors.agent_harness import served_and_collected


def test_pydantic_ai_conversations_are_sessions_and_each_run_a_step(smollm2_source, store):
    with served_and_collected(smollm2_source, store, service="pydantic-agent", record="pydantic-ai") as h:
        answered = h.agent("pydantic_ai")["answered"]

    sessions = store.reads.sessions().set_index("session_id")
    assert sorted(sessions.index) == sorted(answered)  # one session per conversation, across its 3 runs
    assert set(sessions["source"]) == {"otel-genai"} and set(sessions["agent_name"]) == {"planner"}
    assert sessions["num_steps"].tolist() == [3, 3] and sessions["num_failed_steps"].tolist() == [0, 0]
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert steps.groupby("session_id")["response_id"].apply(list).to_dict() == answered
    assert steps.groupby("session_id")["request_id"].apply(list).to_dict() == answered  # the collector's own join
    assert set(steps["request_join"]) == {"response_id"}
    assert set(steps["status"]) == {"ok"} and steps["prompt_tokens"].gt(0).all()
    requests = store.reads.requests()
    assert set(steps["response_id"]) == set(requests["request_id"])  # the id pydantic-ai's span saw = the server's
    verdicts = attribute_steps(steps, requests, store.reads.kv_events())
    assert verdicts["num_requests"].tolist() == [1] * 6
    owned = with_sessions(requests.assign(session_id=None), steps)  # even a request stored before its step
    assert owned.set_index("request_id")["session_id"].to_dict() == dict(zip(steps["response_id"], steps["session_id"]))


@pytest.mark.parametrize("instrumentation", ["openai-v2", "openllmetry-openai"])
def test_a_plain_loop_is_one_session_per_trace_with_its_failure(smollm2_source, store, instrumentation):
    """An OpenAI-client instrumentation names no conversation: the session is the trace the agent's loop ran in.
    Both write GenAI's names (OpenLLMetry's without its SDK too), so both sessions read `otel-genai`."""
    with served_and_collected(smollm2_source, store, service="own-loop", record=instrumentation) as h:
        ran = h.agent("plain_loop", instrumentation=instrumentation)
    ((trace_id, ids),) = ran["answered"].items()
    assert ran["refused"]

    sessions = store.reads.sessions()
    assert sessions["session_id"].tolist() == [trace_id] and sessions["source"].tolist() == ["otel-genai"]
    steps = store.reads.steps().sort_values("step_index")
    assert steps["status"].tolist() == ["ok"] * 3 + ["error"] and steps["error_type"].tolist()[-1] == "400"
    assert steps["response_id"].tolist()[:3] == ids and steps["response_id"].isna().tolist()[-1]
    assert steps["request_id"].tolist()[:3] == ids and steps["request_id"].isna().tolist()[-1]
    # OpenLLMetry also sends traceparent: the reply's id is still asked first, and the refused call names nothing
    assert steps["request_join"].tolist() == ["response_id"] * 3 + ["unanswered"]
    verdicts = attribute_steps(steps, store.reads.requests(), store.reads.kv_events())
    assert verdicts.sort_values("step_index")["num_requests"].tolist() == [1, 1, 1, 0]
