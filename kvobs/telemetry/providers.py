"""OpenTelemetry set-up: a TracerProvider and a MeterProvider exporting over OTLP (gRPC or HTTP/protobuf).

    telemetry = setup_telemetry(TelemetryConfig(service_name="kvobs-engine", endpoint="http://jaeger:4317"))
    tracer = telemetry.tracer(__name__)          # None when tracing is off
    ...
    telemetry.shutdown()                         # flushes what is queued, then stops the exporters

Configuration follows the standard variables, with explicit arguments taking precedence:
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (telemetry is on when one of them or
`endpoint` is set), `OTEL_EXPORTER_OTLP_PROTOCOL` / `..._TRACES_PROTOCOL` (`grpc`, default, or
`http/protobuf`), `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (read by the SDK),
`OTEL_BSP_*` (the batch processor's queue and delays), `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_SDK_DISABLED`.

Spans leave through a batch processor with a bounded queue: the caller never waits on the network.
An unreachable collector costs log lines and a counter (`Telemetry.num_export_failures`), never a
blocked or crashed caller.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from kvobs.logs import worth_logging
from kvobs.semconv.attributes import SERVICE_INSTANCE_ID

log = logging.getLogger(__name__)

PROTOCOL_GRPC = "grpc"
PROTOCOL_HTTP = "http/protobuf"
PROTOCOLS = (PROTOCOL_GRPC, PROTOCOL_HTTP)
DEFAULT_METRIC_INTERVAL_S = 10.0
SHUTDOWN_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class TelemetryConfig:
    """What to export and where; None fields fall back to the `OTEL_*` variables.

    Args:
        service_name: `service.name` unless `OTEL_SERVICE_NAME` is set.
        service_instance_id: `service.instance.id` (which replica exported a span: a collector over a fleet tells
            them apart by it) unless `OTEL_RESOURCE_ATTRIBUTES` sets one.
        endpoint: OTLP endpoint (gRPC: `http://host:4317`; HTTP: `http://host:4318`, `/v1/traces` is added).
        protocol: `grpc` or `http/protobuf`.
        traces, metrics: export spans / metrics at all.
        sample_ratio: head sampling ratio of new traces (parent-based); None leaves `OTEL_TRACES_SAMPLER` in charge.
        metric_interval_s: how often metrics are pushed.
        span_exporters, metric_exporters: extra exporters (in-process ones for tests and benchmarks); they turn
            the signal on even without an endpoint.
    """

    service_name: str = "kvobs"
    service_instance_id: str | None = None
    endpoint: str | None = None
    protocol: str | None = None
    traces: bool = True
    metrics: bool = True
    sample_ratio: float | None = None
    metric_interval_s: float | None = None
    span_exporters: Sequence[SpanExporter] = field(default_factory=tuple)
    metric_exporters: Sequence[MetricExporter] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown OTLP protocol {self.protocol!r}; use one of {', '.join(PROTOCOLS)}")
        if self.sample_ratio is not None and not 0.0 <= self.sample_ratio <= 1.0:
            raise ValueError(f"sample_ratio must be in [0, 1]; got {self.sample_ratio}")
        if self.endpoint is not None and urlparse(self.endpoint).scheme not in ("http", "https"):
            raise ValueError(f"OTLP endpoint must be an http(s) URL, e.g. http://localhost:4317; got {self.endpoint!r}")


class Telemetry:
    """The providers one component uses; either may be None (that signal is off)."""

    def __init__(
        self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None, exporters: list[_Counting]
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self._exporters = exporters
        self._closed = False

    @property
    def enabled(self) -> bool:
        return self.tracer_provider is not None or self.meter_provider is not None

    @property
    def num_export_failures(self) -> int:
        """Export calls that failed (unreachable or refusing collector) across every exporter."""
        return sum(e.num_failures for e in self._exporters)

    def tracer(self, name: str):
        return None if self.tracer_provider is None else self.tracer_provider.get_tracer(name)

    def meter(self, name: str):
        return None if self.meter_provider is None else self.meter_provider.get_meter(name)

    def force_flush(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
        ok = True
        millis = int(timeout_s * 1000)
        if self.tracer_provider is not None:
            ok = self.tracer_provider.force_flush(millis) and ok
        if self.meter_provider is not None:
            ok = self.meter_provider.force_flush(millis) and ok
        return ok

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Flush what is queued (bounded by `timeout_s`), then stop the exporters. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.force_flush(timeout_s)
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)


DISABLED = Telemetry(None, None, [])


def setup_telemetry(config: TelemetryConfig | None = None) -> Telemetry:
    """Build the providers for `config` (not installed globally: pass them to whoever needs them).

    Raises:
        ValueError: a protocol in `OTEL_EXPORTER_OTLP_PROTOCOL` that is not grpc or http/protobuf.
    """
    config = config or TelemetryConfig()
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return DISABLED
    attributes = {SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or config.service_name}
    if config.service_instance_id and SERVICE_INSTANCE_ID not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes[SERVICE_INSTANCE_ID] = config.service_instance_id
    resource = Resource.create(attributes)
    exporters: list[_Counting] = []
    tracer_provider = meter_provider = None
    if config.traces:
        span_exporters = [*config.span_exporters]
        if _endpoint_configured(config, "TRACES"):
            span_exporters.append(_otlp_span_exporter(config))
        if span_exporters:
            sampler = None if config.sample_ratio is None else ParentBased(TraceIdRatioBased(config.sample_ratio))
            tracer_provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
            for exporter in span_exporters:
                counting = _CountingSpanExporter(exporter)
                exporters.append(counting)
                tracer_provider.add_span_processor(BatchSpanProcessor(counting))
    if config.metrics:
        metric_exporters = [*config.metric_exporters]
        if _endpoint_configured(config, "METRICS"):
            metric_exporters.append(_otlp_metric_exporter(config))
        if metric_exporters:
            interval_ms = _metric_interval_s(config) * 1000
            readers = []
            for metric_exporter in metric_exporters:
                counted = _CountingMetricExporter(metric_exporter)
                exporters.append(counted)
                readers.append(PeriodicExportingMetricReader(counted, export_interval_millis=interval_ms))
            meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)
    if tracer_provider is not None or meter_provider is not None:
        log.info(
            "telemetry on: traces %s, metrics %s (OTLP %s)",
            "on" if tracer_provider else "off",
            "on" if meter_provider else "off",
            _describe_endpoint(config),
        )
    return Telemetry(tracer_provider, meter_provider, exporters)


# ---- OTLP exporters --------------------------------------------------------------------------------
def _endpoint_configured(config: TelemetryConfig, signal: str) -> bool:
    return bool(
        config.endpoint
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def protocol_for(config: TelemetryConfig, signal: str) -> str:
    protocol = (
        config.protocol
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or PROTOCOL_GRPC
    )
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown OTLP protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    return protocol


def traces_target(endpoint: str, protocol: str | None = None) -> str:
    """Where `endpoint` sends spans, as one URL whose scheme says the protocol (what `kvobs collect --forward-otlp`
    takes): `grpc://host:port`, or the HTTP traces URL with `/v1/traces`. The protocol as an exporter would pick it."""
    if protocol_for(TelemetryConfig(endpoint=endpoint, protocol=protocol), "TRACES") == PROTOCOL_GRPC:
        return f"grpc://{urlparse(endpoint).netloc}"
    return _signal_url(endpoint, "/v1/traces")


def _signal_url(endpoint: str, path: str) -> str:
    """An explicit HTTP endpoint names the collector's base URL; the signal's path is appended, as the spec says."""
    return endpoint if urlparse(endpoint).path not in ("", "/") else endpoint.rstrip("/") + path


def _otlp_span_exporter(config: TelemetryConfig) -> SpanExporter:
    if protocol_for(config, "TRACES") == PROTOCOL_HTTP:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

        return HttpSpanExporter(endpoint=config.endpoint and _signal_url(config.endpoint, "/v1/traces"))
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

    return GrpcSpanExporter(endpoint=config.endpoint, insecure=_insecure(config.endpoint))


def _otlp_metric_exporter(config: TelemetryConfig) -> MetricExporter:
    if protocol_for(config, "METRICS") == PROTOCOL_HTTP:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

        return HttpMetricExporter(endpoint=config.endpoint and _signal_url(config.endpoint, "/v1/metrics"))
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

    return GrpcMetricExporter(endpoint=config.endpoint, insecure=_insecure(config.endpoint))


def _insecure(endpoint: str | None) -> bool | None:
    return None if endpoint is None else urlparse(endpoint).scheme == "http"


def _metric_interval_s(config: TelemetryConfig) -> float:
    if config.metric_interval_s is not None:
        return config.metric_interval_s
    env = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL")  # milliseconds
    return float(env) / 1000 if env else DEFAULT_METRIC_INTERVAL_S


def _describe_endpoint(config: TelemetryConfig) -> str:
    endpoint = config.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "from OTEL_* variables"
    return f"{protocol_for(config, 'TRACES')} -> {endpoint}" if _endpoint_configured(config, "TRACES") else "none"


# ---- counting wrappers: export failures are logged (rate-limited) and counted -------------------------
class _Counting:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.num_failures = 0
        self._lock = threading.Lock()

    def _failed(self, what: str, error: BaseException | None = None) -> None:
        with self._lock:
            self.num_failures += 1
            n = self.num_failures
        if worth_logging(n):
            log.warning("OTLP %s export failed (%d failures so far)%s", what, n, f": {error!r}" if error else "")


class _CountingSpanExporter(_Counting, SpanExporter):
    def export(self, spans) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # an exporter must not take the batch thread down
            self._failed("span", exc)
            return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._failed("span")
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class _CountingMetricExporter(_Counting, MetricExporter):
    def __init__(self, inner: MetricExporter) -> None:
        _Counting.__init__(self, inner)
        MetricExporter.__init__(
            self, preferred_temporality=inner._preferred_temporality, preferred_aggregation=inner._preferred_aggregation
        )

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:
            self._failed("metric", exc)
            return MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._failed("metric")
        return result

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)
