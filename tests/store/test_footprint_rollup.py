"""`session_footprints`, the rollup of session snapshots: what `queries.session_footprints` answers from it equals
the latest raw snapshot per (session, instance) in the window, on SQLite, PostgreSQL and chDB: over everything, a
window reaching the present, a window in the past (the raw fallback), one instance; NULL columns kept; equal times
resolved to the row written last; and revision 0007 fills it from snapshots stored before it."""

from __future__ import annotations

import random

import pandas as pd

from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import SnapshotRecord
from kvobs.store.schema import FOOTPRINT_COLUMNS
from kvobs.store.sql.store import upgrade


def _snapshots(seed: int = 3) -> list[SnapshotRecord]:
    rng = random.Random(seed)
    rows = []
    for i in range(400):
        ts = 1000.0 + (i // 2) * 0.5  # two rows at each time: the later-written one is the latest
        session = None if i % 7 == 0 else f"s{rng.randrange(12)}"
        pending = None if rng.random() < 0.3 else rng.randrange(5)
        rows.append(
            SnapshotRecord(
                ts=ts,
                instance=rng.choice(["a", "b"]),
                session_id=session,
                kv_usage=None if session else rng.random(),
                session_blocks=rng.randrange(50),
                session_evicted_blocks=i,
                session_pending_idle_blocks=pending,
            )
        )
    for blocks in (7, 8):  # a session's latest two rows at one time: the one written last is its footprint
        rows.append(SnapshotRecord(ts=1200.0, instance="a", session_id="s0", session_blocks=blocks))
    return rows


def _expected(rows: list[SnapshotRecord], since=None, until=None, instances=None) -> list[tuple]:
    """The definition: each (session, instance)'s latest snapshot in the window, of equal times the last written."""
    latest: dict[tuple, SnapshotRecord] = {}
    for row in rows:
        if row.session_id is None or (instances is not None and row.instance not in instances):
            continue
        if (since is not None and row.ts < since) or (until is not None and row.ts > until):
            continue
        key = (row.session_id, row.instance)
        if key not in latest or row.ts >= latest[key].ts:
            latest[key] = row
    return sorted(tuple(getattr(r, c) for c in FOOTPRINT_COLUMNS) for r in latest.values())


def _answer(frame: pd.DataFrame) -> list[tuple]:
    assert list(frame.columns) == list(FOOTPRINT_COLUMNS)
    return sorted(
        tuple(None if pd.isna(v) else v.item() if hasattr(v, "item") else v for v in row)
        for row in frame.itertuples(index=False)
    )


def test_the_rollup_answers_what_the_raw_snapshots_answer(any_store):
    rows = _snapshots()
    writer = StoreWriter(any_store, batch_size=1)  # a batch per row: equal times meet across batches too
    for row in rows:
        writer.add(row)
    writer.close()
    for since, until, instances in [
        (None, None, None),
        (1040.0, None, None),
        (1010.0, 1060.5, None),
        (None, 1030.0, ["b"]),
        (1000.0, 1099.5, ["a"]),
        (None, None, []),
        (1010.0, 1e6, None),  # a window past the newest footprint (a page's, reaching the present): no raw read
    ]:
        answer = any_store.reads.session_footprints(since, until, instances=instances)
        assert _answer(answer) == _expected(rows, since, until, instances), (since, until, instances)
    assert _expected(rows, None, 1030.0)  # the past window holds sessions whose latest came later


def test_revision_0007_fills_the_rollup_from_stored_snapshots(store):
    rows = _snapshots(5)
    upgrade(store.engine, "0006")
    writer = StoreWriter(store)
    writer.add_many([r for r in rows if r.ts < 1050.0])
    writer.close()  # written before the rollup existed: only the raw rows
    upgrade(store.engine)
    writer = StoreWriter(store)
    writer.add_many([r for r in rows if r.ts >= 1050.0])
    writer.close()
    assert _answer(store.reads.session_footprints()) == _expected(rows)


def test_the_clickhouse_migration_fills_the_rollup_from_stored_snapshots(tmp_path):
    from kvobs.store.clickhouse import ddl

    url = f"chdb:///{tmp_path / 'ch'}"
    first = open_store(url, migrate=False)
    ddl.migrate_to(first.client, 1)
    rows = _snapshots(9)
    writer = StoreWriter(first)
    writer.add_many(rows[:250])
    writer.close()
    first.close()
    store = open_store(url)
    writer = StoreWriter(store)
    writer.add_many(rows[250:])
    writer.close()
    assert _answer(store.reads.session_footprints()) == _expected(rows)
    store.close()
