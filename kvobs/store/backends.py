"""Which backend answers a read: SQL stores run `kvobs.store.queries` as written; ClickHouse runs its namesakes."""

from __future__ import annotations

import functools


def per_backend(read_sql):
    """The decorated SQL read, or on a ClickHouse store its namesake in `kvobs.store.clickhouse.reads`."""

    @functools.wraps(read_sql)
    def call(store, *args, **kwargs):
        if store.dialect == "clickhouse":
            from kvobs.store.clickhouse import reads

            return getattr(reads, read_sql.__name__)(store, *args, **kwargs)
        return read_sql(store, *args, **kwargs)

    return call
