"""llm_request spans -> requests rows: an exporter's retry of the same export is stored once; other spans are not."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import func, select

from collectors.span_ingest import SpanIngest
from kvobs.store import StoreWriter
from kvobs.store.schema import RequestRow
from tests.collectors.recorded import otlp_bodies


def test_retried_exports_are_stored_once_and_only_llm_request_spans(store):
    writer = StoreWriter(store)
    ingest = SpanIngest(writer)
    requests = [ExportTraceServiceRequest.FromString(body) for body in otlp_bodies()]
    spans = [s for r in requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]
    llm = [s for s in spans if s.name == "llm_request"]
    for request in requests + requests[-5:]:  # the exporter retried the last five exports
        ingest.handle(request)
    writer.close()
    retried = sum(1 for r in requests[-5:] for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans
                  if s.name == "llm_request")  # fmt: skip
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(RequestRow)) == len(llm) == ingest.num_requests
        assert set(s.scalars(select(RequestRow.instance))) == {"vllm"}  # the exporter's service.name
    assert len(spans) > len(llm) and ingest.num_duplicates == retried > 0


def test_agent_step_spans_are_counted_by_status_and_error_type_once(store):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kvobs.agent import AgentSession

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with AgentSession("ops", tracer_provider=provider) as session:
        for outcome in ("ok", "timeout", "ok", "invalid_response", "timeout"):
            with session.step() as step:
                if outcome != "ok":
                    step.fail(outcome)
    export = encode_spans(exporter.get_finished_spans())  # what the SDK's OTLP exporter sends
    writer = StoreWriter(store)
    ingest = SpanIngest(writer)
    ingest.handle(export)
    ingest.handle(export)  # a retry counts nothing twice
    writer.close()
    assert ingest.agent_steps == {"ok": 2, "error": 3}
    assert ingest.agent_step_failures == {"timeout": 2, "invalid_response": 1}
    assert ingest.num_requests == 0
