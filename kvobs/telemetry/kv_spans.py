"""The one builder of KV loss spans, for the engine and for the collector (vLLM's events).

    spans = KVLossSpans(tracer, medium="GPU", latest=lambda session: contexts.get(session))
    spans.evict(ts, ts, {"s1": 3, "s2": 1}, reasons=["capacity"], instance="vllm-0")   # no request took them
    spans.invalidate(ts, InvalidationReason.MANUAL_RESET, 12, {"s1": None})   # per-session count unknown: None

A `kvcache.evict` span tells cached blocks dropped outside any request (a session's release, vLLM's removals);
a `kvcache.invalidate` span tells an invalidation or a prefix-cache reset. Both carry the number of blocks,
their reasons, the sessions that lost blocks (`kvcache.sessions.affected`, at most `MAX_LISTED`), the medium
and, where known, the instance; an evict span has one `kvcache.evict` span event per session with its count.
Each is linked (`kvcache.link.relation`) to the latest request span of every session it hurt, when `latest`
knows it. Traces from vLLM and from our engine therefore read alike.

Nothing is built for a span that is not recording (sampled out): attributes, events and links are added only
after `is_recording()` says they will be kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.trace import Span, SpanContext, SpanKind, Tracer

from kvobs.semconv import attributes as a
from kvobs.semconv.spans import SpanEvent, SpanName

MAX_LISTED = 64  # most sessions (or reasons, or links) listed on one span or attribute
LatestSpan = Callable[[str], "SpanContext | None"]


def ns(ts: float) -> int:
    """Epoch seconds as OpenTelemetry's epoch nanoseconds."""
    return int(ts * 1e9)


def listed(values: Iterable[str]) -> list[str]:
    """Distinct values, sorted, at most `MAX_LISTED` (an attribute must stay small)."""
    return sorted(set(values))[:MAX_LISTED]


class KVLossSpans:
    """Args:
    tracer: where spans go (its sampler decides which are kept).
    medium: `GPU` or `CPU`, where the cache lives.
    latest: session -> the span context of its latest request, for links (None when unknown).
    """

    def __init__(self, tracer: Tracer, *, medium: str, latest: LatestSpan = lambda _session: None) -> None:
        self.tracer = tracer
        self.medium = medium
        self.latest = latest
        self.num_spans = 0

    def evict(
        self,
        start_ts: float,
        end_ts: float,
        blocks_per_session: Mapping[Any, int | None],  # session id (None: of no known session) -> blocks
        *,
        num_blocks: int | None = None,
        reasons: Iterable[str] = (),
        instance: str | None = None,
    ) -> bool:
        """A `kvcache.evict` span; `num_blocks` defaults to the sum of the per-session counts. True if kept.

        `blocks_per_session` may count blocks no known session owned under `None`."""
        if num_blocks is None:
            num_blocks = sum(n or 0 for n in blocks_per_session.values())
        attrs = {a.KV_BLOCKS_EVICTED: num_blocks, a.KV_EVICTION_REASONS: listed(reasons)}
        return self._span(SpanName.KV_EVICT, start_ts, end_ts, blocks_per_session, a.LINK_EVICTED_FROM, attrs, instance)

    def invalidate(
        self,
        ts: float,
        reason: str,
        num_blocks: int,
        blocks_per_session: Mapping[Any, int | None],  # session id (None: of no known session) -> blocks
        *,
        instance: str | None = None,
    ) -> bool:
        """A `kvcache.invalidate` span. True if kept."""
        attrs = {a.KV_INVALIDATION_REASON: str(reason), a.KV_BLOCKS_INVALIDATED: num_blocks}
        return self._span(SpanName.KV_INVALIDATE, ts, ts, blocks_per_session, a.LINK_INVALIDATED, attrs, instance)

    def _span(
        self,
        name: str,
        start_ts: float,
        end_ts: float,
        per_session: Mapping[str | None, int | None],
        relation: str,
        attrs: dict,
        instance: str | None,
    ) -> bool:
        span = self.tracer.start_span(name, kind=SpanKind.INTERNAL, start_time=ns(start_ts))
        if not span.is_recording():
            span.end(end_time=ns(end_ts))
            return False
        sessions = listed(s for s in per_session if s is not None)
        span.set_attributes({**attrs, a.KV_SESSIONS_AFFECTED: sessions, a.KV_MEDIUM: self.medium})
        if instance is not None:
            span.set_attribute(a.KV_INSTANCE, instance)
        for session in sessions:
            count = {} if per_session[session] is None else {a.KV_BLOCKS_EVICTED: per_session[session]}
            if name == SpanName.KV_EVICT:
                span.add_event(SpanEvent.EVICT, {a.SESSION_ID: session, **count}, timestamp=ns(start_ts))
            self._link(span, session, {a.KV_LINK_RELATION: relation, a.SESSION_ID: session, **count})
        span.end(end_time=ns(end_ts))
        self.num_spans += 1
        return True

    def _link(self, span: Span, session: str, attrs: dict) -> None:
        ctx = self.latest(session)
        if ctx is not None:
            span.add_link(ctx, attrs)
