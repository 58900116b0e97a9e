"""Increases of monotonic series between scrapes, across server restarts.

    tracker = CounterTracker()
    tracker.increase(key, value=120.0, created=t0)   # None: first sight, no increase yet
    tracker.increase(key, value=150.0, created=t0)   # 30.0
    tracker.increase(key, value=4.0, created=t1)     # 4.0: the server restarted (value fell or _created moved)

Prometheus' rule: a counter that goes down was reset to zero, so everything it now holds is new. A
restart is also recognised by a changed `_created` timestamp, which catches the case where the new
process already counted past the old value. Never negative, never counted twice.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass
class _Last:
    value: float
    created: float | None


class CounterTracker:
    def __init__(self) -> None:
        self._last: dict[Hashable, _Last] = {}
        self.num_resets = 0

    def increase(self, key: Hashable, value: float, created: float | None = None) -> float | None:
        """The increase since the previous call for `key`; None the first time `key` is seen."""
        last = self._last.get(key)
        self._last[key] = _Last(value, created)
        if last is None:
            return None
        restarted = value < last.value or (created is not None and last.created is not None and created != last.created)
        if restarted:
            self.num_resets += 1
            return value
        return value - last.value
