"""A restarted collector's block clocks, rebuilt from the store: it then writes the same lifetimes and restores as
one that ran on (`kv_events.lifetime_s`, `restored`, `restored_after_s`).

    rebuild_clocks(ingest, store.lookups)    # the rows read; before the stream's subscriber starts

The rows of the clock's horizon before the instance's latest event are read a window at a time: a busy replica's
hour is millions of rows, and one frame of them all would hold gigabytes. Only the clocks are rebuilt: which session
owns a resident block is not.
"""

from __future__ import annotations

import logging
import math

from collectors.kv.ingest import KVIngest
from kvobs.block_clock import HORIZON_S
from kvobs.store.interface import Lookups

log = logging.getLogger(__name__)

WINDOW_S = 60.0  # the rows read at once: a minute of the instance's block events


def rebuild_clocks(ingest: KVIngest, lookups: Lookups, horizon_s: float = HORIZON_S, window_s: float = WINDOW_S) -> int:
    """Feed `ingest`'s clocks its instance's stored block events of the `horizon_s` before the latest; returns the
    rows read."""
    latest, rows = lookups.latest_kv_ts(ingest.instance), 0
    if latest is None:
        return 0
    start = latest - horizon_s
    for k in range(math.floor(horizon_s / window_s) + 1):  # [since, until) windows, the last one holding `latest`
        rows += ingest.warm(lookups.block_history(ingest.instance, start + k * window_s, start + (k + 1) * window_s))
    if rows:
        log.info("KV events of %s: block clocks rebuilt from %d stored rows", ingest.instance, rows)
    return rows
