"""An agent traced by OpenInference (Phoenix's `openinference-instrumentation-openai` and its `OITracer` for agent
and tool spans, `using_session` for the conversation), calling a real `kvobs serve` through the official OpenAI
client from a process of its own, exporting OTLP/HTTP to a real `kvobs collect`: the collector makes the sessions
and steps, joins each step to its server request, and the step page tells it."""

from __future__ import annotations

from prometheus_client import generate_latest
from streamlit.testing.v1 import AppTest

from kvobs.analytics.steps.attribution import attribute_steps
from kvobs.analytics.steps.story import step_story, tool_calls
from tests.collectors.agent_harness import served_and_collected
from tests.collectors.scenario_parts import TOOL_S
from tests.dashboard.test_app import APP


def test_openinference_agent_is_sessions_steps_tools_and_joined_requests(smollm2_source, store, monkeypatch):
    conversations = ["trip-a", "trip-b", "trip-c"]
    # 24 usable blocks of 16 tokens: the conversations' prefixes evict each other while their tools run
    with served_and_collected(
        smollm2_source, store, num_blocks=25, max_model_len=384, record="openinference-openai"
    ) as h:
        # the session header gives vLLM's (and kvobs serve's) KV events their owner: one line in the recipe
        answered = h.agent("openinference", conversations=dict.fromkeys(conversations, "session"), too_long="trip-c")[
            "answered"
        ]

    sessions = store.reads.sessions().set_index("session_id")
    assert sorted(sessions.index) == conversations
    assert set(sessions["source"]) == {"openinference"} and set(sessions["agent_name"]) == {"travel-agent"}
    assert sessions["num_steps"].tolist() == [3, 3, 3] and sessions["num_failed_steps"].tolist() == [0, 0, 1]
    steps = store.reads.steps().sort_values(["session_id", "step_index"]).reset_index(drop=True)
    assert steps.groupby("session_id")["step_index"].apply(list).tolist() == [[0, 1, 2]] * 3
    failed = steps[steps["status"] == "error"]
    assert failed[["session_id", "step_index", "error_type"]].values.tolist() == [["trip-c", 2, "400"]]
    for conversation, ids in answered.items():  # each answered step names the id the server answered
        mine = steps[(steps["session_id"] == conversation) & (steps["status"] == "ok")]
        assert mine["response_id"].tolist() == ids
        assert mine["request_id"].tolist() == ids and set(mine["request_join"]) == {"response_id"}

    # the pause before steps 1 and 2 is the tool's time: the tool span lies inside it and fills it
    for _, step in steps[steps["step_index"] > 0].iterrows():
        before = steps[(steps["session_id"] == step["session_id"]) & (steps["step_index"] == step["step_index"] - 1)]
        pause = step["started_at"] - float(before["ended_at"].iloc[0])
        (tool,) = tool_calls(step)
        assert tool["name"] == ("search_flights" if step["step_index"] == 1 else "book_hotel")
        assert tool["status"] == "ok" and tool["end"] - tool["start"] >= TOOL_S[tool["name"]]
        assert tool["start"] >= step["started_at"] - pause and tool["end"] <= step["started_at"]
        assert pause - (tool["end"] - tool["start"]) < 0.1, pause

    # each answered step is joined to its server request (by response id), the refused one to none
    requests = store.reads.requests()
    verdicts = attribute_steps(steps, requests, store.reads.kv_events()).set_index(["session_id", "step_index"])
    assert verdicts["num_requests"].to_dict() == {
        (s, i): int(not (s == "trip-c" and i == 2)) for s in conversations for i in range(3)
    }
    assert sorted(requests["request_id"]) == sorted(i for ids in answered.values() for i in ids)
    assert set(requests["session_id"]) == set(conversations)
    stored = store.reads.kv_events(kinds=["stored"])
    assert set(stored["session_id"].dropna()) == set(conversations)  # KV events owned by the conversations
    removed = store.reads.kv_events(kinds=["removed"])
    assert len(removed) and set(removed["session_id"].dropna()) <= set(conversations)  # and their losses
    footprints = store.reads.session_snapshots("trip-a")
    assert footprints["session_evicted_blocks"].max() > 0  # a conversation's own footprint counts its losses

    story = step_story(store, "trip-a", 1)  # the step page's story: the tool in its pause, its request
    assert len(story.requests) == 1 and story.requests["request_id"].iloc[0] == answered["trip-a"][1]
    assert "tool search_flights" in set(story.timeline["lane"])
    assert any(w.startswith("tool search_flights ran") for w in story.events["what"])
    assert step_story(store, "trip-c", 2).requests.empty
    told = step_page(monkeypatch, store, "trip-a", 1)
    assert "tool search_flights ran" in " ".join(told.table[0].value["what happened"])
    told = step_page(monkeypatch, store, "trip-c", 2)
    (said,) = [i.value for i in told.info if i.value.startswith("No server request found for this step")]
    assert "the call failed without an answer" in said and "to join it" not in said  # a refusal: nothing to mend


def step_page(monkeypatch, store, session: str, step: int) -> AppTest:
    """The dashboard's step page (`?session=&step=`) over the collector's store, through Streamlit's AppTest."""
    monkeypatch.setenv("KVOBS_STORE_URL", store.url)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["session"], at.query_params["step"] = session, str(step)
    at.run()
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
    return at


def test_without_response_ids_a_step_joins_by_trace_context_else_by_timing_and_says_so(
    smollm2_source, store, monkeypatch
):
    """OpenInference's `hide_outputs` keeps the reply (and so its id) out of the spans: a step is then joined by
    the trace context its agent sent (`traceparent`); without one, by timing where exactly one request fits the
    call's window and token counts. The agent's own client knew each id it was answered: that is the truth."""
    with served_and_collected(smollm2_source, store, record="openinference-hidden-outputs") as h:
        answered = h.agent(
            "openinference", conversations={"traced": "traceparent", "untraced": None}, hide_outputs=True
        )["answered"]
    exposed = generate_latest(h.collector.registry).decode()  # (steps are decided by the collector's last tick)
    for method, n in (("trace", 3), ("timing", 3)):  # the collector's /metrics counts them apart
        assert f'kvobs_collector_steps_joined_total{{method="{method}",source="openinference"}} {n}.0' in exposed

    steps = store.reads.steps().sort_values(["session_id", "step_index"]).reset_index(drop=True)
    assert steps["response_id"].isna().all() and len(steps) == 6
    assert steps.groupby("session_id")["request_join"].apply(list).to_dict() == {
        "traced": ["trace"] * 3,
        "untraced": ["timing"] * 3,
    }
    assert steps.groupby("session_id")["request_id"].apply(list).to_dict() == answered
    requests = store.reads.requests()
    verdicts = attribute_steps(steps, requests, store.reads.kv_events()).set_index(["session_id", "step_index"])
    assert verdicts["num_requests"].to_dict() == {(s, i): 1 for s in ("traced", "untraced") for i in range(3)}
    story = step_story(store, "untraced", 1)
    assert story.requests["request_id"].tolist() == [answered["untraced"][1]]
    told = step_page(monkeypatch, store, "untraced", 1)
    assert any("joined by timing" in c.value for c in told.caption), [c.value for c in told.caption]
