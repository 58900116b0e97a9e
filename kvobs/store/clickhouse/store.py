"""A store on ClickHouse: a server (`clickhouse://`) or chDB in this process (`chdb:///dir`).

    store = open_clickhouse("chdb:///var/lib/kvobs/ch")
    store.write([("insert", [KVEventRecord(...), ...])], token="...")   # what StoreWriter calls
    store.reads.steps(since, until)                                     # ClickHouseReads (also: store.lookups)
    frame = store.frame("SELECT count() AS n FROM kv_events")           # what the reads and lookups call

Inserts are column-oriented (one Arrow table per table and batch, the types read from the database's own schema)
and carry the batch's token, so a batch retried after a lost answer is not stored twice. Sessions are the one
table that is updated column by column (the agent SDK, the engine and the collector each write some columns):
the writer reads the current row (`FINAL`), merges the new columns into it and inserts the result as a newer
version of the `ReplacingMergeTree` row. Two writers updating one session in the same instant may each miss the
other's columns; each session's writers are normally one SDK and one engine or collector, which write at its start
and its steps.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import make_url

from kvobs.store.clickhouse import ddl
from kvobs.store.clickhouse.client import ChdbClient, HttpClient, StoreUnreachable
from kvobs.store.clickhouse.leases import ClickHouseLeases
from kvobs.store.clickhouse.lookups import ClickHouseLookups
from kvobs.store.clickhouse.reads import ClickHouseReads
from kvobs.store.clickhouse.rollups import as_arrow
from kvobs.store.interface import FILL_CACHED, Batch, Lookups, Reads, missing_store
from kvobs.store.leases import Leases
from kvobs.store.rollups import PREEMPTIONS, REQUEST_MINUTES, BatchRollups, cached_fill_sums
from kvobs.store.rows import PROGRESS_TABLES, KVEventColumns, KVEventRecord, SessionRecord
from kvobs.store.runs import Runs, as_list, is_null
from kvobs.store.schema import DAY_S

log = logging.getLogger(__name__)

DEFAULT_HTTP_PORT = 8123
GENERATED = ("id", "version")  # columns the writer fills: the row id and the row version
# Row ids: a microsecond counter from the clock above bits drawn per process, so two writers into one store do not
# take the same id (unless they drew the same bits), and ids increase in insert order, as SQL's row ids do.
ID_TAG_BITS = 12
_ID_TAG = secrets.randbits(ID_TAG_BITS)
_next_id = [time.time_ns() // 1000]
_id_lock = threading.Lock()


def open_clickhouse(url: str, *, migrate: bool = True, must_exist: bool = False) -> ClickHouseStore:
    """Connect to `clickhouse://[user[:password]@]host[:port]/database` or open `chdb:///dir`; migrate.

    `?async_insert=1`: the server buffers inserts from many small writers into few parts (ClickHouse's asynchronous
    inserts); each insert still waits until its rows are written (`wait_for_async_insert`), and a retried batch is
    still stored once (`async_insert_deduplicate`). `must_exist` is the SQLite file's: a ClickHouse database that
    is not there is created by the migrations; a chDB directory that is not there is refused with `must_exist` (a
    reader), else created by chDB."""
    parsed = make_url(url)
    settings = _insert_settings(url, dict(parsed.query))
    if parsed.drivername == "chdb":
        if not parsed.database:
            raise ValueError(f"chdb URL {url!r} names no directory: chdb:///relative/dir or chdb:////absolute/dir")
        if must_exist and not Path(parsed.database).is_dir():
            raise missing_store(url, parsed.database)
        client: ChdbClient | HttpClient = ChdbClient(parsed.database, insert_settings=settings)
    else:
        client = HttpClient(
            parsed.host or "localhost",
            parsed.port or DEFAULT_HTTP_PORT,
            parsed.username or "default",
            parsed.password or "",
            parsed.database or "default",
            insert_settings=settings,
        )
    if migrate:
        ddl.migrate(client)
    return ClickHouseStore(parsed.render_as_string(hide_password=True), client)


def _insert_settings(url: str, query: dict) -> dict[str, int]:
    unknown = set(query) - {"async_insert"}
    if unknown:
        raise ValueError(f"store URL {url!r}: unknown option(s) {', '.join(sorted(unknown))}; known: async_insert=1")
    if query.get("async_insert", "0") not in ("0", "1"):
        raise ValueError(f"store URL {url!r}: async_insert must be 0 or 1")
    if query.get("async_insert") == "1":
        return {"async_insert": 1, "wait_for_async_insert": 1, "async_insert_deduplicate": 1}
    return {}


@dataclass
class ClickHouseStore:
    url: str
    client: ChdbClient | HttpClient
    batch_rows: int = 50_000  # ClickHouse wants few, large inserts
    flush_interval_s: float = 1.0
    dialect: str = "clickhouse"
    _types: dict[str, dict[str, str]] = field(default_factory=dict)
    _rollups: BatchRollups = field(default_factory=BatchRollups)

    def __post_init__(self) -> None:
        self.reads: Reads = ClickHouseReads(self)
        self.lookups: Lookups = ClickHouseLookups(self)
        self.leases: Leases = ClickHouseLeases(self)

    # ---- writes ----------------------------------------------------------------------------------------------
    def write(self, batch: Batch, *, token: str | None = None) -> None:
        """One insert per table; session upserts merged into their current rows first."""
        rows: dict[str, list[dict]] = {}
        sessions: list[tuple[str, SessionRecord]] = []
        kv_columns: list[KVEventColumns] = []
        fills: list[dict] = []
        for op, records in batch:
            if isinstance(records, KVEventColumns):
                kv_columns.append(records)
                continue
            for record in records:
                if op == FILL_CACHED:
                    fills.append(record.to_row())
                elif isinstance(record, SessionRecord):
                    sessions.append((op, record))
                else:
                    rows.setdefault(record.table, []).append(record.to_row())
        if sessions:
            rows["sessions"] = self._merged_sessions(sessions)
        tables: dict[str, dict[str, list | Runs]] = {table: _columns_of(made) for table, made in rows.items()}
        if kv_columns:  # KV events held as columns, with any given as records: one insert
            tables["kv_events"] = _joined([c.columns for c in kv_columns] + [tables.get("kv_events", {})])
        for table, columns in tables.items():
            self.client.insert(table, self._arrow(table, columns), token=f"{token}-{table}" if token else None)
        snaps = [r for r in rows.get("snapshots", ()) if r.get("session_id") is None]
        parts, counts = self._rollups.partials(
            snaps, rows.get("requests", []), self._counts_before, rows.get("request_lookups")
        )
        filled = self._fill_cached(fills, token)
        if filled:
            parts.append((REQUEST_MINUTES, cached_fill_sums(filled)))
        for rollup, frame in parts:  # after the raw rows: a rollup never holds what its rows do not
            if not frame.empty:
                table = rollup.table
                self.client.insert(table, as_arrow(rollup, frame), token=f"{token}-{table}" if token else None)
        self._rollups.commit(counts)

    def _fill_cached(self, fills: list[dict], token: str | None) -> list[dict]:
        """Requests' cached tokens learnt later (`FILL_CACHED`): each whose stored row has none is inserted again, a
        newer version with them; the ones filled."""
        if not fills:
            return []
        empty = set(
            self.frame(
                """SELECT instance, request_id FROM requests FINAL
                WHERE request_id IN {keys:Array(String)} AND cached_tokens IS NULL""",
                {"keys": sorted({row["request_id"] for row in fills})},
            ).itertuples(index=False, name=None)
        )
        filled = []
        for row in fills:  # the first fill of a request wins, as on SQL
            key = (row["instance"], row["request_id"])
            if key in empty:
                empty.discard(key)
                filled.append(row)
        if filled:
            table = "requests"
            columns = self._arrow(table, _columns_of(filled))
            self.client.insert(table, columns, token=f"{token}-{table}-filled" if token else None)
        return filled

    def _counts_before(self, instances: list[str], ts: float) -> dict[str, float]:
        return self.lookups.instance_counter_before(PREEMPTIONS, ts, instances=instances)

    def _merged_sessions(self, items: list[tuple[str, SessionRecord]]) -> list[dict]:
        keys = sorted({record.session_id for _, record in items})
        current = {
            row["session_id"]: row
            for row in self.frame(
                "SELECT * EXCEPT version FROM sessions FINAL WHERE session_id IN {keys:Array(String)}",
                {"keys": keys},
            ).to_dict("records")
        }
        changed: dict[str, dict] = {}
        for op, record in items:
            row = record.to_row()
            if op == "insert_missing" and record.session_id in current:
                continue
            current[record.session_id] = changed[record.session_id] = {**current.get(record.session_id, {}), **row}
        return list(changed.values())

    def _arrow(self, table: str, given: dict[str, list | Runs]) -> pa.Table:
        """The insert's Arrow table from columns (lists, or `Runs` taken by index): a Nullable column with no value is
        left out (ClickHouse's default is NULL: no column to encode, send and parse); NaN and pandas' NA are NULL; a
        NULL in a column that cannot hold one is the type's zero."""
        n = len(next(iter(given.values()))) if given else 0
        columns = {}
        takes: dict[int, tuple] = {}  # runs' lengths (by identity) -> their row -> run indices
        for name, ch_type in self.column_types(table).items():
            if name in GENERATED:
                columns[name] = _take_ids(n)
                continue
            nullable = ch_type.startswith(("Nullable", "LowCardinality(Nullable"))
            values = given.get(name)
            if nullable and (values is None or is_null(values)):
                continue
            column = _arrow_column(Runs.of(None, n) if values is None else values, _arrow_type(ch_type), takes)
            if nullable and column.null_count == n:  # (NaN and pandas' NA, which are not None)
                continue
            if column.null_count and not nullable:
                if ch_type.startswith("Map"):
                    column = pa.array([{} if v is None else v for v in column.to_pylist()], column.type)
                else:
                    column = pc.fill_null(column, "" if "String" in ch_type else 0)
            columns[name] = column
        return pa.table(columns)

    def column_types(self, table: str) -> dict[str, str]:
        """Column name -> ClickHouse type, as the database has the table (read once)."""
        if table not in self._types:
            described = self.client.query_df(f"DESCRIBE TABLE {table}")
            self._types[table] = {
                n: t
                for n, t, kind in zip(described["name"], described["type"], described["default_type"])
                if kind != "ALIAS"
            }
        return self._types[table]

    def is_unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, StoreUnreachable)

    def expire_kv_events(self, before_ts: float, *, chunk: int = 0) -> int:
        """Drop `kv_events`' day partitions (`ddl`: numbered by day) that end at or before `before_ts`, so a row
        lives whole days; rows dropped (`chunk` is the SQL stores'; a partition goes at once)."""
        table = KVEventRecord.table
        parts = self.frame(
            """SELECT partition, toInt64(sum(rows)) AS rows FROM system.parts WHERE active
            AND database = currentDatabase() AND table = {table:String} GROUP BY partition""",
            {"table": table},
        )
        dropped = 0
        for partition, rows in zip(parts["partition"], parts["rows"]):
            if (int(partition) + 1) * DAY_S <= before_ts:
                self.client.command(f"ALTER TABLE {table} DROP PARTITION {int(partition)}")
                dropped += int(rows)
        return dropped

    def expire_progress(self, before_ts: float) -> int:
        """Delete the progress marks (`rows.PROGRESS_TABLES`) last updated before `before_ts` (a lightweight delete:
        a table of a row per replica or keeper); rows deleted."""
        dropped, old = 0, {"ts": before_ts}
        for table in PROGRESS_TABLES:
            dropped += int(
                self.frame(f"SELECT count() AS n FROM {table} WHERE updated_at < {{ts:Float64}}", old)["n"][0]
            )
            self.client.command(f"DELETE FROM {table} WHERE updated_at < {{ts:Float64}}", old)
        return dropped

    # ---- reads -----------------------------------------------------------------------------------------------
    def frame(self, sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Run a query; columns as `kvobs.store.sql.frames.read` gives them on SQL (see `_as_sql_frame`)."""
        return _as_sql_frame(self.client.query_df(sql, params))

    def close(self) -> None:
        self.client.close()


def _as_sql_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The same values and dtypes a SQL store's read gives: hashes as Python ints (object), integers with gaps as
    float64 with NaN, unsigned counts as int64, missing strings as pandas' missing value. Column-wise, no Python loop
    over rows (a page may read millions)."""
    out = {}
    for name in frame.columns:
        column = frame[name]
        if name.endswith("_hash"):
            out[name] = pd.Series(column.to_numpy(dtype=object, na_value=None), dtype=object)
        elif pd.api.types.is_integer_dtype(column.dtype):
            out[name] = column.astype("float64") if column.isna().any() else column.astype("int64")
        elif pd.api.types.is_float_dtype(column.dtype):
            out[name] = column.astype("float64")
        elif pd.api.types.is_bool_dtype(column.dtype):
            out[name] = column.astype(bool)
        elif isinstance(column.dtype, pd.StringDtype):
            out[name] = column  # pandas' string column, as a SQL read of strings gives
        else:
            values = column.to_numpy(dtype=object, copy=True)
            values[pd.isna(values)] = None
            kind = pd.api.types.infer_dtype(values, skipna=True)
            out[name] = pd.Series(values) if kind in ("string", "empty") else pd.Series(values, dtype=object)
    return pd.DataFrame(out, columns=list(frame.columns))


def _take_ids(n: int) -> pa.Array:
    """`n` row ids from the process's counter, increasing (see `ID_TAG_BITS`)."""
    with _id_lock:
        start = max(_next_id[0], time.time_ns() // 1000)
        _next_id[0] = start + n
    counters = np.arange(start, start + n, dtype=np.uint64)
    return pa.array((counters << np.uint64(ID_TAG_BITS)) | np.uint64(_ID_TAG), pa.uint64())


def _columns_of(rows: list[dict]) -> dict[str, list | Runs]:
    names = dict.fromkeys(name for row in rows for name in row)
    return {name: [row.get(name) for row in rows] for name in names}


def _joined(parts: list[dict[str, list | Runs]]) -> dict[str, list | Runs]:
    """Columns appended part after part (a column a part lacks is None there); runs stay runs where every part's
    are. (It runs once an insert over its hundreds of parts: no Python call a part and column.)"""
    parts = [p for p in parts if p]
    names = dict.fromkeys(chain.from_iterable(parts))
    sizes = [len(next(iter(part.values()))) for part in parts]
    whole = all(part.keys() == names.keys() for part in parts)  # (every part a KVEventColumns: the usual case)
    joined: dict[str, list | Runs] = {}
    shared: dict[tuple[int, ...], tuple[list, list[int]]] = {}  # the parts' run lengths (by identity), joined once
    for name in names:
        if whole:
            columns = [part[name] for part in parts]
        else:
            columns = [Runs.of(None, n) if (c := part.get(name)) is None else c for part, n in zip(parts, sizes)]
        held = set(map(type, columns))
        if held == {Runs}:
            key = tuple([id(c.lengths) for c in columns])  # type: ignore[union-attr]
            joined[name] = made = Runs.joined(columns, shared.get(key, (None, None))[1])  # type: ignore[arg-type]
            shared[key] = (columns, made.lengths)  # (the columns held: no id in the key is reused meanwhile)
        else:
            lists: Iterable[list] = columns if held == {list} else map(as_list, columns)  # type: ignore[assignment]
            joined[name] = list(chain.from_iterable(lists))
    return joined


def _arrow_column(values: list | Runs, type_: pa.DataType, takes: dict[int, tuple]) -> pa.Array:
    """A column as Arrow: a list as it is; runs as their values, each taken its run's times. `takes`: the row ->
    run indices by the identity of a runs' lengths, for the columns of one insert that share them."""
    if not isinstance(values, Runs):
        return pa.array(values, type_, from_pandas=True)
    given = values.values
    if given and given.count(given[0]) == len(given):  # one value in every run (a tier, a group): no index to take
        return pa.repeat(pa.scalar(given[0], type_, from_pandas=True), values.size)
    _, take = takes.get(id(values.lengths), (None, None))
    if take is None:
        take = np.repeat(np.arange(len(given)), values.lengths)
        takes[id(values.lengths)] = (values.lengths, take)  # (the lengths held: their id is not reused meanwhile)
    return pa.array(given, type_, from_pandas=True).take(take)


def _arrow_type(ch_type: str) -> pa.DataType:
    inner = re.sub(r"^(LowCardinality\()?(Nullable\()?(.*?)\)*$", r"\3", ch_type) if "(" in ch_type else ch_type
    if ch_type.startswith("Map"):
        return pa.map_(pa.string(), pa.string())
    if inner.startswith("SimpleAggregateFunction"):
        inner = inner.split(",")[-1].strip().rstrip(")")
    return _ARROW[inner]


_ARROW = {
    "Bool": pa.bool_(),
    "UInt64": pa.uint64(),
    "UInt32": pa.uint32(),
    "UInt8": pa.uint8(),
    "Int16": pa.int16(),
    "Int32": pa.int32(),
    "Int64": pa.int64(),
    "Float64": pa.float64(),
    "String": pa.string(),
}
