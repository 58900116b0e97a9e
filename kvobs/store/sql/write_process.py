"""A SQL store's writes in a process of their own, so they take no core from the process that makes the rows.

    writes = WriteProcess("sqlite:///kvobs.db")       # a child process opens the store (already migrated)
    writer = StoreWriter(writes, spool=...)            # queues, batches, retries and spools as with a store
    ...
    writer.close(); writes.close()                     # flush, then stop the child

`StoreWriter` calls `write(batch)` from its thread; here that sends the batch to the child and waits for its answer,
so a batch counted as written is committed, and an error comes back as `WriteFailed`, unreachable (retried, the
database being down or a concurrent writer's transaction in the way) or not (a row the database refuses: the
writer then writes the batch row by row, as it does in process). The child writes each batch in one transaction,
as `SqlStore.write` does in process, with its rollups; on SQLite it hands `kv_events` to the driver's executemany
(no other thread of the child wants the interpreter lock; in the collector's process one does: see
`SqlBatchWriter._insert_columns`). A child that died (killed, out of memory) is started again: a batch sent after
its death goes to the new one; a batch it died writing is retried as after an outage (its transaction is rolled
back with the dead child, unless the child died in the instant between its commit and its answer, when the retry
stores that batch a second time).

The child is a fresh interpreter running this module (`python -m kvobs.store.sql.write_process`), connected by a socket
pair; it ignores SIGINT and SIGTERM: a collector told to stop flushes its queue through the child first, then stops
it. It ends by itself when its parent is gone (the socket closes).

SQL stores only. A chDB directory has one holder per process and the collector reads it too, and a ClickHouse server
is a process of its own already.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

from kvobs.child_process import end_child, start_child
from kvobs.store.interface import Batch

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # the child's imports and the store's open (a cold start imports SQLAlchemy and pandas)


class WriteFailed(Exception):
    """A batch the child did not write: `unreachable` as the store itself would say (`Store.is_unreachable`)."""

    def __init__(self, message: str, *, unreachable: bool) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class WriteProcess:
    """What `StoreWriter` uses of a store (`write`, `is_unreachable`, `batch_rows`, `flush_interval_s`), its
    writes done by a child process that opened `url`."""

    def __init__(self, url: str) -> None:
        if not url.startswith(("sqlite", "postgresql")):
            raise ValueError(
                f"writes in a process of their own are for SQLite and PostgreSQL stores, not {url.split(':')[0]}: a "
                "chDB directory has one holder per process, and a ClickHouse server is a process of its own"
            )
        self.url = url
        self.num_starts = 0
        self._conn: Connection | None = None
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one exchange at a time: a close never cuts into a batch's
        self.batch_rows, self.flush_interval_s = self._start()

    def write(self, batch: Batch, *, token: str | None = None) -> None:
        with self._lock:
            self._write(batch, token)

    def _write(self, batch: Batch, token: str | None) -> None:
        try:
            self._send((batch, token))
        except OSError as exc:  # the child had died before this batch: it never saw it, so a new one writes it
            self._stop(f"the store's write process had ended ({type(exc).__name__}); starting another")
            self._send((batch, token))
        assert self._conn is not None
        try:
            reply = self._conn.recv()
        except (EOFError, OSError) as exc:  # it died with the batch: retried, like a batch an outage interrupted
            self._stop(f"the store's write process ended while writing a batch ({type(exc).__name__})")
            raise WriteFailed("the store's write process ended before it answered", unreachable=True) from None
        if reply is not None:
            unreachable, message = reply
            raise WriteFailed(message, unreachable=unreachable)

    def is_unreachable(self, exc: BaseException) -> bool:
        return isinstance(exc, WriteFailed) and exc.unreachable

    def _send(self, message) -> None:
        if self._conn is None:
            self._start()
        assert self._conn is not None
        self._conn.send(message)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the child once it has answered every batch sent (call after `StoreWriter.close`). A batch it is
        still writing is answered first, for up to `timeout_s`; after that the child is killed (the batch's
        transaction rolls back; a spool keeps its rows for the next start)."""
        answered = self._lock.acquire(timeout=timeout_s)
        try:
            if answered and self._conn is not None:
                with contextlib.suppress(OSError):  # the child is gone already
                    self._conn.send(None)
            if self._process is not None:
                end_child(self._process, timeout_s if answered else 0)
            self._conn = self._process = None
        finally:
            if answered:
                self._lock.release()

    def _start(self) -> tuple[int, float]:
        """A fresh interpreter runs this module (`kvobs.child_process`); the URL goes over the socket pair."""
        process, parent = start_child("kvobs.store.sql.write_process")
        parent.send(self.url)
        if not parent.poll(START_TIMEOUT_S):
            end_child(process, 0)
            raise WriteFailed(f"the store's write process did not start in {START_TIMEOUT_S:.0f} s", unreachable=True)
        try:
            hello = parent.recv()
        except EOFError:
            raise WriteFailed("the store's write process ended as it started", unreachable=True) from None
        if hello[0] != "ready":
            end_child(process, 5.0)
            raise WriteFailed(hello[1], unreachable=hello[0] == "unreachable")
        self._conn, self._process = parent, process
        self.num_starts += 1
        return hello[1], hello[2]

    def _stop(self, why: str) -> None:
        log.warning(why)
        if self._process is not None:
            end_child(self._process, 1.0)
        self._conn = self._process = None


def _serve(conn: Connection) -> None:
    """The child: take the store's URL, open it, then write each batch sent and answer None, or (unreachable,
    message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it once its queue is flushed
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        url = conn.recv()
    except EOFError:
        return
    from kvobs.store.sql.store import open_sql  # in the child only: the parent may never need a store of its own
    from kvobs.store.sql.write import is_unreachable

    try:
        store = open_sql(url, migrate=False)  # (the parent's SQL store's URL, normalized: this backend's own opener)
    except Exception as exc:  # an unreachable database, a bad URL: said to the parent, which raises it
        conn.send(("unreachable" if is_unreachable(exc) else "error", f"{type(exc).__name__}: {exc}"))
        return
    store.write_alone()  # no other thread here
    conn.send(("ready", store.batch_rows, store.flush_interval_s))
    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the parent is gone
                break
            if message is None:
                break
            batch, token = message
            try:
                store.write(batch, token=token)
                conn.send(None)
            except Exception as exc:  # answered, never raised: the parent decides (retry, row by row)
                conn.send((store.is_unreachable(exc), f"{type(exc).__name__}: {getattr(exc, 'orig', exc)}"))
    finally:
        store.close()


if __name__ == "__main__":  # the child, started by `WriteProcess._start` with its end of the socket pair
    _serve(Connection(int(sys.argv[1])))
