"""LMCache's per-request spans through the collector's OTLP door: the spans LMCache 0.5.6's own tracing emitted
(`tests/fixtures/lmcache-spans/record.py`) POSTed to a real `kvobs collect` become one `connector_lookups` row a
request, each figure as the spans said it, and land in the story of the step whose request they were for, by vLLM's
internal id of it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.capture import read_export_bodies
from collectors.collector import Collector, CollectorOptions
from collectors.traces.span_ingest import SpanIngest
from kvobs.analytics.cache import lookups_of
from kvobs.analytics.steps.story import step_story
from kvobs.store import StoreWriter
from kvobs.store.rows import RequestRecord, SessionRecord, StepRecord
from tests.waiting import wait_for

BODIES = read_export_bodies(Path(__file__).parents[1] / "fixtures" / "lmcache-spans" / "otlp_traces.jsonl")
INTERNAL = {
    "chatcmpl-a1": "chatcmpl-a1-0f3c9d2e",
    "chatcmpl-a2": "chatcmpl-a2-7b1e4a90",
    "chatcmpl-a3": "chatcmpl-a3-c24d8f11",
}


def _spans() -> list:
    return [
        s
        for body in BODIES
        for r in ExportTraceServiceRequest.FromString(body).resource_spans
        for ss in r.scope_spans
        for s in ss.spans
    ]


def _seconds(name: str, rid: str) -> float | None:
    """Truth from the spans themselves: the children of `name` under `rid`'s root, their time summed."""
    roots = {s.span_id for s in _spans() if s.name == "request" and _attr(s, "session_id") == rid}
    kids = [s for s in _spans() if s.name == name and s.parent_span_id in roots]
    return sum((s.end_time_unix_nano - s.start_time_unix_nano) / 1e9 for s in kids) if kids else None


def _attr(span, key):
    return next((a.value.string_value for a in span.attributes if a.key == key), None)


def test_each_request_span_is_one_row_with_what_it_said(any_store):
    writer = StoreWriter(any_store)
    ingest = SpanIngest(writer)
    for body in BODIES * 2:  # (sent twice, as an exporter retries: stored once)
        ingest.handle(ExportTraceServiceRequest.FromString(body))
    writer.close()
    rows = any_store.reads.connector_lookups().set_index("request_id")
    assert sorted(rows.index) == sorted(INTERNAL.values()) and set(rows["connector"]) == {"lmcache"}
    a1, a2, a3 = (rows.loc[INTERNAL[f"chatcmpl-{k}"]] for k in ("a1", "a2", "a3"))
    said = ["requested_tokens", "hit_tokens", "l1_hit_tokens", "l2_hit_tokens"]
    assert [int(a1[c]) for c in said] == [512, 0, 0, 0]
    assert [int(a2[c]) for c in said] == [512, 384, 256, 128]
    assert a3[said].isna().all()  # a store alone: no lookup, so nothing said of one (not 0)
    for rid, row in rows.iterrows():
        for name, col in (("mp.lookup_prefetch", "lookup_s"), ("mp.retrieve", "retrieve_s"), ("mp.store", "store_s")):
            truth = _seconds(name, rid)
            assert (truth is None and row[col] != row[col]) or row[col] == pytest.approx(truth), (rid, col)
    assert (int(a2["num_retrieves"]), int(a2["num_stores"]), int(a1["num_retrieves"])) == (1, 1, 0)
    assert a2["ended_at"] > a2["started_at"]


def test_a_lookup_lands_in_its_steps_story_through_a_live_collector(store):
    collector = Collector(CollectorOptions(otlp_http="127.0.0.1:0"), store=store)
    collector.start()
    try:
        for body in BODIES:
            reply = httpx.post(
                f"http://127.0.0.1:{collector.receiver.http_port}/v1/traces",
                content=body,
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert reply.status_code == 200
        wait_for(lambda: collector.span_ingest.num_connector_lookups == 3)
    finally:
        collector.stop()
    lookups = store.reads.connector_lookups().set_index("request_id")
    # vLLM's spans name each request by the client's id: its steps' requests, as vLLM's llm_request spans make them
    writer = StoreWriter(store)
    writer.upsert(SessionRecord("coder", num_steps=2))
    for step, client_id in enumerate(("chatcmpl-a1", "chatcmpl-a2")):
        lookup = lookups.loc[INTERNAL[client_id]]
        arrival, end = float(lookup["started_at"]) - 0.05, float(lookup["ended_at"]) + 0.05
        writer.add(RequestRecord(client_id, "vllm-0", arrival, session_id="coder", finished_ts=end, prompt_tokens=512))
        writer.add(StepRecord("coder", step, arrival - 0.01, "ok", ended_at=end + 0.01, request_id=client_id))
    writer.close()
    joined = lookups_of(store.reads.requests(), store.reads.connector_lookups())
    assert dict(zip(joined["request_id"], joined["connector_request_id"])) == {
        c: INTERNAL[c] for c in ("chatcmpl-a1", "chatcmpl-a2")
    }  # (a3's request was never read: left out)
    story = step_story(store, "coder", 1)
    said = story.events[story.events["source"] == "connector"]
    assert list(said["request_id"]) == ["chatcmpl-a2"] and list(said["tokens"]) == [384]
    (what,) = said["what"]
    assert what.startswith("lmcache found 384 of 512 prompt tokens (L1 256, L2 128); lookup ")
    assert ", load " in what and ", store " in what
    first = step_story(store, "coder", 0).events
    assert list(first[first["source"] == "connector"]["what"].str.split(";").str[0]) == [
        "lmcache found 0 of 512 prompt tokens"
    ]


def test_children_sent_again_before_their_root_are_counted_once():
    """An export refused for a full queue is sent again whole: its children, waiting for a root in a later export,
    are kept by span id, so the retry adds nothing."""
    from collectors.traces.connector_spans import ConnectorSpans
    from collectors.traces.span_ingest import attributes

    spans = [("lmcache", s, attributes(s.attributes)) for s in _spans()]
    children = [item for item in spans if item[1].name != "request"]
    roots = [item for item in spans if item[1].name == "request"]
    connector = ConnectorSpans()
    assert connector.take(children) == [] and connector.take(children) == []
    rows = {r.request_id: r for r in connector.take(roots)}
    a2 = rows[INTERNAL["chatcmpl-a2"]]
    assert (a2.num_retrieves, a2.num_stores) == (1, 1)
    assert a2.store_s == pytest.approx(_seconds("mp.store", a2.request_id))
    assert connector.waiting == {}
