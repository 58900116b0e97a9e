"""A KV stream's recent stores of blocks that named no session: what ownership by inference reads
(`collectors.block_owners`).

    recent = RecentStores(recent_s=300.0)
    recent.add(ts, [h1, h2], parent)    # a store naming no session (`kvobs.block_events.Stored`)
    recent.frame("vllm-a", 16)          # its stored rows, as `kvobs.analytics.cache.ownership` reads them
"""

from __future__ import annotations

from collections import deque

import pandas as pd


class RecentStores:
    """Args:
    recent_s: how long (stream time) a store is kept: longer than a request runs and waits for its step.
    """

    def __init__(self, recent_s: float) -> None:
        self.recent_s = recent_s
        self.events: deque[tuple[float, list[int], int | None]] = deque()  # (ts, hashes, parent of the first)

    def add(self, ts: float, hashes: list[int], parent: int | None) -> None:
        self.events.append((ts, hashes, parent))
        while self.events and self.events[0][0] < ts - self.recent_s:
            self.events.popleft()

    def frame(self, instance: str, block_size: int | None, since: float = float("-inf")) -> pd.DataFrame:
        """The stores from `since` on (stream time), oldest first."""
        recent = []
        for event in reversed(self.events):  # (newest first: a slice of the end costs only what it reads)
            if event[0] < since:
                break
            recent.append(event)
        ts, hashes, parents = [], [], []
        for at, stored, parent in reversed(recent):
            ts += [at] * len(stored)
            hashes += stored
            parents += [parent, *stored[:-1]]
        return pd.DataFrame(
            {
                "ts": ts,
                "instance": instance,
                "block_hash": pd.Series(hashes, dtype=object),
                "parent_hash": pd.Series(parents, dtype=object),
                "session_id": None,
                "num_tokens": block_size,
            }
        )
