"""llm_request spans -> requests rows: an exporter's retry of the same export is stored once; other spans are not."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import func, select

from collectors.traces.span_ingest import SpanIngest
from kvobs.semconv.limits import MAX_ID_BYTES
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
    retried = sum(
        1
        for r in requests[-5:]
        for rs in r.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if s.name == "llm_request"
    )
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(RequestRow)) == len(llm) == ingest.num_requests
        assert set(s.scalars(select(RequestRow.instance))) == {"vllm"}  # the exporter's service.name
    assert len(spans) > len(llm) and ingest.num_duplicates == retried > 0


def test_a_replica_is_named_by_its_service_instance_id_only_when_the_collector_knows_it(store):
    """vLLM's exporter carries a random `service.instance.id` unless told one: a known replica name wins, an unknown
    id falls back to `service.name`."""
    from kvobs.semconv.attributes import SERVICE_INSTANCE_ID

    exports = [ExportTraceServiceRequest.FromString(b) for b in otlp_bodies()]
    body, told = [
        e
        for e in exports
        if any(s.name == "llm_request" for rs in e.resource_spans for ss in rs.scope_spans for s in ss.spans)
    ][:2]
    (random_id,) = {
        kv.value.string_value
        for rs in body.resource_spans
        for kv in rs.resource.attributes
        if kv.key == SERVICE_INSTANCE_ID
    }
    assert random_id not in ("vllm", "vllm-b")
    for rs in told.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key == SERVICE_INSTANCE_ID:
                kv.value.string_value = "vllm-b"  # OTEL_RESOURCE_ATTRIBUTES=service.instance.id=vllm-b
    writer = StoreWriter(store)
    ingest = SpanIngest(writer, known_instances=["vllm-a", "vllm-b"])
    ingest.handle(body)
    ingest.handle(told)
    writer.close()
    with store.session() as s:
        assert set(s.scalars(select(RequestRow.instance))) == {"vllm", "vllm-b"}


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


def _llm_export(spans: list[dict]) -> ExportTraceServiceRequest:
    """An export of `llm_request` spans with these attributes (as an exporter with a type bug would send them)."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    def value(v) -> AnyValue:
        if isinstance(v, str):
            return AnyValue(string_value=v)
        if isinstance(v, bool):
            return AnyValue(bool_value=v)
        return AnyValue(int_value=v) if isinstance(v, int) else AnyValue(double_value=v)

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for i, attrs in enumerate(spans):
        span = scope.spans.add(
            name="llm_request",
            trace_id=bytes([1] * 15 + [i + 1]),
            span_id=bytes([2] * 7 + [i + 1]),
            start_time_unix_nano=10**18,
            end_time_unix_nano=10**18 + 10**9,
        )
        span.attributes.extend(KeyValue(key=k, value=value(v)) for k, v in attrs.items())
    return request


def test_a_span_with_a_wrongly_typed_attribute_is_refused_alone_and_long_ids_are_cut(store):
    """The probe's F15 and F5: a string TTFT used to fail the whole export with 500 (uncounted); a 1 MB session id
    was copied into every row."""
    long_session = "s" * 1_000_000
    export = _llm_export(
        [
            {"gen_ai.request.id": "ok-1", "gen_ai.latency.time_to_first_token": 0.25, "session.id": long_session},
            {"gen_ai.request.id": "bad", "gen_ai.latency.time_to_first_token": "fast"},
            {"gen_ai.request.id": "bad-tokens", "gen_ai.usage.prompt_tokens": 1.5},
            {"gen_ai.request.id": "ok-2", "gen_ai.usage.prompt_tokens": 12, "session.id": long_session + "x"},
        ]
    )
    writer = StoreWriter(store)
    ingest = SpanIngest(writer)
    assert ingest.handle(export) == 2
    writer.close()
    with store.session() as s:
        rows = {r.request_id: r for r in s.scalars(select(RequestRow))}
    assert set(rows) == {"ok-1", "ok-2"} and ingest.num_refused == 2 and ingest.num_ids_cut == 2
    first, second = rows["ok-1"].session_id, rows["ok-2"].session_id
    assert len(first.encode()) == len(second.encode()) == MAX_ID_BYTES and "~cut:" in first and first != second
    assert rows["ok-1"].first_token_ts == pytest.approx(1e9 + 0.25) and rows["ok-2"].prompt_tokens == 12


def test_a_request_takes_its_cached_tokens_and_session_by_every_spelling_emitters_write(store):
    """An `llm_request` span's cached prompt tokens under each name in `CACHE_READ_KEYS` (the registry's first when a
    span carries two), and its session from `session.id`, else `gen_ai.conversation.id`; a count that is no
    integer refuses the span alone, as any other does."""
    from kvobs.semconv.agent_traces import CACHE_READ_KEYS

    spans = [{"gen_ai.request.id": f"r-{i}", key: 16 * (i + 1)} for i, key in enumerate(CACHE_READ_KEYS)]
    spans += [
        {"gen_ai.request.id": "both", CACHE_READ_KEYS[1]: 99, CACHE_READ_KEYS[0]: 48, "session.id": "s-1"},
        {"gen_ai.request.id": "conversation", "gen_ai.conversation.id": "c-1", "gen_ai.usage.prompt_tokens": 64},
        {"gen_ai.request.id": "bad", CACHE_READ_KEYS[2]: "many"},
    ]
    writer = StoreWriter(store)
    ingest = SpanIngest(writer)
    assert ingest.handle(_llm_export(spans)) == 1 and ingest.num_requests == len(spans) - 1  # refused, stored
    writer.close()
    with store.session() as s:
        rows = {r.request_id: r for r in s.scalars(select(RequestRow))}
    assert [rows[f"r-{i}"].cached_tokens for i in range(len(CACHE_READ_KEYS))] == [16, 32, 48, 64, 80]
    assert {rows[f"r-{i}"].cached_from for i in range(len(CACHE_READ_KEYS))} == {"server"}
    assert (rows["both"].cached_tokens, rows["both"].session_id) == (48, "s-1")
    assert (rows["conversation"].cached_tokens, rows["conversation"].cached_from) == (None, None)  # not said: unknown
    assert rows["conversation"].session_id == "c-1" and "bad" not in rows
