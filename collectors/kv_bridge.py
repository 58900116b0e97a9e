"""vLLM's KV events as spans, so a vLLM user sees evictions in Jaeger next to the requests they hurt.

    bridge = KVSpanBridge(telemetry.tracer("kvobs.collector"), activity)
    KVIngest(..., bridge=bridge)

Per event batch that removed blocks, one `kvcache.evict` span (at the batch's time) with the number of
blocks, the sessions that owned them (`kvcache.sessions.affected`), one `kvcache.evict` span event per
session with its count, and a link (`kvcache.link.relation` = `evicted_from`) to each such session's latest
`llm_request` span when the collector has seen it. Per `AllBlocksCleared`, one `kvcache.invalidate` span
(`manual_reset`) linked the same way (`invalidated`). Names and keys are the engine's (`kvobs.semconv`),
so traces from vLLM and from our engine read alike.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, Tracer

from collectors.session_activity import SessionActivity
from kvobs.semconv import attributes as a
from kvobs.semconv.reasons import InvalidationReason
from kvobs.semconv.spans import SpanEvent, SpanName

MAX_LISTED = 64


class KVSpanBridge:
    def __init__(self, tracer: Tracer, activity: SessionActivity | None = None, *, medium: str = "GPU") -> None:
        self.tracer = tracer
        self.activity = activity
        self.medium = medium
        self.num_spans = 0

    def on_batch(self, instance: str, ts: float, removed: Mapping[str | None, int],
                 cleared: Mapping[str | None, int]) -> None:  # fmt: skip
        if removed:
            self._span(SpanName.KV_EVICT, instance, ts, removed, a.LINK_EVICTED_FROM,
                       {a.KV_BLOCKS_EVICTED: sum(removed.values())})  # fmt: skip
        if cleared:
            self._span(SpanName.KV_INVALIDATE, instance, ts, cleared, a.LINK_INVALIDATED,
                       {a.KV_BLOCKS_INVALIDATED: sum(cleared.values()),
                        a.KV_INVALIDATION_REASON: InvalidationReason.MANUAL_RESET.value})  # fmt: skip

    def _span(self, name: str, instance: str, ts: float, per_session: Mapping[str | None, int], relation: str,
              attrs: dict) -> None:  # fmt: skip
        sessions = sorted(s for s in per_session if s is not None)
        links = self._links(sessions, relation, per_session)
        ns = int(ts * 1e9)
        span = self.tracer.start_span(name, kind=SpanKind.INTERNAL, start_time=ns, links=links, attributes={
            **attrs, a.KV_INSTANCE: instance, a.KV_MEDIUM: self.medium,
            a.KV_SESSIONS_AFFECTED: sessions[:MAX_LISTED],
        })  # fmt: skip
        if name == SpanName.KV_EVICT:
            for session in sessions[:MAX_LISTED]:
                span.add_event(SpanEvent.EVICT, {a.SESSION_ID: session, a.KV_BLOCKS_EVICTED: per_session[session]},
                               timestamp=ns)  # fmt: skip
        span.end(end_time=ns)
        self.num_spans += 1

    def _links(self, sessions: list[str], relation: str, per_session: Mapping[str | None, int]) -> list[Link]:
        if self.activity is None:
            return []
        links = []
        for session in sessions[:MAX_LISTED]:
            latest = self.activity.latest_span.get(session)
            if latest is not None:
                ctx = SpanContext(int(latest[0], 16), int(latest[1], 16), is_remote=True,
                                  trace_flags=TraceFlags(TraceFlags.SAMPLED))  # fmt: skip
                links.append(Link(ctx, {a.KV_LINK_RELATION: relation, a.SESSION_ID: session,
                                        a.KV_BLOCKS_EVICTED: per_session[session]}))  # fmt: skip
        return links
