"""The recorded agent runs (tests/fixtures/agents: OTLP exports of OpenInference, pydantic-ai, openai-v2 and
OpenLLMetry-instrumented agents and of the `kvobs serve` or vLLM 0.32 they called, as a real collector received
them) replayed into every backend: the same sessions and steps come out of SQLite, PostgreSQL and chDB, whether
each export arrives once or twice (an exporter's retry) and whether the server's request spans arrive before or
after the agent's."""

from __future__ import annotations

import base64
import json

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.capture import span_bounds
from collectors.session_activity import SessionActivity
from collectors.traces.span_ingest import SpanIngest
from collectors.traces.span_steps import JOIN_WAIT_S, SpanSteps
from kvobs.analytics.cache.token_details import cached_fill_check
from kvobs.analytics.steps.attribution import attribute_steps
from kvobs.semconv.spans import STEP_JOINED
from kvobs.store.writer import StoreWriter
from tests.collectors.agent_harness import FIXTURES, STEP_COLUMNS

RECORDINGS = sorted(p.name for p in FIXTURES.iterdir() if (p / "steps.json").exists())


def exports(name: str) -> list[ExportTraceServiceRequest]:
    with open(FIXTURES / name / "otlp_traces.jsonl") as f:
        return [ExportTraceServiceRequest.FromString(base64.b64decode(json.loads(line)["body_b64"])) for line in f]


def _is_server(request: ExportTraceServiceRequest) -> bool:
    """An export of the server's (`kvobs serve`'s or vLLM's): it holds `llm_request` spans."""
    return any(
        span.name == "llm_request" for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans
    )


def replay(store, requests: list[ExportTraceServiceRequest], *, join_wait_s: float = JOIN_WAIT_S) -> SpanIngest:
    """Feed the exports to span ingest and the step maker as the collector does, deciding after each export. The
    collector's clock is the stream's: an export arrives when its latest span has ended (a batch exporter sends
    within seconds), so waits for parents and for server requests last as long as they did live."""
    now = [0.0]
    writer = StoreWriter(store)
    activity = SessionActivity()
    steps = SpanSteps(
        writer,
        activity=activity,
        step_counts=lambda ids: store.lookups.session_step_counts(ids),
        clock=lambda: now[0],
        join_wait_s=join_wait_s,
    )
    ingest = SpanIngest(writer, activity=activity, steps=steps, instance="engine")
    for request in requests:
        now[0] = max(now[0], span_bounds(request)[1])
        ingest.handle(request)
        steps.settle()
    steps.settle(final=True)
    writer.close()
    return ingest


def _tool_names(tools) -> list:
    return [(t["name"], t["status"]) for t in json.loads(tools)] if isinstance(tools, str) else []


@pytest.mark.parametrize("name", RECORDINGS)
@pytest.mark.parametrize("order", ["as_received", "each_twice", "server_last"])
def test_recorded_agent_runs_make_the_same_steps_on_every_backend(any_store, name, order):
    truth = json.loads((FIXTURES / name / "steps.json").read_text())
    requests = exports(name)
    if order == "each_twice":
        requests = [r for r in requests for _ in range(2)]
    elif order == "server_last":
        requests = [r for r in requests if not _is_server(r)] + [r for r in requests if _is_server(r)]
    # server last: every request span after every agent span, so the calls wait as long as the recording lasted
    bounds = [span_bounds(r) for r in requests]
    whole = max(end for _, end in bounds) - min(start for start, _ in bounds)
    wait = whole + 1.0 if order == "server_last" else JOIN_WAIT_S
    ingest = replay(any_store, requests, join_wait_s=max(wait, JOIN_WAIT_S))

    steps = any_store.reads.steps().sort_values(["session_id", "step_index"])[STEP_COLUMNS]
    got = json.loads(steps.to_json(orient="records"))
    want = [{c: s[c] for c in STEP_COLUMNS} for s in truth["steps"]]
    assert [{**s, "tools": _tool_names(s["tools"])} for s in got] == [
        {**s, "tools": _tool_names(s["tools"])} for s in want
    ]
    assert [s["tools"] for s in got] == [s["tools"] for s in want]  # the tool spans' own times
    sessions = any_store.reads.sessions().sort_values("session_id")
    assert json.loads(sessions[list(truth["sessions"][0])].to_json(orient="records")) == truth["sessions"]
    assert ingest.num_duplicates == (
        sum(len(s.spans) for r in exports(name) for rs in r.resource_spans for s in rs.scope_spans)
        if order == "each_twice"
        else 0
    )
    # every step the live run joined to a request is joined again (by response id or trace), the others to none
    verdicts = attribute_steps(any_store.reads.steps(), any_store.reads.requests(), any_store.reads.kv_events())
    joined = verdicts.set_index(["session_id", "step_index"])["num_requests"].to_dict()
    assert joined == {(s["session_id"], s["step_index"]): int(s["joined"]) for s in truth["steps"]}
    # the Sessions page's join rate, counted in the database
    outcomes = any_store.reads.step_outcomes().set_index("session_id")[["judged", "joined"]]
    want = {}
    for s in truth["steps"]:
        judged, joined = want.get(s["session_id"], (0, 0))
        want[s["session_id"]] = (judged + 1, joined + (s["request_join"] in STEP_JOINED))
    assert {k: tuple(int(x) for x in v) for k, v in outcomes.iterrows()} == want


@pytest.mark.parametrize("name", ["vllm-openinference-pydantic-ai", "vllm-frameworks-kv"])
def test_vllms_requests_take_their_cached_tokens_from_the_replies_of_the_steps_joined_to_them(any_store, name):
    """vLLM's request spans carry no cached tokens; an agent's LLM span records its reply's usage, cached tokens
    included where vLLM gives them (`--enable-prompt-tokens-details`) and the instrumentation keeps them (not the
    OpenAI Agents SDK's, nor the raw client's under OpenInference here). Replayed: each request a step with a
    count was joined to holds that count, said to come from the reply, and its minute counts it; a request whose
    step had none stays unknown (NULL, not 0), and each outcome is counted."""
    requests = exports(name)
    assert any(_is_server(r) for r in requests)  # vLLM's own request spans, beside the agents'
    steps = replay(any_store, requests).steps
    stored = any_store.reads.steps()
    joined = stored[stored["request_id"].notna()]
    told, untold = joined[joined["cached_tokens"].notna()], joined[joined["cached_tokens"].isna()]
    rows = any_store.reads.request_rows(0, 4e9).set_index("request_id")
    assert len(told) >= 5 and len(untold) >= 6 and set(joined["request_id"]) <= set(rows.index)
    assert rows.loc[told["request_id"], "cached_tokens"].tolist() == told["cached_tokens"].tolist()
    assert set(rows.loc[told["request_id"], "cached_from"]) == {"reply"}
    assert rows.loc[untold["request_id"], ["cached_tokens", "cached_from"]].isna().all().all()
    assert rows["cached_tokens"].notna().sum() == len(told)  # no request filled but a joined one with a count
    assert dict(steps.cached_fills) == {"filled": len(told), "no_count": len(untold)}
    ok, said = cached_fill_check(steps.cached_fills)  # `kvobs doctor --collector`'s line
    assert ok and said.startswith(f"of {len(joined)} joined requests whose own span said no cached tokens, {len(told)}")
    assert f"{len(untold)} stay unknown (never 0)" in said and "to fix" not in said
    minutes = any_store.reads.minute_rollup("request_minutes", 0, 4e9)
    assert minutes["requests"].sum() == len(rows) and minutes["cached_said"].sum() == len(told)
    assert minutes["cached_tokens"].sum() == told["cached_tokens"].sum()
    if name == "vllm-openinference-pydantic-ai":
        assert told["cached_tokens"].max() == 128  # the third step of a session found its first blocks
