"""What-if run by run: a replay never crosses an engine restart, nor mixes two replicas' caches.

    plans = replay_plans(store, since, until)                 # one ReplayPlan per run in the range (`plan.span`)
    total, per_run = simulate_runs(plans, num_blocks=64, policy="lru")
    observed = observed_total(plans, store, since, until)     # what the runs achieved, together
    rows = comparison(observed, [total])                       # the table: observed, then each replay

Each run began with an empty cache of its own (`kvobs.analytics.runs`): its requests are replayed through a cache of
their own, and the results add up. On a fleet each replica's run is its own cache too. Without recorded runs (a
store from before them) the range is one replay, as it always was, and the caller says so.
"""

from __future__ import annotations

from dataclasses import fields

import pandas as pd

from instrumented_engine.whatif.replay import ReplayPlan, simulate
from instrumented_engine.whatif.units import WhatIfResult
from kvobs.analytics.cache import NO_SOURCE, HitRate, hit_rate_in
from kvobs.analytics.runs import run_table, spans
from kvobs.analytics.steps import RESPONSES
from kvobs.store.interface import Store

_SUMMED = ("evicted_blocks", "released_blocks", "lost_in_pause_blocks", "pending_idle_blocks", "recompute_tokens")
# the what-if table's columns, in the terminal and on the page (`comparison`)
COMPARISON = (
    "configuration",
    "blocks",
    "hit rate",
    "blocks lost",
    "blocks released",
    "lost in tool pauses",
    "recompute tokens",
    "waited",
)


def replay_plans(
    store: Store, since=None, until=None, *, instances=None, block_size: int | None = None
) -> list[ReplayPlan]:
    """One plan per run in [since, until] that has something to replay, oldest first, each with its `span`.

    Raises:
        ValueError: no stored KV blocks at all (nothing can be replayed).
    """
    plans, errors = [], []
    table = run_table(store.reads.runs(instances=instances))
    policies = dict(zip(table["run_id"], table["eviction_policy"]))
    tiers = dict(zip(table["run_id"], table["offload_blocks"]))
    engines = dict(zip(table["run_id"], table["engine"]))
    for span in spans(table, since, until, instances):
        scope = instances if span.instance is None else [span.instance]
        try:
            plan = ReplayPlan.from_store(store, span.since, span.until, block_size=block_size, instances=scope)
        except ValueError as exc:  # this run stored no blocks (an engine that served nothing)
            errors.append(exc)
            continue
        plan.span = span
        policy = policies.get(span.run_id)
        plan.policy = policy if isinstance(policy, str) else None
        tier = tiers.get(span.run_id)
        plan.tier_blocks = None if tier is None or pd.isna(tier) else int(tier)
        engine = engines.get(span.run_id)
        plan.engine = engine if isinstance(engine, str) else None
        plans.append(plan)
    if not plans:
        raise errors[0] if errors else ValueError("no run in this range has requests to replay")
    return plans


def simulate_runs(plans: list[ReplayPlan], **options) -> tuple[WhatIfResult, list[WhatIfResult]]:
    """Each plan through a cache of its own (`whatif.simulate` with `options`), and their sum."""
    per_run = [simulate(plan, **options) for plan in plans]
    total = WhatIfResult(per_run[0].num_blocks, per_run[0].policy, ttl_s=per_run[0].ttl_s)
    for result in per_run:
        for f in fields(WhatIfResult):
            if f.name in ("num_blocks", "policy", "ttl_s"):
                continue
            mine, theirs = getattr(total, f.name), getattr(result, f.name)
            if isinstance(mine, dict):
                setattr(total, f.name, {k: mine.get(k, 0) + theirs.get(k, 0) for k in {*mine, *theirs}})
            else:
                setattr(total, f.name, mine + theirs)
    return total, per_run


def observed_total(plans: list[ReplayPlan], store: Store, since, until, instances=None) -> dict:
    """What the runs achieved together: their counts added, the hit rate over the whole range (one definition,
    `kvobs.analytics.cache.hit_rate`), or the runs' own added up where one compares its replayed requests' responses (so
    the table's "observed" is what each run's check compares), the cache size when every run had the same."""
    observed = {name: _sum(plan.observed.get(name) for plan in plans) for name in _SUMMED}
    sizes = {plan.observed.get("num_blocks") for plan in plans}
    observed["num_blocks"] = sizes.pop() if len(sizes) == 1 else None
    hits = [plan.observed.get("hit") for plan in plans]
    if any(hit is not None and hit.source == RESPONSES for hit in hits):  # (compared on the replayed requests)
        observed["hit"] = summed(hits)
    else:
        observed["hit"] = hit_rate_in(store, since, until, instances)
    observed["hit_rate"] = observed["hit"].rate
    return observed


def comparison(observed: dict | None, results: list[WhatIfResult]) -> list[dict]:
    """The what-if table's rows (keys `COMPARISON`): what was observed (`observed_total`'s, or a plan's
    `observed`; no row for None: a trace has nothing observed), then each replay in `results`; None where a value is
    unknown."""
    rows: list[tuple] = []
    if observed is not None:
        rows.append(
            (
                "observed",
                observed.get("num_blocks"),
                observed.get("hit_rate"),
                observed.get("evicted_blocks"),
                observed.get("released_blocks"),
                observed.get("lost_in_pause_blocks"),
                observed.get("recompute_tokens"),
                None,
            )
        )
    rows += [
        (
            r.configuration,
            r.num_blocks,
            r.hit_rate,
            r.evicted_blocks,
            r.released_blocks,
            r.lost_in_pause_blocks,
            r.recompute_tokens,
            r.waited,
        )
        for r in results
    ]
    return [dict(zip(COMPARISON, row)) for row in rows]


def summed(hits: list[HitRate | None]) -> HitRate:
    """The runs' hit rates added up (tokens over tokens), their sources named once each."""
    known = [hit for hit in hits if hit is not None]
    sources = " and ".join(dict.fromkeys(hit.source for hit in known)) or NO_SOURCE
    counts = [hit.num_requests for hit in known]
    return HitRate(
        sum(hit.hit_tokens for hit in known),
        sum(hit.query_tokens for hit in known),
        None if None in counts else sum(c for c in counts if c is not None),
        sources,
    )


def _sum(values):
    values = list(values)
    return None if any(v is None for v in values) else sum(values)
