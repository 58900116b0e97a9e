"""Retention: raw KV events older than N days are dropped (`--retention-days` of `kvobs serve` and `kvobs collect`),
and the progress marks of replicas and verdict keepers not heard of for as long (`rows.PROGRESS_TABLES`).

    retention = Retention(store, days=7)      # a thread: at start, then every hour
    retention.start(); ...; retention.stop()
    retention.num_expired                     # rows dropped so far: kvobs_store_rows_expired_total{table="kv_events"}

`kv_events` is what grows with traffic (a busy replica: ~100M rows a day); sessions, steps, requests, snapshots,
scraped samples and alerts are kept. On SQL stores old rows go in chunked deletes (50,000 rows per transaction, by
the `ts` index), so the writer is never held up for long. On ClickHouse whole day partitions are dropped once every
row in them is older than the cut, so a row lives N to N+1 days; nothing is rewritten.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvobs.store.schema import DAY_S

log = logging.getLogger(__name__)

EXPIRED_TABLE = "kv_events"  # the table retention trims (the stores' expire_kv_events)


class Retention:
    """Drop KV events older than `days` at start and every `interval_s`, on its own thread."""

    def __init__(self, store, days: float, *, interval_s: float = 3600.0, clock: Callable[[], float] = time.time):
        if days <= 0:
            raise ValueError(f"--retention-days must be positive; got {days}")
        self.store = store
        self.days = days
        self.interval_s = interval_s
        self.clock = clock
        self.num_expired = 0
        self.num_progress_expired = 0  # progress marks dropped so far
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvobs-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def run_once(self) -> int:
        cut = self.clock() - self.days * DAY_S
        expired = self.store.expire_kv_events(cut)  # whole days on ClickHouse
        self.num_expired += expired
        if expired:
            log.info("retention: %d KV events older than %g days dropped", expired, self.days)
        marks = self.store.expire_progress(cut)
        self.num_progress_expired += marks
        if marks:
            log.info("retention: %d progress marks not updated for %g days dropped", marks, self.days)
        return expired

    def _run(self) -> None:
        while True:
            try:
                self.run_once()
            except Exception:  # an unreachable store: try again next round; the service goes on
                log.exception("retention: dropping old KV events failed")
            if self._stop.wait(self.interval_s):
                return
