"""A KV connector's own per-request spans -> `connector_lookups` rows: LMCache's multiprocess server's (`request`,
with `mp.lookup_prefetch`, `mp.retrieve` and `mp.store` below it; `kvobs.semconv.lmcache_spans`).

    connector = ConnectorSpans()
    records = connector.take(spans)     # [(instance, span)] of an export's `lmcache_mp.server` scope, in any order

A root span is a row: its request id (the id vLLM's connector gave LMCache), its tokens asked for and found by level
as the root says them once the lookup ended (none where it never did), and its children's time summed by kind. A
child ends before its root, so it arrives in the same export or an earlier one: it waits, bounded, for its root
(`MAX_WAITING` roots' children kept, the oldest dropped first, counted and said once). A child is kept by its span id,
so an export the exporter sends again (the store's queue was full) counts it once. A value of the wrong type is left
out (None), never guessed.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from collectors.values import count
from kvobs.identifiers import clip_id
from kvobs.semconv import lmcache_spans as lm
from kvobs.store.rows import ConnectorLookupRecord

log = logging.getLogger(__name__)

MAX_WAITING = 10_000  # roots whose children arrived before them, kept until they do
_NS = 1e-9


class ConnectorSpans:
    def __init__(self) -> None:
        # (trace id, parent span id) -> {child span id: (child name, seconds)}
        self.waiting: OrderedDict[tuple[bytes, bytes], dict[bytes, tuple[str, float]]] = OrderedDict()
        self.num_dropped = 0  # roots whose children were dropped, waited for too long

    def take(self, spans: list[tuple[str, object, dict]]) -> list[ConnectorLookupRecord]:
        """The rows of the roots among `spans` ((instance, span, attributes) of the connector's scope)."""
        roots = []
        for instance, span, attrs in spans:
            name = span.name  # type: ignore[attr-defined]
            if name in lm.CHILDREN:
                self._child(span, name)
            elif name == lm.ROOT:
                roots.append((instance, span, attrs))
        return [r for r in (self._row(*root) for root in roots) if r is not None]

    def _child(self, span, name: str) -> None:
        seconds = max(0.0, (span.end_time_unix_nano - span.start_time_unix_nano) * _NS)
        self.waiting.setdefault((span.trace_id, span.parent_span_id), {})[span.span_id] = (name, seconds)
        while len(self.waiting) > MAX_WAITING:
            self.waiting.popitem(last=False)
            self.num_dropped += 1
            if self.num_dropped == 1:
                log.warning(
                    "a KV connector's child spans waited for their request span past %d requests: dropped (the "
                    "connector's exporter sends roots apart from their children, or loses them)",
                    MAX_WAITING,
                )

    def _row(self, instance: str, span, attrs: dict) -> ConnectorLookupRecord | None:
        request_id = attrs.get(lm.REQUEST_ID)
        if not isinstance(request_id, str) or not request_id:
            return None
        children = self.waiting.pop((span.trace_id, span.span_id), {}).values()
        lookup, retrieve, store = ([s for n, s in children if n == name] for name in lm.CHILDREN)
        reason = attrs.get(lm.EARLY_EXIT_REASON)
        return ConnectorLookupRecord(
            request_id=clip_id(request_id),
            instance=instance,
            connector=lm.CONNECTOR,
            started_at=span.start_time_unix_nano * _NS,
            ended_at=span.end_time_unix_nano * _NS if span.end_time_unix_nano else None,
            requested_tokens=count(attrs.get(lm.REQUESTED_TOKENS)),
            hit_tokens=count(attrs.get(lm.HIT_TOKENS)),
            l1_hit_tokens=count(attrs.get(lm.L1_HIT_TOKENS)),
            l2_hit_tokens=count(attrs.get(lm.L2_HIT_TOKENS)),
            early_exit_reason=clip_id(reason) if isinstance(reason, str) and reason else None,
            lookup_s=sum(lookup) if lookup else None,
            retrieve_s=sum(retrieve) if retrieve else None,
            store_s=sum(store) if store else None,
            num_retrieves=len(retrieve),
            num_stores=len(store),
            trace_id=span.trace_id.hex() or None,
            span_id=span.span_id.hex() or None,
        )
