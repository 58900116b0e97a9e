"""Do a replica's KV events and its own prefix-cache counters tell the same story? (`kvobs doctor`)

    for check in kv_counter_agreement(store, since, until):
        print(check.instance, check.verdict, check.words)

Every full block a replica computes it stores, and says so in a `stored` event; every token it computes is either a
prompt token its prefix cache missed (`vllm:prefix_cache_queries - vllm:prefix_cache_hits`) or a generated one
(`vllm:generation_tokens`). So over a range, the tokens of its stored blocks (blocks x block size) should lie
between those counted tokens less one partial block per request (a request's last, partial block is never stored)
and those counted tokens. Above: more blocks were computed than the counters say were missed, so the hit counter
over-counts (vLLM has shipped such bugs) or the query counter under-counts: the counters are off. Below by a whole
block or more (an event is lost a block at a time; a few tokens under the band are the engines' own accounting, such
as the block an engine recomputes when a whole prompt hits): the KV events are short (batches lost on the way,
events switched on part-way, a replica that publishes only some tiers). Where no counter was scraped, a replica's
own request rows stand in for them when they say how many prompt tokens were cached (our engine writes them itself:
`kvobs serve --store` needs no scrape; vLLM's spans do not say, so vLLM needs its counters). Without either, or
without stored events, the verdict is `unknown`, and says which is missing. Re-computation after a preemption and
blocks freed before they filled can put a run a little outside the band; the words give the numbers so a person can
judge.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvobs.analytics.cache.hit_rate import HITS, QUERIES
from kvobs.semconv.metrics import INCREASE_SUFFIX, vllm
from kvobs.semconv.spans import KVEventKind
from kvobs.store.interface import Store

GENERATED = vllm.GENERATION_TOKENS.name + INCREASE_SUFFIX
FINISHED = vllm.REQUEST_SUCCESS.name + INCREASE_SUFFIX
VERDICTS = ("agree", "counters_off", "events_short", "unknown")


@dataclass(frozen=True)
class Agreement:
    instance: str
    verdict: str  # one of VERDICTS
    words: str
    stored_tokens: int | None = None  # stored blocks x block size
    counted_tokens: int | None = None  # prompt tokens missed + generated tokens, from the counters
    slack_tokens: int | None = None  # one partial block per request


def kv_counter_agreement(store: Store, since: float | None = None, until: float | None = None) -> list[Agreement]:
    """Per instance that reported KV events or counters in the range, its verdict with the numbers."""
    stored = store.reads.kv_events(since, until, kinds=[KVEventKind.STORED.value])
    counters = store.reads.metric_series([HITS, QUERIES, GENERATED, FINISHED], since, until)
    totals = counters.groupby(["instance", "name"])["value"].sum() if not counters.empty else pd.Series(dtype=float)
    requests = None  # read only for a replica without the finished-requests counter

    def finished_requests(instance: str) -> int:
        nonlocal requests
        if requests is None:
            requests = store.reads.requests(since, until)
        return int((requests["instance"] == instance).sum())

    loads: dict | None = None

    def tier_loads() -> dict:
        nonlocal loads
        if loads is None:
            rows = store.reads.kv_events(since, until, kinds=[KVEventKind.TIER_LOADED.value])
            loads = rows.groupby("instance")["num_tokens"].sum().to_dict() if not rows.empty else {}
        return loads

    def own_rows(instance: str) -> tuple[float, float, float] | None:
        """(queries, hits, generated) from the instance's request rows, when they say what was cached. Cached tokens
        count those loaded from an offload tier (as vLLM's do), which the cache stores again as it would computed
        ones: they are no hit of the cache's here (as vLLM's `prefix_cache_hits` leaves them out)."""
        nonlocal requests
        if requests is None:
            requests = store.reads.requests(since, until)
        mine = requests[requests["instance"] == instance]
        admitted = mine["queue_s"].notna() | mine["first_token_ts"].notna()  # others never looked their prefix up
        mine = mine[admitted | mine["cached_tokens"].notna()]
        if mine.empty or mine["cached_tokens"].isna().any():
            return None
        sums = mine[["prompt_tokens", "cached_tokens", "completion_tokens"]].sum()
        loaded = tier_loads().get(instance, 0.0)
        hits = float(sums["cached_tokens"]) - loaded
        return float(sums["prompt_tokens"]), hits, float(sums["completion_tokens"])

    out = []
    for instance in sorted(set(stored["instance"]) | set(counters["instance"])):
        out.append(_verdict(instance, stored[stored["instance"] == instance], totals, finished_requests, own_rows))
    return out


NO_EVENTS = (
    "no stored KV events in the range: are its KV events on? vLLM publishes them only with enable_kv_cache_events "
    "true in --kv-events-config (false unless set), and the collector must reach their endpoint (kvobs collect "
    "--kv-events NAME=tcp://HOST:PORT)"
)


def _verdict(instance: str, stored: pd.DataFrame, totals: pd.Series, finished_requests, own_rows) -> Agreement:
    def total(name: str) -> float | None:
        key = (instance, name)
        return float(totals[key]) if key in totals.index else None

    hits, queries, generated = total(HITS), total(QUERIES), total(GENERATED)
    source = "the counters"
    if stored.empty:
        return Agreement(instance, "unknown", NO_EVENTS)
    if hits is None or queries is None or generated is None:
        rows = own_rows(instance)
        if rows is None:
            return Agreement(
                instance,
                "unknown",
                "no prefix-cache or generation counters scraped in the range, and its request rows do not say what "
                "was cached: is --vllm-url given?",
            )
        queries, hits, generated = rows
        source = "its own request rows (no scrape needed)"
    block_size = int(stored["num_tokens"].dropna().mode().iloc[0])
    finished = total(FINISHED)
    num_requests = int(finished) if finished is not None else finished_requests(instance)
    stored_tokens = len(stored) * block_size
    counted = int(queries - hits + generated)
    slack = num_requests * block_size
    numbers = (
        f"{len(stored):,} stored blocks x {block_size} = {stored_tokens:,} tokens computed; {source}: "
        f"{int(queries - hits):,} prompt tokens missed + {int(generated):,} generated = {counted:,}, less up to "
        f"{slack:,} ({num_requests:,} requests x one partial block)"
    )
    if stored_tokens > counted:
        return Agreement(
            instance,
            "counters_off",
            f"{numbers}: more was computed than the counters say missed, so the prefix-cache hit counter "
            "over-counts (or the query counter under-counts): trust the KV events' hit rate",
            stored_tokens,
            counted,
            slack,
        )
    if counted - slack - stored_tokens >= block_size:  # events are lost in whole blocks: less is no block lost
        return Agreement(
            instance,
            "events_short",
            f"{numbers}: the KV events are short of what was computed (batches lost, events on for part of the "
            "range, or a tier not published): trust the counters' hit rate",
            stored_tokens,
            counted,
            slack,
        )
    return Agreement(instance, "agree", f"{numbers}: they agree", stored_tokens, counted, slack)
