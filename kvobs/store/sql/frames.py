"""Reading a SQL store into pandas: the helpers `SqlReads` and `SqlLookups` build their reads on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import pandas as pd
from sqlalchemy import CompoundSelect, Engine, Select, select

from kvobs.store.uint64 import UInt64


class SqlSource(Protocol):
    """What the reads and lookups use of a SQL store (`kvobs.store.sql.store.SqlStore`): its engine. A type of their
    own, so the rooms the store is built of never import the store."""

    @property
    def engine(self) -> Engine: ...


def read(store: SqlSource, stmt: Select | CompoundSelect) -> pd.DataFrame:
    """Run `stmt`; one column per selected expression (result processors applied: hashes come back as ints).

    Block-hash columns (`*_hash`) keep Python ints in an object column: pandas would turn a column of 64-bit
    values with gaps into float64 and lose their low bits.

    Rows are fetched from the driver's cursor into a frame in one pass (`DataFrame.from_records`, which infers each
    column's type as a Series of its values would), and each column's result processor (the hash type's, JSON's)
    is applied a column at a time, only where the type has one: SQLAlchemy's row objects cost as much as the query
    itself when a page reads 100,000 rows, and transposing the rows in Python cost half as much again.
    """
    dialect = store.engine.dialect
    with store.engine.connect() as conn:
        result = conn.execute(stmt)
        names, rows = list(result.keys()), result.cursor.fetchall()
        result.close()
    if not rows:
        return pd.DataFrame(
            {name: pd.Series((), dtype=object if name.endswith("_hash") else None) for name in names}, columns=names
        )
    frame = pd.DataFrame.from_records(rows, columns=names)
    for i, (name, column) in enumerate(zip(names, stmt.selected_columns)):
        process = _column_processor(column.type, dialect)
        if process is not None or name.endswith("_hash"):  # from the raw values, not the inferred column
            values = [row[i] for row in rows]
            frame[name] = pd.Series(
                values if process is None else process(values), dtype=object if name.endswith("_hash") else None
            )
    return frame


def _column_processor(column_type, dialect):
    """What turns a column's raw values into Python values (the hash type's, JSON's); None where they are used as
    they come."""
    if isinstance(column_type, UInt64):
        return UInt64.column_from_db
    process = column_type.result_processor(dialect, None)
    return None if process is None else (lambda values: [process(v) for v in values])


def _columns(row_class, *exclude: str) -> list:
    return [c for c in row_class.__table__.columns if c.name not in exclude]


def _between(stmt: Select, column, since: float | None, until: float | None) -> Select:
    if since is not None:
        stmt = stmt.where(column >= since)
    if until is not None:
        stmt = stmt.where(column <= until)
    return stmt


def _lookup(store: SqlSource, key, value, keys: Iterable, chunk: int, *where) -> dict:
    """key -> value for the given keys, `chunk` keys per query (an IN list stays within what databases take)."""
    keys, found = list(keys), dict[object, object]()
    with store.engine.connect() as conn:
        for i in range(0, len(keys), chunk):
            found.update(conn.execute(select(key, value).where(key.in_(keys[i : i + chunk]), *where)).all())
    return found


def _of_instances(stmt: Select, column, instances: Iterable[str] | None) -> Select:
    """`stmt` narrowed to the rows of `instances` (None: every instance)."""
    return stmt if instances is None else stmt.where(column.in_(list(instances)))
