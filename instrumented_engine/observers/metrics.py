"""The engine's Prometheus metrics: vLLM's names and meanings plus kvobs' own, fed by step results.

`EngineMetrics.on_step` runs on the engine thread after every step (an `AsyncEngine` observer) and
turns outputs, stats and KV events into metric updates. Meanings follow vLLM V1:

- `vllm:kv_cache_usage_perc` is the pinned fraction, 1 - free/usable (cached free blocks count as free);
- `vllm:prefix_cache_queries/hits` count tokens once per request at admission (re-admissions after a
  preemption are not counted again); hits are block-aligned and capped at num_tokens - 1;
- `vllm:prompt_tokens` counts a request's prompt when its prefill completes; `vllm:generation_tokens`
  every sampled token;
- `kvobs_session_prefix_lost_total` counts a session's idle losses once hindsight says they were in a tool pause
  (its next request began); until then they are `kvobs_session_prefix_lost_pending`, and losses after a
  session's end (release, or idle past the horizon) are never counted as pause losses;
- the block-residency histograms are recorded for every evicted block (vLLM samples them);
- a prefix-cache reset counts its blocks as evicted (`reset`) and invalidated (`manual_reset`), as every
  other invalidation counts its blocks under both.

Values go to one or more sinks: the Prometheus registry `/metrics` serves, and, when telemetry is on,
OpenTelemetry instruments (`instrumented_engine.observers.otel_metrics.OTelMetricSink`), so both see the same numbers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import RequestOutput, SchedulerStats, StepResult
from instrumented_engine.observers.dispatch import Handlers, dispatch
from kvobs.semconv import buckets as buckets_of
from kvobs.semconv import metrics as m
from kvobs.semconv import vllm_metrics as vm
from kvobs.semconv.metric_spec import MetricSpec
from kvobs.semconv.metrics import (
    ENGINE_LABELS,
    FINISHED_ABORT,
    FINISHED_REASONS,
    OFFLOAD_METRICS,
    REJECTED_QUEUE_FULL,
    TIERING_METRICS,
    kvobs_metrics,
    vllm,
)
from kvobs.semconv.reasons import EvictionReason, InvalidationReason

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TYPES = {"counter": Counter, "gauge": Gauge, "histogram": Histogram, "info": Info}
# Every vLLM metric plus kvobs' engine-side ones (agent-step counters belong to the agent SDK); no tiering manager's.
ENGINE_METRICS = (
    *(spec for spec in vars(vllm).values() if spec not in OFFLOAD_METRICS and spec not in TIERING_METRICS),
    kvobs_metrics.KV_BLOCKS_EVICTED,
    kvobs_metrics.KV_BLOCKS_INVALIDATED,
    kvobs_metrics.KV_CACHE_RESIDENT_BLOCKS,
    kvobs_metrics.KV_CACHE_FREE_BLOCKS,
    kvobs_metrics.KV_CACHE_TOTAL_BLOCKS,
    kvobs_metrics.ENGINE_START_TIME,
    kvobs_metrics.SESSION_PREFIX_LOST,
    kvobs_metrics.SESSION_PREFIX_LOST_PENDING,
    kvobs_metrics.REQUESTS_REJECTED,
    kvobs_metrics.TELEMETRY_DROPPED,
    kvobs_metrics.STORE_ROWS_EXPIRED,
)

# ... and with an offload tier: vLLM's offloading metrics, and kvobs' count of the stores it refused (vLLM logs them)
TIER_METRICS = (*OFFLOAD_METRICS, kvobs_metrics.KV_OFFLOAD_STORE_FAILURES)


class MetricSink(Protocol):
    def create(self, spec: MetricSpec, label_names: tuple[str, ...], buckets: Sequence[float] | None) -> Any:
        """An instrument whose `.labels(**values)` returns a child with `inc`, `set`, `observe` or `info`."""
        ...


class PrometheusSink:
    """Instruments in a prometheus_client registry (what `/metrics` exposes)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def create(self, spec: MetricSpec, label_names: tuple[str, ...], buckets: Sequence[float] | None) -> Any:
        kwargs = {"buckets": buckets} if spec.type == "histogram" else {}
        return _TYPES[spec.type](spec.name, spec.description, label_names, registry=self.registry, **kwargs)


class _Fanout:
    """One labelled series in every sink."""

    def __init__(self, children: list) -> None:
        self.children = children

    def inc(self, amount: float = 1) -> None:
        for child in self.children:
            child.inc(amount)

    def set(self, value: float) -> None:
        for child in self.children:
            child.set(value)

    def observe(self, value: float) -> None:
        for child in self.children:
            child.observe(value)

    def info(self, values: dict[str, str]) -> None:
        for child in self.children:
            child.info(values)


class EngineMetrics:
    """Every metric of one engine, in its own registry.

    Args:
        model_name: the served model name (label `model_name`).
        cache_config: the `vllm:cache_config_info` labels (block_size, num_gpu_blocks, ...).
        max_model_len: upper end of the token-count buckets.
        registry: where to register (a fresh one by default).
        extra_sinks: more places every value goes (OpenTelemetry instruments).
        started_at: when this engine's run began (`kvobs_engine_start_time_seconds`; default now).
        offload: the engine has an offload tier: its metrics too (`TIER_METRICS`).
    """

    def __init__(
        self,
        model_name: str,
        *,
        cache_config: dict[str, str],
        max_model_len: int,
        registry: CollectorRegistry | None = None,
        engine_index: str = "0",
        extra_sinks: Sequence[MetricSink] = (),
        started_at: float | None = None,
        offload: bool = False,
    ) -> None:
        self.specs = (*ENGINE_METRICS, *(TIER_METRICS if offload else ()))
        self.registry = registry or CollectorRegistry()
        if registry is None:  # process_start_time_seconds and the rest, as vLLM's /metrics has them
            ProcessCollector(registry=self.registry)
        sinks = [PrometheusSink(self.registry), *extra_sinks]
        self._labels = {m.LABEL_MODEL_NAME: model_name, m.LABEL_ENGINE: engine_index}
        tokens = buckets_of.token_buckets(max_model_len)
        buckets = {
            vllm.TIME_TO_FIRST_TOKEN: buckets_of.TTFT_BUCKETS,
            vllm.INTER_TOKEN_LATENCY: buckets_of.ITL_BUCKETS,
            vllm.REQUEST_TIME_PER_OUTPUT_TOKEN: buckets_of.ITL_BUCKETS,
            vllm.REQUEST_PROMPT_TOKENS: tokens,
            vllm.REQUEST_GENERATION_TOKENS: tokens,
            vllm.ITERATION_TOKENS: tokens,
            vllm.REQUEST_NUM_PREEMPTIONS: buckets_of.PREEMPTION_BUCKETS,
            vllm.KV_BLOCK_LIFETIME: buckets_of.BLOCK_RESIDENCY_BUCKETS,
            vllm.KV_BLOCK_IDLE_BEFORE_EVICT: buckets_of.BLOCK_RESIDENCY_BUCKETS,
            vllm.KV_BLOCK_REUSE_GAP: buckets_of.BLOCK_RESIDENCY_BUCKETS,
            vllm.KV_OFFLOAD_LOAD_SIZE: buckets_of.TRANSFER_SIZE_BUCKETS,
            vllm.KV_OFFLOAD_STORE_SIZE: buckets_of.TRANSFER_SIZE_BUCKETS,
        }
        for spec in (
            vllm.E2E_REQUEST_LATENCY,
            vllm.REQUEST_QUEUE_TIME,
            vllm.REQUEST_PREFILL_TIME,
            vllm.REQUEST_DECODE_TIME,
            vllm.REQUEST_INFERENCE_TIME,
        ):
            buckets[spec] = buckets_of.REQUEST_LATENCY_BUCKETS
        self._instruments = {
            spec.name: [sink.create(spec, (*ENGINE_LABELS, *spec.labels), buckets.get(spec)) for sink in sinks]
            for spec in self.specs
        }
        self._series: dict[tuple, Any] = {}
        self._total_sources: dict[tuple, tuple[MetricSpec, dict[str, str], Callable[[], int]]] = {}
        self._totals_seen: dict[tuple, int] = {}
        self._total_lock = threading.Lock()
        self._get(vllm.CACHE_CONFIG_INFO).info(cache_config)
        self._get(kvobs_metrics.ENGINE_START_TIME).set(time.time() if started_at is None else started_at)
        self._last_token_ts: dict[str, float] = {}
        self._create_labelled_series()

    def _create_labelled_series(self) -> None:
        """Every counter and histogram series with known labels exists from the start at 0, as in vLLM (its
        `vllm:num_preemptions_total` reads 0 before the first preemption), so rate() sees the first increase. Gauges
        are not: a 0 before the first step would be a false reading (total blocks 0); the first step sets them."""
        for spec in self.specs:
            if spec.type in ("counter", "histogram") and not spec.labels:
                self._get(spec)
        for reason in FINISHED_REASONS:
            self._get(vllm.REQUEST_SUCCESS, finished_reason=reason)
        for reason in EvictionReason:
            self._get(kvobs_metrics.KV_BLOCKS_EVICTED, reason=reason.value)
        for reason in InvalidationReason:
            self._get(kvobs_metrics.KV_BLOCKS_INVALIDATED, reason=reason.value)
        self._get(kvobs_metrics.REQUESTS_REJECTED, reason=REJECTED_QUEUE_FULL)
        # without an offload tier nothing is ever transferred from an external cache (a true 0, as vLLM reads)
        for source in (vm.PROMPT_SOURCE_COMPUTED, vm.PROMPT_SOURCE_CACHED, vm.PROMPT_SOURCE_EXTERNAL):
            self._get(vllm.PROMPT_TOKENS_BY_SOURCE, source=source)
        for source in vm.CACHED_SOURCES:  # (as vLLM 0.34 makes every source's series)
            self._get(vllm.PROMPT_TOKENS_CACHED_BY_SOURCE, source=source)

    def _get(self, spec: MetricSpec, **labels: str) -> Any:
        key = (spec.name, *labels.values())
        series = self._series.get(key)
        if series is None:
            children = [inst.labels(**self._labels, **labels) for inst in self._instruments[spec.name]]
            series = self._series[key] = children[0] if len(children) == 1 else _Fanout(children)
        return series

    # ---- telemetry loss ---------------------------------------------------------------------------
    def watch_dropped(self, component: str, total: Callable[[], int]) -> None:
        """Count what `component` drops (`kvobs_telemetry_dropped_total{component}`) from its running total."""
        self.watch_total(kvobs_metrics.TELEMETRY_DROPPED, total, component=component)

    def watch_total(self, spec: MetricSpec, total: Callable[[], int], **labels: str) -> None:
        """Count `spec` (a counter) from a running total another part keeps (e.g. rows retention dropped)."""
        key = (spec.name, tuple(sorted(labels.items())))
        self._total_sources[key] = (spec, labels, total)
        self._totals_seen[key] = 0
        self._get(spec, **labels)

    def sync_dropped(self) -> None:
        """Bring the watched counters up to their running totals (after every step and before a scrape)."""
        with self._total_lock:
            for key, (spec, labels, total) in self._total_sources.items():
                now, seen = total(), self._totals_seen[key]
                if now > seen:
                    self._get(spec, **labels).inc(now - seen)
                    self._totals_seen[key] = now

    # ---- the observer ---------------------------------------------------------------------------
    def on_step(self, result: StepResult) -> None:
        if self._total_sources:
            self.sync_dropped()
        self._observe_stats(result.stats)
        dispatch(self, self.HANDLERS, result.events)
        for out in result.outputs:
            self._observe_output(out, result.stats.ts)

    def request_rejected(self, reason: str = REJECTED_QUEUE_FULL) -> None:
        self._get(kvobs_metrics.REQUESTS_REJECTED, reason=reason).inc()

    def _observe_stats(self, stats: SchedulerStats) -> None:
        self._get(vllm.NUM_REQUESTS_RUNNING).set(stats.num_running)
        self._get(vllm.NUM_REQUESTS_WAITING).set(stats.num_waiting)
        self._get(vllm.KV_CACHE_USAGE_PERC).set(stats.kv_cache_usage)
        self._get(kvobs_metrics.KV_CACHE_RESIDENT_BLOCKS).set(stats.num_blocks_resident)
        self._get(kvobs_metrics.KV_CACHE_FREE_BLOCKS).set(stats.num_blocks_free)
        self._get(kvobs_metrics.KV_CACHE_TOTAL_BLOCKS).set(stats.num_blocks_total)
        self._get(kvobs_metrics.SESSION_PREFIX_LOST_PENDING).set(stats.num_idle_losses_pending)
        if stats.num_scheduled_tokens:
            self._get(vllm.ITERATION_TOKENS).observe(stats.num_scheduled_tokens)

    # ---- event handlers (one table, below) --------------------------------------------------------
    def _lookup(self, event: ev.PrefixLookup) -> None:
        for gap in event.reuse_gaps_s:
            self._get(vllm.KV_BLOCK_REUSE_GAP).observe(gap)
        if not event.readmission:
            self._get(vllm.PREFIX_CACHE_QUERIES).inc(event.query_tokens)
            self._get(vllm.PREFIX_CACHE_HITS).inc(event.hit_tokens)
            self._get(vllm.PROMPT_TOKENS_CACHED).inc(event.hit_tokens)
            loaded = event.tier_hit_tokens  # (from the offload tier, vLLM's KV connector: external)
            self._get(vllm.PROMPT_TOKENS_BY_SOURCE, source=vm.PROMPT_SOURCE_COMPUTED).inc(
                event.query_tokens - event.hit_tokens - loaded
            )
            self._get(vllm.PROMPT_TOKENS_BY_SOURCE, source=vm.PROMPT_SOURCE_CACHED).inc(event.hit_tokens)
            self._get(vllm.PROMPT_TOKENS_BY_SOURCE, source=vm.PROMPT_SOURCE_EXTERNAL).inc(loaded)
            self._get(vllm.PROMPT_TOKENS_CACHED_BY_SOURCE, source=vm.CACHED_SOURCE_DEVICE).inc(event.hit_tokens)
            self._get(vllm.PROMPT_TOKENS_CACHED_BY_SOURCE, source=vm.CACHED_SOURCE_HOST).inc(loaded)  # (its CPU tier)
            if vllm.EXTERNAL_PREFIX_CACHE_QUERIES in self.specs:
                self._get(vllm.EXTERNAL_PREFIX_CACHE_QUERIES).inc(event.query_tokens - event.hit_tokens)
                self._get(vllm.EXTERNAL_PREFIX_CACHE_HITS).inc(loaded)

    def _tier_loaded(self, event: ev.TierLoaded) -> None:
        self._get(vllm.KV_OFFLOAD_LOAD_BYTES).inc(event.num_bytes)
        self._get(vllm.KV_OFFLOAD_LOAD_TIME).inc(event.seconds)
        self._get(vllm.KV_OFFLOAD_LOAD_SIZE).observe(event.num_bytes)

    def _tier_stored(self, event: ev.TierStored) -> None:
        self._get(vllm.KV_OFFLOAD_STORE_BYTES).inc(event.num_bytes)
        self._get(vllm.KV_OFFLOAD_STORE_TIME).inc(event.seconds)
        self._get(vllm.KV_OFFLOAD_STORE_SIZE).observe(event.num_bytes)

    def _evicted(self, event: ev.BlockEvicted) -> None:
        self._get(kvobs_metrics.KV_BLOCKS_EVICTED, reason=event.reason.value).inc()
        self._get(vllm.KV_BLOCK_LIFETIME).observe(event.lifetime_s)
        self._get(vllm.KV_BLOCK_IDLE_BEFORE_EVICT).observe(event.idle_s)

    def _settled(self, event: ev.IdleLossesSettled) -> None:
        """Hindsight: losses pending for a session were in a tool pause (counted) or after its end (not)."""
        if event.in_pause:
            self._get(kvobs_metrics.SESSION_PREFIX_LOST).inc(event.num_blocks)

    def _invalidated(self, event: ev.Invalidated) -> None:
        self._get(kvobs_metrics.KV_BLOCKS_INVALIDATED, reason=event.reason.value).inc(event.num_blocks)

    def _cleared(self, event: ev.CacheCleared) -> None:
        # A reset is an invalidation without per-block events: its blocks count under both reasons.
        self._get(kvobs_metrics.KV_BLOCKS_EVICTED, reason=event.eviction_reason.value).inc(event.num_blocks)
        self._get(kvobs_metrics.KV_BLOCKS_INVALIDATED, reason=event.invalidation_reason.value).inc(event.num_blocks)

    def _preempted(self, event: ev.Preempted) -> None:
        self._get(vllm.NUM_PREEMPTIONS).inc()

    HANDLERS: Handlers = {
        ev.PrefixLookup: _lookup,
        ev.BlockEvicted: _evicted,
        ev.Invalidated: _invalidated,
        ev.CacheCleared: _cleared,
        ev.Preempted: _preempted,
        ev.IdleLossesSettled: _settled,
        ev.TierLoaded: _tier_loaded,
        ev.TierStored: _tier_stored,
    }

    def _observe_output(self, out: RequestOutput, now: float) -> None:
        num_new = len(out.new_token_ids)
        if num_new:
            self._get(vllm.GENERATION_TOKENS).inc(num_new)
            last = self._last_token_ts.get(out.request_id)
            if last is None:
                self._get(vllm.PROMPT_TOKENS).inc(out.num_prompt_tokens)
                self._get(vllm.TIME_TO_FIRST_TOKEN).observe(now - out.arrival_ts)
            else:
                self._get(vllm.INTER_TOKEN_LATENCY).observe(now - last)
            self._last_token_ts[out.request_id] = now
        if out.finished:
            self._last_token_ts.pop(out.request_id, None)
            self._observe_finished(out)

    def _observe_finished(self, out: RequestOutput) -> None:
        self._get(vllm.REQUEST_SUCCESS, finished_reason=out.finish_reason or FINISHED_ABORT).inc()
        self._get(vllm.REQUEST_NUM_PREEMPTIONS).observe(out.num_preemptions)
        self._get(vllm.REQUEST_PROMPT_TOKENS).observe(out.num_prompt_tokens)
        num_generated = len(out.output_token_ids)
        self._get(vllm.REQUEST_GENERATION_TOKENS).observe(num_generated)
        lat = out.latencies()  # phases a request never reached (aborted while waiting) are None
        for spec, value in (
            (vllm.E2E_REQUEST_LATENCY, lat.e2e),
            (vllm.REQUEST_QUEUE_TIME, lat.queue),
            (vllm.REQUEST_INFERENCE_TIME, lat.inference),
            (vllm.REQUEST_PREFILL_TIME, lat.prefill),
            (vllm.REQUEST_DECODE_TIME, lat.decode),
        ):
            if value is not None:
                self._get(spec).observe(value)
        if lat.decode is not None and num_generated > 1:
            self._get(vllm.REQUEST_TIME_PER_OUTPUT_TOKEN).observe(lat.decode / (num_generated - 1))
