"""The engine's spans: step results -> `llm_request` spans with the cache's story, and KV loss spans.

    tracer = EngineTracer(telemetry.tracer_provider, model_name="smollm2", block_size=16, medium="CPU")
    AsyncEngine(llm_engine, observers=[metrics, tracer])         # on_step runs on the engine thread

Per request, one `llm_request` SERVER span, child of the request's `traceparent`, started when the request is
first scheduled (`StepResult.started`) with its arrival as start time and ended when it finishes, with vLLM's
`gen_ai.latency.*`/`gen_ai.usage.*` attributes plus the cache's story as timed span events:
`kvcache.prefix_lookup`, `kvcache.allocate`, `kvcache.evict` (cached blocks its allocation took from other
sessions, with their reasons), `kvcache.preempt`, `kvcache.resume`, `kvcache.first_token`. The span links to
the latest request span of every session it evicted blocks from. A request the sampler drops costs one
`start_span` and a set lookup per event: no attribute, event or link is built for it.

Invalidations and prefix-cache resets, and evictions no request caused (a session's release), are spans of
their own, built by `kvobs.telemetry.kv_spans` (the collector builds vLLM's the same way). With
`step_sample_every=N`, every Nth step is a `kvcache.step` span.

Nothing here raises into the engine: an error is logged (rate-limited) and counted in `num_errors`.
With telemetry off this observer is not installed, so the engine pays nothing.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from opentelemetry.propagate import extract
from opentelemetry.trace import Span, SpanContext, SpanKind, TracerProvider

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import RequestOutput, RequestStart, SchedulerStats, StepResult
from instrumented_engine.observers.dispatch import Handlers, dispatch
from instrumented_engine.observers.span_attributes import extend_unique, request_attributes
from kvobs.logs import worth_logging
from kvobs.semconv import attributes as a
from kvobs.semconv.spans import KVEventKind, SpanEvent, SpanName
from kvobs.telemetry.kv_spans import KVLossSpans, ns

log = logging.getLogger(__name__)

SCOPE = "kvobs.instrumented_engine"


@dataclass
class _RequestTrace:
    """What happened to one recorded request so far, kept until it finishes."""

    span: Span | None = None  # None: first seen without a start (hand-made results); made when it finishes
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
        self.loss_spans = KVLossSpans(self.tracer, medium=medium, latest=self.latest_span)
        self._requests: dict[str, _RequestTrace] = {}
        self._dropped: set[str] = set()  # requests the sampler dropped, until they finish
        self._latest: OrderedDict[str, SpanContext] = OrderedDict()
        self._unattributed: list[ev.BlockEvicted] = []  # this step's evictions no request caused
        self._invalidated: Counter[str] = Counter()  # blocks per owner of the invalidation under way
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
        """The span context of the session's latest finished (recorded) request, if remembered."""
        return self._latest.get(session_id)

    # ---- per step ------------------------------------------------------------------------------------
    def _on_step(self, result: StepResult) -> None:
        for start in result.started:
            self._start(start)
        dispatch(self, self.HANDLERS, result.events)
        if self._unattributed:
            self._evict_span(self._unattributed)
            self._unattributed = []
        for out in result.outputs:
            self._output(out)
        self._num_steps += 1
        if self.step_sample_every and self._num_steps % self.step_sample_every == 0:
            self._step_span(result.stats)
        self._last_step_ts = result.stats.ts

    def _start(self, start: RequestStart) -> None:
        parent = extract(start.trace_headers) if start.trace_headers else None
        span = self.tracer.start_span(
            SpanName.LLM_REQUEST, context=parent, kind=SpanKind.SERVER, start_time=ns(start.arrival_ts)
        )
        if span.is_recording():
            self._requests[start.request_id] = _RequestTrace(span)
        else:
            self._dropped.add(start.request_id)

    def _trace(self, event: ev.KVEvent) -> _RequestTrace | None:
        """The recorded trace of the event's request; None for a dropped request or no request."""
        rid = event.request_id
        if rid is None or rid in self._dropped:
            return None
        trace = self._requests.get(rid)
        if trace is None:
            trace = self._requests[rid] = _RequestTrace()
        return trace

    # ---- event handlers ----------------------------------------------------------------------------
    def _lookup(self, event: ev.PrefixLookup) -> None:
        if (trace := self._trace(event)) is None:
            return
        if not event.readmission:
            trace.query_tokens, trace.hit_tokens = event.query_tokens, event.hit_tokens
        trace.events.append(
            (
                SpanEvent.PREFIX_LOOKUP,
                event.ts,
                {
                    a.KV_PREFIX_QUERY_TOKENS: event.query_tokens,
                    a.KV_PREFIX_HIT_TOKENS: event.hit_tokens,
                    a.KV_BLOCKS_HIT: event.hit_blocks,
                    a.KV_PREFIX_READMISSION: event.readmission,
                    a.KV_TIER_HIT_TOKENS: event.tier_hit_tokens,
                },
            )
        )

    def _tier_loaded(self, event: ev.TierLoaded) -> None:
        if (trace := self._trace(event)) is None:
            return
        trace.events.append(
            (
                SpanEvent.TIER_LOAD,
                event.ts,
                {
                    a.KV_MEDIUM: event.medium,
                    a.KV_BLOCKS_HIT: len(event.block_hashes),
                    a.KV_TIER_HIT_TOKENS: event.num_tokens,
                    a.KV_TIER_LOAD_SECONDS: event.seconds,
                },
            )
        )

    def _allocated(self, event: ev.BlocksAllocated) -> None:
        if (trace := self._trace(event)) is None:
            return
        trace.blocks_allocated += len(event.block_ids)
        trace.events.append(
            (
                SpanEvent.ALLOCATE,
                event.ts,
                {a.KV_BLOCKS_ALLOCATED: len(event.block_ids), a.KV_BLOCKS_FREE: event.num_free_after},
            )
        )

    def _evicted(self, event: ev.BlockEvicted) -> None:
        if event.loss_kind is not KVEventKind.EVICTED:
            self._invalidated.update(event.owner_sessions)  # told by the invalidation's own span
        elif event.request_id is None:
            self._unattributed.append(event)
        elif (trace := self._trace(event)) is not None:
            self._caused_eviction(trace, event)

    def _preempted(self, event: ev.Preempted) -> None:
        if (trace := self._trace(event)) is None:
            return
        trace.events.append(
            (
                SpanEvent.PREEMPT,
                event.ts,
                {
                    a.KV_BLOCKS_FREED: event.num_blocks_freed,
                    a.KV_TOKENS_LOST: event.num_computed_tokens_lost,
                    a.KV_PREEMPTION_REASON: event.reason.value,
                },
            )
        )

    def _resumed(self, event: ev.Resumed) -> None:
        if (trace := self._trace(event)) is None:
            return
        attrs = {a.KV_PREFIX_HIT_TOKENS: event.hit_tokens, a.KV_REQUEST_NUM_PREEMPTIONS: event.num_preemptions}
        trace.events.append((SpanEvent.RESUME, event.ts, attrs))

    def _invalidated_span(self, event: ev.Invalidated) -> None:
        per_session = {s: self._invalidated.get(s) for s in event.sessions_affected}
        self._invalidated.clear()
        self.loss_spans.invalidate(event.ts, event.reason, event.num_blocks, per_session)

    def _cleared(self, event: ev.CacheCleared) -> None:
        per_session = dict.fromkeys(event.sessions_affected)  # a reset has no per-block events: counts unknown
        self.loss_spans.invalidate(event.ts, event.invalidation_reason, event.num_blocks, per_session)

    HANDLERS: Handlers = {
        ev.PrefixLookup: _lookup,
        ev.BlocksAllocated: _allocated,
        ev.BlockEvicted: _evicted,
        ev.Preempted: _preempted,
        ev.Resumed: _resumed,
        ev.Invalidated: _invalidated_span,
        ev.CacheCleared: _cleared,
        ev.TierLoaded: _tier_loaded,
    }

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
            extend_unique(attrs, a.KV_EVICTION_REASONS, (event.reason.value,))
            extend_unique(attrs, a.KV_SESSIONS_AFFECTED, event.owner_sessions)
            extend_unique(attrs, a.KV_SESSIONS_PAUSED, event.paused_sessions)
            return
        trace.events.append(
            (
                SpanEvent.EVICT,
                event.ts,
                {
                    a.KV_BLOCKS_EVICTED: 1,
                    a.KV_EVICTION_REASONS: [event.reason.value],
                    a.KV_SESSIONS_AFFECTED: list(event.owner_sessions),
                    a.KV_SESSIONS_PAUSED: list(event.paused_sessions),
                },
            )
        )

    def _evict_span(self, evictions: list[ev.BlockEvicted]) -> None:
        per_session = Counter(s for e in evictions for s in e.owner_sessions)
        self.loss_spans.evict(
            evictions[0].ts,
            evictions[-1].ts,
            per_session,
            num_blocks=len(evictions),
            reasons=(e.reason.value for e in evictions),
        )

    # ---- request spans -------------------------------------------------------------------------------
    def _output(self, out: RequestOutput) -> None:
        if out.request_id in self._dropped:
            if out.finished:
                self._dropped.discard(out.request_id)
            return
        trace = self._requests.get(out.request_id)
        if trace is None:
            trace = self._requests[out.request_id] = _RequestTrace()
        if out.first_token_ts is not None and not trace.first_token_seen:
            trace.first_token_seen = True
            trace.events.append((SpanEvent.FIRST_TOKEN, out.first_token_ts, {}))
        if out.finished:
            del self._requests[out.request_id]
            self._request_span(out, trace)

    def _request_span(self, out: RequestOutput, trace: _RequestTrace) -> None:
        span = trace.span
        if span is None:  # never started (aborted while waiting, or a hand-made step result): start it now
            parent = extract(out.trace_headers) if out.trace_headers else None
            span = self.tracer.start_span(
                SpanName.LLM_REQUEST, context=parent, kind=SpanKind.SERVER, start_time=ns(out.arrival_ts)
            )
        end = ns(out.finished_ts or out.arrival_ts)
        if not span.is_recording():
            span.end(end_time=end)
            return
        span.set_attributes(
            request_attributes(
                out,
                model_name=self.model_name,
                block_size=self.block_size,
                medium=self.medium,
                query_tokens=trace.query_tokens,
                hit_tokens=trace.hit_tokens,
                blocks_allocated=trace.blocks_allocated,
                blocks_evicted=trace.blocks_evicted,
            )
        )
        for session, n in trace.evicted_from.items():
            if (ctx := self._latest.get(session)) is not None:
                span.add_link(
                    ctx, {a.KV_LINK_RELATION: a.LINK_EVICTED_FROM, a.SESSION_ID: session, a.KV_BLOCKS_EVICTED: n}
                )
        for name, ts, attrs in trace.events:
            span.add_event(name, attrs, timestamp=ns(ts))
        span.end(end_time=end)
        if out.session_id is not None:
            self._remember(out.session_id, span.get_span_context())

    def _step_span(self, stats: SchedulerStats) -> None:
        start = self._last_step_ts if self._last_step_ts is not None else stats.ts
        span = self.tracer.start_span(SpanName.KV_STEP, kind=SpanKind.INTERNAL, start_time=ns(start))
        if span.is_recording():
            span.set_attributes(
                {
                    a.KV_BATCH_REQUESTS: stats.num_running,
                    a.KV_BATCH_TOKENS: stats.num_scheduled_tokens,
                    a.KV_REQUESTS_WAITING: stats.num_waiting,
                    a.KV_BLOCKS_FREE: stats.num_blocks_free,
                    a.KV_BLOCKS_RESIDENT: stats.num_blocks_resident,
                    a.KV_BLOCKS_TOTAL: stats.num_blocks_total,
                }
            )
        span.end(end_time=ns(stats.ts))

    def _remember(self, session_id: str, ctx: SpanContext) -> None:
        self._latest[session_id] = ctx
        self._latest.move_to_end(session_id)
        while len(self._latest) > self.max_sessions:
            self._latest.popitem(last=False)
