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
    instance before it, in the rows' order (`events` as read: by time, then as written), so a block removed and
    stored again in one batch (one timestamp) is aged by its earlier store; rows with no such store are left out."""
    assert events["ts"].is_monotonic_increasing, "the rows are not in time order"
    ordered = events.assign(seq=range(len(events)))
    losses = ordered[ordered["kind"].isin(BLOCK_LOSS_KINDS) & (ordered["first_owner"] == 1)]
    stores = ordered.loc[ordered["kind"] == STORED, ["instance", "block_hash", "ts", "seq"]].rename(
        columns={"ts": "stored_ts", "seq": "stored_seq"}
    )
    matched = pd.merge_asof(
        losses.reset_index(),
        stores,
        left_on="seq",
        right_on="stored_seq",
        by=["instance", "block_hash"],
        direction="backward",
        allow_exact_matches=False,
    ).set_index("index")
    return (matched["ts"] - matched["stored_ts"]).dropna().sort_index()
