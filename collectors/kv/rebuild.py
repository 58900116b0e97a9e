"""A restarted collector's block clocks, rebuilt from the store: it then writes the same lifetimes and restores as
one that ran on (`kv_events.lifetime_s`, `restored`, `restored_after_s`).

    rebuild_clocks(ingest, store.lookups)    # the rows read; before the stream's subscriber starts
    warm(ingest, frame)                      # one frame of `Lookups.block_history`'s rows

The rows of the clock's horizon before the instance's latest event are read a window at a time: a busy replica's
hour is millions of rows, and one frame of them all would hold gigabytes. Only the clocks are rebuilt: which session
owns a resident block is not.
"""

from __future__ import annotations

import logging
import math

import pandas as pd

from collectors.kv.batch_rows import CLEARED, STORED, TIER_STORED
from collectors.kv.ingest import KVIngest
from kvobs.block_clock import HORIZON_S
from kvobs.store.interface import Lookups

log = logging.getLogger(__name__)

WINDOW_S = 60.0  # the rows read at once: a minute of the instance's block events
HISTORY = ("ts", "kind", "block_hash", "medium")  # of `Lookups.block_history`'s columns, those read as they are


def rebuild_clocks(ingest: KVIngest, lookups: Lookups, horizon_s: float = HORIZON_S, window_s: float = WINDOW_S) -> int:
    """Feed `ingest`'s clocks its instance's stored block events of the `horizon_s` before the latest; returns the
    rows read."""
    latest, rows = lookups.latest_kv_ts(ingest.instance), 0
    if latest is None:
        return 0
    start = latest - horizon_s
    for k in range(math.floor(horizon_s / window_s) + 1):  # [since, until) windows, the last one holding `latest`
        rows += warm(ingest, lookups.block_history(ingest.instance, start + k * window_s, start + (k + 1) * window_s))
    if rows:
        log.info("KV events of %s: block clocks rebuilt from %d stored rows", ingest.instance, rows)
    return rows


def warm(ingest: KVIngest, history: pd.DataFrame) -> int:
    """Feed `ingest`'s block clocks the store's rows of its instance (`Lookups.block_history`, oldest first) as the
    stream fed them: an event's blocks at once; returns the rows read."""
    known = history["group_idx"].notna().to_numpy()
    groups = [int(g) if k else None for g, k in zip(history["group_idx"].fillna(0).tolist(), known, strict=True)]
    run: tuple = (None, None, None)  # (clock, stored or lost, ts): the rows of one event
    hashes: list = []
    with ingest.lock:
        for ts, kind, block_hash, medium, group in zip(*(history[c].tolist() for c in HISTORY), groups, strict=True):
            if kind == CLEARED:
                _feed(run, hashes)
                run, hashes = (None, None, None), []
                for clock in ingest.clocks():
                    clock.cleared(ts)
                continue
            key = (ingest.clock_of(medium, group, kind), kind in (STORED, TIER_STORED), ts)
            if key != run:
                _feed(run, hashes)
                run, hashes = key, []
            hashes.append(block_hash)
        _feed(run, hashes)
    return len(history)


def _feed(run: tuple, hashes: list) -> None:
    clock, stored, ts = run
    if clock is not None:
        clock.stored(hashes, ts) if stored else clock.lost(hashes, ts)
