"""One trace from an agent's step down to the KV blocks its request hit, allocated, lost or had invalidated.

The real server exports spans over OTLP (gRPC, then HTTP/protobuf) to a real OTLP receiver in this process; the
agent SDK drives two sessions against it: `victim` pauses on a tool while `noisy` fills the small cache, so
the victim's prefix is evicted; then the victim's cache is invalidated (session_forget).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from sqlalchemy import select

from kvobs.agent import AgentSession, StoreStepRecorder
from kvobs.semconv import attributes as a
from kvobs.semconv.spans import SpanEvent, SpanName
from kvobs.store import StoreWriter, open_store
from kvobs.store.schema import KVEventRow, RequestRow, SnapshotRow, StepRow
from kvobs.telemetry import TelemetryConfig, setup_telemetry
from tests.otlp import otlp_receiver
from tests.server.conftest import SERVED, running_server

SYSTEM = "You are the operations agent of a small airline. Check bookings, baggage rules and delays. " * 5


def noisy_prompt(step: int) -> str:
    return f"Inventory {step}: " + " ".join(f"crate{step}z{j}" for j in range(65))


def run_noisy_session(url: str, tracer_provider, recorder) -> None:
    client = httpx.Client(base_url=url + "/v1", timeout=120)
    with AgentSession("loader", session_id="noisy", tracer_provider=tracer_provider, recorder=recorder) as s:
        for i in range(2):
            with s.step() as step:
                step.chat(
                    client,
                    model=SERVED,
                    messages=[{"role": "user", "content": noisy_prompt(i)}],
                    max_tokens=2,
                    temperature=0,
                )


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_agent_trace_reaches_kv_blocks(smollm2_source, tmp_path, protocol):
    store_url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    with otlp_receiver() as (receiver, received):
        port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
        endpoint = f"http://127.0.0.1:{port}"
        engine_telemetry = setup_telemetry(
            TelemetryConfig(service_name="kvobs-engine", endpoint=endpoint, protocol=protocol, metrics=False)
        )
        agent_telemetry = setup_telemetry(
            TelemetryConfig(service_name="agents", endpoint=endpoint, protocol=protocol, metrics=False)
        )
        writer = StoreWriter(open_store(store_url))
        recorder = StoreStepRecorder(writer)
        options = {"store_url": store_url, "instance": "engine-test"}
        with running_server(smollm2_source, num_blocks=48, options=options, telemetry=engine_telemetry) as server:
            client = httpx.Client(base_url=server.url + "/v1", timeout=120)
            history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Is flight KV12 late?"}]
            with AgentSession(
                "ops", session_id="victim", tracer_provider=agent_telemetry.tracer_provider, recorder=recorder
            ) as victim:
                with victim.step() as step:
                    first = step.chat(client, model=SERVED, messages=history, max_tokens=4, temperature=0)
                    with step.tool("flight_status"):  # while the agent waits, another session fills the cache
                        args = (server.url, agent_telemetry.tracer_provider, recorder)
                        noisy = threading.Thread(target=run_noisy_session, args=args)
                        noisy.start()
                        noisy.join()
                history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "On time."}]
                with victim.step() as step:
                    second = step.chat(client, model=SERVED, messages=history, max_tokens=4, temperature=0)
                # Before the session ends: once it does, the SDK releases it and its own blocks are freed.
                r = httpx.post(
                    server.url + "/v1/kvobs/invalidate", json={"reason": "session_forget", "session_id": "victim"}
                )
                assert r.status_code == 200 and r.json()["num_blocks"] > 0, r.text
            time.sleep(0.2)  # the invalidation's step result reaches the observers
        agent_telemetry.shutdown()  # the server's shutdown flushed its own
        writer.close()
    assert first.cached_tokens is not None and second.cached_tokens < first.prompt_tokens  # the prefix was lost

    # ---- the trace tree: invoke_agent > agent_step > chat > llm_request ------------------------------------
    by_id = {s.span_id: s for s in received.spans}
    (session_span,) = [
        s for s in received.named(SpanName.INVOKE_AGENT) if s.attributes[a.GEN_AI_CONVERSATION_ID] == "victim"
    ]
    assert session_span.name == "invoke_agent ops" and session_span.service == "agents"
    steps = sorted(
        (s for s in received.named(SpanName.AGENT_STEP) if s.parent_span_id == session_span.span_id),
        key=lambda s: s.attributes[a.AGENT_STEP_INDEX],
    )
    assert [s.attributes[a.AGENT_STEP_INDEX] for s in steps] == [0, 1]
    requests = []
    for step_span in steps:
        (chat,) = [s for s in received.named(SpanName.CHAT) if s.parent_span_id == step_span.span_id]
        assert chat.kind == PbSpan.SPAN_KIND_CLIENT and chat.name == f"chat {SERVED}"
        (llm,) = [s for s in received.named(SpanName.LLM_REQUEST) if s.parent_span_id == chat.span_id]
        assert llm.kind == PbSpan.SPAN_KIND_SERVER and llm.service == "kvobs-engine"
        assert llm.trace_id == session_span.trace_id and llm.attributes[a.SESSION_ID] == "victim"
        assert llm.attributes[a.GEN_AI_USAGE_PROMPT_TOKENS] == chat.attributes[a.GEN_AI_USAGE_INPUT_TOKENS]
        assert llm.attributes[a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] > 0
        names = [e[0] for e in llm.events]
        assert names[0] == SpanEvent.PREFIX_LOOKUP and SpanEvent.ALLOCATE in names and SpanEvent.FIRST_TOKEN in names
        lookup = llm.events[0][1]
        assert lookup[a.KV_PREFIX_HIT_TOKENS] == llm.attributes[a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS]
        requests.append(llm)
    tool = [s for s in received.named(SpanName.EXECUTE_TOOL) if s.parent_span_id == steps[0].span_id]
    assert [t.name for t in tool] == ["execute_tool flight_status"]

    # ---- the eviction: noisy's request evicted victim's blocks during the tool pause, and links to it --------
    evicting = [
        s
        for s in received.named(SpanName.LLM_REQUEST)
        if s.attributes.get(a.SESSION_ID) == "noisy" and any(e[0] == SpanEvent.EVICT for e in s.events)
    ]
    assert evicting, "the noisy session must have evicted cached blocks"
    evict = next(e[1] for s in evicting for e in s.events if e[0] == SpanEvent.EVICT)
    assert evict[a.KV_EVICTION_REASONS] == ["capacity"] and "victim" in evict[a.KV_SESSIONS_AFFECTED]
    assert "victim" in evict[a.KV_SESSIONS_PAUSED]  # it was waiting on its tool
    links = [ln for s in evicting for ln in s.links if ln[2][a.SESSION_ID] == "victim"]
    assert links and links[0][1] == requests[0].span_id and links[0][2][a.KV_LINK_RELATION] == a.LINK_EVICTED_FROM
    assert by_id[evicting[0].parent_span_id].name == f"chat {SERVED}"  # noisy's own trace

    # ---- the invalidation: one span, linked to the victim's latest request span ------------------------------
    (inval,) = received.named(SpanName.KV_INVALIDATE)
    assert inval.attributes[a.KV_INVALIDATION_REASON] == "session_forget"
    assert inval.attributes[a.KV_BLOCKS_INVALIDATED] > 0 and "victim" in inval.attributes[a.KV_SESSIONS_AFFECTED]
    assert [(ln[1], ln[2][a.KV_LINK_RELATION]) for ln in inval.links if ln[2][a.SESSION_ID] == "victim"] == [
        (requests[1].span_id, a.LINK_INVALIDATED)
    ]

    # ---- the store holds the same story -------------------------------------------------------------------
    store = open_store(store_url)
    with store.session() as db:
        step_rows = db.scalars(select(StepRow).where(StepRow.session_id == "victim").order_by(StepRow.step_index)).all()
        assert [(r.trace_id, r.span_id, r.status) for r in step_rows] == [
            (session_span.trace_id, s.span_id, "ok") for s in steps
        ]
        assert step_rows[1].cached_tokens == second.cached_tokens and step_rows[0].ttft_s > 0
        req_rows = db.scalars(select(RequestRow).where(RequestRow.session_id == "victim")).all()
        assert {r.trace_id for r in req_rows} == {session_span.trace_id} and len(req_rows) == 2
        lost = db.scalars(
            select(KVEventRow).where(KVEventRow.session_id == "victim", KVEventRow.kind == "evicted")
        ).all()
        assert lost and all(r.reason == "capacity" and r.block_hash is not None for r in lost)
        assert db.scalars(
            select(KVEventRow).where(KVEventRow.kind == "invalidated", KVEventRow.reason == "session_forget")
        ).all()
        snaps = db.scalars(select(SnapshotRow).where(SnapshotRow.session_id == "victim").order_by(SnapshotRow.ts)).all()
        # One per finished request, and one when its second request began: hindsight, its losses were in a pause.
        assert len(snaps) == 3 and snaps[-1].session_evicted_blocks == len(lost)
        assert [s.session_pending_idle_blocks for s in snaps] == [0, 0, 0]
        assert snaps[1].session_evicted_idle_blocks == snaps[-1].session_evicted_idle_blocks == len(lost)
        assert db.scalars(select(SnapshotRow).where(SnapshotRow.session_id.is_(None))).all()  # instance snapshots
    store.close()
