"""When was a session busy? Request intervals from `llm_request` spans, to tell an eviction during a tool pause.

    activity = SessionActivity(resolve=store_trace_sessions)
    activity.add_request(trace_id, start, end, session_id=None)     # from each llm_request span
    activity.idle_verdict("s1", ts, now=latest_event_ts)   # PAUSE, AFTER_END, PENDING, BUSY, BEFORE or UNKNOWN

vLLM's `llm_request` span has no session; its trace id is the agent step's, so the session comes from the
span's `session.id` (our engine sets it), from a step made of the agent's spans that claimed the request by its
trace or its response id (`claim`, before or after the request arrives), or, lazily, from `resolve(trace_ids)`
(the store's `steps` rows the agent SDK wrote; a span whose trace is still unknown after `unresolved_ttl_s` is
given up, so each resolution pass asks about recent traces only). A session is idle at `ts` when `ts` falls
after its first request started and inside none of its requests: between steps (a tool pause) or after its last
one. Which of the two it was needs hindsight (`idle_verdict`): a tool pause once a later request of the session is
known; after its end once the session ended (`ended=True`: the agent SDK's `sessions.ended_at`) or stayed without
a request for `end_after_s` of stream time; pending until then. Times are the events' own, never arrival times.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from kvobs.semconv.sessions import SESSION_END_AFTER_S

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

    def __init__(
        self,
        resolve: Resolver | None = None,
        *,
        max_sessions: int = 100_000,
        max_unresolved: int = 100_000,
        unresolved_ttl_s: float = 300.0,
        end_after_s: float = SESSION_END_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resolve = resolve
        self.max_sessions = max_sessions
        self.max_unresolved = max_unresolved
        self.unresolved_ttl_s = unresolved_ttl_s
        self.end_after_s = end_after_s
        self.clock = clock
        self._intervals: OrderedDict[str, list[tuple[float, float]]] = OrderedDict()
        # trace id -> (when first seen, [(start, end, span id, request id)]), oldest first
        self._unresolved: OrderedDict[str, tuple[float, list[tuple[float, float, str, str | None]]]] = OrderedDict()
        self._unresolved_requests: dict[str, str] = {}  # request id -> its trace id, while unresolved
        self._claims: OrderedDict[str, str] = OrderedDict()  # "t:<trace id>" / "r:<request id>" -> session
        self._cached: OrderedDict[str, int] = OrderedDict()  # request id -> the cached tokens its step's reply gave
        self.latest_span: dict[str, tuple[str, str]] = {}  # session -> (trace id, span id) of its latest request

    def add_request(
        self,
        trace_id: str,
        span_id: str,
        start: float,
        end: float,
        session_id: str | None = None,
        request_id: str | None = None,
    ) -> None:
        session_id = session_id or self.claimed(trace_id, request_id)
        if session_id is None:
            self._unresolved.setdefault(trace_id, (self.clock(), []))[1].append((start, end, span_id, request_id))
            if request_id is not None:
                self._unresolved_requests[request_id] = trace_id
            while len(self._unresolved) > self.max_unresolved:
                self._forget(*self._unresolved.popitem(last=False))
            return
        self._add(session_id, start, end, trace_id, span_id)

    def claimed(self, trace_id: str | None, request_id: str | None) -> str | None:
        """The session a step claimed this request for (by response id first, then by trace), if any."""
        return self._claims.get(f"r:{request_id}") or self._claims.get(f"t:{trace_id}")

    def note_cached(self, request_id: str, cached_tokens: int) -> None:
        """The cached tokens a joined step's reply gave for a request whose own span said none (vLLM's): what tells
        the blocks it found from those it stored, when its blocks name no session (`collectors.block_owners`)."""
        self._cached[request_id] = cached_tokens
        self._cached.move_to_end(request_id)
        while len(self._cached) > self.max_unresolved:
            self._cached.popitem(last=False)

    def cached(self, request_id: str) -> int | None:
        """The cached tokens a step's reply gave for `request_id` (`note_cached`), if any."""
        return self._cached.get(request_id)

    def claim(self, session_id: str, *, trace_id: str | None = None, request_id: str | None = None) -> None:
        """A step of `session_id` sent the request `request_id` (its response id), or a request in `trace_id`
        (trace context reached the server): its requests, seen or still to come, are the session's."""
        for key in ((f"t:{trace_id}",) if trace_id else ()) + ((f"r:{request_id}",) if request_id else ()):
            self._claims[key] = session_id
            self._claims.move_to_end(key)
        while len(self._claims) > self.max_unresolved:
            self._claims.popitem(last=False)
        if request_id is not None and request_id in self._unresolved_requests:
            trace = self._unresolved_requests.pop(request_id)
            spans = self._unresolved[trace][1]
            self._settle(session_id, trace, [s for s in spans if s[3] == request_id])
            spans[:] = [s for s in spans if s[3] != request_id]
        if trace_id is not None and trace_id in self._unresolved:
            self._settle(session_id, trace_id, self._forget(trace_id, self._unresolved.pop(trace_id))[1])

    def _settle(self, session_id: str, trace_id: str, spans) -> None:
        for start, end, span_id, _ in spans:
            self._add(session_id, start, end, trace_id, span_id)

    def _forget(self, trace_id: str, entry):
        for *_, request_id in entry[1]:
            self._unresolved_requests.pop(request_id, None)
        return entry

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

    def idle_verdicts(
        self, losses: dict[str, list[float]], *, now: float, ended: set[str] | frozenset = frozenset()
    ) -> dict[str, list[str]]:
        """`idle_verdict` of each session's losses at once (one call per tick, where the caller is another process)."""
        return {s: [self.idle_verdict(s, ts, now=now, ended=s in ended) for ts in times] for s, times in losses.items()}

    def resolve_pending(self) -> None:
        """Attribute waiting spans to sessions through `resolve`; spans still unknown keep waiting until their TTL."""
        if self.resolve is None or not self._unresolved:
            return
        found = self.resolve(list(self._unresolved))
        for trace_id, session_id in found.items():
            if trace_id in self._unresolved:
                self._settle(session_id, trace_id, self._forget(trace_id, self._unresolved.pop(trace_id))[1])
        expired = self.clock() - self.unresolved_ttl_s
        while self._unresolved and next(iter(self._unresolved.values()))[0] < expired:
            self._forget(*self._unresolved.popitem(last=False))

    def _add(self, session_id: str, start: float, end: float, trace_id: str, span_id: str) -> None:
        intervals = self._intervals.setdefault(session_id, [])
        bisect.insort(intervals, (start, end))
        if start >= intervals[-1][0]:
            self.latest_span[session_id] = (trace_id, span_id)
        self._intervals.move_to_end(session_id)
        while len(self._intervals) > self.max_sessions:
            dropped, _ = self._intervals.popitem(last=False)
            self.latest_span.pop(dropped, None)
