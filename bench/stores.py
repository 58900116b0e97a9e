"""What the store benchmarks share: a plain count of `kv_events`, their baseline."""

from __future__ import annotations

from kvobs.store.sql.store import SqlStore


def count_events(store) -> int:
    """The baseline: a plain count of kv_events, in the store's own SQL."""
    if isinstance(store, SqlStore):
        with store.engine.connect() as conn:
            return conn.exec_driver_sql("SELECT count(*) FROM kv_events").scalar()
    return int(store.frame("SELECT count() AS n FROM kv_events")["n"].iloc[0])
