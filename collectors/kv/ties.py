"""One stream's part of ownership by inference (`collectors.block_owners`): which of the requests due have stores of
blocks that named no session in their window, their ties (`kvobs.analytics.cache.ownership.block_ties`) over the
stream's recent stores and resident chains, and the adoption of what was tied. It runs where the stream's chains live:
in the collector's process, or in the stream's worker (`collectors.kv.workers`), which the caller then reaches by a
call.

    looked, ties, adopted = tie_requests(ingest, frame, due_ids, since)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.cache import STORE_SLACK_S, block_ties


def tie_requests(ingest, frame: pd.DataFrame, due_ids: list[str], since: float) -> tuple[list[str], pd.DataFrame, int]:
    """`frame`: the due requests and their context (requests of the stream tied already), each with its session
    (`block_owners._requests`); `due_ids`: the due ones. Returns the due requests looked at (those with a store naming
    no session in their window), each looked-at or context request's `tie` (`request_id`, `tie`), and the blocks
    adopted (`KVIngest.adopt`)."""
    stored = ingest.recent_stores(since)
    times = stored["ts"].to_numpy(float)
    due = frame[frame["request_id"].isin(set(due_ids))]
    ends = due["finished_ts"].astype(float).fillna(due["arrival_ts"].astype(float))
    looked = [
        request_id
        for request_id, start, end in zip(due["request_id"], due["arrival_ts"].astype(float), ends)
        if _stores_between(times, start, end)
    ]
    if not looked:
        return [], pd.DataFrame(columns=["request_id", "tie"]), 0
    skipped = set(due_ids) - set(looked)  # a header named every block of their windows
    kept = frame[~frame["request_id"].isin(skipped)]
    ties = block_ties(kept, stored, block_size=ingest.block_size, before=ingest.chains.parents())
    adopted = ingest.adopt(ties.attrs["owned"])
    return looked, ties[["request_id", "tie"]].reset_index(drop=True), adopted


def _stores_between(times: np.ndarray, start: float, end: float) -> bool:
    lo, hi = np.searchsorted(times, start - STORE_SLACK_S), np.searchsorted(times, end + STORE_SLACK_S, "right")
    return bool(hi > lo)
