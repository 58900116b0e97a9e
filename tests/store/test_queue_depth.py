"""How much a store writer holds uncommitted and for how long, now and at its peaks (what a burst leaves on the
collector's /metrics): the arithmetic on a clock of the test's own, then a real writer on SQLite."""

from __future__ import annotations

import time

from kvobs.store import StoreWriter
from kvobs.store.queue_depth import QueueDepth
from kvobs.store.rows import KVEventRecord


def test_rows_and_waits_are_counted_from_queued_to_committed():
    now = [0.0]
    depth = QueueDepth(clock=lambda: now[0])
    depth.accepted(50)
    now[0] = 1.0
    depth.accepted(30)
    now[0] = 2.0
    assert (depth.rows, depth.peak_rows, depth.lag_s(), depth.peak_lag_s) == (80, 80, 2.0, 0.0)
    now[0] = 3.0
    depth.committed(1)  # the first unit, queued at 0
    assert (depth.rows, depth.lag_s(), depth.peak_lag_s) == (30, 2.0, 3.0)
    now[0] = 3.5
    depth.committed(5)  # (more than it holds: the rest)
    assert (depth.rows, depth.peak_rows, depth.lag_s(), depth.peak_lag_s) == (0, 80, 0.0, 3.0)


def _rows(n: int, first: int = 0) -> list[KVEventRecord]:
    return [KVEventRecord(ts=1.0, instance="e0", kind="stored", block_hash=first + i) for i in range(n)]


def test_a_writer_says_what_it_holds_until_it_is_committed(store):
    writer = StoreWriter(store, batch_size=10_000, flush_interval_s=30.0)  # (rows wait for the flush)
    for unit in range(3):
        assert writer.add_many(_rows(100, unit * 100))
    time.sleep(0.3)
    rows, lag_s, peak_rows, peak_lag_s = writer.depth_now()
    assert (rows, peak_rows, peak_lag_s) == (300, 300, 0.0) and lag_s >= 0.3
    assert writer.flush()
    rows, lag_s, peak_rows, peak_lag_s = writer.depth_now()
    assert (rows, lag_s, peak_rows) == (0, 0.0, 300) and peak_lag_s >= 0.3
    writer.close()
    assert writer.num_written == 300 and writer.num_full == 0


def test_units_that_find_the_queue_full_are_counted(store):
    writer = StoreWriter(store, max_queue=10, flush_interval_s=30.0)
    assert not writer.add_many(_rows(11))  # (more than it ever holds: dropped)
    assert writer.add_many(_rows(6, 100))
    assert not writer.add_many(_rows(6, 200), wait_s=0.2)  # waited for room, none came: dropped
    assert (writer.num_full, writer.num_dropped) == (2, 17)
    assert writer.depth_now()[0] == 6
    writer.close()
