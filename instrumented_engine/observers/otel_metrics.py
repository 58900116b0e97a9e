"""`EngineMetrics`' OpenTelemetry sink: every engine metric also as an OpenTelemetry instrument.

    EngineMetrics(..., extra_sinks=[OTelMetricSink(telemetry.meter("kvobs.engine"))])

Instrument names and units come from `MetricSpec.otel_name` / `otel_unit`, so Prometheus and OTLP carry the
same values under the names each ecosystem expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvobs.semconv.metric_spec import MetricSpec


class OTelMetricSink:
    """Creates the OpenTelemetry instrument of each `MetricSpec` on `meter`."""

    def __init__(self, meter) -> None:
        self.meter = meter

    def create(self, spec: MetricSpec, label_names: tuple[str, ...], buckets: Sequence[float] | None) -> Any:
        name, unit = spec.otel_name, spec.otel_unit
        if spec.type == "counter":
            return _OTelInstrument(self.meter.create_counter(name, unit, spec.description), "add")
        if spec.type == "histogram":
            hist = self.meter.create_histogram(
                name, unit, spec.description, explicit_bucket_boundaries_advisory=buckets
            )
            return _OTelInstrument(hist, "record")
        return _OTelInstrument(self.meter.create_gauge(name, unit, spec.description), "set")  # gauge and info


class _OTelInstrument:
    def __init__(self, instrument, method: str) -> None:
        self.record = getattr(instrument, method)

    def labels(self, **labels: str) -> _OTelSeries:
        return _OTelSeries(self.record, labels)


class _OTelSeries:
    def __init__(self, record, attributes: dict[str, str]) -> None:
        self._record = record
        self._attributes = attributes

    def inc(self, amount: float = 1) -> None:
        self._record(amount, self._attributes)

    def set(self, value: float) -> None:
        self._record(value, self._attributes)

    observe = set

    def info(self, values: dict[str, str]) -> None:
        self._record(1, {**self._attributes, **values})
