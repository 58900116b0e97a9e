"""Which backend answers a read: SQL stores run `kvobs.store.queries` as written; ClickHouse runs its namesakes
(the collector's lookups in `clickhouse.lookups`, every other read in `clickhouse.reads`)."""

from __future__ import annotations

import functools


def per_backend(read_sql):
    """The decorated SQL read, or on a ClickHouse store its namesake in `kvobs.store.clickhouse`."""

    @functools.wraps(read_sql)
    def call(store, *args, **kwargs):
        if store.dialect == "clickhouse":
            from kvobs.store.clickhouse import lookups, reads

            found = getattr(reads, read_sql.__name__, None) or getattr(lookups, read_sql.__name__)
            return found(store, *args, **kwargs)
        return read_sql(store, *args, **kwargs)

    return call
