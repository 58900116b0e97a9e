"""What a configuration's hits are worth in prefill time: each replayed request's hits against the replay at the run's
observed configuration, priced at its instance's measured prefill rate.

    _, checks = fidelity(plans, observed["hit"])                          # the replay at each run's observed point
    saved, prices = sizes_saved(store, plans, checks, [total for total, _ in runs], since, until)
    rows = [entry.row() for entry in saved]                               # `SAVED_COLUMNS`

A request's prefill costs `(prompt - hits) / prefill rate + loaded / load rate` (`kvobs.analytics.cache`'s
`PrefillRates` and `LoadRates`, the instance's own, fitted over its requests within `RATE_WINDOW_S / 2` either side
of the request). What a configuration saves on a request is that cost in the baseline replay less its cost in the
configuration's; the baseline is the replay, not the run, so the replay's error at the observed point (the check
the table prints) does not count as a saving. A request whose instance has no rate there, or whose loads changed
where no load rate is known, is not priced: counted apart, never as zero. Only the prefill's own time is priced:
what queueing behind others' prefill would also change is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from instrumented_engine.whatif.units import WhatIfResult
from kvobs.analytics.cache import RATE_WINDOW_S, PrefillRates, prefill_overlap

SAVED_COLUMNS = (
    "configuration",
    "blocks",
    "steps priced",
    "TTFT saved p50 (s)",
    "TTFT saved p90 (s)",
    "steps faster",
    "steps slower",
    "engine prefill s saved",
    "GPU-hours saved",
    "cost saved",
)
HALF_WINDOW_S = RATE_WINDOW_S / 2  # a rate around the request: the replay is offline, the requests after it count
SAVED_WORDS = (
    "TTFT saved: per replayed step, the prefill time its hits save against the replay at the observed configuration "
    "(prompt tokens no longer computed, at the instance's prefill rate; tokens loaded from a tier at its load rate); "
    "negative: slower. Only the prefill's own time: less queueing behind others' prefill is not modelled. "
    "engine prefill s saved: the steps' savings summed, each x its instance's prefill overlap (the time any of its "
    "requests was prefilling over the sum of their prefill times: prefills batched together share the engine's "
    "time). GPU-hours: those seconds x {gpus} GPU(s) an instance, / 3600."
)


@dataclass(frozen=True)
class Prices:
    """Each replayed request's instance and the measured rates to price its prefill with."""

    instances: dict[str, str]  # request id -> the instance that served it
    rates: PrefillRates
    arrivals: dict[str, float]  # request id -> when it looked its prefix up
    overlap: dict[str, float]  # instance -> its prefills' union over their sum (`prefill_overlap`)

    @classmethod
    def from_store(cls, store, plans: list, since=None, until=None) -> Prices:
        """The replayed requests' instances, and every instance's prefill and load rates over the range (and half a
        rate window either side of it)."""
        start = None if since is None else since - HALF_WINDOW_S
        end = None if until is None else until + HALF_WINDOW_S
        frame = store.reads.requests(start, end)
        instances = dict(zip(frame["request_id"], frame["instance"])) if not frame.empty else {}
        arrivals = {r.request_id: r.arrival_ts for plan in plans for r in plan.requests}
        rates = PrefillRates.from_store(store, start, end, requests=frame)
        return cls(instances, rates, arrivals, prefill_overlap(frame) if not frame.empty else {})

    def engine_share(self, request_id: str) -> float | None:
        """The share of that request's prefill time that was its engine's own (None: not measured)."""
        instance = self.instances.get(request_id)
        return None if instance is None else self.overlap.get(instance)

    def saved(self, request_id: str, computed_saved: int, loads_saved: int) -> float | None:
        """Seconds saved on that request by computing `computed_saved` fewer prompt tokens and loading `loads_saved`
        fewer from a tier (either negative: more); None where no rate prices it."""
        instance, ts = self.instances.get(request_id), self.arrivals.get(request_id)
        if instance is None or ts is None:
            return None
        rate = self.rates.at(instance, ts + HALF_WINDOW_S)  # (`at` fits the window before its moment)
        if rate is None:
            return None
        seconds = computed_saved / rate.tokens_per_s
        if loads_saved:
            load = self.rates.loads.at(instance, ts)
            if load is None:
                return None
            seconds += loads_saved / load.tokens_per_s
        return seconds

    def rate_words(self) -> str:
        """Which rates priced the steps, in words: per instance, its rate at the middle of its requests."""
        said = []
        by_instance: dict[str, list[float]] = {}
        for request_id, ts in self.arrivals.items():
            instance = self.instances.get(request_id)
            if instance is not None:
                by_instance.setdefault(instance, []).append(ts)
        for instance, times in sorted(by_instance.items()):
            rate = self.rates.at(instance, float(np.median(times)) + HALF_WINDOW_S)
            if rate is None:
                said.append(f"{instance}: no prefill rate measured (fewer than 3 clean prefills), not priced")
                continue
            source = "its request rows" if rate.source == "requests" else "its scraped prefill counters"
            overlap = self.overlap.get(instance)
            shared = "overlap not measured" if overlap is None else f"prefill overlap {overlap:.2f}"
            measured = f"{rate.tokens_per_s:,.0f} tokens/s over {rate.num_requests:,} requests ({source})"
            said.append(f"{instance}: {measured}, {shared}")
        return "Prefill rates (each instance's own, measured): " + "; ".join(said or ["none"])


@dataclass(frozen=True)
class TimeSaved:
    configuration: str
    num_blocks: int
    by_request: dict[str, float]  # per priced step (request id), the prefill seconds it saves (negative: added)
    unpriced: int  # steps with no rate to price them
    engine_s: float | None  # the engine's prefill seconds saved (None: an instance's prefill overlap not measured)
    gpus: int = 1
    gpu_hour_cost: float | None = None

    @property
    def saved_s(self) -> tuple[float, ...]:
        return tuple(self.by_request.values())

    def row(self) -> dict:
        """The row of `SAVED_COLUMNS`; None where unknown."""
        saved = np.asarray(self.saved_s, float)
        hours = None if self.engine_s is None or not len(saved) else self.engine_s * self.gpus / 3600.0
        return dict(
            zip(
                SAVED_COLUMNS,
                (
                    self.configuration,
                    self.num_blocks,
                    f"{len(saved):,} of {len(saved) + self.unpriced:,}",
                    float(np.median(saved)) if len(saved) else None,
                    float(np.percentile(saved, 90)) if len(saved) else None,
                    int((saved > 0).sum()),
                    int((saved < 0).sum()),
                    self.engine_s if len(saved) else None,
                    hours,
                    None if hours is None or self.gpu_hour_cost is None else hours * self.gpu_hour_cost,
                ),
            )
        )


def sizes_saved(
    store, plans: list, checks: list, results: list[WhatIfResult], since=None, until=None, **options
) -> tuple[list[TimeSaved], Prices]:
    """Each of `results` priced against the replays at the runs' observed points (`checks`: `fidelity`'s per run),
    at the rates `store` measured over the range; and those prices (`options`: `time_saved`'s)."""
    prices = Prices.from_store(store, plans, since, until)
    baseline = request_costs([check.replay for check in checks])
    return [time_saved(result, baseline, prices, **options) for result in results], prices


def request_costs(replays: list[WhatIfResult | None]) -> dict[str, tuple[int, int]]:
    """Per request, (hit tokens, loaded tokens) in the replays at the observed configuration (one per run; a run
    that could not be replayed there gives none: its requests are not priced)."""
    costs: dict[str, tuple[int, int]] = {}
    for replay in replays:
        if replay is not None:
            for request_id, hits in replay.request_hits.items():
                costs[request_id] = (hits, replay.request_loads.get(request_id, 0))
    return costs


def time_saved(
    result: WhatIfResult,
    baseline: dict[str, tuple[int, int]],
    prices: Prices,
    *,
    gpus: int = 1,
    gpu_hour_cost: float | None = None,
) -> TimeSaved:
    """`result`'s steps priced against `baseline` (`request_costs`): what each saves, and those that cannot be."""
    saved: dict[str, float] = {}
    unpriced, engine_s = 0, 0.0
    shares_known = True
    for request_id, hits in result.request_hits.items():
        base = baseline.get(request_id)
        # a prompt costs (prompt - hits) computed + loaded: hits more computes fewer, loads fewer loads less
        seconds = None
        if base is not None:
            loaded = result.request_loads.get(request_id, 0)
            seconds = prices.saved(request_id, hits - base[0], base[1] - loaded)
        if seconds is None:
            unpriced += 1
        else:
            saved[request_id] = seconds
            share = prices.engine_share(request_id)
            shares_known = shares_known and share is not None
            engine_s += seconds * (share or 0.0)
    return TimeSaved(
        result.configuration,
        result.num_blocks,
        saved,
        unpriced,
        engine_s if shares_known else None,
        gpus,
        gpu_hour_cost,
    )


def saved_table(saved: list[TimeSaved], prices: Prices) -> str:
    """The terminal's table of `saved` (one row per configuration), the rates that priced it and what it counts."""
    lines = ["| " + " | ".join(SAVED_COLUMNS) + " |", "|" + "---|" * len(SAVED_COLUMNS)]
    for entry in saved:
        values = list(entry.row().values())
        cells = [
            values[0],
            f"{values[1]:,}",
            values[2],
            *(_seconds(v, 3) for v in values[3:5]),
            *(f"{v:,}" for v in values[5:7]),
            _seconds(values[7], 1),
            *("-" if v is None else f"{v:,.3g}" for v in values[8:10]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    gpus = saved[0].gpus if saved else 1
    return "\n".join(["Time to first token:", "", *lines, "", prices.rate_words(), SAVED_WORDS.format(gpus=gpus)])


def _seconds(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:+,.{digits}f}"
