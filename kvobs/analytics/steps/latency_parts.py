"""Where a step's time went: its whole latency, from its start to its end, in parts that add up to it.

Every instant of the step is counted once, in the first of these that covers it (`step_parts`):
- `preempted_s`: what preemption cost. Before the first token, from the request's first scheduling to its last
  re-admission (the compute thrown away and the waits); after it, each wait from preemption to re-admission and the
  recompute after it. Measured from the engine's `preempted` rows and its re-admission `hit` rows; where a server only
  counts preemptions (vLLM), estimated as the prefill beyond what its computed tokens take at the instance's rate
  (`preemption` says which: measured, estimated, unknown);
- `queue_s`: arrival to first scheduling; a request never scheduled (aborted at its client's deadline, say) queued
  from arrival to its end;
- `prefill_s`: scheduling (or the last re-admission) to the first token. Inside it, `lost_recompute_s`,
  `invalidated_recompute_s` and `routed_recompute_s`: recomputing the prefix the session lost in its tool pause, its
  invalidated blocks, the prefix another replica held, each the share of the prefill its tokens are of the tokens the
  prefill computed (the request's own cost per token: together never more than the prefill);
- `decode_s`: first token to the end;
- `tool_s`: the step's own tool calls (the SDK runs a step's tools inside the step);
- `before_s`: from the step's start to its first request's arrival at the server (the agent's own queue, the network,
  the server's accept queue); the whole step, less its tools, where its request reached the server only after the
  step ended;
- `other_s`: the rest, outside the engine: the client after the reply, gaps between a step's requests, the agent's
  own work.

Which part explains a step's excess over its session's typical step: `kvobs.analytics.steps.excess`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np

PARTS = ("queue_s", "preempted_s", "prefill_s", "decode_s", "tool_s", "before_s", "other_s")  # add up to the latency
ESTIMATES = ("lost_recompute_s", "invalidated_recompute_s", "routed_recompute_s")  # inside prefill_s
# the order parts take an instant covered by several (a request waiting while another decodes: the step waits)
_PRIORITY = ("preempted", "queue", "prefill", "decode", "tool", "before")
MEASURED, ESTIMATED, UNKNOWN = "measured", "estimated", "unknown"


@dataclass
class RequestTimes:
    """One request of a step: its times (epoch s; NaN unknown), tokens, and the engine's preemption record."""

    request_id: object
    arrival: float
    queue: float  # arrival to first scheduling
    first_token: float
    finished: float
    prompt: float
    cached: float
    completion: float
    num_preemptions: int = 0
    preempted: list[tuple[float, float]] = field(default_factory=list)  # (ts, computed tokens lost), the engine's
    readmitted: list[float] = field(default_factory=list)  # re-admission times, the engine's

    @property
    def scheduled(self) -> float:
        """When it was first scheduled; NaN when never (a first token without a queue time: at arrival)."""
        if self.queue == self.queue:
            return self.arrival + self.queue
        return self.arrival if self.first_token == self.first_token else np.nan

    @property
    def computed(self) -> float:
        """The prompt tokens its prefill computed (the prompt when its cached tokens are unknown)."""
        if self.prompt != self.prompt:
            return np.nan
        return self.prompt - self.cached if self.cached == self.cached else self.prompt


@dataclass(frozen=True)
class StepParts:
    latency_s: float
    queue_s: float = 0.0
    preempted_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    tool_s: float = 0.0
    before_s: float = 0.0
    other_s: float = 0.0
    lost_recompute_s: float = 0.0
    invalidated_recompute_s: float = 0.0
    routed_recompute_s: float = 0.0
    decoded_tokens: float = 0.0  # tokens after each request's first
    prefill_request: int = -1  # the request whose prefill holds the pause's recompute (-1: none got one)
    own_rate: float = np.nan  # that prefill's computed tokens per second
    never_scheduled: bool = False  # a request of the step ended without ever being scheduled
    preemption: str | None = None  # MEASURED, ESTIMATED or UNKNOWN where a request was preempted
    reached_after_s: float = np.nan  # its first request's arrival at the server, from the step's start

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def new_prefill_s(self) -> float:
        return self.prefill_s - self.lost_recompute_s - self.invalidated_recompute_s - self.routed_recompute_s


def step_parts(
    start: float,
    end: float,
    requests: list[RequestTimes],
    *,
    tools: Sequence[tuple[float, float]] = (),
    lost_tokens: float = 0.0,
    invalidated_tokens: float = 0.0,
    routed_tokens: dict | None = None,
    rate=None,
) -> StepParts:
    """The parts of a step that ran from `start` to `end` (see the module's doc). `requests` in arrival order;
    `tools`: its own tool calls; `lost_tokens`, `invalidated_tokens`: what its session lost before it (recomputed by
    its first scheduled request); `routed_tokens`: request id -> tokens another replica held; `rate`: the instance's
    `prefill_rates.Rate`, only to estimate a preemption a server does not time."""
    latency = end - start
    if latency != latency or latency < 0:
        return StepParts(latency_s=latency, other_s=np.nan)
    intervals, preemption, never = [], None, False
    for i, req in enumerate(requests):
        own, kind, unscheduled = request_intervals(req, end)
        intervals += [(label, i, lo, hi) for label, lo, hi in own]
        never |= unscheduled
        preemption = _stronger(preemption, kind)
    intervals += [("tool", -1, lo, hi) for lo, hi in tools]
    arrivals = [r.arrival for r in requests if r.arrival == r.arrival]
    reached = min(arrivals) if arrivals else np.nan
    if reached == reached:
        intervals.append(("before", -1, start, reached))
    spent = _sweep(intervals, start, end)  # (label, request) -> seconds
    totals = {label: float(sum(s for (lab, _), s in spent.items() if lab == label)) for label in _PRIORITY}
    prefill_of = {i: spent.get(("prefill", i), 0.0) for i in range(len(requests))}
    estimated = 0.0
    for i, req in enumerate(requests):  # a preemption the server counted but did not time: the prefill's excess
        if req.num_preemptions and not req.preempted and prefill_of[i] > 0:
            expected = _expected_prefill(req, rate)
            if expected is None:
                preemption = _stronger(preemption, UNKNOWN)
                continue
            moved = min(max(prefill_of[i] - expected, 0.0), prefill_of[i])
            prefill_of[i] -= moved
            estimated += moved
            preemption = _stronger(preemption, ESTIMATED)
    first = next((i for i in range(len(requests)) if prefill_of[i] > 0), -1)
    shares = {"lost": 0.0, "invalidated": 0.0, "routed": 0.0}
    room = [r.computed if r.computed == r.computed and prefill_of[i] > 0 else 0.0 for i, r in enumerate(requests)]

    def recompute(i: int, name: str, tokens: float) -> None:
        """`tokens` of request i's prefill (at most what it computed and no other share took) as its seconds."""
        taken = min(tokens, room[i])
        if taken > 0:
            shares[name] += prefill_of[i] * taken / requests[i].computed
            room[i] -= taken

    if first >= 0:
        recompute(first, "lost", lost_tokens)
        recompute(first, "invalidated", invalidated_tokens)
    for i, req in enumerate(requests):
        recompute(i, "routed", (routed_tokens or {}).get(req.request_id, 0.0))
    computed = requests[first].computed if first >= 0 else np.nan
    own_rate = computed / prefill_of[first] if computed == computed and computed > 0 else np.nan
    covered = sum(totals.values())
    decoded = sum(max(r.completion - 1, 0.0) for r in requests if r.first_token == r.first_token and r.completion > 0)
    return StepParts(
        latency_s=latency,
        queue_s=totals["queue"],
        preempted_s=totals["preempted"] + estimated,
        prefill_s=totals["prefill"] - estimated,
        decode_s=totals["decode"],
        tool_s=totals["tool"],
        before_s=totals["before"],
        other_s=max(latency - covered, 0.0),
        lost_recompute_s=shares["lost"],
        invalidated_recompute_s=shares["invalidated"],
        routed_recompute_s=shares["routed"],
        decoded_tokens=float(decoded),
        prefill_request=first,
        own_rate=own_rate,
        never_scheduled=never,
        preemption=preemption,
        reached_after_s=reached - start,
    )


def request_intervals(req: RequestTimes, step_end: float) -> tuple[list, str | None, bool]:
    """A request's labelled intervals, whether its preemptions were timed, and whether it was never scheduled."""
    end = req.finished if req.finished == req.finished else step_end  # still running when the step ended
    scheduled, first = req.scheduled, req.first_token
    if scheduled != scheduled:
        return [("queue", req.arrival, end)], None, True
    out = [("queue", req.arrival, scheduled)]
    kind = MEASURED if req.preempted else None  # counted but untimed preemptions: estimated by `step_parts`
    has_first = first == first
    before = [p for p in req.preempted if not has_first or p[0] <= first]
    after = [p for p in req.preempted if has_first and p[0] > first]
    prefill_from = scheduled
    if before:
        last = before[-1][0]
        readmitted = [r for r in req.readmitted if last <= r <= (first if has_first else end)]
        if readmitted:
            out.append(("preempted", scheduled, readmitted[-1]))
            prefill_from = readmitted[-1]
        elif not has_first:  # preempted and never re-admitted before it ended
            out.append(("preempted", scheduled, end))
            prefill_from = end
        else:  # re-admission not recorded: the prefill holds it
            kind = UNKNOWN
    prefill_to = first if has_first else end
    if prefill_to > prefill_from:
        out.append(("prefill", prefill_from, prefill_to))
    if has_first:
        out.append(("decode", first, end))
        per_token = (prefill_to - prefill_from) / req.computed if req.computed and req.computed > 0 else np.nan
        for ts, tokens in after:
            back = next((r for r in req.readmitted if r >= ts), end)
            recompute = tokens * per_token if per_token == per_token else 0.0
            out.append(("preempted", ts, min(back + recompute, end)))
    return out, kind, False


def _sweep(intervals: list[tuple[str, int, float, float]], start: float, end: float) -> dict:
    """Seconds per (label, request), each instant of [start, end] given to the covering interval of the highest
    priority (`_PRIORITY`), the earliest request first."""
    clipped = [(lab, i, max(lo, start), min(hi, end)) for lab, i, lo, hi in intervals if lo == lo and hi == hi]
    clipped = [c for c in clipped if c[3] > c[2]]
    if not clipped:
        return {}
    bounds = sorted({b for _, _, lo, hi in clipped for b in (lo, hi)})
    rank = {label: n for n, label in enumerate(_PRIORITY)}
    spent: dict = {}
    for lo, hi in zip(bounds, bounds[1:]):
        mid = (lo + hi) / 2
        covering = [(rank[lab], i, lab) for lab, i, a, b in clipped if a <= mid < b]
        if covering:
            _, i, label = min(covering)
            spent[(label, i)] = spent.get((label, i), 0.0) + (hi - lo)
    return spent


def _expected_prefill(req: RequestTimes, rate) -> float | None:
    """What the request's computed tokens take to prefill at the instance's measured rate (None: no rate)."""
    computed = req.computed
    if rate is None or computed != computed:
        return None
    return rate.overhead_s + rate.seconds(computed)


def _stronger(a: str | None, b: str | None) -> str | None:
    """Of two provenances of a step's preemption cost, the weaker claim (unknown > estimated > measured)."""
    order = [None, MEASURED, ESTIMATED, UNKNOWN]
    return a if order.index(a) >= order.index(b) else b
