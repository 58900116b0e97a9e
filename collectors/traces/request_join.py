"""Which server request an agent framework's LLM call made: found among the requests the collector saw, never guessed.

    join = RequestJoin()
    join.add(request_records)            # each `llm_request` span stored (span ingest), from any instance
    found = join.find(call)              # a collectors.traces.agent_spans.TraceSpan (an LLM call)
    found.request_id, found.method       # "chatcmpl-..." and StepJoin.RESPONSE_ID; or None and why not

In order, the first that is sure:
1. **response id**: an id the reply holds (`TraceSpan.reply_ids`) is the id of a request seen on an instance
   whose arrival falls in the call's time window (`slack_s` either side for clocks and export times);
2. **trace**: the call's trace context reached the server: of the requests of its trace that arrived while the
   call ran and finished by its end (with the slack), the call span's child, else the only one;
3. **timing**: the only request, not claimed by another call, that arrived while the call ran, finished by its
   end and has the call's prompt token count (and its completion count, when both are known).
Otherwise none, with the reason (`StepJoin`): the step page says "no server request found" and why. A request's
span is exported after the request ends, so a call whose request is not seen yet is asked again later
(`collectors/traces/span_steps.py` waits for it, up to its `join_wait_s`). Requests are kept `keep_s` of their own time
(the newest seen is the clock) and `max_requests` at most.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from collectors.traces.agent_spans import TraceSpan
from kvobs.semconv.spans import StepJoin
from kvobs.store.rows import RequestRecord

SLACK_S = 2.0
KEEP_S = 900.0
MAX_REQUESTS = 200_000
# A call with one of these outcomes may still be joined once more request spans arrive.
WAITS_FOR_REQUESTS = frozenset({StepJoin.NO_REQUEST, StepJoin.ID_NOT_SEEN, StepJoin.NO_COUNTS, StepJoin.UNANSWERED})


@dataclass(slots=True)
class Seen:
    request_id: str
    instance: str
    trace_id: str | None
    parent_span_id: str | None
    arrival: float
    finished: float
    prompt_tokens: int | None
    completion_tokens: int | None
    unfilled: RequestRecord | None  # its row, when it says no cached tokens (vLLM's spans): the reply's may fill it
    claimed: bool = False  # a call took it (by any method): no other call takes it by timing


@dataclass(slots=True)
class Found:
    request_id: str | None
    method: StepJoin
    instance: str | None = None
    unfilled: RequestRecord | None = None  # the request's row, when it says no cached tokens

    @property
    def joined(self) -> bool:
        return self.request_id is not None


class RequestJoin:
    def __init__(self, *, slack_s: float = SLACK_S, keep_s: float = KEEP_S, max_requests: int = MAX_REQUESTS) -> None:
        self.slack_s = slack_s
        self.keep_s = keep_s
        self.max_requests = max_requests
        self._by_id: dict[str, Seen] = {}
        self._arrivals: list[tuple[float, str]] = []  # (arrival, request id), sorted
        self._named: OrderedDict[str, None] = OrderedDict()  # ids calls' replies hold: never another's by timing

    def add(self, records: Iterable[RequestRecord]) -> None:
        for r in records:
            if r.request_id in self._by_id:
                continue
            finished = r.finished_ts if r.finished_ts is not None else r.arrival_ts
            self._by_id[r.request_id] = Seen(
                r.request_id,
                r.instance,
                r.trace_id,
                r.parent_span_id,
                r.arrival_ts,
                finished,
                r.prompt_tokens,
                r.completion_tokens,
                r if r.cached_tokens is None else None,
            )
            bisect.insort(self._arrivals, (r.arrival_ts, r.request_id))
        self._trim()

    def name(self, call: TraceSpan) -> None:
        """A call's reply ids, as soon as it arrives: a request one of them names is that call's, not another's by
        timing."""
        for reply_id in call.reply_ids:
            self._named[reply_id] = None
        while len(self._named) > self.max_requests:
            self._named.popitem(last=False)

    def find(self, call: TraceSpan) -> Found:
        for reply_id in call.reply_ids:
            seen = self._by_id.get(reply_id)
            if seen is not None and call.start - self.slack_s <= seen.arrival <= call.end + self.slack_s:
                return self._take(seen, StepJoin.RESPONSE_ID)
        window = self._within(call.start - self.slack_s, call.end + self.slack_s)  # (only where no id decided)
        inside = [s for s in window if s.arrival <= call.end and s.finished <= call.end + self.slack_s]
        traced = [s for s in inside if s.trace_id == call.trace_id and not s.claimed]
        child = [s for s in traced if s.parent_span_id == call.span_id]
        if len(child) == 1 or len(traced) == 1:
            return self._take((child or traced)[0], StepJoin.TRACE)
        if call.error_type is not None and call.prompt_tokens is None and not call.reply_ids:
            return Found(None, StepJoin.UNANSWERED)  # (a refusal: no request span to look for, whatever arrived)
        if not window:
            return Found(None, StepJoin.NO_REQUEST)
        if call.prompt_tokens is None:
            return Found(None, StepJoin.ID_NOT_SEEN if call.reply_ids else StepJoin.NO_COUNTS)
        fits = [
            s
            for s in inside
            if not s.claimed
            and s.request_id not in self._named
            and s.prompt_tokens == call.prompt_tokens
            and (call.completion_tokens is None or s.completion_tokens in (None, call.completion_tokens))
        ]
        if len(fits) == 1:
            return self._take(fits[0], StepJoin.TIMING)
        if len(fits) > 1:
            return Found(None, StepJoin.AMBIGUOUS)
        return Found(None, StepJoin.ID_NOT_SEEN if call.reply_ids else StepJoin.NO_REQUEST)

    @staticmethod
    def _take(seen: Seen, method: StepJoin) -> Found:
        seen.claimed = True
        return Found(seen.request_id, method, seen.instance, seen.unfilled)

    def _within(self, start: float, end: float) -> list[Seen]:
        lo = bisect.bisect_left(self._arrivals, (start, ""))
        hi = bisect.bisect_right(self._arrivals, (end, "\uffff"))
        return [self._by_id[rid] for _, rid in self._arrivals[lo:hi]]

    def _trim(self) -> None:
        if not self._arrivals:
            return
        horizon = self._arrivals[-1][0] - self.keep_s
        cut = bisect.bisect_left(self._arrivals, (horizon, ""))
        cut = max(cut, len(self._arrivals) - self.max_requests)
        if cut > 0:
            for _, rid in self._arrivals[:cut]:
                self._by_id.pop(rid, None)
            del self._arrivals[:cut]
