"""In front of Jaeger: every export is forwarded unchanged, and vLLM's evictions come out as kvobs spans linked
to the requests of the sessions that lost blocks. "Jaeger" here is a second real OTLP receiver."""

from __future__ import annotations

import httpx
import pytest

from collectors.collector import Collector, CollectorOptions
from collectors.traces.span_ingest import attributes
from kvobs.semconv import attributes as a
from tests.collectors import expected
from tests.collectors.recorded import kv_messages, otlp_bodies
from tests.collectors.recorded_run import record_agent_steps
from tests.collectors.replay import publisher, wait_subscribed
from tests.otlp import otlp_receiver
from tests.server.conftest import free_port
from tests.waiting import wait_for


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_exports_are_forwarded_unchanged_and_evictions_become_linked_spans(tmp_path, protocol):
    from kvobs.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    record_agent_steps(store)
    port = free_port()
    with otlp_receiver() as (jaeger, received):
        target = (
            f"http://127.0.0.1:{jaeger.http_port}" if protocol == "http" else f"grpc://127.0.0.1:{jaeger.grpc_port}"
        )
        options = CollectorOptions(
            kv_events=[f"tcp://127.0.0.1:{port}"],
            kv_events_bind=True,
            otlp_http="127.0.0.1:0",
            forward_otlp=target,
            interval_s=3600,
            settle_s=0,
        )
        collector = Collector(options, store=store)
        collector.start()
        try:
            url = f"http://127.0.0.1:{collector.receiver.http_port}/v1/traces"
            for body in otlp_bodies():  # spans first, so the bridge can link to them
                assert httpx.post(url, content=body, headers={"Content-Type": "application/x-protobuf"}).is_success
            wait_for(lambda: collector.span_ingest.num_requests == len(expected.llm_request_spans()))
            collector.activity.resolve_pending()
            with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub:
                wait_subscribed(pub)
                for message in kv_messages():
                    pub.send_multipart(message.frames)
                wait_for(lambda: collector.streams[0].subscriber.num_batches == len(kv_messages()))
        finally:
            collector.stop()
        forwarded = [
            r.SerializeToString()
            for r in received.requests
            if attributes(r.resource_spans[0].resource.attributes)["service.name"] != "kvobs-collector"
        ]
        evict, invalidate = received.named("kvcache.evict"), received.named("kvcache.invalidate")
    store.close()
    assert sorted(forwarded) == sorted(otlp_bodies())  # byte for byte
    removal_batches = [ts for ts, events in expected.batches() if any(e["type"] == "BlockRemoved" for e in events)]
    assert len(evict) == len(removal_batches)
    assert sum(s.attributes[a.KV_BLOCKS_EVICTED] for s in evict) == 171  # the fixture README's removals
    assert {s.service for s in evict} == {"kvobs-collector"}
    sessions = {sid for s in evict for sid in s.attributes[a.KV_SESSIONS_AFFECTED]}
    assert sessions == {sid for (kind, sid) in expected.kv_outcome()["rows"] if kind == "removed" and sid}
    request_spans = {(s.trace_id.hex(), s.span_id.hex()) for s in expected.llm_request_spans()}
    links = [(t, sp) for s in evict for t, sp, attrs in s.links if attrs[a.KV_LINK_RELATION] == a.LINK_EVICTED_FROM]
    assert links and set(links) <= request_spans
    assert len(invalidate) == 1 and invalidate[0].attributes[a.KV_INVALIDATION_REASON] == "manual_reset"
