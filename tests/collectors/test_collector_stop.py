"""What a collector's stop decides: the streams' final footprints read the sessions' ends from the store, and the
stop writes the ends its own steps gave (the framework agents' steps, joined from their spans) before it reads them.
On the recorded two-replica `kvobs serve` run, a store slower than the collector (each write waits a while first, as
a loaded database's would) must give the same final footprints as a fast one: every session ended, so no loss is
left pending."""

from __future__ import annotations

import time

from kvobs.store import open_store
from tests.collectors.fleet_recording import collect_fleet_recording

LATEST = (
    "SELECT s.session_id, s.session_pending_idle_blocks, x.ended_at FROM snapshots s JOIN sessions x USING (session_id)"
    " WHERE s.id IN (SELECT max(id) FROM snapshots WHERE session_id IS NOT NULL GROUP BY instance, session_id)"
)


def _final_footprints(url: str, write_wait_s: float) -> list[tuple]:
    store = open_store(url)
    write = store.write

    def slow_write(batch, **kwargs):
        time.sleep(write_wait_s)
        return write(batch, **kwargs)

    store.write = slow_write
    try:
        with collect_fleet_recording(store, workers=1):
            pass
        with store.engine.connect() as conn:
            return sorted(tuple(row) for row in conn.exec_driver_sql(LATEST).all())
    finally:
        store.close()


def test_the_final_footprints_wait_for_the_session_ends_a_slow_store_has_not_written(tmp_path):
    fast = _final_footprints(f"sqlite:///{tmp_path / 'fast.db'}", 0.0)
    slow = _final_footprints(f"sqlite:///{tmp_path / 'slow.db'}", 0.5)
    assert len(fast) >= 3 and all(ended is not None for _, _, ended in fast)  # every session's end is known
    assert [pending for _, pending, _ in slow] == [pending for _, pending, _ in fast] == [0] * len(fast)
    assert slow == fast
