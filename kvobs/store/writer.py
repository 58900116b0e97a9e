"""A batched background writer: producers never wait on the database.

    writer = StoreWriter(store)
    writer.add("kv_events", {"ts": ..., "instance": "engine-0", "kind": "evicted", ...})
    writer.upsert("sessions", {"session_id": "s1", "num_steps": 3, ...})   # insert or update by key
    writer.insert_missing("sessions", {"session_id": "s1", ...})             # insert unless the key exists
    writer.flush()                                                           # wait until written
    writer.close()                                                           # flush, then stop

Rows go into a bounded queue; one thread writes them in batches, one transaction per batch, so a
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
from kvobs.store.schema import TABLES

log = logging.getLogger(__name__)

_FLUSH = object()
_STOP = object()


class StoreWriter:
    """Write rows to `store` from a background thread.

    Args:
        store: an opened store.
        max_queue: rows waiting at most; beyond it rows are dropped and counted.
        batch_size: rows per transaction at most.
        flush_interval_s: longest a row waits before its batch is written.
        max_backoff_s: cap of the retry delay while the database is unreachable.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_queue: int = 100_000,
        batch_size: int = 1000,
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
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvobs-store-writer", daemon=True)
        self._thread.start()

    # ---- producers -------------------------------------------------------------------------------
    def add(self, table: str, row: dict) -> bool:
        """Queue an insert; False (and counted) when the queue is full or the writer closed."""
        return self._put(("insert", table, row))

    def upsert(self, table: str, row: dict) -> bool:
        """Queue an insert that updates the row with the same primary key if it exists."""
        return self._put(("upsert", table, row))

    def insert_missing(self, table: str, row: dict) -> bool:
        """Queue an insert that leaves an existing row with the same primary key as it is."""
        return self._put(("insert_missing", table, row))

    def _put(self, item: tuple[str, str, dict]) -> bool:
        if item[1] not in TABLES:
            raise ValueError(f"unknown store table {item[1]!r}; tables: {', '.join(TABLES)}")
        if self._closed:
            self.num_dropped += 1
            return False
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self.num_dropped += 1
            if worth_logging(self.num_dropped, every=10_000):
                log.warning("store queue full: %d rows dropped so far", self.num_dropped)
            return False

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued before this call is committed; False on timeout."""
        done = threading.Event()
        self._queue.put((_FLUSH, done, None))
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put((_STOP, None, None))
        self._thread.join(timeout_s)

    # ---- the writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch, markers, stop = self._collect()
            if batch:
                try:
                    self._write_with_retry(batch)
                except Exception:  # never let the thread die: later rows must still be written
                    self.num_dropped += len(batch)
                    log.exception("writing a batch of %d rows failed; dropped", len(batch))
            for marker in markers:
                marker.set()
            if stop:
                return

    def _collect(self) -> tuple[list[tuple[str, str, dict]], list[threading.Event], bool]:
        batch: list = []
        markers: list[threading.Event] = []
        deadline = None
        while len(batch) < self.batch_size:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                break
            if item[0] is _STOP:
                return batch, markers, True
            if item[0] is _FLUSH:
                markers.append(item[1])
                break
            batch.append(item)
            if deadline is None:
                deadline = time.monotonic() + self.flush_interval_s
        return batch, markers, False

    def _write_with_retry(self, batch: list[tuple[str, str, dict]]) -> None:
        delay = 0.5
        while True:
            try:
                self._write(batch)
                self.num_written += len(batch)
                return
            except SQLAlchemyError as exc:
                if not _is_connection_error(exc):
                    self._write_one_by_one(batch, exc)
                    return
                self.num_failed_attempts += 1
                if self._closed:  # shutting down: the database will not come back in time
                    log.error("store unreachable at shutdown; %d rows dropped", len(batch))
                    self.num_dropped += len(batch)
                    return
                log.warning("store unreachable (%s); retrying in %.1f s", type(exc.orig).__name__, delay)
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def _write_one_by_one(self, batch: list[tuple[str, str, dict]], exc: Exception) -> None:
        """A row the database refuses (constraint, type) must not take its batch with it."""
        log.warning("store refused a batch of %d rows (%s); writing them one by one", len(batch), type(exc).__name__)
        for item in batch:
            try:
                self._write([item])
                self.num_written += 1
            except Exception as row_exc:  # the writer thread must outlive any one bad row
                self.num_dropped += 1
                log.error("store refused a %s row; dropped: %s", item[1], getattr(row_exc, "orig", row_exc))

    def _write(self, batch: list[tuple[str, str, dict]]) -> None:
        grouped: dict[tuple[str, str, tuple], list[dict]] = defaultdict(list)
        for op, table, row in batch:  # one executemany per column set: rows may leave defaulted columns out
            grouped[(op, table, tuple(row))].append(row)
        with self.store.engine.begin() as conn:
            for (op, table, _), rows in grouped.items():
                model = TABLES[table]
                if op == "insert":
                    conn.execute(insert(model), rows)
                else:
                    for row in _merge_per_key(model, rows, first_wins=op == "insert_missing"):
                        conn.execute(self._upsert_statement(model, row, update=op == "upsert"))

    def _upsert_statement(self, model, row: dict, *, update: bool):
        dialect = postgresql if self.store.dialect == "postgresql" else sqlite
        keys = [c.name for c in model.__table__.primary_key.columns]
        stmt = dialect.insert(model).values(**row)
        updates = {k: stmt.excluded[k] for k in row if k not in keys} if update else {}
        return (
            stmt.on_conflict_do_update(index_elements=keys, set_=updates) if updates else stmt.on_conflict_do_nothing()
        )


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
