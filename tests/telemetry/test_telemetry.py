"""kvobs.telemetry: OTLP over both transports from flags or OTEL_* variables, sampling, failure counting."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from kvobs.telemetry import TelemetryConfig, setup_telemetry
from tests.otlp import otlp_receiver
from tests.server.conftest import free_port

OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SDK_DISABLED",
)


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch):
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_no_endpoint_means_no_telemetry():
    telemetry = setup_telemetry(TelemetryConfig())
    assert not telemetry.enabled and telemetry.tracer("x") is None
    telemetry.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_standard_variables_configure_the_exporter(monkeypatch, protocol):
    with otlp_receiver() as (receiver, received):
        port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
        telemetry = setup_telemetry(TelemetryConfig(service_name="default-name", metrics=False))
        with telemetry.tracer("t").start_as_current_span("hello"):
            pass
        telemetry.shutdown()
        assert [(s.name, s.service) for s in received.spans] == [("hello", "from-env")]


def test_the_instance_names_the_resource_unless_the_variables_do(monkeypatch):
    """`kvobs serve --instance NAME` exports as `service.instance.id=NAME` (a collector over a fleet tells the
    engines apart by it); `OTEL_RESOURCE_ATTRIBUTES` setting one wins."""
    for variable, expected in ((None, "replica-a"), ("service.instance.id=from-env,team=x", "from-env")):
        if variable is None:
            monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
        else:
            monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", variable)
        exporter = InMemorySpanExporter()
        config = TelemetryConfig(service_instance_id="replica-a", span_exporters=[exporter], metrics=False)
        telemetry = setup_telemetry(config)
        telemetry.tracer("t").start_span("hello").end()
        telemetry.shutdown()
        (span,) = exporter.get_finished_spans()
        assert span.resource.attributes["service.instance.id"] == expected


def test_sampler_variables_are_honoured(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry(TelemetryConfig(span_exporters=[exporter], metrics=False))
    tracer = telemetry.tracer("t")
    for _ in range(20):
        tracer.start_span("new-trace").end()
    sampled_parent = NonRecordingSpan(SpanContext(0x1234, 0x99, is_remote=True, trace_flags=TraceFlags(1)))
    tracer.start_span("child", context=set_span_in_context(sampled_parent)).end()
    telemetry.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == ["child"]  # ratio 0, but the caller's decision stands


def test_unreachable_collector_is_counted_not_raised(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    telemetry = setup_telemetry(
        TelemetryConfig(endpoint=f"http://127.0.0.1:{free_port()}", protocol="http/protobuf", metrics=False)
    )
    tracer = telemetry.tracer("t")
    for i in range(50):
        tracer.start_span(f"s{i}").end()  # returns at once: spans wait in the batch queue
    telemetry.force_flush(5)
    telemetry.shutdown(1)
    assert telemetry.num_export_failures >= 1


def test_sdk_disabled_variable_turns_everything_off(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not setup_telemetry(TelemetryConfig(endpoint="http://127.0.0.1:4317")).enabled


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"protocol": "thrift"}, "unknown OTLP protocol"),
        ({"endpoint": "localhost:4317"}, "must be an http"),
        ({"sample_ratio": 1.5}, "sample_ratio"),
    ],
)
def test_bad_configuration_is_a_clear_error(config, message):
    with pytest.raises(ValueError, match=message):
        TelemetryConfig(**config)


def test_bad_protocol_variable_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ValueError, match="unknown OTLP protocol 'carrier-pigeon'"):
        setup_telemetry(TelemetryConfig(endpoint="http://127.0.0.1:4317"))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_traces_target_is_where_an_exporter_with_that_endpoint_sends(monkeypatch, protocol):
    """`kvobs demo --otlp-endpoint E` has the collector forward agents' spans to `traces_target(E)`: the same receiver,
    by the same protocol, as the engine's exporter given E reaches."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from collectors.drops import DropCounter
    from collectors.traces.otlp_forward import OTLPForwarder
    from kvobs.telemetry.providers import traces_target

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    with otlp_receiver() as (receiver, received):
        port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
        target = traces_target(f"http://127.0.0.1:{port}")
        assert target == (f"grpc://127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}/v1/traces")
        request = ExportTraceServiceRequest()
        request.resource_spans.add().scope_spans.add().spans.add(
            name="forwarded", trace_id=b"\1" * 16, span_id=b"\2" * 8
        )
        drops = DropCounter()
        forwarder = OTLPForwarder(target, drops)
        forwarder.start()
        forwarder.forward(request)
        forwarder.close()
        assert [s.name for s in received.spans] == ["forwarded"] and not drops.totals()
    assert traces_target("http://h:4318/custom/path", "http/protobuf") == "http://h:4318/custom/path"
