"""The prefix-cache hit rate: one definition for the terminal, the Overview, the fleet table, What-if and the alert
rules.

    hit = hit_rate_in(store, since, until, instances=["demo-engine"])
    hit.rate, hit.hit_tokens, hit.query_tokens, hit.num_requests, hit.source
    hit_rate_windows(range_sums(...).requests, counters, window_s=60)  # the same, per window (the Overview's)
    hit_rates_in(store, since, until)                       # per instance: {instance: HitRate} (the alert rule's)

Prompt tokens served from the prefix cache over prompt tokens, for the requests that arrived in the range: vLLM's
`prefix_cache_hits / prefix_cache_queries` (tokens, each request's first admission; a re-admission after a
preemption is not a query). Per instance, from its request rows where they say how many prompt tokens were cached
(our engine), else from its scraped counters' increases in the range (vLLM's spans do not say). Not a mean of
hit rates: a mean of snapshots, or of cumulative rates since an engine started, weighs the wrong things and mixes
runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvobs.semconv.metrics import INCREASE_SUFFIX, vllm

# `HitRate.source`: what a hit rate counted (sources of a fleet of both joined by " and ")
REQUESTS, COUNTERS, NO_SOURCE = "requests", "counters", "none"
HITS = vllm.PREFIX_CACHE_HITS.name + INCREASE_SUFFIX
QUERIES = vllm.PREFIX_CACHE_QUERIES.name + INCREASE_SUFFIX


@dataclass(frozen=True)
class HitRate:
    hit_tokens: float
    query_tokens: float
    num_requests: int | None  # None: from counters (they count tokens, not requests)
    source: str  # "requests", "counters", "requests and counters" (a fleet of both), or "none"

    @property
    def rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens else None

    def describe(self) -> str:
        """`65.9% of 6,703 prompt tokens` (or what is missing): to the tenth of a point, as every page shows it."""
        if self.rate is None:
            return "no prompt tokens"
        return f"{self.rate:.1%} of {self.query_tokens:,.0f} prompt tokens"


def hit_rate(requests: pd.DataFrame, counters: pd.DataFrame | None = None) -> HitRate:
    """The hit rate of these requests (`reads.requests` rows), and of the instances whose requests do not say what
    was cached, of their counters (`reads.metric_series` of `HITS`, `QUERIES`)."""
    return _combine(request_sums(requests), counters)


def request_sums(requests: pd.DataFrame) -> pd.DataFrame:
    """Per instance whose rows say what was cached: `instance`, `requests`, `cached_tokens`, `prompt_tokens` (their
    sums), as `lookups.cached_prompt_tokens` reads them from the store."""
    known, _ = _split(requests)
    sums = known.groupby("instance", sort=True).agg(
        requests=("cached_tokens", "size"),
        cached_tokens=("cached_tokens", "sum"),
        prompt_tokens=("prompt_tokens", "sum"),
    )
    return sums.reset_index()


def hit_rates_in(store, since: float, until: float) -> dict[str, HitRate]:
    """Per instance: `hit_rate` of the requests that arrived in [since, until], summed in the store (no rows
    pulled), else its counters; the instances with neither are left out."""

    sums = store.lookups.cached_prompt_tokens(since, until)
    counters = store.reads.metric_series([HITS, QUERIES], since, until)
    names = sorted(set(sums["instance"]) | set(counters["instance"]))
    return {name: _combine(sums[sums["instance"] == name], counters[counters["instance"] == name]) for name in names}


def _combine(sums: pd.DataFrame, counters: pd.DataFrame | None) -> HitRate:
    """The hit rate of `request_sums`' instances, and of the other instances' `counters`."""
    hits, queries = float(sums["cached_tokens"].sum()), float(sums["prompt_tokens"].sum())
    sources = [REQUESTS] if len(sums) else []
    if counters is not None and not counters.empty:
        mine = counters[~counters["instance"].isin(set(sums["instance"]))]
        if not mine.empty:
            totals = mine.groupby("name")["value"].sum()
            hits, queries = hits + float(totals.get(HITS, 0.0)), queries + float(totals.get(QUERIES, 0.0))
            sources.append(COUNTERS)
    num_requests = int(sums["requests"].sum()) if sources == [REQUESTS] else None
    return HitRate(hits, queries, num_requests, " and ".join(sources) or NO_SOURCE)


def hit_rate_of_sums(sums: pd.DataFrame, counters: pd.DataFrame | None = None) -> HitRate:
    """`hit_rate` of requests summed per window and instance (`kvobs.analytics.windows.RangeSums.requests`)."""
    return _combine(_said(sums).groupby("instance", as_index=False, sort=True)[_SUMS].sum(), counters)


def hit_rate_windows(sums: pd.DataFrame, counters: pd.DataFrame | None, window_s: float) -> pd.Series:
    """`hit_rate` per window (its start, epoch s) of arrival (requests, summed per window and instance:
    `RangeSums.requests`) or scrape (counters) time; NaN where no prompt token was queried."""
    said = _said(sums)
    parts = []
    if len(said):
        parts.append(
            said.groupby("window")[["cached_tokens", "prompt_tokens"]].sum().set_axis(["hits", "queries"], axis=1)
        )
    if counters is not None and not counters.empty:
        mine = counters[~counters["instance"].isin(set(said["instance"]))]
        if not mine.empty:
            window = np.floor(mine["ts"].astype(float) / window_s) * window_s
            wide = mine.assign(window=window).pivot_table(
                index="window", columns="name", values="value", aggfunc="sum", fill_value=0.0
            )
            parts.append(pd.DataFrame({"hits": wide.get(HITS, 0.0), "queries": wide.get(QUERIES, 0.0)}))
    if not parts:
        return pd.Series(dtype=float, name="hit_rate")
    sums = pd.concat(parts).groupby(level=0).sum()
    return (sums["hits"] / sums["queries"].where(sums["queries"] > 0)).rename("hit_rate").rename_axis("window")


_SUMS = ["requests", "cached_tokens", "prompt_tokens"]


def _said(sums: pd.DataFrame) -> pd.DataFrame:
    """The summed requests of the instances whose rows say what was cached, their `requests` those that say it
    and give their prompt tokens (as `_split` keeps them)."""
    if sums.empty:
        return pd.DataFrame(columns=["window", "instance", *_SUMS])
    says = sums["instance"].isin(sums.loc[sums["cached_said"] > 0, "instance"].unique())
    mine = sums[says]
    return mine.assign(requests=mine["hit_requests"])[["window", "instance", *_SUMS]]


def hit_rate_in(store, since, until, instances=None, *, requests: pd.DataFrame | None = None) -> HitRate:
    """`hit_rate` of the store's requests that arrived in [since, until] (or those given), on `instances`."""

    requests = store.reads.requests(since, until, instances=instances) if requests is None else requests
    counters = store.reads.metric_series([HITS, QUERIES], since, until)
    if instances is not None:
        counters = counters[counters["instance"].isin(list(instances))]
    return hit_rate(requests, counters)


def _split(requests: pd.DataFrame) -> tuple[pd.DataFrame, set]:
    """The requests of instances whose rows say what was cached, and those instances (the others' counters count)."""
    if requests.empty:
        return requests.iloc[0:0], set()
    cached = requests["cached_tokens"].notna()
    says = requests["instance"].isin(requests.loc[cached, "instance"].unique())  # vectorised: no per-group lambda
    known = requests[says & cached & requests["prompt_tokens"].notna()]
    return known, set(known["instance"].unique())


def known_hit_rate(requests: list[tuple[str, int]], rows: pd.DataFrame) -> tuple[HitRate, list[tuple[str, int]]] | None:
    """Of `requests` ((request id, prompt tokens)), where some say their cached tokens in `rows` (the request rows;
    vLLM's say them where their steps' replies filled them) and some do not: the hit rate of those that say, and
    which they are, so that a replay is compared over the same; None where all or none say."""
    known = {r: int(c) for r, c in zip(rows["request_id"], rows["cached_tokens"]) if pd.notna(c)}
    counted = [(request_id, n) for request_id, n in requests if request_id in known]
    if not counted or len(counted) == len(requests):
        return None
    hits, queries = sum(known[r] for r, _ in counted), sum(n for _, n in counted)
    return HitRate(float(hits), float(queries), len(counted), REQUESTS), counted
