"""An on-disk spool for the store writer: what it accepted survives a SIGKILL, or a shutdown while the store is down.

    spool = Spool(Path("/var/lib/kvobs/spool"))
    seq = spool.append("insert", records)      # before the writer queues them (one write() call: in the page cache)
    spool.commit(seq)                          # everything up to seq is in the store
    for seq, op, records in spool.backlog():   # on the next start: what was accepted and never committed
        ...

Like the OpenTelemetry Collector's persistent queue: a write-ahead log of the writer's queue, in segment files
(`seg-<first seq>.log`) of length-prefixed msgpack frames `[seq, op, table, [row, ...]]` (`KVEventColumns`:
`[seq, op, "kv_events", {column: [value, ...]}]`), and a `committed` file
holding the last sequence number the store committed (replaced atomically). Segments wholly committed are deleted.
A frame cut off by a kill was still being written, so its producer was never told it was accepted: it is ignored.

Delivery is at least once: a kill between a batch's commit and its `commit()` (the rename of one small file) stores
that batch again on the next start. Nothing is fsync'ed: a process kill loses nothing; a power loss may lose what
the operating system had not yet written out.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from kvobs.store.rows import RECORDS, KVEventColumns, Record

log = logging.getLogger(__name__)

SEGMENT_BYTES = 64 * 1024 * 1024
COMMITTED = "committed"
_LENGTH = struct.Struct(">I")
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class Spool:
    """A write-ahead log of the writer's queued items in `directory` (created if missing; one writer at a time)."""

    def __init__(self, directory: str | Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.committed = self._read_committed()
        self._lock = threading.Lock()
        self._segments = sorted(self.directory.glob("seg-*.log"))
        last = self._last_seq()
        self._next_seq = max(last, self.committed) + 1
        self._file: BinaryIO | None = None
        self._file_bytes = 0
        self.num_backlog = sum(1 for _ in self._frames(after=self.committed))  # items left by an earlier process

    # ---- the producer side -------------------------------------------------------------------------
    def append(self, op: str, records: list[Record] | KVEventColumns) -> int:
        """Write one queued item; its sequence number (increasing: call in queue order)."""
        if isinstance(records, KVEventColumns):
            frame: list = [op, records.table, records.lists()]  # a map of lists (a column of runs expanded)
        else:
            frame = [op, records[0].table, [r.to_row() for r in records]]
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            payload = _encode([seq, *frame])
            if self._file is None or self._file_bytes >= self.segment_bytes:
                self._file = self._roll(seq)
            self._file.write(_LENGTH.pack(len(payload)) + payload)  # unbuffered: one write() reaches the OS
            self._file_bytes += _LENGTH.size + len(payload)
            return seq

    # ---- the writer side -----------------------------------------------------------------------------
    def commit(self, seq: int) -> None:
        """Everything up to `seq` is in the store: remember it, and delete segments holding nothing newer."""
        if seq <= self.committed:
            return
        tmp = self.directory / (COMMITTED + ".tmp")
        tmp.write_text(str(seq))
        os.replace(tmp, self.directory / COMMITTED)
        self.committed = seq
        with self._lock:
            while len(self._segments) > 1 and _first_seq(self._segments[1]) <= seq + 1:
                self._segments.pop(0).unlink(missing_ok=True)

    def backlog(self) -> Iterator[tuple[int, str, list[Record] | KVEventColumns]]:
        """The items an earlier process accepted and the store never committed, oldest first."""
        for seq, op, table, rows in self._frames(after=self.committed):
            if isinstance(rows, dict):
                yield seq, op, KVEventColumns(**rows)
            else:
                cls = RECORDS[table]
                yield seq, op, [cls(**row) for row in rows]

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    # ---- internals ---------------------------------------------------------------------------------------
    def _roll(self, seq: int) -> BinaryIO:
        """Close the current segment; open and return the next (kept open across calls, unbuffered)."""
        if self._file is not None:
            self._file.close()
        path = self.directory / f"seg-{seq:020d}.log"
        self._file_bytes = 0
        self._segments.append(path)
        return open(path, "ab", buffering=0)  # noqa: SIM115

    def _read_committed(self) -> int:
        path = self.directory / COMMITTED
        return int(path.read_text()) if path.exists() else 0

    def _last_seq(self) -> int:
        last = 0
        for seq, *_ in self._frames(after=0, segments=self._segments[-1:]):
            last = seq
        return last

    def _frames(self, *, after: int, segments: list[Path] | None = None) -> Iterator[tuple[int, str, str, list]]:
        for path in list(self._segments if segments is None else segments):
            data = path.read_bytes()
            at = 0
            while at + _LENGTH.size <= len(data):
                (length,) = _LENGTH.unpack_from(data, at)
                end = at + _LENGTH.size + length
                if end > len(data):
                    log.warning("spool %s ends in a frame cut off mid-write (never acknowledged); ignored", path.name)
                    break
                seq, op, table, rows = _decode(data[at + _LENGTH.size : end])
                at = end
                if seq > after:
                    yield seq, op, table, rows


def _first_seq(path: Path) -> int:
    return int(path.stem.removeprefix("seg-"))
