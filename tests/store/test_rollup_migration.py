"""Revision 0005 on a store that already holds KV events: `first_owner` is set on one row per block event and the
per-minute rollup is filled from the rows, so answers before and after the upgrade agree."""

from __future__ import annotations

from sqlalchemy import text

from kvobs.store import open_store
from kvobs.store.sql.store import upgrade

ROWS = [  # ts, kind, block_hash, session_id, reason: block 7 lost by two owners at once, block 9 by one
    (100.0, "stored", "7", "a", None),
    (100.5, "stored", "9", "a", None),
    (130.0, "evicted", "7", "a", "capacity"),
    (130.0, "evicted", "7", "b", "capacity"),
    (185.0, "evicted", "9", "a", "capacity"),
    (190.0, "cleared", None, None, "reset"),
]


def test_upgrading_a_filled_store_sets_first_owner_and_fills_the_rollup(store_url):
    store = open_store(store_url, migrate=False)
    upgrade(store.engine, "0004")
    with store.engine.begin() as conn:
        for ts, kind, block, session, reason in ROWS:
            conn.execute(
                text(
                    "INSERT INTO kv_events (ts, instance, kind, block_hash, session_id, reason) VALUES "
                    "(:ts, 'e', :kind, :block, :session, :reason)"
                ),
                {"ts": ts, "kind": kind, "block": block, "session": session, "reason": reason},
            )
    upgrade(store.engine)
    with store.engine.connect() as conn:
        flags = conn.execute(text("SELECT kind, first_owner FROM kv_events ORDER BY id")).all()
        minutes = conn.execute(
            text("SELECT minute, kind, reason, events, blocks FROM kv_event_minutes ORDER BY minute, kind")
        ).all()
    assert [f for _, f in flags] == [1, 1, 1, 0, 1, None]
    assert [tuple(m) for m in minutes] == [
        (60.0, "stored", "", 2, 2),
        (120.0, "evicted", "capacity", 2, 1),
        (180.0, "cleared", "reset", 1, 0),
        (180.0, "evicted", "capacity", 1, 1),
    ]
    losses = store.reads.block_losses(bucket_s=60)
    assert losses["blocks"].tolist() == [1, 1]  # block 7 once though two owners recorded it
    store.close()
