"""How a step's facts are said (`kvobs.analytics.steps.facts`): the words of the evidence for a recompute, a load
back from a tier and a preemption, each with what it cost and how that was known (measured, estimated, or not).
"""

from __future__ import annotations

from kvobs.analytics.cache import PrefillRates
from kvobs.analytics.steps.latency_parts import ESTIMATED, MEASURED, RequestTimes, StepParts


def prefill_rate_at(rates: PrefillRates | None, reqs, sent):
    """The prefill rate measured at the step's first request's instance and arrival, or None."""
    if rates is None or not len(sent):
        return None
    return rates.at(reqs.instance[sent[0]], reqs.arrival[sent[0]])


def load_words(rates: PrefillRates | None, reqs, sent, tokens: float) -> str:
    """What loading `tokens` back cost at the instance's measured load rate, beside recomputing them."""
    if rates is None or not len(sent):
        return ""
    instance, ts = reqs.instance[sent[0]], reqs.arrival[sent[0]]
    load = rates.loads.at(instance, ts)
    if load is None:
        return "; their load time is not measured (no load counter scraped around it)"
    words = f": about {load.seconds(tokens):.3f} s to load at {load.describe(instance)}"
    prefill = prefill_rate_at(rates, reqs, sent)
    if prefill is not None:
        words += f", against about {prefill.seconds(tokens):.3f} s to recompute them at {prefill.describe(instance)}"
    return words


class RecomputeWords:
    """How a recompute's share of the step's prefill is said: its seconds, of which prefill, at what cost."""

    def __init__(self, parts: StepParts, times: list[RequestTimes]) -> None:
        self.parts, self.times = parts, times

    def words(self, seconds: float, tokens: float) -> str:
        if not tokens:
            return ""
        parts = self.parts
        if parts.prefill_request < 0:
            if parts.never_scheduled:
                return "; not recomputed: its request was never scheduled"
            return "; not recomputed: no request of this step reached its prefill"
        computed = self.times[parts.prefill_request].computed
        return (
            f", about {seconds:.2f} s of its {parts.prefill_s:.2f} s prefill to recompute ({min(tokens, computed):.0f} "
            f"of the {computed:.0f} tokens it computed, at {parts.own_rate:,.0f} tokens/s, its own prefill's pace)"
        )


def preemption_words(count: int, parts: StepParts, times: list[RequestTimes], start: float, end: float) -> str:
    head = f"preempted {count} time{'s' if count > 1 else ''} (recomputed)"
    if parts.preemption == MEASURED:
        waits = _waits(times, end)
        waited = _union_s(waits, start, end)
        listed = "; ".join(
            f"preempted {ts - start:.2f} s into the step, "
            + (f"re-admitted at {back - start:.2f} s" if back < end else "not re-admitted before the step ended")
            for ts, back in waits[:_LISTED]
        ) + (f"; {len(waits) - _LISTED} more" if len(waits) > _LISTED else "")
        return (
            f"{head}: {parts.preempted_s:.2f} s of its latency, of which {waited:.2f} s waiting to be re-admitted "
            f"({listed}) and {max(parts.preempted_s - waited, 0.0):.2f} s of compute it threw away or redid (measured "
            "from the engine's preemption and re-admission events; the prefill after a re-admission is the prefill's)"
        )
    if parts.preemption == ESTIMATED:
        return (
            f"{head}: about {parts.preempted_s:.2f} s of its latency, its prefill beyond what its computed tokens "
            "take at the instance's measured prefill rate (the server does not say when it was preempted)"
        )
    return (
        f"{head}: what it cost is inside its {parts.prefill_s:.2f} s prefill and not separated (the server does not "
        "say when, and no prefill rate was measured to estimate it)"
    )


_LISTED = 3  # preemptions named one by one in the evidence


def _waits(times: list[RequestTimes], end: float) -> list[tuple[float, float]]:
    """Each timed preemption of the step's requests as (preempted, re-admitted), the step's end where it was not
    re-admitted before it; in time order."""
    out = []
    for t in times:
        for ts, _ in t.preempted:
            back = next((r for r in t.readmitted if r >= ts), end)
            out.append((ts, min(back, end)))
    return sorted(out)


def _union_s(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] that any of `intervals` covers (two requests waiting at once count once, as the
    latency's parts count them)."""
    total, reach = 0.0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            total += hi - lo
            reach = hi
    return total
