"""The hit-rate shortfall, split: available vs achieved prefix-cache hit rate, and why each missed block missed.

    lookups = store_lookups(store, requests, steps, since, until)   # routing.request_lookups, read from a store
    lookups = measured_lookups(store, requests)                     # ... as a collector measured them (or None)
    table = shortfall(lookups, "instance")                         # per instance, then the fleet's row
    spread = hit_rate_spread(table)                                # max, mean, stddev of the replicas' hit rates

Counted in whole prompt blocks of the requests whose hash chain is known (a lookup finds whole blocks): the
**achieved** hit rate is the blocks each request found on its own replica / its prompt blocks; the **available**
one what a cache that never evicted would have held at each lookup (every block some replica had stored before).
The shortfall between them, and the cold blocks below both, split by why each missed block missed
(`routing.MISS_PARTS`): held by another replica (`routed`), invalidated or reset, evicted while the session waited
on a tool (`pause`), evicted otherwise (`capacity`), held yet not found (`unexplained`), never stored (`cold`).
Of the achieved, `tier_tokens` were found only in a lower tier of the request's replica (its offload tier: loaded,
not recomputed; a tool-pause loss the tier saved is counted there, not as a loss).
The parts add up: achieved + every part = the prompt blocks (`prompt_block_tokens`: the prompt's whole blocks, up to
the last token, which a lookup never finds); available = prompt - cold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.cache.routing import (
    FLEET,
    LOOKUP_COLUMNS,
    MISS_PARTS,
    FleetCheck,
    read_inputs,
    request_lookups,
    stored_lookups,
)
from kvobs.store.interface import Store
from kvobs.store.rollups import LOOKUP_TOKENS, lookup_tokens

SHORTFALL_COLUMNS = [
    "requests",
    "prompt_block_tokens",
    "achieved_tokens",
    "tier_tokens",
    "available_tokens",
    "achieved_rate",
    "available_rate",
    "shortfall_tokens",
    *(f"{part}_tokens" for part in MISS_PARTS),
]


def store_lookups(
    store: Store, requests: pd.DataFrame, steps: pd.DataFrame, since: float | None, until: float | None
) -> tuple[pd.DataFrame, FleetCheck]:
    """`routing.request_lookups` of `requests` (sessions filled from `steps`), with what `routing.read_inputs`
    reads from the store."""
    if requests.empty:
        return pd.DataFrame(columns=LOOKUP_COLUMNS), FleetCheck()
    requests, events, check = read_inputs(store, requests, steps, since, until)
    return request_lookups(requests, events, check), check


def measured_lookups(store: Store, requests: pd.DataFrame) -> pd.DataFrame | None:
    """The lookups a collector measured of `requests` (`routing.stored_lookups`), when every one of them has its
    row; None otherwise (one not measured yet, or never: a replay must work them out)."""
    if requests.empty:
        return None
    found = stored_lookups(store, requests)
    return found if len(found) >= len(requests) else None


def shortfall(lookups: pd.DataFrame, by: str, *, total: str | None = FLEET) -> pd.DataFrame:
    """One row per value of `by` (`instance`, `session_id`), then one over every request (named `total`; none
    when None): the columns `SHORTFALL_COLUMNS`, in tokens of whole blocks (rates over `prompt_block_tokens`)."""
    tokens = pd.DataFrame(lookup_tokens(lookups), index=lookups.index)[list(LOOKUP_TOKENS)]
    sums = tokens.assign(**{by: lookups[by], "requests": 1}).groupby(by, as_index=False, sort=True).sum()
    return shortfall_of_sums(sums, by, total=total)


def shortfall_of_sums(sums: pd.DataFrame, by: str, *, total: str | None = FLEET) -> pd.DataFrame:
    """`shortfall` of sums per value of `by` (`requests` and `kvobs.store.rollups.LOOKUP_TOKENS`, as
    `LOOKUP_MINUTES` keeps them per instance)."""
    groups = [(row[by], row) for _, row in sums.sort_values(by).iterrows()]
    if total is not None:
        groups.append((total, sums[["requests", *LOOKUP_TOKENS]].sum()))
    rows = []
    for name, row in groups:
        prompt, available = float(row["prompt_block_tokens"]), float(row["available_tokens"])
        achieved = float(row["achieved_tokens"])
        rows.append(
            {
                by: name,
                "requests": int(row["requests"]),
                "prompt_block_tokens": int(prompt),
                "achieved_tokens": int(achieved),
                "tier_tokens": int(row["tier_tokens"]),
                "available_tokens": int(available),
                "achieved_rate": achieved / prompt if prompt else np.nan,
                "available_rate": available / prompt if prompt else np.nan,
                "shortfall_tokens": int(available - achieved),
                **{f"{part}_tokens": int(row[f"{part}_tokens"]) for part in MISS_PARTS},
            }
        )
    return pd.DataFrame(rows, columns=[by, *SHORTFALL_COLUMNS])


def hit_rate_spread(table: pd.DataFrame) -> dict:
    """The replicas' achieved hit rates (a `shortfall(..., "instance")` table, its total row left out): how many,
    the highest, the mean and the standard deviation (None with fewer than two)."""
    rates = table.loc[table["instance"] != FLEET, "achieved_rate"].dropna().to_numpy(float)
    if len(rates) < 2:
        return {"replicas": len(rates), "max": None, "mean": None, "stddev": None}
    return {
        "replicas": len(rates),
        "max": float(rates.max()),
        "mean": float(rates.mean()),
        "stddev": float(rates.std()),
    }
