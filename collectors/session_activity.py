"""When was a session busy? Request intervals from `llm_request` spans, to tell an eviction during a tool pause.

    activity = SessionActivity(resolve=store_trace_sessions)
    activity.add_request(trace_id, start, end, session_id=None)     # from each llm_request span
    activity.idle_verdict("s1", ts, now=latest_event_ts)   # PAUSE, AFTER_END, PENDING, BUSY, BEFORE or UNKNOWN

vLLM's `llm_request` span has no session; its trace id is the agent step's, so the session comes from the
span's `session.id` (our engine sets it) or, lazily, from `resolve(trace_ids)` (the store's `steps` rows
the agent SDK wrote; a span whose trace is still unknown after `unresolved_ttl_s` is given up, so each
resolution pass asks about recent traces only). A session is idle at `ts` when `ts` falls after its first
request started and inside none of its requests: between steps (a tool pause) or after its last one. Which of
the two it was needs hindsight (`idle_verdict`): a tool pause once a later request of the session is
known; after its end once the session ended (`ended=True`: the agent SDK's `sessions.ended_at`) or stayed without a
request for `end_after_s` of stream time; pending until then. Times are the events' own, never arrival times.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from kvobs.semconv.protocol import SESSION_END_AFTER_S

BUSY, BEFORE, UNKNOWN = "busy", "before", "unknown"  # no idle loss at all
PAUSE, AFTER_END, PENDING = "pause", "after_end", "pending"  # idle losses, by hindsight

Resolver = Callable[[Iterable[str]], dict[str, str]]


class SessionActivity:
    """Args:
    resolve: trace ids -> session ids for spans without a session (None: such spans stay unattributed).
    max_sessions: sessions remembered (least recently active dropped first).
    max_unresolved: spans waiting for their session at most.
    unresolved_ttl_s: how long a span waits for its trace's session (the agent SDK writes the step when the
        step ends, after its tool call) before it is given up.
    end_after_s: a session with no request for this long (stream time) has ended.
    """

    def __init__(self, resolve: Resolver | None = None, *, max_sessions: int = 100_000,
                 max_unresolved: int = 100_000, unresolved_ttl_s: float = 300.0,
                 end_after_s: float = SESSION_END_AFTER_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.resolve = resolve
        self.max_sessions = max_sessions
        self.max_unresolved = max_unresolved
        self.unresolved_ttl_s = unresolved_ttl_s
        self.end_after_s = end_after_s
        self.clock = clock
        self._intervals: OrderedDict[str, list[tuple[float, float]]] = OrderedDict()
        # trace id -> (when first seen, [(start, end, span id)]), oldest first
        self._unresolved: OrderedDict[str, tuple[float, list[tuple[float, float, str]]]] = OrderedDict()
        self.latest_span: dict[str, tuple[str, str]] = {}  # session -> (trace id, span id) of its latest request

    def add_request(self, trace_id: str, span_id: str, start: float, end: float,
                    session_id: str | None = None) -> None:  # fmt: skip
        if session_id is None:
            self._unresolved.setdefault(trace_id, (self.clock(), []))[1].append((start, end, span_id))
            while len(self._unresolved) > self.max_unresolved:
                self._unresolved.popitem(last=False)
            return
        self._add(session_id, start, end, trace_id, span_id)

    def idle_verdict(self, session_id: str, ts: float, *, now: float, ended: bool = False) -> str:
        """What a loss of `session_id`'s block at `ts` was, as far as is known at stream time `now` (`ended`: the
        session is known to have ended)."""
        intervals = self._intervals.get(session_id)
        if not intervals:
            return UNKNOWN
        if ts < intervals[0][0]:
            return BEFORE
        if any(start <= ts <= end for start, end in intervals):
            return BUSY
        if intervals[-1][0] > ts:
            return PAUSE  # a request of the session began after the loss: it came back
        if ended or now - max(end for _, end in intervals) >= self.end_after_s:
            return AFTER_END
        return PENDING

    def resolve_pending(self) -> None:
        """Attribute waiting spans to sessions through `resolve`; spans still unknown keep waiting until their TTL."""
        if self.resolve is None or not self._unresolved:
            return
        found = self.resolve(list(self._unresolved))
        for trace_id, session_id in found.items():
            _, spans = self._unresolved.pop(trace_id, (0.0, ()))
            for start, end, span_id in spans:
                self._add(session_id, start, end, trace_id, span_id)
        expired = self.clock() - self.unresolved_ttl_s
        while self._unresolved and next(iter(self._unresolved.values()))[0] < expired:
            self._unresolved.popitem(last=False)

    def _add(self, session_id: str, start: float, end: float, trace_id: str, span_id: str) -> None:
        intervals = self._intervals.setdefault(session_id, [])
        bisect.insort(intervals, (start, end))
        if start >= intervals[-1][0]:
            self.latest_span[session_id] = (trace_id, span_id)
        self._intervals.move_to_end(session_id)
        while len(self._intervals) > self.max_sessions:
            dropped, _ = self._intervals.popitem(last=False)
            self.latest_span.pop(dropped, None)
