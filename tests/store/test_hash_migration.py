"""Revision 0006 on a store that already holds KV events: SQLite's decimal-text hashes become 8-byte integers with
the same bits, every value (0, 2^63 - 1, 2^63, 2^64 - 1) reads back unchanged, and joins on hashes still match."""

from __future__ import annotations

from sqlalchemy import inspect, text

from kvobs.store import open_store
from kvobs.store.sql.store import upgrade

EDGES = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 12_345_678_901_234_567_890]


def test_upgrading_turns_text_hashes_into_integers_with_the_same_values(store_url):
    store = open_store(store_url, migrate=False)
    upgrade(store.engine, "0005")
    with store.engine.begin() as conn:
        for i, block in enumerate(EDGES):
            conn.execute(
                text(
                    "INSERT INTO kv_events (ts, instance, kind, block_hash, parent_hash, session_id) "
                    "VALUES (:ts, 'e', 'stored', :block, :parent, 's')"
                ),
                {"ts": 100.0 + i, "block": str(block), "parent": str(EDGES[i - 1]) if i else None},
            )
        conn.execute(
            text(
                "INSERT INTO kv_events (ts, instance, kind, block_hash, session_id) "
                "VALUES (200.0, 'e', 'stored', :block, 's')"
            ),
            {"block": str(2**64 - 1)},
        )
    indexes = {ix["name"] for ix in inspect(store.engine).get_indexes("kv_events")}
    upgrade(store.engine, "0020")
    assert {ix["name"] for ix in inspect(store.engine).get_indexes("kv_events")} >= indexes  # the rebuild keeps them
    upgrade(store.engine)  # 0021 drops the block-hash index (no read needs it), and only it
    after = {ix["name"] for ix in inspect(store.engine).get_indexes("kv_events")}
    assert after == indexes - {"ix_kv_events_block_hash"} and "ix_kv_events_block_hash" in indexes
    events = store.reads.kv_events(kinds=["stored"])
    assert events["block_hash"].tolist() == [*EDGES, 2**64 - 1]
    assert events["parent_hash"].tolist()[1:6] == EDGES[:-1] and events["parent_hash"].isna().tolist()[0]
    with store.engine.connect() as conn:
        again = "SELECT block_hash, count(*) FROM kv_events GROUP BY block_hash HAVING count(*) > 1"
        top = [tuple(row) for row in conn.execute(text(again))]
    assert [(int(h) % 2**64, n) for h, n in top] == [(2**64 - 1, 2)]  # grouped by the integer (signed on SQLite)
    if store.dialect == "sqlite":
        with store.engine.connect() as conn:
            kinds = conn.execute(text("SELECT DISTINCT typeof(block_hash) FROM kv_events")).scalars().all()
        assert kinds == ["integer"]
        upgrade_down(store)
        with store.engine.connect() as conn:
            back = conn.execute(text("SELECT block_hash FROM kv_events ORDER BY id")).scalars().all()
        assert back == [str(v) for v in [*EDGES, 2**64 - 1]]
    store.close()


def upgrade_down(store) -> None:
    from alembic import command
    from alembic.config import Config

    from kvobs.store.sql.store import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0005")
