"""How a batch of records is written to a SQL store (SQLite, PostgreSQL): one transaction per batch.

Inserts go as one executemany per table and column set (on SQLite a driver-level executemany of tuples; KV events
held as columns, `KVEventColumns`, as one `json_each` statement there: see `_insert_columns`); upserts
and insert-if-missing are merged per key (later columns win, or the first for insert-if-missing), then sent as one
executemany of `INSERT ... ON CONFLICT` per column set (a session upsert per row once capped the writer at about
7k rows/s). The per-minute rollup of the batch's `kv_events`
(`kv_event_minutes`: sums only) is added in the same transaction, so it always equals the raw rows, and so are the
latest footprint of each session the batch's snapshots name (`session_footprints`) and the per-minute rollups of the
instance snapshots, requests and request lookups (`kvobs.store.rollups`). Used by `Store.write`, which
`StoreWriter` calls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from itertools import chain, repeat
from math import floor
from typing import TYPE_CHECKING

import msgspec
from sqlalchemy import BigInteger, Float, Integer, Numeric, SmallInteger, String, TypeDecorator, insert, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError

from kvobs.store.interface import FILL_CACHED, Batch
from kvobs.store.rollups import REQUEST_MINUTES, BatchRollups, Rollup, cached_fill_sums
from kvobs.store.rows import KVEventColumns, KVEventRecord
from kvobs.store.runs import Runs, is_null
from kvobs.store.schema import (
    FOOTPRINT_COLUMNS,
    MINUTE_S,
    TABLES,
    KVEventRow,
    SessionFootprintRow,
)
from kvobs.store.uint64 import as_int64_column, checked_uint64_column

if TYPE_CHECKING:
    import pandas as pd

_KV_COLUMNS = KVEventRecord._columns


class SqlBatchWriter:
    def __init__(self, engine, counts_before: Callable[[list[str], float], dict[str, float]]) -> None:
        """`counts_before`: instances, ts -> each one's latest stored preemption count before ts (the store's
        `lookups.instance_counter_before`), for the first batch of an instance's snapshots."""
        self.engine = engine
        self.counts_before = counts_before
        self._sqlite_inserts: dict[tuple, tuple[str, list, tuple]] = {}
        self._rollups = BatchRollups()
        self.alone = False  # no other thread of the process wants the interpreter lock (`SqlStore.write_alone`)

    def write(self, batch: Batch) -> None:
        grouped: dict[tuple[str, str, tuple], list[dict]] = defaultdict(list)
        columns: list[KVEventColumns] = []
        keyed: dict[tuple[str, str], list[dict]] = defaultdict(list)  # upserts and insert_missing, in queue order
        fills: list[dict] = []  # requests' cached tokens learnt after their rows (FILL_CACHED)
        for op, records in batch:  # one executemany per table and column set (session upserts give some columns)
            if isinstance(records, KVEventColumns):
                if len(records):  # (columns of no row: no statement, which would name no column)
                    columns.append(records)
                continue
            for record in records:
                row = record.to_row()
                if op == FILL_CACHED:
                    fills.append(row)
                elif op == "insert":
                    grouped[(op, record.table, tuple(row))].append(row)
                else:
                    keyed[(op, record.table)].append(row)
        for (op, table), rows in keyed.items():  # merged per key first, so grouping by columns cannot reorder them
            for row in _merge_per_key(TABLES[table], rows, first_wins=op == "insert_missing"):
                grouped[(op, table, tuple(row))].append(row)
        dialect = self.engine.dialect.name
        kv_rows = grouped_rows(grouped, "kv_events")
        minutes = minute_sums(
            chain(
                ((r["ts"], r["instance"], r["kind"], r.get("reason"), 1, r.get("first_owner") or 0) for r in kv_rows),
                *map(_column_minutes, columns),
            )
        )
        snaps = [r for r in grouped_rows(grouped, "snapshots") if r.get("session_id") is None]
        parts, counts = self._rollups.partials(
            snaps, grouped_rows(grouped, "requests"), self.counts_before, grouped_rows(grouped, "request_lookups")
        )
        with self.engine.begin() as conn:
            if columns:
                self._insert_columns(conn, dialect, columns)
            for (op, table, _), rows in grouped.items():
                model = TABLES[table]
                if op == "insert" and dialect == "sqlite":
                    sql, processors, defaults = self._sqlite_insert(model, tuple(rows[0]))
                    conn.exec_driver_sql(
                        sql, [(*(r[c] if p is None else p(r[c]) for c, p in processors), *defaults) for r in rows]
                    )
                elif op == "insert":
                    conn.execute(insert(model), rows)
                else:
                    conn.execute(_upsert_statement(dialect, model, tuple(rows[0]), update=op == "upsert"), rows)
            if minutes:
                conn.execute(_ADD_MINUTES, minutes)
            footprints = latest_footprints(grouped_rows(grouped, "snapshots"))
            if footprints:
                conn.execute(_footprint_upsert(dialect), footprints)
            filled = [row for row in fills if conn.execute(_FILL_CACHED, row).rowcount]  # (after their rows' insert)
            if filled:
                parts.append((REQUEST_MINUTES, cached_fill_sums(filled)))
            for rollup, frame in parts:
                added = minute_rows(frame, rollup.columns)
                if added:  # a driver-level executemany of tuples: SQLAlchemy's work per row dict cost half the time
                    conn.exec_driver_sql(_rollup_upsert(rollup, conn.dialect.paramstyle), added)
        self._rollups.commit(counts)  # once the transaction holds: a batch retried counts from the same counts

    def _insert_columns(self, conn, dialect: str, batches: list[KVEventColumns]) -> None:
        """KV events held as columns. On SQLite: one statement that reads the rows from a JSON array bound as one
        value (`json_each`), so the whole insert runs inside SQLite without Python's lock. An executemany takes
        and gives back that lock once per row, and a writer thread doing so next to a busy producer thread (the
        collector decoding the next batches) waits a thread switch interval for every row. Where no other thread
        wants the lock (`alone`: a process that only writes), the driver's executemany of tuples, which SQLite runs
        faster than `json_each`'s `json_extract` a column and row. On PostgreSQL: COPY, in the batch's transaction,
        faster than psycopg's executemany and without the row dicts SQLAlchemy's insert takes; hashes as they are
        (NUMERIC(20), as `UInt64` binds them there). (The measurements: this docstring's commit message.)"""
        names = _valued(batches)  # (a column NULL on every row is left out: NULL is its default, and binding it costs)
        if dialect == "postgresql":  # binary COPY: half the client's CPU a row of text COPY's
            with conn.connection.driver_connection.cursor() as cursor, cursor.copy(_pg_copy(names)) as copy:
                copy.set_types(_pg_copy_types(names))
                for row in _kv_rows(batches, names, checked_uint64_column):
                    copy.write_row(row)
            return
        rows = list(_kv_rows(batches, names, as_int64_column))
        if self.alone:
            conn.exec_driver_sql(_sqlite_kv_insert(names), rows)
        else:
            conn.exec_driver_sql(_sqlite_kv_json_insert(names), (_json(rows),))

    def _sqlite_insert(self, model, columns: tuple[str, ...]) -> tuple[str, list, tuple]:
        """SQLite's fast path: one driver-level executemany of tuples (SQLAlchemy's per-row work skipped), with each
        column's own bind processor (UInt64 -> text, JSON -> text) applied."""
        key = (model.__tablename__, columns)
        cached = self._sqlite_inserts.get(key)
        if cached is None:
            table, dialect = model.__table__, self.engine.dialect
            defaults = {
                c.name: c.default.arg
                for c in table.columns  # Python-side defaults Core would have applied
                if c.name not in columns and c.default is not None and c.default.is_scalar
            }
            names = [*columns, *defaults]
            sql = f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
            processors = [(c, table.c[c].type.bind_processor(dialect)) for c in columns]
            cached = self._sqlite_inserts[key] = (sql, processors, tuple(defaults.values()))
        return cached


def _valued(batches: list[KVEventColumns]) -> tuple[str, ...]:
    """The `kv_events` columns with a value on some row of the batches, in the table's order."""
    return tuple(name for name in _KV_COLUMNS if not all(is_null(c.columns[name]) for c in batches))


def _kv_rows(batches: list[KVEventColumns], names: tuple[str, ...], hashes: Callable[[list], list]) -> Iterator[tuple]:
    """The batches' rows as tuples of the `names` columns, each hash column bound by `hashes` first."""
    for c in batches:
        yield from zip(*(hashes(c.column(name)) if name.endswith("_hash") else c.column(name) for name in names))


@cache
def _pg_copy(names: tuple[str, ...]) -> str:
    return f"COPY kv_events ({', '.join(names)}) FROM STDIN (FORMAT BINARY)"


@cache
def _pg_copy_types(names: tuple[str, ...]) -> list[str]:
    """Each named `kv_events` column's PostgreSQL type, as binary COPY names them (the model's types on PostgreSQL)."""
    dialect, types = postgresql.dialect(), []
    for name in names:
        type_ = KVEventRow.__table__.c[name].type
        impl = type_.load_dialect_impl(dialect) if isinstance(type_, TypeDecorator) else type_
        types.append(next(pg for kind, pg in _PG_BINARY if isinstance(impl, kind)))
    return types


# (SQLAlchemy type, PostgreSQL's name): the narrower integers first (they are Integers too)
_PG_BINARY = (
    (SmallInteger, "int2"),
    (BigInteger, "int8"),
    (Integer, "int4"),
    (Float, "float8"),
    (Numeric, "numeric"),
    (String, "text"),  # (VARCHAR and TEXT share their binary form)
)


@cache
def _sqlite_kv_insert(names: tuple[str, ...]) -> str:
    return f"INSERT INTO kv_events ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"


@cache
def _sqlite_kv_json_insert(names: tuple[str, ...]) -> str:
    values = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(len(names)))
    return f"INSERT INTO kv_events ({', '.join(names)}) SELECT {values} FROM json_each(?)"


_json = msgspec.json.Encoder().encode


@cache
def _rollup_upsert(rollup: Rollup, paramstyle: str) -> str:
    """Add partial rows (tuples of the rollup's columns) to a rollup table, SQLite and PostgreSQL alike: sums added,
    the higher maximum and the lower minimum kept (a NULL is no value). In the driver's own parameter style."""
    merged = {"sum": "{t}.{c} + excluded.{c}"}
    merged["max"] = "CASE WHEN excluded.{c} IS NULL OR {t}.{c} >= excluded.{c} THEN {t}.{c} ELSE excluded.{c} END"
    merged["min"] = merged["max"].replace(">=", "<=")
    sets = ", ".join(f"{c} = " + merged[how].format(t=rollup.table, c=c) for c, how in rollup.how().items())
    mark = "?" if paramstyle == "qmark" else "%s"  # sqlite3; psycopg's format and pyformat
    return (
        f"INSERT INTO {rollup.table} ({', '.join(rollup.columns)}) "
        f"VALUES ({', '.join(mark for _ in rollup.columns)}) "
        f"ON CONFLICT ({', '.join(rollup.keys)}) DO UPDATE SET {sets}"
    )


# A request's cached tokens learnt later, set only where its row has none (so its minute counts them once).
_FILL_CACHED = text(
    "UPDATE requests SET cached_tokens = :cached_tokens, cached_from = :cached_from "
    "WHERE instance = :instance AND request_id = :request_id AND cached_tokens IS NULL"
)

_ADD_MINUTES = text(
    "INSERT INTO kv_event_minutes (minute, instance, kind, reason, events, blocks) "
    "VALUES (:minute, :instance, :kind, :reason, :events, :blocks) "
    "ON CONFLICT (minute, instance, kind, reason) DO UPDATE SET "
    "events = kv_event_minutes.events + excluded.events, blocks = kv_event_minutes.blocks + excluded.blocks"
)


def latest_footprints(rows: list[dict]) -> list[dict]:
    """The batch's latest session snapshot per (session, instance) (of equal times, the later row), with every
    footprint column (a column the row left out is NULL, as in `snapshots`)."""
    latest: dict[tuple, dict] = {}
    for row in rows:
        if row.get("session_id") is None:
            continue
        key = (row["session_id"], row["instance"])
        if key not in latest or row["ts"] >= latest[key]["ts"]:
            latest[key] = row
    return [{c: row.get(c) for c in FOOTPRINT_COLUMNS} for _, row in sorted(latest.items())]  # see `_in_key_order`


def _footprint_upsert(dialect_name: str):
    """Insert a footprint, or replace the stored one unless it is newer (`ts`), on SQLite and PostgreSQL alike."""
    table = SessionFootprintRow.__table__
    stmt = upsert_insert(dialect_name, table)
    return stmt.on_conflict_do_update(
        index_elements=["session_id", "instance"],
        set_={c: stmt.excluded[c] for c in FOOTPRINT_COLUMNS if c not in ("session_id", "instance")},
        where=stmt.excluded.ts >= table.c.ts,
    )


# `_in_key_order`: upserts go in primary-key order, so two writers into one PostgreSQL lock shared rows in the same
# order and never deadlock; one that still fails so is retried like an outage (`is_unreachable`), not a bad row.


def grouped_rows(grouped: dict[tuple, list[dict]], table: str) -> list[dict]:
    return [row for (op, name, _), rows in grouped.items() if name == table and op == "insert" for row in rows]


_MINUTE_KEYS = ("ts", "instance", "kind", "reason")


def minute_sums(rows: Iterable[tuple]) -> list[dict]:
    """`kv_event_minutes` increments for `kv_events` rows given as (ts, instance, kind, reason, rows, blocks), each
    tuple standing for `rows` rows of those keys whose `first_owner`s sum to `blocks`: events and blocks per minute,
    instance, kind and reason (None as '')."""
    sums: dict[tuple, list[int]] = {}
    given: tuple | None = None
    acc = [0, 0]
    for ts, instance, kind, reason, events, blocks in rows:
        if (ts, instance, kind, reason) != given:  # (a batch's rows mostly repeat the keys of the row before)
            given = (ts, instance, kind, reason)
            key = (floor(ts / MINUTE_S) * MINUTE_S, instance, kind, reason or "")  # as the reads cut minutes
            acc = sums.get(key) or sums.setdefault(key, [0, 0])
        acc[0] += events
        acc[1] += blocks
    return [
        {"minute": m, "instance": i, "kind": k, "reason": r, "events": e, "blocks": b}
        for (m, i, k, r), (e, b) in sorted(sums.items())  # in key order: see `_in_key_order`
    ]


def _column_minutes(c: KVEventColumns) -> Iterator[tuple]:
    """`minute_sums`' tuples for rows held as columns: one a run where every key column is runs of the same edges (the
    collector's: its time and instance one run, its kind and reason a run an event), else one a row."""
    keys = [c.columns[name] for name in _MINUTE_KEYS]
    owners = c.column("first_owner")
    varying = [key.lengths for key in keys if isinstance(key, Runs) and len(key.values) > 1]
    if not all(isinstance(key, Runs) for key in keys) or any(lengths != varying[0] for lengths in varying[1:]):
        yield from zip(*(c.column(name) for name in _MINUTE_KEYS), repeat(1), (o or 0 for o in owners))
        return
    start = 0
    keyed = [repeat(key.values[0]) if len(key.values) == 1 else key.values for key in keys]  # type: ignore[union-attr]
    for ts, instance, kind, reason, n in zip(*keyed, varying[0] if varying else [len(c)]):
        if n:  # (a run of no rows adds no minute)
            yield ts, instance, kind, reason, n, sum(filter(None, owners[start : start + n]))
            start += n


# PostgreSQL's serialization failure and deadlock: another writer's transaction won; the same batch succeeds again.
_RETRY_SQLSTATES = ("40001", "40P01")


def is_unreachable(exc: BaseException) -> bool:
    """True for errors worth retrying: the database cannot be reached, or a concurrent writer's transaction made this
    one fail; not a row it refuses."""
    if isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) in _RETRY_SQLSTATES:
        return True
    return isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)


def upsert_insert(dialect_name: str, table):
    """The dialect's INSERT for `table` (a Table or a model), which has `on_conflict_do_update`/`_do_nothing` on
    SQLite and PostgreSQL alike."""
    return (postgresql if dialect_name == "postgresql" else sqlite).insert(table)


def _upsert_statement(dialect_name: str, model, columns: tuple[str, ...], *, update: bool):
    """`INSERT ... ON CONFLICT (key) DO UPDATE SET <columns>` (or DO NOTHING), for an executemany of rows."""
    keys = [c.name for c in model.__table__.primary_key.columns]
    stmt = upsert_insert(dialect_name, model)
    updates = {k: stmt.excluded[k] for k in columns if k not in keys} if update else {}
    return stmt.on_conflict_do_update(index_elements=keys, set_=updates) if updates else stmt.on_conflict_do_nothing()


def _merge_per_key(model, rows: list[dict], *, first_wins: bool) -> list[dict]:
    """Merge rows for the same primary key in order (later values win unless `first_wins`): one statement per key."""
    keys = [c.name for c in model.__table__.primary_key.columns]
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row.get(k) for k in keys)
        earlier = merged.get(key, {})
        merged[key] = {**row, **earlier} if first_wins else {**earlier, **row}
    return [merged[key] for key in sorted(merged)]  # in key order: see `_in_key_order`


def minute_rows(frame: pd.DataFrame, columns: tuple[str, ...]) -> list[tuple]:
    """Partial rows keyed by `window` as tuples of the rollup table's `columns` (`window` as `minute`), NaN as None,
    plain Python values, in key order (upserts go in key order: `_in_key_order`)."""
    frame = frame.rename(columns={"window": "minute"})
    values = []
    for name in columns:
        column = frame[name]
        if column.dtype.kind == "f" and column.isna().any():
            values.append([None if v != v else v for v in column.tolist()])
        else:
            values.append(column.tolist())
    return list(zip(*values))
