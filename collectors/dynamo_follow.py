"""A directory of Dynamo's request-trace shards followed as Dynamo writes them: `kvobs collect --dynamo-trace DIR`.

    follower = DynamoTraceFollower(writer, Path("/var/lib/dynamo-trace"))   # DYN_REQUEST_TRACE_FILE_PATH's directory
    follower.poll()                                                          # each tick: what was written since

Dynamo's frontend writes rolling gzipped shards (`dynamo-request-trace.NNNNNN.jsonl.gz`, a new one when the last is
full) or, with the JSONL sink, one growing `.jsonl` file. Each file is read on from where the last poll stopped, up to
its last whole line: a gzipped shard is decoded as Dynamo flushes it (`DYN_REQUEST_TRACE_FILE_FLUSH_INTERVAL_MS`), so
its rows arrive before it rolls over; a line cut at the end waits for the next poll. The rows become requests, steps
and sessions as `kvobs import dynamo-trace` makes them (`collectors.dynamo_trace.SessionSteps`, kept across polls: a
session's steps go on across shards); with KV streams collected, each request is joined with its worker's blocks
first (`collectors.dynamo_join`). A directory that is not there, or holds no shard yet, is said in the log, and
the rows read and left out are counted on the collector's /metrics.
"""

from __future__ import annotations

import logging
import zlib
from pathlib import Path

from collectors.dynamo_join import DynamoJoin
from collectors.dynamo_trace import (
    DEFAULT_INSTANCE,
    DynamoTraceSummary,
    SessionSteps,
    parse_rows,
    schema_rows,
)
from kvobs.store import StoreWriter

log = logging.getLogger(__name__)

SHARDS = ("*.jsonl.gz", "*.jsonl")  # Dynamo's two sinks' files


class DynamoTraceFollower:
    def __init__(
        self, writer: StoreWriter, directory: Path, *, instance: str = DEFAULT_INSTANCE, join: DynamoJoin | None = None
    ) -> None:
        self.directory, self.instance, self.join = directory, instance, join
        self.summary = DynamoTraceSummary()
        self.steps = SessionSteps(writer, self.summary)
        self.shards: dict[Path, _Shard] = {}  # how far each file is read
        self._said_missing = self._said_empty = False
        self._said_reasons: set[str] = set()  # why rows were left out, each said in the log once

    def poll(self, now: float | None = None) -> int:
        """Store what the directory's shards hold that was not read yet; the rows read."""
        if not self.directory.is_dir():
            if not self._said_missing:
                log.warning("Dynamo's request-trace directory %s is not there: nothing to follow yet", self.directory)
                self._said_missing = True
            return 0
        self._said_missing = False
        before = self.summary.rows
        lines: list[str] = []
        shards = sorted(p for pattern in SHARDS for p in self.directory.glob(pattern))
        if not shards and not self._said_empty:
            log.warning(
                "no Dynamo request-trace shard in %s yet (is DYN_REQUEST_TRACE=1 set on Dynamo's frontend, and its "
                "shards written here?)",
                self.directory,
            )
        self._said_empty = not shards
        for path in shards:
            lines += self._read(path)
        if lines:
            requests, tools = parse_rows(schema_rows(lines, self.summary), self.summary, self.instance)
            self.steps.add(requests if self.join is None else self.join.join(requests), tools)
        self._say_left_out()
        return self.summary.rows - before

    def _say_left_out(self) -> None:
        """Each new reason rows were left out for, once (the count goes on on /metrics)."""
        for reason, n in self.summary.left_out.items():
            if reason not in self._said_reasons:
                self._said_reasons.add(reason)
                log.warning(
                    "Dynamo request-trace rows left out in %s: %s (%d so far; counted on "
                    'kvobs_collector_dynamo_trace_rows_total{outcome="left_out"})',
                    self.directory,
                    reason,
                    n,
                )

    def _read(self, path: Path) -> list[str]:
        """The whole lines of a shard written since the last poll: its bytes read on from where they stopped, decoded
        as they come (a gzipped segment as Dynamo flushes it), a line cut at the end kept for the next poll."""
        shard = self.shards.setdefault(path, _Shard(gzipped=path.suffix == ".gz"))
        if shard.broken:
            return []
        try:
            with path.open("rb") as file:
                file.seek(shard.offset)
                data = file.read()
        except OSError as exc:
            log.warning("Dynamo's request-trace shard %s cannot be read (%s)", path, exc)
            return []
        shard.offset += len(data)
        try:
            return shard.feed(data)
        except zlib.error as exc:
            said = "Dynamo's request-trace shard %s is not gzip past byte %d (%s): left out"
            log.warning(said, path, shard.offset, exc)
            shard.broken = True
            self.summary.left_out["shards that are not gzip"] += 1
            return []


class _Shard:
    """A shard read as it grows, up to its last newline; a gzipped one decoded stream after stream (a member each)."""

    def __init__(self, *, gzipped: bool) -> None:
        self.offset = 0
        self.broken = False
        self._stream = zlib.decompressobj(wbits=31) if gzipped else None
        self._tail = b""  # bytes after the last newline

    def feed(self, data: bytes) -> list[str]:
        out = self._tail
        if self._stream is None:
            out += data
        while self._stream is not None and data:
            out += self._stream.decompress(data)
            data = self._stream.unused_data  # (the next member's bytes, once this one ended)
            if self._stream.eof:
                self._stream = zlib.decompressobj(wbits=31)
        whole = out[: out.rfind(b"\n") + 1]
        self._tail = out[len(whole) :]
        return whole.decode("utf-8", errors="replace").splitlines(keepends=True)
