"""vLLM's KV events as spans, so a vLLM user sees evictions in Jaeger next to the requests they hurt.

    bridge = KVSpanBridge(telemetry.tracer("kvobs.collector"), activity)
    KVIngest(..., bridge=bridge)

Per event batch that removed blocks, one `kvcache.evict` span (at the batch's time); per `AllBlocksCleared`,
one `kvcache.invalidate` span (`manual_reset`). Both are built by `kvobs.telemetry.kv_spans`, the builder the
engine uses too, so traces from vLLM and from our engine read alike; links go to each session's latest
`llm_request` span the collector has seen (`SessionActivity.latest_span`).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.trace import SpanContext, TraceFlags, Tracer

from collectors.session_activity import SessionActivity
from kvobs.semconv.attributes import MEDIUM_GPU
from kvobs.semconv.reasons import InvalidationReason
from kvobs.telemetry.kv_spans import KVLossSpans


class KVSpanBridge:
    def __init__(self, tracer: Tracer, activity: SessionActivity | None = None, *, medium: str = MEDIUM_GPU) -> None:
        self.activity = activity
        self.spans = KVLossSpans(tracer, medium=medium, latest=self._latest)

    @property
    def num_spans(self) -> int:
        return self.spans.num_spans

    def on_batch(
        self, instance: str, ts: float, removed: Mapping[str | None, int], cleared: Mapping[str | None, int]
    ) -> None:
        if removed:
            self.spans.evict(ts, ts, removed, instance=instance)
        if cleared:
            self.spans.invalidate(
                ts, InvalidationReason.MANUAL_RESET, sum(cleared.values()), cleared, instance=instance
            )

    def _latest(self, session: str) -> SpanContext | None:
        latest = self.activity.latest_span.get(session) if self.activity is not None else None
        if latest is None:
            return None
        trace_id, span_id = latest
        return SpanContext(
            int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
