"""A batched background writer: producers never wait on the database.

    writer = StoreWriter(store)
    writer.add(KVEventRecord(ts=..., instance="engine-0", kind="evicted", ...))   # records: kvobs.store.rows
    writer.add_many(records)                                   # one unit: all queued, or all dropped
    writer.add_many(KVEventColumns(ts=[...], ...))             # the same, for KV events held as columns
    writer.add_many(rows, on_written=done)                     # done() once their batch is committed
    writer.offer(records)                                      # all queued, or False and the caller keeps them
    writer.upsert(SessionRecord("s1", num_steps=3))            # insert or update the columns given, by key
    writer.insert_missing(SessionRecord("s1", source="engine"))  # insert unless the key exists
    writer.flush()                                             # wait until written
    writer.close()                                             # flush, then stop

Records (one frozen dataclass per table) are the only thing the writer takes, so a wrong column fails where the
record is made. Rows go into a bounded queue; one thread writes them in batches, one transaction per batch (on
ClickHouse one insert per table, with a token so a retried batch is not stored twice), so a committed batch is never
lost. When the database is unreachable the batch is retried with exponential backoff while new rows wait in the
queue; once the queue is full, new rows are dropped and counted in `num_dropped`: the caller (an engine step, a
collector) never blocks or crashes.

With a `spool` (`kvobs.store.spool.Spool`, `--spool-dir`), every queued item is first written to disk and marked
committed once its batch is in the store; what an earlier process left uncommitted (a SIGKILL, or a shutdown while
the store was unreachable) is written first when the writer starts. Without one, a SIGKILL loses the rows queued
(at most `max_queue`, under steady load about `flush_interval_s` of them) and a shutdown during an outage drops
the queue, counted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from kvobs.logs import worth_logging
from kvobs.store.interface import FILL_CACHED
from kvobs.store.queue_depth import QueueDepth
from kvobs.store.rows import KVEventColumns, Record, RequestRecord

log = logging.getLogger(__name__)

_FLUSH = object()
_STOP = object()
# a queued unit: its operation, its rows, its spool sequence number (0 without a spool), what to call once written
Item = tuple[str, Sequence[Record] | KVEventColumns, int, Callable[[], object] | None]


class StoreWriter:
    """Write rows to `store` from a background thread.

    Args:
        store: an opened store (`kvobs.store.open_store`: SQL or ClickHouse).
        max_queue: rows waiting at most; beyond it rows are dropped and counted.
        batch_size: rows per transaction (a list from `add_many` is never split, so a batch may hold more); by
            default the store's own (`store.batch_rows`: 5,000 on SQL, 50,000 on ClickHouse).
        flush_interval_s: longest a row waits before its batch is written; by default the store's own
            (`store.flush_interval_s`: 0.5 s on SQL, 1 s on ClickHouse, which wants few large inserts).
        max_backoff_s: cap of the retry delay while the database is unreachable.
        spool: an on-disk spool that keeps what was queued across a kill or an outage at shutdown (None: memory).
    """

    def __init__(
        self,
        store,
        *,
        max_queue: int = 100_000,
        batch_size: int | None = None,
        flush_interval_s: float | None = None,
        max_backoff_s: float = 30.0,
        spool=None,
    ) -> None:
        self.store = store
        self.spool = spool
        self._held_in_spool = False
        self.batch_size = batch_size or store.batch_rows
        self.flush_interval_s = store.flush_interval_s if flush_interval_s is None else flush_interval_s
        self.max_backoff_s = max_backoff_s
        self.num_dropped = 0
        self.num_full = 0  # units that found the queue full (each then waited for room, or was dropped)
        self.num_written = 0
        self.num_failed_attempts = 0
        self.max_queue = max_queue
        self._queued_rows = 0  # rows put and not yet taken by the writer thread
        self.depth = QueueDepth()  # rows accepted and not yet committed: how many, how old, the peaks (under `_room`)
        self._count_lock = threading.Lock()
        self._room = threading.Condition(self._count_lock)  # notified when the writer thread takes rows
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvobs-store-writer", daemon=True)
        self._thread.start()

    # ---- producers -------------------------------------------------------------------------------
    def add(self, record: Record) -> bool:
        """Queue an insert; False (and counted) when the queue is full or the writer closed."""
        return self._put("insert", [record])

    def add_many(
        self,
        records: Sequence[Record] | KVEventColumns,
        *,
        wait_s: float = 0.0,
        on_written: Callable[[], object] | None = None,
    ) -> bool:
        """Queue inserts as one unit (all queued, or all dropped); records of one table write fastest, and
        `KVEventColumns` fastest of all.

        `wait_s`: how long to wait for room when the queue is full (backpressure for a producer that can wait, such
        as the KV-event subscriber, whose socket buffers meanwhile); 0, never (an engine step).
        `on_written`: called on the writer's thread once the unit's batch is done with (committed, kept in the spool
        at shutdown, or a refused row dropped and counted), in queue order; not called for a unit dropped here."""
        if not records:
            return True
        return self._put("insert", records, wait_s, on_written=on_written)

    def offer(self, records: Sequence[Record]) -> bool:
        """Queue inserts as one unit if there is room now; False otherwise, and nothing is dropped or counted: the
        caller still holds them (an OTLP receiver answers 429 and the exporter sends them again)."""
        return self._put("insert", records, count=False) if records else True

    def upsert(self, record: Record) -> bool:
        """Queue an insert that updates the row with the same primary key (the record's columns only)."""
        return self._put("upsert", [record])

    def insert_missing(self, record: Record) -> bool:
        """Queue an insert that leaves an existing row with the same primary key as it is."""
        return self._put("insert_missing", [record])

    def fill_cached(self, request: RequestRecord) -> bool:
        """Queue a stored request's cached tokens learnt after its row (`request`: that row as it was written, its
        `cached_tokens` and `cached_from` now given): set where the row has none, and counted in its minute's
        rollup then (`kvobs.store.rollups.cached_fill_sums`)."""
        return self._put(FILL_CACHED, [request])

    def _put(
        self,
        op: str,
        rows: Sequence[Record] | KVEventColumns,
        wait_s: float = 0.0,
        *,
        count: bool = True,
        on_written: Callable[[], object] | None = None,
    ) -> bool:
        if not isinstance(rows, KVEventColumns):
            for record in rows:
                if not isinstance(record, Record):
                    raise TypeError(f"the store writer takes kvobs.store.rows records, not {type(record).__name__}")
        with self._room:
            if self._queued_rows + len(rows) > self.max_queue:
                self.num_full += 1
            if wait_s > 0:
                self._room.wait_for(lambda: self._closed or self._queued_rows + len(rows) <= self.max_queue, wait_s)
            full = self._closed or self._queued_rows + len(rows) > self.max_queue
            if full and count:
                self.num_dropped += len(rows)
            elif not full:
                self._queued_rows += len(rows)
                self.depth.accepted(len(rows))
                seq = self.spool.append(op, rows) if self.spool is not None else 0  # in queue order, under the lock
                self._queue.put((op, rows, seq, on_written))
        if full and count and not self._closed and worth_logging(self.num_dropped, every=10_000):
            log.warning("store queue full: %d rows dropped so far", self.num_dropped)
        return not full

    def depth_now(self) -> tuple[int, float, int, float]:
        """(rows accepted and not yet committed, the oldest one's wait in seconds, the most rows ever held, the longest
        wait from queued to committed): a burst's mark on the writer."""
        with self._room:
            d = self.depth
            return d.rows, d.lag_s(), d.peak_rows, d.peak_lag_s

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued before this call is committed; False on timeout."""
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, then stop the thread."""
        if self._closed:
            return
        with self._room:
            self._closed = True
            self._room.notify_all()
        self._queue.put((_STOP, None))
        self._thread.join(timeout_s)

    # ---- the writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        if self.spool is not None and self.spool.num_backlog:
            self._write_backlog()
        while True:
            batch, markers, stop = self._collect()
            if batch:
                self._write_batch(batch)
                with self._room:
                    self.depth.committed(len(batch))
            for marker in markers:
                marker.set()
            if stop:
                if self.spool is not None:
                    self.spool.close()
                return

    def _write_batch(self, batch: list[tuple]) -> None:  # (`Item`s)
        try:
            kept = self._write_with_retry([(op, rows) for op, rows, _, _ in batch])
        except Exception:  # never let the thread die: later rows must still be written
            kept = False
            self.num_dropped += _rows(batch)
            log.exception("writing a batch of %d rows failed; dropped", _rows(batch))
        if kept:
            self._held_in_spool = True  # a later commit mark would cover this batch too: mark nothing more
        if self.spool is not None and not self._held_in_spool:
            self.spool.commit(batch[-1][2])
        for _, _, _, on_written in batch:
            if on_written is not None:
                try:
                    on_written()
                except Exception:  # the writer thread must outlive a caller's callback
                    log.exception("a store writer's on_written callback failed")

    def _write_backlog(self) -> None:
        """Write what an earlier process spooled and never committed, before anything new."""
        log.info("store spool: writing %d items an earlier process accepted and did not commit", self.spool.num_backlog)
        batch: list = []
        for item in self.spool.backlog():
            batch.append((*item[1:], item[0], None))  # (op, records, seq, no callback)
            if _rows(batch) >= self.batch_size:
                self._write_batch(batch)
                batch = []
        if batch:
            self._write_batch(batch)

    def _collect(self) -> tuple[list[Item], list[threading.Event], bool]:
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
        with self._room:
            self._queued_rows -= rows
            self._room.notify_all()
        return batch, markers, stop

    def _write_with_retry(self, batch: list[tuple[str, list[Record]]]) -> bool:
        """Write the batch (a refused row alone is dropped); True when it was left in the spool (unreachable at
        shutdown) for the next start."""
        delay = 0.5
        token = uuid.uuid4().hex  # the same on every retry: a store that deduplicates (ClickHouse) never doubles it
        while True:
            try:
                self.store.write(batch, token=token)
                self.num_written += _rows(batch)
                return False
            except Exception as exc:  # a row the database refuses (a constraint, a value no column can hold, ...)
                if not self.store.is_unreachable(exc):
                    self._write_one_by_one(batch, exc)  # isolates it, whatever its error type (OverflowError too)
                    return False
                self.num_failed_attempts += 1
                if self._closed and self.spool is not None:
                    log.warning(
                        "store unreachable at shutdown; %d rows kept in the spool for the next start", _rows(batch)
                    )
                    return True
                if self._closed:  # shutting down: the database will not come back in time
                    log.error("store unreachable at shutdown; %d rows dropped", _rows(batch))
                    self.num_dropped += _rows(batch)
                    return False
                cause = type(getattr(exc, "orig", exc)).__name__
                log.warning("store unreachable (%s); retrying in %.1f s", cause, delay)
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def _write_one_by_one(self, batch: list[tuple[str, list[Record]]], exc: Exception) -> None:
        """A row the database refuses (constraint, type) must not take its batch with it."""
        log.warning("store refused a batch of %d rows (%s); writing them one by one", _rows(batch), type(exc).__name__)
        for op, records in batch:
            for record in records:
                try:
                    self.store.write([(op, [record])])
                    self.num_written += 1
                except Exception as row_exc:  # the writer thread must outlive any one bad row
                    self.num_dropped += 1
                    if worth_logging(self.num_dropped):  # a replayed batch can hold thousands: 1, 10, 100, ...
                        log.error(
                            "store refused a %s row; dropped (%d so far): %s",
                            record.table,
                            self.num_dropped,
                            getattr(row_exc, "orig", row_exc),
                        )


def _rows(batch: list[tuple]) -> int:
    return sum(len(item[1]) for item in batch)
