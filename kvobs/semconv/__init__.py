"""Every telemetry name kvobs uses: Prometheus metric names, label keys and enumerated label values.

This package is the single source of names. Code elsewhere imports these constants instead of
spelling a metric, label or reason as a string literal. The vLLM names carry vLLM's meaning (see
`kvobs.semconv.metrics`); the `kvobs_*` names are what vLLM does not expose.
"""

from kvobs.semconv.metrics import MetricSpec, kvobs_metrics, vllm  # noqa: F401
from kvobs.semconv.reasons import EvictionReason, InvalidationReason  # noqa: F401
