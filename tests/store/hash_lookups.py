"""What the reads looked up by hash before the block clock (revision 0021), recomputed from a store's raw rows: the
reference the columns written at ingest (`kv_events.lifetime_s`, `restored`) are checked against."""

from __future__ import annotations

import pandas as pd

from kvobs.semconv.spans import BLOCK_LOSS_KINDS, KVEventKind

STORED = KVEventKind.STORED.value


def restores_by_hash(events: pd.DataFrame) -> pd.Series:
    """Per `stored` row (by its index): 1 where the same block was stored on the same instance at an earlier time."""
    stored = events[events["kind"] == STORED]
    first = stored.groupby(["instance", "block_hash"])["ts"].transform("min")
    return (stored["ts"] > first).astype(int)


def lifetimes_by_hash(events: pd.DataFrame) -> pd.Series:
    """Per loss row that is a block's first (by its index): the time since the same block's latest store on the same
    instance at or before it; rows with no such store are left out."""
    losses = events[events["kind"].isin(BLOCK_LOSS_KINDS) & (events["first_owner"] == 1)]
    stores = events.loc[events["kind"] == STORED, ["instance", "block_hash", "ts"]].rename(columns={"ts": "stored_ts"})
    keyed = losses.reset_index().sort_values("ts")
    matched = pd.merge_asof(
        keyed,
        stores.sort_values("stored_ts"),
        left_on="ts",
        right_on="stored_ts",
        by=["instance", "block_hash"],
        direction="backward",
    ).set_index("index")
    return (matched["ts"] - matched["stored_ts"]).dropna().sort_index()
