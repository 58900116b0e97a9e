"""A request names its session the way vLLM reads it and the way coding agents send it (`SESSION_HEADERS`): through
a real `kvobs serve`, each way's session and parent land in the store, on the `llm_request` span (and from there,
through a collector, in its store) and on the KV events; no session id ever becomes a metric label. The header
sets are the ones each agent's requests carry: Claude Code's session, agent and parent agent ids; OpenCode's
`X-Session-Id` with `x-parent-session-id`; Codex's `session-id`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from collectors.traces.span_ingest import SpanIngest
from dashboard import session_data
from dashboard.views.sessions import subagents_said
from kvobs.named_sessions import request_session
from kvobs.semconv import attributes as a
from kvobs.store import StoreWriter, open_store
from kvobs.telemetry import TelemetryConfig, setup_telemetry
from tests.server.conftest import SERVED, running_server

CLAUDE = "4f1c6a52-8d7e-4c1b-9a0e-2b7d5e3f9c10"  # Claude Code: one session id for the conversation and its agents
# (headers, body extras) -> (session, parent): each way a request names its session
WAYS = [
    ({"x-claude-code-session-id": CLAUDE}, {}, (CLAUDE, None)),
    ({"X-Claude-Code-Session-Id": CLAUDE, "X-Claude-Code-Agent-Id": "a1"}, {}, (f"{CLAUDE}/a1", CLAUDE)),
    (
        {"x-claude-code-session-id": CLAUDE, "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"},
        {},
        (f"{CLAUDE}/a2", f"{CLAUDE}/a1"),
    ),
    ({"X-Session-Id": "ses_child", "x-parent-session-id": "ses_parent"}, {}, ("ses_child", "ses_parent")),
    ({"session-id": "codex-thread-1"}, {}, ("codex-thread-1", None)),
    ({"x-dynamo-session-id": "dyn-child", "x-dynamo-parent-session-id": "dyn-root"}, {}, ("dyn-child", "dyn-root")),
    ({}, {"vllm_xargs": {"session_id": "xargs-1"}}, ("xargs-1", None)),
    ({}, {"session_id": "body-1"}, ("body-1", None)),
    ({"X-Session-ID": "header-wins"}, {"session_id": "body-loses"}, ("header-wins", None)),
]


def test_the_ways_a_request_names_its_session_read_as_one_list():
    for headers, body, expected in WAYS:
        named = request_session(httpx.Headers(headers), body)
        assert named is not None and (named.session_id, named.parent_session_id) == expected, headers
    assert request_session(httpx.Headers({"x-claude-code-session-id": ""}), {"vllm_xargs": {"session_id": 7}}) is None
    long = request_session(httpx.Headers({"x-claude-code-session-id": "s" * 200, "x-claude-code-agent-id": "a" * 200}))
    assert long is not None and len(long.session_id.encode()) == 255 and long.parent_session_id == "s" * 200


RECORDED = Path(__file__).parents[1] / "fixtures" / "coding-agents" / "headers.json"


def test_the_coding_agents_requests_as_recorded_name_their_sessions_and_subagents():
    """The headers Claude Code 2.1.332, OpenCode 1.18.33 and Codex 0.171.0 sent (`record.py` beside the recording):
    each agent's main requests are one session; a subagent's requests (Claude Code's with its agent id, OpenCode's
    child session) are a session of their own whose parent is the main one; Codex's thread is its session."""
    recorded = json.loads(RECORDED.read_text())
    by_client: dict[str, list] = {}
    for request in recorded:
        named = request_session(httpx.Headers(request["headers"]))
        assert named is not None, request
        by_client.setdefault(request["client"], []).append((named.session_id, named.parent_session_id))
    assert set(by_client) == {"claude-code", "opencode", "codex"}
    for client in ("claude-code", "opencode"):
        sessions = by_client[client]
        (main,) = {session for session, parent in sessions if parent is None}
        children = {session for session, parent in sessions if parent is not None}
        assert len(children) == 1 and {parent for _, parent in sessions if parent} == {main}, client
        assert all(session in (main, *children) for session, _ in sessions)
    (child,) = {session for session, parent in by_client["claude-code"] if parent}
    assert child.startswith(by_client["claude-code"][0][0] + "/")  # <session>/<agent id>
    assert {parent for _, parent in by_client["codex"]} == {None} and len(set(by_client["codex"])) == 1


def test_each_way_names_its_session_and_parent_in_the_store_the_spans_and_the_kv_events(smollm2_source, tmp_path):
    store_url = f"sqlite:///{tmp_path / 'engine.db'}"
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry(TelemetryConfig(service_name="kvobs-engine", span_exporters=[exporter], metrics=False))
    with running_server(smollm2_source, options={"store_url": store_url, "instance": "eng"}, telemetry=telemetry) as s:
        for i, (headers, extra, _) in enumerate(WAYS):
            prompt = f"Request {i} of the agents: " + " ".join(f"w{i}x{j}" for j in range(12))  # a full block or more
            body = {"model": SERVED, "max_tokens": 2, "temperature": 0, "prompt": prompt, **extra}
            reply = httpx.post(s.url + "/v1/completions", json=body, headers=headers, timeout=60)
            assert reply.status_code == 200, reply.text
        too_long = httpx.post(
            s.url + "/v1/completions",
            json={"model": SERVED, "max_tokens": 2, "prompt": "hi"},
            headers={"x-claude-code-session-id": "c" * 300},
            timeout=60,
        )
        assert too_long.status_code == 400 and "x-claude-code-session-id" in too_long.text
        labels = httpx.get(s.url + "/metrics").text
    telemetry.shutdown()
    expected = {session: parent for _, _, (session, parent) in WAYS}
    store = open_store(store_url)
    sessions = store.reads.sessions().set_index("session_id")
    assert {k: v for k, v in expected.items() if k != "body-loses"} == {
        k: (None if v is None or v != v else v) for k, v in sessions["parent_session_id"].items()
    }
    stored_by = set(store.reads.kv_events(kinds=["stored"])["session_id"].dropna())
    assert stored_by <= set(expected) and f"{CLAUDE}/a2" in stored_by  # the blocks are the subagent's own
    spans = [span for span in exporter.get_finished_spans() if span.name == "llm_request"]
    said = {span.attributes[a.SESSION_ID]: span.attributes.get(a.SESSION_PARENT_ID) for span in spans}
    assert said == expected
    assert all(session not in labels for session in ("ses_child", "ses_parent", "codex-thread-1", "xargs-1", CLAUDE))
    # a collector fed the engine's spans stores the same parents
    collected = open_store(f"sqlite:///{tmp_path / 'collected.db'}")
    writer = StoreWriter(collected)
    SpanIngest(writer).handle(encode_spans(spans))
    writer.close()
    parents = collected.reads.sessions().set_index("session_id")["parent_session_id"].dropna().to_dict()
    assert parents == {k: v for k, v in expected.items() if v is not None}
    # the Sessions page: who started whom
    first, last = store.reads.time_range()
    table = session_data.sessions(store, first - 1, last + 1)
    assert dict(zip(table["session_id"], table["subagents"]))[CLAUDE] == 1
    assert subagents_said(table, f"{CLAUDE}/a1") == (
        f"Started by session {CLAUDE}. Its subagents (1, sessions of their own): {CLAUDE}/a2."
    )
    assert subagents_said(table, "codex-thread-1") == ""
    store.close()
    collected.close()
