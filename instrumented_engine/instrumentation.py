"""The engine's one OpenTelemetry adapter: step results -> spans, span events, span links and OTel metrics.

    tracer = EngineTracer(telemetry.tracer_provider, model_name="smollm2", block_size=16, medium="CPU")
    AsyncEngine(llm_engine, observers=[metrics, tracer])         # on_step runs on the engine thread
    EngineMetrics(..., extra_sinks=[OTelMetricSink(telemetry.meter("kvobs.engine"))])

Per request, one `llm_request` SERVER span, child of the request's `traceparent`, made when the request
finishes (as vLLM does) with its true start and end times and vLLM's `gen_ai.latency.*`/`gen_ai.usage.*`
attributes plus the cache's story as timed span events: `kvcache.prefix_lookup`, `kvcache.allocate`,
`kvcache.evict` (cached blocks its allocation took from other sessions, with their reasons), `kvcache.preempt`,
`kvcache.resume`, `kvcache.first_token`. The span links to the latest request span of every session it
evicted blocks from. Each invalidation (and prefix-cache reset) is a `kvcache.invalidate` span linked to the
latest request span of each session it hit; evictions no request caused (a session's release) are a
`kvcache.evict` span. With `step_sample_every=N`, every Nth step is a `kvcache.step` span.

Nothing here raises into the engine: an error is logged (rate-limited) and counted in `num_errors`.
With telemetry off none of this is installed, so the engine pays nothing.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.propagate import extract
from opentelemetry.trace import Link, SpanContext, SpanKind, TracerProvider

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import RequestOutput, SchedulerStats, StepResult
from kvobs.logs import worth_logging
from kvobs.semconv import attributes as a
from kvobs.semconv.metrics import MetricSpec
from kvobs.semconv.reasons import InvalidationReason
from kvobs.semconv.spans import SpanEvent, SpanName

log = logging.getLogger(__name__)

SCOPE = "kvobs.instrumented_engine"
MAX_LISTED = 64  # most sessions or hashes listed in one attribute
_REQUEST_EVENTS = (ev.PrefixLookup, ev.BlocksAllocated, ev.BlockEvicted, ev.Preempted, ev.Resumed)


def _ns(ts: float) -> int:
    return int(ts * 1e9)


# ---- metrics -----------------------------------------------------------------------------------------
class OTelMetricSink:
    """`EngineMetrics` sink writing the same values to OpenTelemetry instruments (names: `MetricSpec.otel_name`)."""

    def __init__(self, meter) -> None:
        self.meter = meter

    def create(self, spec: MetricSpec, label_names: tuple[str, ...], buckets: Sequence[float] | None) -> Any:
        name, unit = spec.otel_name, spec.otel_unit
        if spec.type == "counter":
            return _OTelInstrument(self.meter.create_counter(name, unit, spec.description), "add")
        if spec.type == "histogram":
            hist = self.meter.create_histogram(name, unit, spec.description,
                                               explicit_bucket_boundaries_advisory=buckets)  # fmt: skip
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


# ---- spans ---------------------------------------------------------------------------------------------
@dataclass
class _RequestTrace:
    """What happened to one request so far, kept until it finishes."""

    events: list[tuple[str, float, dict]] = field(default_factory=list)
    evicted_from: Counter[str] = field(default_factory=Counter)  # session -> its blocks this request evicted
    query_tokens: int = 0
    hit_tokens: int = 0
    blocks_allocated: int = 0
    blocks_evicted: int = 0
    first_token_seen: bool = False


class EngineTracer:
    """An `AsyncEngine` observer that turns step results into spans.

    Args:
        tracer_provider: where spans go (its sampler decides which traces are kept).
        model_name: the served model name.
        block_size: tokens per KV block.
        medium: `GPU` or `CPU`, where the cache lives.
        step_sample_every: make a `kvcache.step` span every this many steps (0: never).
        max_sessions: sessions whose latest request span is remembered for links.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider,
        *,
        model_name: str,
        block_size: int,
        medium: str,
        step_sample_every: int = 0,
        max_sessions: int = 10_000,
    ) -> None:
        self.tracer = tracer_provider.get_tracer(SCOPE)
        self.model_name = model_name
        self.block_size = block_size
        self.medium = medium
        self.step_sample_every = step_sample_every
        self.max_sessions = max_sessions
        self.num_errors = 0
        self._requests: dict[str, _RequestTrace] = {}
        self._latest: OrderedDict[str, SpanContext] = OrderedDict()
        self._num_steps = 0
        self._last_step_ts: float | None = None

    def on_step(self, result: StepResult) -> None:
        try:
            self._on_step(result)
        except Exception:  # telemetry must never take the engine down
            self.num_errors += 1
            if worth_logging(self.num_errors):
                log.exception("tracing a step failed (%d failures so far); the engine goes on", self.num_errors)

    def latest_span(self, session_id: str) -> SpanContext | None:
        """The span context of the session's latest finished request, if remembered."""
        return self._latest.get(session_id)

    # ---- per step ------------------------------------------------------------------------------------
    def _on_step(self, result: StepResult) -> None:
        unattributed: list[ev.BlockEvicted] = []
        for event in result.events:
            if isinstance(event, ev.BlockEvicted) and event.request_id is None:
                if event.invalidation_reason is None:
                    unattributed.append(event)  # invalidations are told by their own span
            elif isinstance(event, ev.Invalidated):
                self._invalidate_span(event.ts, event.reason, event.num_blocks, event.sessions_affected)
            elif isinstance(event, ev.CacheCleared):
                self._invalidate_span(event.ts, InvalidationReason.MANUAL_RESET.value, event.num_blocks,
                                      event.sessions_affected)  # fmt: skip
            elif isinstance(event, _REQUEST_EVENTS) and event.request_id is not None:
                self._request_event(event)
        if unattributed:
            self._evict_span(unattributed)
        for out in result.outputs:
            self._output(out)
        self._num_steps += 1
        if self.step_sample_every and self._num_steps % self.step_sample_every == 0:
            self._step_span(result.stats)
        self._last_step_ts = result.stats.ts

    def _trace(self, request_id: str) -> _RequestTrace:
        trace = self._requests.get(request_id)
        if trace is None:
            trace = self._requests[request_id] = _RequestTrace()
        return trace

    def _request_event(self, event: ev.KVEvent) -> None:
        trace = self._trace(event.request_id)
        if isinstance(event, ev.PrefixLookup):
            if not event.readmission:
                trace.query_tokens, trace.hit_tokens = event.query_tokens, event.hit_tokens
            trace.events.append((SpanEvent.PREFIX_LOOKUP, event.ts, {
                a.KV_PREFIX_QUERY_TOKENS: event.query_tokens,
                a.KV_PREFIX_HIT_TOKENS: event.hit_tokens,
                a.KV_BLOCKS_HIT: event.hit_blocks,
                a.KV_PREFIX_READMISSION: event.readmission,
            }))  # fmt: skip
        elif isinstance(event, ev.BlocksAllocated):
            trace.blocks_allocated += len(event.block_ids)
            trace.events.append((SpanEvent.ALLOCATE, event.ts, {
                a.KV_BLOCKS_ALLOCATED: len(event.block_ids), a.KV_BLOCKS_FREE: event.num_free_after}))  # fmt: skip
        elif isinstance(event, ev.BlockEvicted):
            self._caused_eviction(trace, event)
        elif isinstance(event, ev.Preempted):
            trace.events.append((SpanEvent.PREEMPT, event.ts, {
                a.KV_BLOCKS_FREED: event.num_blocks_freed,
                a.KV_TOKENS_LOST: event.num_computed_tokens_lost,
                a.KV_PREEMPTION_REASON: event.reason,
            }))  # fmt: skip
        elif isinstance(event, ev.Resumed):
            attrs = {a.KV_PREFIX_HIT_TOKENS: event.hit_tokens, a.KV_REQUEST_NUM_PREEMPTIONS: event.num_preemptions}
            trace.events.append((SpanEvent.RESUME, event.ts, attrs))

    def _caused_eviction(self, trace: _RequestTrace, event: ev.BlockEvicted) -> None:
        """Consecutive evictions of one allocation become one `kvcache.evict` event."""
        trace.blocks_evicted += 1
        for session in event.owner_sessions:
            if session != event.session_id:
                trace.evicted_from[session] += 1
        last = trace.events[-1] if trace.events else None
        if last is not None and last[0] == SpanEvent.EVICT and last[1] == event.ts:
            attrs = last[2]
            attrs[a.KV_BLOCKS_EVICTED] += 1
            _extend_unique(attrs, a.KV_EVICTION_REASONS, (event.reason,))
            _extend_unique(attrs, a.KV_SESSIONS_AFFECTED, event.owner_sessions)
            _extend_unique(attrs, a.KV_SESSIONS_PAUSED, event.paused_sessions)
            return
        trace.events.append((SpanEvent.EVICT, event.ts, {
            a.KV_BLOCKS_EVICTED: 1,
            a.KV_EVICTION_REASONS: [event.reason],
            a.KV_SESSIONS_AFFECTED: list(event.owner_sessions),
            a.KV_SESSIONS_PAUSED: list(event.paused_sessions),
        }))  # fmt: skip

    def _output(self, out: RequestOutput) -> None:
        trace = self._trace(out.request_id)
        if out.first_token_ts is not None and not trace.first_token_seen:
            trace.first_token_seen = True
            trace.events.append((SpanEvent.FIRST_TOKEN, out.first_token_ts, {}))
        if out.finished:
            del self._requests[out.request_id]
            self._request_span(out, trace)

    # ---- spans -------------------------------------------------------------------------------------------
    def _request_span(self, out: RequestOutput, trace: _RequestTrace) -> None:
        links = [
            Link(ctx, {a.KV_LINK_RELATION: a.LINK_EVICTED_FROM, a.SESSION_ID: session, a.KV_BLOCKS_EVICTED: n})
            for session, n in trace.evicted_from.items()
            if (ctx := self._latest.get(session)) is not None
        ]
        parent = extract(out.trace_headers) if out.trace_headers else None
        span = self.tracer.start_span(SpanName.LLM_REQUEST, context=parent, kind=SpanKind.SERVER,
                                      attributes=self._request_attributes(out, trace), links=links,
                                      start_time=_ns(out.arrival_ts))  # fmt: skip
        for name, ts, attrs in trace.events:
            span.add_event(name, attrs, timestamp=_ns(ts))
        span.end(end_time=_ns(out.finished_ts or out.arrival_ts))
        if out.session_id is not None:
            self._remember(out.session_id, span.get_span_context())

    def _request_attributes(self, out: RequestOutput, trace: _RequestTrace) -> dict:
        completion = len(out.output_token_ids)
        attrs = {
            a.GEN_AI_REQUEST_ID: out.request_id,
            a.GEN_AI_RESPONSE_MODEL: self.model_name,
            a.GEN_AI_REQUEST_N: 1,
            a.GEN_AI_USAGE_PROMPT_TOKENS: out.num_prompt_tokens,
            a.GEN_AI_USAGE_COMPLETION_TOKENS: completion,
            a.GEN_AI_USAGE_INPUT_TOKENS: out.num_prompt_tokens,
            a.GEN_AI_USAGE_OUTPUT_TOKENS: completion,
            a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: out.num_cached_tokens,
            a.GEN_AI_RESPONSE_FINISH_REASONS: [out.finish_reason or "abort"],
            a.KV_PREFIX_QUERY_TOKENS: trace.query_tokens,
            a.KV_PREFIX_HIT_TOKENS: trace.hit_tokens,
            a.KV_BLOCKS_ALLOCATED: trace.blocks_allocated,
            a.KV_BLOCKS_EVICTED: trace.blocks_evicted,
            a.KV_REQUEST_NUM_PREEMPTIONS: out.num_preemptions,
            a.KV_BLOCK_SIZE: self.block_size,
            a.KV_MEDIUM: self.medium,
        }
        optional = {
            a.GEN_AI_REQUEST_MAX_TOKENS: out.max_tokens,
            a.GEN_AI_REQUEST_TEMPERATURE: out.temperature,
            a.GEN_AI_REQUEST_TOP_P: out.top_p,
            a.SESSION_ID: out.session_id,
        }
        attrs.update((k, v) for k, v in optional.items() if v is not None)
        attrs.update(_latencies(out))
        return attrs

    def _invalidate_span(self, ts: float, reason: str, num_blocks: int, sessions: Sequence[str]) -> None:
        links = self._links(sessions, {a.KV_LINK_RELATION: a.LINK_INVALIDATED})
        span = self.tracer.start_span(SpanName.KV_INVALIDATE, kind=SpanKind.INTERNAL, links=links, start_time=_ns(ts),
                                      attributes={a.KV_INVALIDATION_REASON: reason, a.KV_BLOCKS_INVALIDATED: num_blocks,
                                                  a.KV_SESSIONS_AFFECTED: list(sessions[:MAX_LISTED]),
                                                  a.KV_MEDIUM: self.medium})  # fmt: skip
        span.end(end_time=_ns(ts))

    def _evict_span(self, evictions: list[ev.BlockEvicted]) -> None:
        sessions = sorted({s for e in evictions for s in e.owner_sessions})
        reasons = sorted({e.reason for e in evictions})
        links = self._links(sessions, {a.KV_LINK_RELATION: a.LINK_EVICTED_FROM})
        span = self.tracer.start_span(SpanName.KV_EVICT, kind=SpanKind.INTERNAL, links=links,
                                      start_time=_ns(evictions[0].ts),
                                      attributes={a.KV_BLOCKS_EVICTED: len(evictions), a.KV_EVICTION_REASONS: reasons,
                                                  a.KV_SESSIONS_AFFECTED: sessions[:MAX_LISTED],
                                                  a.KV_MEDIUM: self.medium})  # fmt: skip
        span.end(end_time=_ns(evictions[-1].ts))

    def _step_span(self, stats: SchedulerStats) -> None:
        start = self._last_step_ts if self._last_step_ts is not None else stats.ts
        span = self.tracer.start_span(SpanName.KV_STEP, kind=SpanKind.INTERNAL, start_time=_ns(start), attributes={
            a.KV_BATCH_REQUESTS: stats.num_running,
            a.KV_BATCH_TOKENS: stats.num_scheduled_tokens,
            a.KV_REQUESTS_WAITING: stats.num_waiting,
            a.KV_BLOCKS_FREE: stats.num_blocks_free,
            a.KV_BLOCKS_RESIDENT: stats.num_blocks_resident,
            a.KV_BLOCKS_TOTAL: stats.num_blocks_total,
        })  # fmt: skip
        span.end(end_time=_ns(stats.ts))

    def _links(self, sessions: Iterable[str], attrs: dict) -> list[Link]:
        return [
            Link(ctx, {**attrs, a.SESSION_ID: s})
            for s in list(sessions)[:MAX_LISTED]
            if (ctx := self._latest.get(s)) is not None
        ]

    def _remember(self, session_id: str, ctx: SpanContext) -> None:
        self._latest[session_id] = ctx
        self._latest.move_to_end(session_id)
        while len(self._latest) > self.max_sessions:
            self._latest.popitem(last=False)


def _extend_unique(attrs: dict, key: str, values: Iterable[str]) -> None:
    listed = attrs[key]
    for value in values:
        if value not in listed and len(listed) < MAX_LISTED:
            listed.append(value)


def _latencies(out: RequestOutput) -> dict[str, float]:
    """vLLM's `gen_ai.latency.*` attributes, for the phases the request reached."""
    lat = out.latencies()
    values = {
        a.GEN_AI_LATENCY_E2E: lat.e2e,
        a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: lat.ttft,
        a.GEN_AI_LATENCY_TIME_IN_QUEUE: lat.queue,
        a.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: lat.inference,
        a.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: lat.prefill,
        a.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: lat.decode,
    }
    return {key: value for key, value in values.items() if value is not None}
