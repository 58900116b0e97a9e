"""A stream worker: a process of its own that receives, decodes and attributes its KV-event streams (`KVIngest`:
chains, block clocks, rows, footprints), started by the collector's `collectors.kv.workers.WorkerPool`.

Everything a stream's attribution needs from the rest of the collector crosses the channel (`collectors.kv.channel`):
its rows go to the collector's store writer, told in order with the batch's sequence number (what the collector has
taken is acknowledged: a restarted worker resumes after it, from the publisher's replay socket), or, where the store
takes many writers (PostgreSQL, a ClickHouse server), to the worker's own writer, which tells the collector each
batch taken once it is committed or in the worker's spool (`DirectWriter`); its loss spans to
the collector's bridge; and what it asks of the spans' side (the session activity's verdicts, the store's session
ends, a restart's rebuild of the block clocks) is asked of the collector's, which holds the store and the spans. The
collector asks the worker for each stream's snapshot, ties (ownership by inference) and running totals.

The child is a fresh interpreter running this module (`python -m collectors.kv.worker FD`), as the store's write
process is; it ignores SIGINT and SIGTERM (the collector stops it once the last snapshot is taken) and ends by itself
when the collector is gone (the connection closes).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from collectors.drops import DropCounter
from collectors.kv.channel import Channel
from collectors.kv.ingest import KVIngest
from collectors.kv.poller import KVEventPoller
from collectors.kv.rebuild import rebuild_clocks
from collectors.kv.shared_starts import STARTS
from collectors.kv.streams import KVStreamSpec, subscribe
from collectors.kv.subscriber import KVEventSubscriber
from kvobs.hash_key import HashKey
from kvobs.store import StoreWriter, open_store
from kvobs.store.spool import Spool

log = logging.getLogger(__name__)

STATS = (  # a stream's running totals the collector reads (its metrics, silence watch, ownership by inference)
    (
        "subscriber",
        (
            "num_batches",
            "num_events",
            "num_lost",
            "num_gaps",
            "num_restarts",
            "num_replayed",  # (a ZMQ stream's; an HTTP poller has none of these two and none is said)
            "num_tail_recovered",
            "lag_s",
            "last_batch_at",
            "handling_since",
        ),
    ),
    (
        "ingest",
        (
            "latest_ts",
            "block_size",
            "num_lost_in_pause",
            "num_pending_idle",
            "num_sessions_forgotten",
            "num_ids_cut",
            "num_placeholders",
            "num_repeated_stores",
            "num_unknown_removals",
        ),
    ),
    ("starts", STARTS),
)


def unstarted_stats() -> dict:
    """A stream's totals before its worker's first start: none counted, nothing received."""
    stats: dict = {name: 0 if name.startswith("num_") else None for _, names in STATS for name in names}
    stats.update(latest_ts=float("-inf"), shapes={}, unknown_tiers={})
    return stats


def stream_stats(ingest: KVIngest, subscriber) -> dict:
    """What the collector's proxies of a stream read (`STATS`, the wire shapes and unknown tiers seen)."""
    parts = {"ingest": ingest, "subscriber": subscriber, "starts": ingest.starts}
    stats = {name: getattr(parts[part], name, None) for part, names in STATS for name in names}
    stats.update(shapes=dict(subscriber.shapes), unknown_tiers=dict(ingest.unknown_tiers))
    return stats


class DirectWriter:
    """What `KVIngest` uses of a `StoreWriter`, written by the worker's own writer into a store many processes write
    (PostgreSQL, a ClickHouse server). The collector is told a batch is taken once its rows are committed, or once
    they are in the worker's spool (a restarted worker's writer writes what its spool holds first, so the stream's
    replay starts after it)."""

    def __init__(self, writer: StoreWriter, channel: Channel, instance: str) -> None:
        self.writer, self.channel, self.instance = writer, channel, instance
        self.seq: int | None = None
        self._first_told = False

    def add_many(self, columns, *, wait_s: float = 0.0) -> None:
        seq = self.seq
        if seq is not None and not self._first_told:  # (a worker killed before its first commit resumes from it)
            self._first_told = True
            self.channel.tell("first", self.instance, seq)
        if self.writer.spool is not None:
            if self.writer.add_many(columns, wait_s=wait_s):
                self._taken(seq)
        else:
            self.writer.add_many(columns, wait_s=wait_s, on_written=lambda: self._taken(seq))

    def _taken(self, seq: int | None) -> None:
        if seq is not None:
            self.channel.tell("taken", self.instance, seq)

    def add(self, record) -> None:
        self.writer.add(record)

    def insert_missing(self, record) -> None:
        self.writer.insert_missing(record)


class ForwardedWriter:
    """What `KVIngest` uses of a `StoreWriter`, its rows told to the collector, which writes them: `seq` is the batch
    being attributed (set before each), so the collector knows what it has taken."""

    def __init__(self, channel: Channel, instance: str) -> None:
        self.channel, self.instance = channel, instance
        self.seq: int | None = None

    def add_many(self, columns, *, wait_s: float | None = None) -> None:
        self.channel.tell("rows", self.instance, self.seq, columns)

    def add(self, record) -> None:
        self.channel.tell("record", "add", record)

    def insert_missing(self, record) -> None:
        self.channel.tell("record", "insert_missing", record)


class RemoteActivity:
    """The collector's `SessionActivity`, asked across the channel (what `KVIngest` asks of it)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def resolve_pending(self) -> None:
        self.channel.call("activity", "resolve_pending", (), {})

    def idle_verdicts(self, losses, *, now: float, ended=frozenset()) -> dict[str, list[str]]:
        return self.channel.call("activity", "idle_verdicts", (losses,), {"now": now, "ended": set(ended)})


class RemoteBridge:
    """The collector's loss-span bridge, told each batch's removals and clears."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def on_batch(self, instance: str, ts: float, removed, cleared) -> None:
        self.channel.tell("bridge", instance, ts, removed, cleared)


class RemoteLookups:
    """The collector's store lookups a stream needs (`Lookups.session_ends`, and a restart's rebuild's)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def __getattr__(self, method: str):
        return lambda *args: self.channel.call("lookups", method, args)


class Worker:
    def __init__(self, conn: Connection, config: dict) -> None:
        self.config = config
        self.channel = Channel(conn, self._handle, name=f"kvobs-worker-{config['index']}", on_closed=self._gone)
        self.drops = DropCounter()
        self.held: dict[str, bool] = dict(config["leases"])  # instance -> this collector holds its lease
        self.exit = threading.Event()
        self.streams: dict[str, tuple[KVIngest, ForwardedWriter | DirectWriter, KVEventSubscriber | KVEventPoller]] = {}
        self.writer: StoreWriter | None = None  # its own, where the store takes many writers (`config["direct"]`)

    def run(self) -> None:
        self.channel.start()
        self.exit.wait()
        self._close_writer()

    def _close_writer(self) -> None:
        if self.writer is not None:
            self.writer.close()  # what it queued, committed (or spooled) before the worker ends

    def _gone(self) -> None:
        self.exit.set()  # the collector is gone, or told us to go

    def _start(self) -> dict:
        """Build each stream, rebuild its clocks from the store, and open its socket."""
        o = self.config["options"]
        activity, lookups = RemoteActivity(self.channel), RemoteLookups(self.channel)
        bridge = RemoteBridge(self.channel) if self.config["bridge"] else None
        direct = self.config.get("direct")
        if direct is not None:
            spool = Spool(Path(direct["spool_dir"]) / f"worker-{self.config['index']}") if direct["spool_dir"] else None
            self.writer = StoreWriter(open_store(direct["url"], migrate=False), spool=spool)
            self.writer.flush()  # what a dead worker left in its spool, stored before the clocks are rebuilt
        for spec in self.config["specs"]:
            writer: ForwardedWriter | DirectWriter = (
                ForwardedWriter(self.channel, spec.instance)
                if self.writer is None
                else DirectWriter(self.writer, self.channel, spec.instance)
            )
            ingest = KVIngest(
                writer,
                instance=spec.instance,
                activity=activity,  # type: ignore[arg-type]  # (what KVIngest asks of a SessionActivity)
                bridge=bridge,
                settle_s=o["settle_s"],
                session_idle_s=o["session_idle_s"],
                verdict_wait_s=o["verdict_wait_s"],
                session_ends=lookups.session_ends,
            )
            if self.config["infer"] is not None:
                ingest.infer_owners(*self.config["infer"])
            if self.config.get("sequences"):
                ingest.name_sequences()
            rebuild_clocks(ingest, lookups)
            receiver = subscribe(
                spec,
                self._on_batch(spec, ingest, writer),
                self.drops,
                on_restart=ingest.on_restart,
                bind=o["bind"],
                topic=o["topic"],
                resume_from=self.config["resume"].get(spec.instance),
                token_hashes=bool(self.config.get("sequences")),
            )
            self.streams[spec.instance] = (ingest, writer, receiver)
        for _, _, receiver in self.streams.values():
            receiver.start()
        return self._stats()

    def _on_batch(self, spec: KVStreamSpec, ingest: KVIngest, writer: ForwardedWriter | DirectWriter):
        key = HashKey.from_env(self.config["options"].get("hash_key_file"))

        def on_batch(seq: int, batch) -> None:
            if self.held.get(spec.instance, True):
                writer.seq = seq
                ingest.on_batch(seq, batch if key is None else key.batch(batch))
            else:
                self.drops.count("kv_events", "lease_lost", f"{spec.instance} is written by another collector")

        return on_batch

    def _stats(self) -> dict:
        drops = self.drops.counts()
        if self.writer is not None and self.writer.num_dropped:  # its own writer's: the collector's /metrics says them
            drops[("store", "worker writer")] = self.writer.num_dropped
        return {
            "streams": {name: stream_stats(ingest, receiver) for name, (ingest, _, receiver) in self.streams.items()},
            "drops": drops,
            "written": None if self.writer is None else self.writer.num_written,  # (its own writer's rows)
            "queue": None if self.writer is None else _queue(self.writer),
        }

    def _handle(self, kind: str, args: tuple):
        if kind == "start":
            return self._start()
        if kind == "snapshot":
            instance, final, held = args
            self.held.update(held)
            written = self.streams[instance][0].snapshot(final=final)
            return written, self._stats()
        if kind == "leases":  # (a lease lost or taken back: told at once)
            self.held.update(args[0])
            return None
        if kind == "tie":
            instance, frame, due_ids, since = args
            return self.streams[instance][0].tie(frame, due_ids, since)
        if kind == "sequence_blocks":
            return self.streams[args[0]][0].sequence_blocks(args[1])
        if kind == "adopt_sequences":
            return self.streams[args[0]][0].adopt_sequences(args[1])
        if kind == "stats":
            return self._stats()
        if kind == "stop_streams":
            for _, _, receiver in self.streams.values():
                receiver.stop()
            return self._stats()
        if kind == "exit":
            self._close_writer()  # (the collector's close waits for this answer: its rows are stored by then)
            threading.Timer(0.0, self.exit.set).start()  # (after the answer is sent)
            return None
        raise ValueError(f"a stream worker does not know {kind!r}")


def _queue(writer: StoreWriter) -> dict:
    """Its own writer's queue, by what the collector's /metrics says of it (`own_metrics._worker_queues`)."""
    rows, lag_s, peak_rows, peak_lag_s = writer.depth_now()
    return dict(
        rows=rows, lag_s=lag_s, peak_rows=peak_rows, peak_lag_s=peak_lag_s, room=writer.max_queue, full=writer.num_full
    )


def main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the collector stops it once its streams' last rows are taken
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        config = conn.recv()
    except EOFError:
        return
    logging.basicConfig(level=config["log_level"], format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    Worker(conn, config).run()


if __name__ == "__main__":  # started by `collectors.kv.workers.StreamWorker` with its end of a socket pair
    main(int(sys.argv[1]))
