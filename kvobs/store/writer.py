"""A batched background writer: producers never wait on the database.

    writer = StoreWriter(store)
    writer.add(KVEventRecord(ts=..., instance="engine-0", kind="evicted", ...))   # records: kvobs.store.rows
    writer.add_many(records)                                   # one unit: all queued, or all dropped
    writer.upsert(SessionRecord("s1", num_steps=3))            # insert or update the columns given, by key
    writer.insert_missing(SessionRecord("s1", source="engine"))  # insert unless the key exists
    writer.flush()                                             # wait until written
    writer.close()                                             # flush, then stop

Records (one frozen dataclass per table) are the only thing the writer takes, so a wrong column fails where the
record is made. Rows go into a bounded queue; one thread writes them in batches, one transaction per batch, so a
committed batch is never lost. When the database is unreachable the batch is retried with
exponential backoff while new rows wait in the queue; once the queue is full, new rows are dropped
and counted in `num_dropped`: the caller (an engine step, a collector) never blocks or crashes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict

from sqlalchemy import insert
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from kvobs.logs import worth_logging
from kvobs.store.db import Store
from kvobs.store.rows import Record
from kvobs.store.schema import TABLES

log = logging.getLogger(__name__)

_FLUSH = object()
_STOP = object()


class StoreWriter:
    """Write rows to `store` from a background thread.

    Args:
        store: an opened store.
        max_queue: rows waiting at most; beyond it rows are dropped and counted.
        batch_size: rows per transaction (a list from `add_many` is never split, so a batch may hold more).
        flush_interval_s: longest a row waits before its batch is written.
        max_backoff_s: cap of the retry delay while the database is unreachable.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_queue: int = 100_000,
        batch_size: int = 5000,
        flush_interval_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.store = store
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.max_backoff_s = max_backoff_s
        self.num_dropped = 0
        self.num_written = 0
        self.num_failed_attempts = 0
        self.max_queue = max_queue
        self._queued_rows = 0  # rows put and not yet taken by the writer thread
        self._count_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._sqlite_inserts: dict[tuple, tuple[str, list, tuple]] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvobs-store-writer", daemon=True)
        self._thread.start()

    # ---- producers -------------------------------------------------------------------------------
    def add(self, record: Record) -> bool:
        """Queue an insert; False (and counted) when the queue is full or the writer closed."""
        return self._put("insert", [record])

    def add_many(self, records: list[Record]) -> bool:
        """Queue inserts as one unit (all queued, or all dropped); records of one table write fastest."""
        return self._put("insert", records) if records else True

    def upsert(self, record: Record) -> bool:
        """Queue an insert that updates the row with the same primary key (the record's columns only)."""
        return self._put("upsert", [record])

    def insert_missing(self, record: Record) -> bool:
        """Queue an insert that leaves an existing row with the same primary key as it is."""
        return self._put("insert_missing", [record])

    def _put(self, op: str, rows: list[Record]) -> bool:
        for record in rows:
            if not isinstance(record, Record):
                raise TypeError(f"the store writer takes kvobs.store.rows records, not {type(record).__name__}")
        with self._count_lock:
            full = self._closed or self._queued_rows + len(rows) > self.max_queue
            if full:
                self.num_dropped += len(rows)
            else:
                self._queued_rows += len(rows)
        if full:
            if not self._closed and worth_logging(self.num_dropped, every=10_000):
                log.warning("store queue full: %d rows dropped so far", self.num_dropped)
            return False
        self._queue.put((op, rows))
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued before this call is committed; False on timeout."""
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put((_STOP, None))
        self._thread.join(timeout_s)

    # ---- the writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch, markers, stop = self._collect()
            if batch:
                try:
                    self._write_with_retry(batch)
                except Exception:  # never let the thread die: later rows must still be written
                    self.num_dropped += _rows(batch)
                    log.exception("writing a batch of %d rows failed; dropped", _rows(batch))
            for marker in markers:
                marker.set()
            if stop:
                return

    def _collect(self) -> tuple[list[tuple[str, list[Record]]], list[threading.Event], bool]:
        """Items until `batch_size` rows, a flush or stop marker, or `flush_interval_s` after the first one."""
        batch: list = []
        markers: list[threading.Event] = []
        rows = 0
        deadline = None
        stop = False
        while rows < self.batch_size:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                break
            if item[0] is _STOP:
                stop = True
                break
            if item[0] is _FLUSH:
                markers.append(item[1])
                break
            batch.append(item)
            rows += len(item[1])
            if deadline is None:
                deadline = time.monotonic() + self.flush_interval_s
        with self._count_lock:
            self._queued_rows -= rows
        return batch, markers, stop

    def _write_with_retry(self, batch: list[tuple[str, list[Record]]]) -> None:
        delay = 0.5
        while True:
            try:
                self._write(batch)
                self.num_written += _rows(batch)
                return
            except Exception as exc:  # a row the database refuses (a constraint, a value no column can hold, ...)
                if not (isinstance(exc, SQLAlchemyError) and _is_connection_error(exc)):
                    self._write_one_by_one(batch, exc)  # isolates it, whatever its error type (OverflowError too)
                    return
                self.num_failed_attempts += 1
                if self._closed:  # shutting down: the database will not come back in time
                    log.error("store unreachable at shutdown; %d rows dropped", _rows(batch))
                    self.num_dropped += _rows(batch)
                    return
                log.warning("store unreachable (%s); retrying in %.1f s", type(exc.orig).__name__, delay)
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def _write_one_by_one(self, batch: list[tuple[str, list[Record]]], exc: Exception) -> None:
        """A row the database refuses (constraint, type) must not take its batch with it."""
        log.warning("store refused a batch of %d rows (%s); writing them one by one", _rows(batch),
                    type(exc).__name__)  # fmt: skip
        for op, records in batch:
            for record in records:
                try:
                    self._write([(op, [record])])
                    self.num_written += 1
                except Exception as row_exc:  # the writer thread must outlive any one bad row
                    self.num_dropped += 1
                    log.error("store refused a %s row; dropped: %s", record.table, getattr(row_exc, "orig", row_exc))

    def _write(self, batch: list[tuple[str, list[Record]]]) -> None:
        grouped: dict[tuple[str, str, tuple], list[dict]] = defaultdict(list)
        for op, records in batch:  # one executemany per table and column set (session upserts give some columns)
            for record in records:
                row = record.to_row()
                grouped[(op, record.table, tuple(row))].append(row)
        with self.store.engine.begin() as conn:
            for (op, table, _), rows in grouped.items():
                model = TABLES[table]
                if op == "insert" and self.store.dialect == "sqlite":
                    sql, processors, defaults = self._sqlite_insert(model, tuple(rows[0]))
                    conn.exec_driver_sql(sql, [(*(r[c] if p is None else p(r[c]) for c, p in processors), *defaults)
                                               for r in rows])  # fmt: skip
                elif op == "insert":
                    conn.execute(insert(model), rows)
                else:
                    for row in _merge_per_key(model, rows, first_wins=op == "insert_missing"):
                        conn.execute(self._upsert_statement(model, row, update=op == "upsert"))

    def _sqlite_insert(self, model, columns: tuple[str, ...]) -> tuple[str, list, tuple]:
        """SQLite's fast path: one driver-level executemany of tuples (SQLAlchemy's per-row work skipped), with each
        column's own bind processor (UInt64 -> text, JSON -> text) applied."""
        key = (model.__tablename__, columns)
        cached = self._sqlite_inserts.get(key)
        if cached is None:
            table, dialect = model.__table__, self.store.engine.dialect
            defaults = {c.name: c.default.arg for c in table.columns  # Python-side defaults Core would have applied
                        if c.name not in columns and c.default is not None and c.default.is_scalar}  # fmt: skip
            names = [*columns, *defaults]
            sql = f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
            processors = [(c, table.c[c].type.bind_processor(dialect)) for c in columns]
            cached = self._sqlite_inserts[key] = (sql, processors, tuple(defaults.values()))
        return cached

    def _upsert_statement(self, model, row: dict, *, update: bool):
        dialect = postgresql if self.store.dialect == "postgresql" else sqlite
        keys = [c.name for c in model.__table__.primary_key.columns]
        stmt = dialect.insert(model).values(**row)
        updates = {k: stmt.excluded[k] for k in row if k not in keys} if update else {}
        return (
            stmt.on_conflict_do_update(index_elements=keys, set_=updates) if updates else stmt.on_conflict_do_nothing()
        )


def _rows(batch: list[tuple[str, list[Record]]]) -> int:
    return sum(len(records) for _, records in batch)


def _merge_per_key(model, rows: list[dict], *, first_wins: bool) -> list[dict]:
    """Merge rows for the same primary key in order (later values win unless `first_wins`): one statement per key."""
    keys = [c.name for c in model.__table__.primary_key.columns]
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row.get(k) for k in keys)
        earlier = merged.get(key, {})
        merged[key] = {**row, **earlier} if first_wins else {**earlier, **row}
    return list(merged.values())


def _is_connection_error(exc: SQLAlchemyError) -> bool:
    return isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)
