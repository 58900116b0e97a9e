"""Each instance's measured prefill cost: seconds per uncached prompt token, over its requests of the
`RATE_WINDOW_S` before a moment. What turns "10 blocks (160 tokens) lost" into "about 0.03 s to recompute".

    rates = PrefillRates.from_store(store, since - RATE_WINDOW_S, until)
    rate = rates.at("demo-engine", ts)   # Rate(tokens_per_s=5300.0, overhead_s=0.03, num_requests=41, ...) or None
    rate.seconds(160)                    # what 160 more tokens of prefill cost there: 160 / tokens_per_s

A prefill's time is a fixed part (the engine step it shares with other requests' decodes, the sampling) and a part
per token. The model `prefill seconds = overhead_s x requests + tokens / tokens_per_s` is fitted by least squares
over the window's requests, so `tokens_per_s` is the marginal rate: what recomputing lost tokens adds, not a short
prompt's time divided by its few tokens. With fewer than `MIN_FIT_SAMPLES` requests, a negative part, or counters
(scrape intervals sum many requests, too coarse to fit), it is the ratio of the sums: no fixed part, so a higher
estimate of what lost tokens cost; `latency_parts.explain_excess` never lets an estimate take more than the prefill
really took beyond the session's usual.

One definition, two sources of the same quantity: the request rows where they say how many prompt tokens were
cached (our engine: prefill = scheduled to first token, requests preempted before it left out, since their prefill
holds a wait), else the instance's own counters per scrape interval (vLLM: `vllm:prompt_tokens` less
`vllm:prompt_tokens_cached` over `vllm:request_prefill_time_seconds`' sum and count, as scraped). Fewer than
`MIN_RATE_REQUESTS` requests in the window, or no per-token cost left after the fit: no rate (`None`), and no
recompute time is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvobs.analytics.cache.load_rates import LOAD_WINDOW_S, LoadRates
from kvobs.semconv.metrics import COUNT_SUFFIX, INCREASE_SUFFIX, SUM_SUFFIX, vllm

RATE_WINDOW_S = 600.0
MIN_RATE_REQUESTS = 3
MIN_FIT_SAMPLES = 10  # fewer samples (requests, or scrape intervals): the ratio of the sums, not a fitted line
COUNTERS = {
    "prompt": vllm.PROMPT_TOKENS.name + INCREASE_SUFFIX,
    "cached": vllm.PROMPT_TOKENS_CACHED.name + INCREASE_SUFFIX,
    "seconds": vllm.REQUEST_PREFILL_TIME.name + SUM_SUFFIX,
    "count": vllm.REQUEST_PREFILL_TIME.name + COUNT_SUFFIX,
}


@dataclass(frozen=True)
class Rate:
    tokens_per_s: float  # the marginal rate: 1 / seconds per uncached token
    overhead_s: float  # the fixed part of one request's prefill
    num_requests: int
    source: str  # "requests" (the instance's request rows) or "counters" (its scraped prefill counters)

    def seconds(self, tokens: float) -> float:
        """What `tokens` more tokens of prefill cost."""
        return tokens / self.tokens_per_s

    def describe(self, instance: str) -> str:
        return (
            f"{self.tokens_per_s:,.0f} tokens/s ({instance}'s prefill cost per token, measured over "
            f"{self.num_requests} requests of the {RATE_WINDOW_S / 60:g} minutes before)"
        )


class _Series:
    """One instance's samples (time; requests c, uncached tokens t, prefill seconds y) as running sums of the normal
    equations' terms, so the fit over any window costs two look-ups."""

    def __init__(self, ts, tokens, seconds, count, source: str) -> None:
        order = np.argsort(np.asarray(ts, float), kind="stable")
        self.ts = np.asarray(ts, float)[order]
        c, t, y = (np.asarray(v, float)[order] for v in (count, tokens, seconds))
        terms = {"c": c, "t": t, "y": y, "cc": c * c, "ct": c * t, "tt": t * t, "cy": c * y, "ty": t * y}
        self.sums = {name: np.concatenate([[0.0], np.cumsum(v)]) for name, v in terms.items()}
        self.source = source

    def at(self, ts: float) -> Rate | None:
        low, high = np.searchsorted(self.ts, [ts - RATE_WINDOW_S, ts], side="right")
        s = {name: float(v[high] - v[low]) for name, v in self.sums.items()}
        if s["c"] < MIN_RATE_REQUESTS or s["t"] <= 0 or s["y"] <= 0:
            return None
        det = s["cc"] * s["tt"] - s["ct"] ** 2
        overhead = per_token = 0.0
        fit = self.source == "requests" and high - low >= MIN_FIT_SAMPLES
        if fit and det > 1e-9 * s["cc"] * s["tt"]:  # seconds = overhead x requests + per_token x tokens
            overhead = (s["tt"] * s["cy"] - s["ct"] * s["ty"]) / det
            per_token = (s["cc"] * s["ty"] - s["ct"] * s["cy"]) / det
        if overhead <= 0 or per_token <= 0:  # no fixed part to speak of (or one size only): the ratio of the sums
            overhead, per_token = 0.0, s["y"] / s["t"]
        return Rate(1.0 / per_token, overhead, int(round(s["c"])), self.source)


class PrefillRates:
    """Per instance, the prefill rate over the `RATE_WINDOW_S` before any moment (see the module's doc)."""

    def __init__(
        self, requests: pd.DataFrame, counters: pd.DataFrame | None = None, loads: LoadRates | None = None
    ) -> None:
        self._series: dict[str, _Series] = {}
        self.loads = LoadRates() if loads is None else loads  # what loading from a lower tier costs, read with it
        if not requests.empty:
            measured = _measured_prefills(requests)
            for instance, group in measured.groupby("instance"):
                self._series[instance] = _Series(
                    group["arrival_ts"], group["uncached"], group["prefill_s"], np.ones(len(group)), "requests"
                )
        if counters is not None and not counters.empty:
            for instance, group in counters.groupby("instance"):
                if instance in self._series:
                    continue  # its request rows say it directly
                wide = group.pivot_table(index="ts", columns="name", values="value", aggfunc="sum", fill_value=0.0)
                if not set(COUNTERS.values()) <= set(wide.columns):
                    continue  # without its cached tokens the uncached ones are unknown: no rate
                uncached = wide[COUNTERS["prompt"]] - wide[COUNTERS["cached"]]
                self._series[instance] = _Series(
                    wide.index, uncached, wide[COUNTERS["seconds"]], wide[COUNTERS["count"]], "counters"
                )

    @classmethod
    def from_store(cls, store, since, until, requests: pd.DataFrame | None = None) -> PrefillRates:
        """From the store's requests (or those given, read from `since`) and prefill counters in [since, until]; and
        the instances' load rates from a lower tier (`load_rates.LoadRates`) over the same span."""

        requests = store.reads.requests(since, until) if requests is None else requests
        counters = store.reads.metric_series(COUNTERS.values(), since, until)
        # (loads are counted by the scrape after them: read past the span's end)
        loads = LoadRates.from_store(store, since, None if until is None else until + LOAD_WINDOW_S)
        return cls(requests, counters, loads)

    def at(self, instance, ts: float) -> Rate | None:
        series = self._series.get(instance)
        return None if series is None or ts != ts else series.at(ts)


def _measured_prefills(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests whose prefill is measured cleanly: cached tokens known, scheduled and first token known, something
    to prefill, never preempted."""
    frame = requests.assign(
        uncached=requests["prompt_tokens"].astype(float) - requests["cached_tokens"].astype(float),
        prefill_s=requests["first_token_ts"].astype(float)
        - (requests["arrival_ts"].astype(float) + requests["queue_s"].astype(float)),
    )
    clean = frame["num_preemptions"].fillna(0).astype(float) == 0
    return frame[clean & (frame["uncached"] > 0) & (frame["prefill_s"] > 0)]


def prefill_overlap(requests: pd.DataFrame) -> dict[str, float]:
    """Per instance, the share of its requests' prefill time the engine spent once: the union of their prefill
    intervals (scheduled to first token) over their sum. 1.0: one prefill at a time; 0.25: four at once on average,
    each request's prefill time the same engine time. What turns requests' prefill seconds into the engine's."""
    frame = requests.assign(
        start=requests["arrival_ts"].astype(float) + requests["queue_s"].astype(float),
        end=requests["first_token_ts"].astype(float),
    )
    frame = frame[frame["end"] > frame["start"]]
    shares = {}
    for instance, group in frame.groupby("instance"):
        starts, ends = group["start"].to_numpy(), group["end"].to_numpy()
        order = np.argsort(starts, kind="stable")
        union, reach = 0.0, -np.inf
        for start, end in zip(starts[order], ends[order]):
            if end > reach:  # the part of this interval past everything before it
                union += end - max(start, reach)
                reach = end
        shares[str(instance)] = union / float((ends - starts).sum())
    return shares
