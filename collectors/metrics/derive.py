"""Turn two consecutive scrapes into what the store keeps: interval increases, quantiles, gauges, a snapshot.

Raw expositions are large (about 700 lines per vLLM) and mostly histogram buckets; the store keeps, per
scrape and instance, for the metrics kvobs knows (vLLM's and kvobs' own, see `kvobs.semconv.metrics`; SGLang's and
LMCache's KV-cache counters, `kvobs.semconv.engine_metrics`):

- gauges as they are (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, ...);
- counters as the increase over the interval, `<name>:increase`, by their meaningful labels
  (`finished_reason`, `reason`, `source`; `model_name` and `engine` summed). Increases add up over any
  window: a rate is sum(increase) / window;
- histograms as `<name>:count` and `<name>:sum` increases and `<name>:p50` / `<name>:p99` of the interval's
  observations, interpolated inside the buckets the server reported (as PromQL's histogram_quantile);
- `vllm:prefix_cache_hit_rate`: hit tokens / queried tokens over the interval.

Restarts are handled by `CounterTracker`: no negative increase, nothing counted twice. A counter or histogram series
that first appears after an instance's first scrape held 0 at the scrape before (an engine creates a labelled series
on its first count): its whole value is the interval's increase, not lost as a first sight.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from collectors.metrics.counters import CounterTracker
from collectors.metrics.prom_text import Labels, ParsedMetrics
from kvobs.semconv.engine_metrics import ENGINE_METRICS
from kvobs.semconv.metrics import COUNT_SUFFIX, ENGINE_LABELS, INCREASE_SUFFIX, SUM_SUFFIX, kvobs_metrics, vllm

KNOWN = {spec.name: spec for spec in (*vars(vllm).values(), *vars(kvobs_metrics).values(), *ENGINE_METRICS)}
# other engines' counters are kept by the labels kvobs names only: their ranks and worker ids would split one count
DECLARED_ONLY = {spec.name: frozenset(spec.labels) for spec in ENGINE_METRICS}
QUANTILES = {"p50": 0.5, "p99": 0.99}
HIT_RATE = "vllm:prefix_cache_hit_rate"
INCREASE, COUNT, SUM = INCREASE_SUFFIX, COUNT_SUFFIX, SUM_SUFFIX


@dataclass
class Derived:
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    increases: dict[str, float] = field(default_factory=dict)  # counter name -> increase, all labels summed
    totals: dict[str, float] = field(default_factory=dict)  # counter name -> total seen since the collector started
    hit_rate: float | None = None  # prefix-cache hit tokens / queried tokens over the interval


class Deriver:
    """Per-instance state between scrapes: counters' last values and running totals."""

    def __init__(self) -> None:
        self.tracker = CounterTracker()
        self._totals: dict[tuple[str, str], float] = defaultdict(float)
        self._derived: set[str] = set()  # instances derived once: a series new after that began at 0

    def derive(self, instance: str, parsed: ParsedMetrics) -> Derived:
        out = Derived()
        gauges: dict[tuple[str, Labels], list[float]] = defaultdict(list)
        for (name, labels), value in parsed.gauges.items():
            if name in KNOWN:
                gauges[(name, tuple(_meaningful(labels).items()))].append(value)
        for (name, labels), values in gauges.items():  # engines summed; a fraction averaged
            value = sum(values) / len(values) if name.endswith("_perc") else sum(values)
            out.samples.append((name, dict(labels), value))
        self._counters(instance, parsed, out)
        self._histograms(instance, parsed, out)
        self._derived.add(instance)
        queries = out.increases.get(vllm.PREFIX_CACHE_QUERIES.name)
        if queries:
            out.hit_rate = out.increases.get(vllm.PREFIX_CACHE_HITS.name, 0.0) / queries
            out.samples.append((HIT_RATE, {}, out.hit_rate))
        return out

    def _counters(self, instance: str, parsed: ParsedMetrics, out: Derived) -> None:
        by_labels: dict[tuple[str, Labels], float] = defaultdict(float)
        fresh = instance in self._derived  # a series new after the instance's first scrape began at 0
        for (name, labels), counter in parsed.counters.items():
            if name not in KNOWN:
                continue
            increase = self._increase((instance, name, labels), counter.value, counter.created, fresh)
            self._totals[(instance, name)] += counter.value if increase is None else increase
            out.totals[name] = self._totals[(instance, name)]
            if increase is not None:
                by_labels[(name, tuple(_meaningful(labels, DECLARED_ONLY.get(name)).items()))] += increase
        for (name, labels), increase in by_labels.items():
            out.samples.append((name + INCREASE, dict(labels), increase))
            out.increases[name] = out.increases.get(name, 0.0) + increase

    def _increase(self, key, value: float, created: float | None, fresh: bool) -> float | None:
        """The tracker's increase; with `fresh` (the instance was scraped before), a series seen for the first time
        counts whole: a labelled series an engine creates on its first count (SGLang's `cache_source="host"`,
        LMCache's histograms in its multiprocess registry, a first abort) was absent from the previous scrape, so it
        held 0 then."""
        increase = self.tracker.increase(key, value, created)
        return value if increase is None and fresh else increase

    def _histograms(self, instance: str, parsed: ParsedMetrics, out: Derived) -> None:
        buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        counts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        fresh = instance in self._derived  # a series new after the instance's first scrape began empty
        for (name, labels), hist in parsed.histograms.items():
            if name not in KNOWN:
                continue
            key = (instance, name, labels)
            if hist.count is None:  # (the parser refuses a histogram without its _count)
                continue
            seen = [self._increase((*key, le), n, hist.created, fresh) for le, n in hist.buckets]
            count = self._increase((*key, COUNT), hist.count, hist.created, fresh)
            total = self._increase((*key, SUM), hist.sum or 0.0, hist.created, fresh)
            increases = [i for i in seen if i is not None]
            if count is None or total is None or len(increases) < len(seen):
                continue  # first sight: no interval yet
            for (le, _), increase in zip(hist.buckets, increases):
                buckets[name][le] += increase
            counts[name][0] += count
            counts[name][1] += total
        for name, (count, total) in counts.items():
            out.samples.append((name + COUNT, {}, count))
            out.samples.append((name + SUM, {}, total))
            cumulative = sorted(buckets[name].items())
            for suffix, q in QUANTILES.items():
                value = histogram_quantile(q, cumulative)
                if value is not None:
                    out.samples.append((f"{name}:{suffix}", {}, value))


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """PromQL's estimate: linear inside the bucket holding rank q; the highest finite bound for the +Inf bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(upper):
                return lower
            if cumulative == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (cumulative - below)
        lower, below = upper, cumulative
    return lower


def _meaningful(labels: Labels, only: frozenset[str] | None = None) -> dict[str, str]:
    if only is not None:
        return {k: v for k, v in labels if k in only}
    return {k: v for k, v in labels if k not in ENGINE_LABELS}
