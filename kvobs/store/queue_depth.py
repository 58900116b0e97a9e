"""What a store writer holds that is not committed yet: how many rows, since when, and the most it ever held.

    depth = QueueDepth()
    depth.accepted(50)               # a unit of 50 rows queued (call under the writer's lock)
    depth.rows, depth.lag_s()        # 50, seconds since that unit was queued
    depth.committed(1)               # the oldest unit written: its wait counts toward `peak_lag_s`

A burst (a publisher at many times its usual rate) shows here first: rows pile up in the writer's queue, and the
oldest waits longer before it is committed. A scrape every 15 s can miss a short burst, so the peaks are kept as well
(the most rows held, the longest any unit waited from being queued until its batch was committed).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class QueueDepth:
    __slots__ = ("rows", "peak_rows", "peak_lag_s", "_units", "_clock")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.rows = 0  # accepted, not yet committed (queued, or in the batch being written)
        self.peak_rows = 0
        self.peak_lag_s = 0.0  # the longest a unit waited from being queued until its batch was done with
        self._units: deque[tuple[float, int]] = deque()  # (queued at, rows), oldest first
        self._clock = clock

    def accepted(self, rows: int) -> None:
        self._units.append((self._clock(), rows))
        self.rows += rows
        self.peak_rows = max(self.peak_rows, self.rows)

    def committed(self, units: int) -> None:
        """The oldest `units` were done with (committed, kept in the spool, or dropped after they were taken)."""
        now = self._clock()
        for _ in range(min(units, len(self._units))):
            queued_at, rows = self._units.popleft()
            self.rows -= rows
            self.peak_lag_s = max(self.peak_lag_s, now - queued_at)

    def lag_s(self) -> float:
        """How long the oldest unit not yet done with has waited (0 with none)."""
        return self._clock() - self._units[0][0] if self._units else 0.0
