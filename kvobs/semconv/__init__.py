"""Every telemetry name kvobs uses: span names, attribute keys, span events, metric names, enumerations.

This package is the single source of names. Code elsewhere imports these constants instead of
spelling a span, attribute, metric, label or reason as a string literal. The vLLM names carry vLLM's
meaning (see `kvobs.semconv.metrics`); the `kvobs_*` / `kvcache.*` names are what vLLM does not expose.
"""

from kvobs.semconv import attributes  # noqa: F401
from kvobs.semconv.metric_spec import MetricSpec  # noqa: F401
from kvobs.semconv.metrics import kvobs_metrics, vllm  # noqa: F401
from kvobs.semconv.reasons import EvictionReason, InvalidationReason  # noqa: F401
from kvobs.semconv.spans import (  # noqa: F401
    GenAIOperation,
    KVEventKind,
    SessionSource,
    SpanEvent,
    SpanName,
    StepErrorType,
    StepStatus,
)
