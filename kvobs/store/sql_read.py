"""Reading a SQL store into pandas: the helpers `kvobs.store.queries` builds its SQL reads on."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from sqlalchemy import Select, select

from kvobs.store.db import Store


def read(store: Store, stmt: Select) -> pd.DataFrame:
    """Run `stmt`; one column per selected expression (result processors applied: hashes come back as ints).

    Block-hash columns (`*_hash`) keep Python ints in an object column: pandas would turn a column of 64-bit
    values with gaps into float64 and lose their low bits.
    """
    with store.engine.connect() as conn:
        result = conn.execute(stmt)
        names, rows = list(result.keys()), result.all()
    columns = list(zip(*rows)) if rows else [()] * len(names)
    return pd.DataFrame({name: pd.Series(values, dtype=object if name.endswith("_hash") else None)
                         for name, values in zip(names, columns)}, columns=names)  # fmt: skip


def _columns(row_class, *exclude: str) -> list:
    return [c for c in row_class.__table__.columns if c.name not in exclude]


def _between(stmt: Select, column, since: float | None, until: float | None) -> Select:
    if since is not None:
        stmt = stmt.where(column >= since)
    if until is not None:
        stmt = stmt.where(column <= until)
    return stmt


def _lookup(store: Store, key, value, keys: Iterable, chunk: int, *where) -> dict:
    """key -> value for the given keys, `chunk` keys per query (an IN list stays within what databases take)."""
    keys, found = list(keys), {}
    with store.engine.connect() as conn:
        for i in range(0, len(keys), chunk):
            found.update(conn.execute(select(key, value).where(key.in_(keys[i : i + chunk]), *where)).all())
    return found


def _of_instances(stmt: Select, column, instances: Iterable[str] | None) -> Select:
    """`stmt` narrowed to the rows of `instances` (None: every instance)."""
    return stmt if instances is None else stmt.where(column.in_(list(instances)))
