"""The kvobs agent SDK with no store: an OTLP endpoint only. Its sessions run against a real `kvobs serve` and
export their spans to a real `kvobs collect`, which writes the steps and session ends the SDK's recorder would
have written (the same rows, `kvobs.agent.recorder.step_record` of the SDK's own step objects), joined to their
requests, with their KV events owned by the session (the SDK sends `X-Session-ID`)."""

from __future__ import annotations

import json
from contextlib import nullcontext

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from kvobs.agent import AgentSession, ChatError
from kvobs.agent.recorder import step_record
from kvobs.analytics.steps.attribution import attribute_steps
from tests.collectors.agent_harness import served_and_collected
from tests.server.conftest import SERVED

SYSTEM = "You are the planning agent of a travel company. Think, then call one tool. " * 4
# the span's clock and the SDK's time.time() differ by microseconds; a float through JSON by its last digit
TIMES = ("started_at", "ended_at", "e2e_s", "ttft_s")


def test_sdk_sessions_reach_the_store_through_the_collector_as_its_recorder_would_write_them(smollm2_source, store):
    finished = []
    with served_and_collected(smollm2_source, store, service="sdk-agent") as h:
        provider = TracerProvider()
        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=h.otlp_http), schedule_delay_millis=200)
        )
        client = httpx.Client(base_url=h.server.url + "/v1", timeout=60)
        for name in ("planner-a", "planner-b"):
            with AgentSession("planner", session_id=name, tracer_provider=provider) as session:
                history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Trip {name}"}]
                for turn in range(3):
                    refused = name == "planner-b" and turn == 2  # a prompt over the server's context: a 400
                    with pytest.raises(ChatError) if refused else nullcontext(), session.step() as step:
                        if refused:
                            history.append({"role": "user", "content": "again " * 600})
                        reply = step.chat(client, model=SERVED, messages=history, max_tokens=6, temperature=0)
                        h.served += 1
                        with step.tool("search"):
                            history += [
                                {"role": "assistant", "content": reply.text},
                                {"role": "user", "content": "three flights found"},
                            ]
                    finished.append((session, step))
        provider.shutdown()

    steps = store.reads.steps().sort_values(["session_id", "step_index"]).reset_index(drop=True)
    want = [step_record(session, step).to_row() for session, step in finished]
    got = json.loads(steps[list(want[0])].to_json(orient="records", double_precision=15))  # (NaN as None)
    assert [{k: v for k, v in row.items() if k not in TIMES} for row in got] == [
        {k: v for k, v in row.items() if k not in TIMES} for row in want
    ]
    for row, truth in zip(got, want):
        assert all(abs(row[k] - truth[k]) < 0.005 for k in TIMES if truth[k] is not None), (row, truth)
    sessions = store.reads.sessions().set_index("session_id")
    assert sessions.loc[:, ["agent_name", "source", "num_steps", "num_failed_steps"]].values.tolist() == [
        ["planner", "sdk", 3, 0],
        ["planner", "sdk", 3, 1],
    ]
    for session, _ in finished[::3]:
        assert abs(sessions.loc[session.session_id, "ended_at"] - session.ended_at) < 0.005
    assert store.lookups.session_ends(["planner-a", "planner-b"]).keys() == {"planner-a", "planner-b"}
    verdicts = attribute_steps(steps, store.reads.requests(), store.reads.kv_events())
    assert verdicts["num_requests"].tolist() == [1, 1, 1, 1, 1, 0]
    assert set(store.reads.kv_events(kinds=["stored"])["session_id"].dropna()) == {"planner-a", "planner-b"}
    assert h.collector.span_steps.by_source["sdk"] == 6 and h.collector.span_ingest.agent_steps["error"] == 1
