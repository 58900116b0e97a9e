"""Count and log what a collector skips: malformed frames, bad bodies, unknown events, full queues.

    drops = DropCounter()
    drops.count("kv_events", "truncated", "expected 3 frames, got 2")
    drops.totals()            # {"kv_events": 1}: fed to kvobs_telemetry_dropped_total{component}

Each (component, kind) pair is logged on its 1st, 10th, 100th and every 1000th occurrence, so a stream of
garbage neither floods the log nor goes unnoticed.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from kvobs.logs import worth_logging

log = logging.getLogger(__name__)


class DropCounter:
    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def count(self, component: str, kind: str, detail: str = "", n: int = 1) -> None:
        with self._lock:
            self._counts[(component, kind)] += n
            total = self._counts[(component, kind)]
        if worth_logging(total):
            log.warning("%s: skipped %s (%d so far)%s", component, kind, total, f": {detail}" if detail else "")

    def get(self, component: str, kind: str | None = None) -> int:
        with self._lock:
            return sum(n for (c, k), n in self._counts.items() if c == component and kind in (None, k))

    def counts(self) -> dict[tuple[str, str], int]:
        """(component, kind) -> dropped: what a stream worker reports to its collector."""
        with self._lock:
            return dict(self._counts)

    def totals(self) -> dict[str, int]:
        """Dropped items per component."""
        out: Counter[str] = Counter()
        with self._lock:
            for (component, _), n in self._counts.items():
                out[component] += n
        return dict(out)
