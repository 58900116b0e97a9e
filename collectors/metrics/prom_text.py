"""Parse a Prometheus `/metrics` body (vLLM's or our engine's) into counters, gauges and histograms.

    parsed = parse_metrics(body)                  # MetricsParseError when the body is not a whole exposition
    parsed.gauges[("vllm:kv_cache_usage_perc", (("engine", "0"), ("model_name", "m")))]
    parsed.counters[("vllm:prefix_cache_hits", labels)].value
    parsed.histograms[("vllm:time_to_first_token_seconds", labels)].buckets   # ((le, cumulative), ...)

Parsing is `prometheus_client`'s text parser. Names are canonical: counters without `_total`, and the
names older vLLM releases emit (`vllm:gpu_cache_usage_perc`, `vllm:gpu_prefix_cache_*`,
`vllm:time_per_output_token_seconds`) mapped to the current ones (the current one wins when a release
emits both). Bucket boundaries are read from the body, never assumed. A counter's `_created` timestamp
(a sample of the family, or vLLM's separate `<name>_created` gauge) is kept to detect restarts.

A body is refused as a whole (no partial ingestion) when it is not the text format (an HTML error page),
does not end with a newline (cut off), or holds a histogram without its `+Inf` bucket or `_count`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvobs.semconv.metrics import VLLM_LEGACY_NAMES

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]

_LEGACY = {old: spec.name.removesuffix("_total") for old, spec in VLLM_LEGACY_NAMES.items()}
_CREATED = "_created"


class MetricsParseError(ValueError):
    """The body is not a complete Prometheus text exposition."""


@dataclass
class Counter:
    value: float
    created: float | None = None


@dataclass
class Histogram:
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (upper bound, cumulative count), ascending
    count: float | None = None
    sum: float | None = None
    created: float | None = None


@dataclass
class ParsedMetrics:
    gauges: dict[Key, float] = field(default_factory=dict)
    counters: dict[Key, Counter] = field(default_factory=dict)
    histograms: dict[Key, Histogram] = field(default_factory=dict)
    info: dict[str, dict[str, str]] = field(default_factory=dict)  # `*_info` gauges: their labels

    def gauge_values(self, name: str) -> list[float]:
        """A gauge's value of each of its label sets (engines, models, ranks)."""
        return [v for (n, _), v in self.gauges.items() if n == name]

    def gauge(self, name: str) -> float | None:
        """The sum of a gauge over its label sets (engines, models); None when absent."""
        values = self.gauge_values(name)
        return sum(values) if values else None


def labels_of(sample_labels: dict[str, str], *drop: str) -> Labels:
    return tuple(sorted((k, v) for k, v in sample_labels.items() if k not in drop))


def parse_metrics(text: str) -> ParsedMetrics:
    """Raises MetricsParseError when `text` is not a whole exposition (see the module doc)."""
    if not text.strip():
        raise MetricsParseError("empty body")
    if not text.endswith("\n"):
        raise MetricsParseError("body does not end with a newline: cut off")
    families = _families(text)
    present = {f.name for f in families}
    out = ParsedMetrics()
    created: dict[Key, float] = {}
    for family in families:
        name = _LEGACY.get(family.name, family.name)
        if name != family.name and name in present:
            continue  # a transition release emitting both: keep the current name
        if family.type == "counter":
            _add_counter(out, created, name, family.samples)
        elif family.type == "histogram":
            _add_histogram(out, created, name, family.samples)
        elif family.type in ("gauge", "untyped", "unknown"):
            for s in family.samples:
                if name.endswith(_CREATED):
                    base = name.removesuffix(_CREATED)
                    created[(_LEGACY.get(base, base), labels_of(s.labels))] = s.value
                elif name.endswith("_info"):
                    out.info[name] = dict(s.labels)
                else:
                    out.gauges[(name, labels_of(s.labels))] = s.value
    for key, ts in created.items():
        target = out.counters.get(key) or out.histograms.get(key)
        if target is not None:
            target.created = ts
    for (name, labels), hist in out.histograms.items():
        _check_histogram(name, labels, hist)
    return out


def _families(text: str) -> list:
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, IndexError, TypeError) as exc:
        raise MetricsParseError(f"not Prometheus text format: {exc}"[:300]) from exc


def _add_counter(out: ParsedMetrics, created: dict, name: str, samples) -> None:
    for s in samples:
        key = (name, labels_of(s.labels))
        if s.name.endswith(_CREATED):
            created[key] = s.value
        else:
            out.counters.setdefault(key, Counter(0.0)).value = s.value


def _add_histogram(out: ParsedMetrics, created: dict, name: str, samples) -> None:
    for s in samples:
        key = (name, labels_of(s.labels, "le"))
        if s.name.endswith(_CREATED):
            created[key] = s.value
            continue
        hist = out.histograms.setdefault(key, Histogram())
        if s.name.endswith("_bucket"):
            hist.buckets.append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            hist.count = s.value
        elif s.name.endswith("_sum"):
            hist.sum = s.value


def _check_histogram(name: str, labels: Labels, hist: Histogram) -> None:
    hist.buckets.sort()
    if not hist.buckets or not math.isinf(hist.buckets[-1][0]):
        raise MetricsParseError(f"histogram {name}{dict(labels)} has no +Inf bucket: cut off")
    if hist.count is None:
        raise MetricsParseError(f"histogram {name}{dict(labels)} has no _count: cut off")
