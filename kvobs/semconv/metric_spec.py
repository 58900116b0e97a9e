"""A metric's specification: its name, Prometheus type, unit and meaning, and the forms OpenTelemetry gives them.

spec = MetricSpec("vllm:kv_cache_usage_perc", "gauge", "1", "KV-cache usage.")
spec.otel_name     # vllm.kv_cache_usage_perc
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name (counters without `_total`), Prometheus type, unit and meaning."""

    name: str
    type: str  # counter | gauge | histogram
    unit: str
    description: str
    labels: tuple[str, ...] = ()

    @property
    def otel_name(self) -> str:
        """The OpenTelemetry instrument name: OTel names cannot hold ':', so `vllm:kv_cache_usage_perc` becomes
        `vllm.kv_cache_usage_perc` (exported to Prometheus as `vllm_kv_cache_usage_perc`); no `_total` either."""
        return self.name.replace(":", ".")

    @property
    def otel_unit(self) -> str:
        """UCUM where one exists (`s`, `1`), else an annotation such as `{tokens}`."""
        return self.unit if self.unit in ("s", "1") else "{" + self.unit + "}"


def metric_spec(name: str, type_: str, unit: str, description: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, type_, unit, description, tuple(labels))
