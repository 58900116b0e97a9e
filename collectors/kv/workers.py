"""Attribution on every core: `kvobs collect --workers N` pins each KV-event stream to one of N worker processes
(`collectors.kv.worker`), which receives, decodes and attributes it, as Dynamo's and llm-d's indexers shard per
replica. The collector keeps the store, the spans and the session activity; each worker's rows come back to its
writer (so acknowledged is stored, with its spool, as in process), or, where the store takes many writers
(PostgreSQL, a ClickHouse server), each worker writes them itself and says which batches are stored; the rest of the
collector reads each stream
through proxies with the in-process stream's names (`RemoteIngest`, `RemoteSubscriber`).

    pool = WorkerPool(specs, workers=2, handler=..., config=...)
    stream = KVStream(spec, pool.ingest(spec.instance), pool.subscriber(spec.instance))

A worker that dies (killed, out of memory) is started again at once: its streams resume after the last batch whose
rows the collector took, from the publisher's replay socket where one is configured (`--kv-events-replay`; without
one, what the dead worker had not handed on is counted lost, as any gap is). Its chains start empty and its block
clocks are rebuilt from the store, as after a collector restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace

from collectors.kv.channel import Channel, ChannelClosed, RemoteError
from collectors.kv.shared_starts import STARTS
from collectors.kv.streams import KVStreamSpec
from collectors.kv.worker import unstarted_stats
from kvobs.child_process import end_child, start_child

log = logging.getLogger(__name__)

STATS_FRESH_S = 0.2  # a proxy's totals are read again from its worker when older than this
START_TIMEOUT_S = 120.0  # a worker's imports, its streams' rebuilds and sockets
RESTART_WAIT_S, RESTART_WAIT_MAX_S = 1.0, 30.0  # between failed starts of a dead worker: from, doubling up to


def default_workers(num_streams: int) -> int:
    """The machine's cores, up to the number of streams (one stream stays in the collector's process)."""
    return max(1, min(os.cpu_count() or 1, num_streams))


class StreamWorker:
    """One worker process and its streams; started again when it dies, unless the pool is closing."""

    def __init__(self, index: int, specs: list[KVStreamSpec], pool: WorkerPool) -> None:
        self.index, self.specs, self.pool = index, specs, pool
        self.channel: Channel | None = None
        self.process: subprocess.Popen | None = None
        self.num_starts = 0
        self.num_failed_restarts = 0
        self.last_seq: dict[str, int] = {}  # instance -> the last batch whose rows the collector took
        self.first_seq: dict[str, int] = {}  # instance -> its first batch, where the worker writes the store itself
        self.stats: dict = {"streams": {spec.instance: unstarted_stats() for spec in specs}, "drops": {}}
        self._read_at = 0.0
        self._restarting = False  # from its end until it runs again
        self._lock = threading.Lock()  # one start at a time
        self._streams_stopped = False

    def start(self) -> None:
        with self._lock:
            if self.channel is None or self.channel.closed.is_set():
                self._start()

    def _start(self) -> None:
        self.process, conn = start_child("collectors.kv.worker")
        # after the last batch acknowledged; a worker that writes the store itself and died before its first commit:
        # from the first batch it received
        after = {**self.first_seq, **{i: seq + 1 for i, seq in self.last_seq.items()}}
        resume = {i: seq for i, seq in after.items() if any(s.instance == i and s.replay for s in self.specs)}
        conn.send({**self.pool.config, "index": self.index, "specs": self.specs, "resume": resume})
        channel = Channel(
            conn, self.pool.handler(self), name=f"kvobs-worker-{self.index}", on_closed=lambda: self._ended(channel)
        )
        self.channel = channel
        channel.start()
        try:
            self._update(channel.call("start", timeout_s=START_TIMEOUT_S))
        except (RemoteError, ChannelClosed, TimeoutError) as exc:  # (a socket that cannot bind: as in process)
            self._streams_stopped |= not self._restarting  # a first start is not tried again; a restart is
            self.process.kill()
            raise (OSError if str(exc).startswith("OSError") else RuntimeError)(
                f"KV-event worker {self.index} did not start: {exc}"
            ) from None
        self.num_starts += 1
        log.info(
            "KV-event worker %d (pid %d): %s",
            self.index,
            self.process.pid,
            ", ".join(f"{s.instance} {s.endpoint}" for s in self.specs),
        )

    def call(self, kind: str, *args):
        if self.channel is None:
            raise ChannelClosed(f"{kind}: worker {self.index} is not started")
        return self.channel.call(kind, *args)

    def _update(self, stats: dict) -> None:
        self.stats, self._read_at = stats, time.monotonic()

    def stream_stats(self, instance: str) -> dict:
        """The stream's latest totals, read again when stale (the last known while the worker restarts)."""
        if time.monotonic() - self._read_at > STATS_FRESH_S and self.channel is not None:
            with contextlib.suppress(ChannelClosed, TimeoutError):
                self._update(self.channel.call("stats", timeout_s=10.0))
        return self.stats["streams"].get(instance, {})

    def stop_streams(self) -> None:
        if not self._streams_stopped and self.channel is not None:
            self._streams_stopped = True
            with contextlib.suppress(ChannelClosed):
                self._update(self.call("stop_streams"))

    def close(self, timeout_s: float = 30.0) -> None:
        """Tell the worker to go and wait for it (after the last snapshot)."""
        channel, process = self.channel, self.process
        self.channel = None
        if channel is not None:
            with contextlib.suppress(ChannelClosed, TimeoutError):
                channel.call("exit", timeout_s=timeout_s)
        if process is not None:
            end_child(process, timeout_s)
        if channel is not None:
            channel.close()

    def _ended(self, channel: Channel) -> None:
        if self.pool.closing or channel is not self.channel or self._streams_stopped or self._restarting:
            return
        self._restarting = True
        code = self.process.poll() if self.process is not None else None
        self.pool.num_restarts[self.index] += 1
        log.warning(
            "KV-event worker %d ended (exit code %s); starting it again: its streams resume after the last batch the "
            "collector took (%s)",
            self.index,
            code,
            ", ".join(f"{i} {self.last_seq.get(i, 'none')}" for i in (s.instance for s in self.specs)),
        )
        threading.Thread(target=self._restart, name=f"kvobs-worker-{self.index}-restart", daemon=True).start()

    @property
    def up(self) -> bool:
        """Whether the worker runs (started, its channel open)."""
        return not self._restarting and self.channel is not None and not self.channel.closed.is_set()

    def _restart(self) -> None:
        """Start the worker again until it runs or the pool closes: a start that fails (its port taken meanwhile,
        the machine out of memory) is retried after a wait that doubles up to `RESTART_WAIT_MAX_S`."""
        if self.process is not None:
            self.process.wait()
        wait_s = RESTART_WAIT_S
        while not self.pool.closing:
            try:
                self.pool.before_restart()  # (the store holds what the dead worker handed on: its clocks rebuild)
                self.start()
                self._restarting = False
                return
            except Exception:
                self.num_failed_restarts += 1
                log.exception("starting KV-event worker %d again failed; trying again in %.0f s", self.index, wait_s)
            if self.pool.closed.wait(wait_s):
                return
            wait_s = min(2 * wait_s, RESTART_WAIT_MAX_S)


class WorkerPool:
    """Args:
    specs: the collector's streams, pinned to `workers` processes in turn.
    config: what every worker is started with (`collectors.kv.worker.Worker`'s `config`, less its own part).
    handler: worker -> what answers its messages (the collector's writer, bridge, lookups and activity).
    before_restart: run before a dead worker is started again (the collector flushes its writer).
    """

    def __init__(
        self,
        specs: list[KVStreamSpec],
        workers: int,
        *,
        config: dict,
        handler: Callable[[StreamWorker], Callable[[str, tuple], object]],
        before_restart: Callable[[], object] = lambda: None,
    ) -> None:
        self.config, self.handler, self.before_restart = config, handler, before_restart
        self.closing = False
        self.closed = threading.Event()  # (set with `closing`: a worker's restart waits on it)
        self.num_restarts: Counter[int] = Counter()
        self.workers = [StreamWorker(i, specs[i::workers], self) for i in range(min(workers, len(specs)))]
        self._of = {spec.instance: worker for worker in self.workers for spec in worker.specs}

    def start(self) -> None:
        """Start every worker at once (each imports, rebuilds its streams' clocks and opens its sockets); raises what
        a worker's start raised (a port taken: OSError, as in process)."""
        errors: list[BaseException] = []

        def start(worker: StreamWorker) -> None:
            try:
                worker.start()
            except BaseException as exc:  # (re-raised below, on the caller's thread)
                errors.append(exc)

        threads = [
            threading.Thread(target=start, args=(w,), name=f"kvobs-worker-{w.index}-start") for w in self.workers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def of(self, instance: str) -> StreamWorker:
        return self._of[instance]

    def drop_counts(self) -> Counter[str]:
        """Dropped input per component, as the workers last reported it."""
        totals: Counter[str] = Counter()
        for worker in self.workers:
            for (component, _), n in worker.stats.get("drops", {}).items():
                totals[component] += n
        return totals

    def set_lease(self, instance: str, held: bool) -> None:
        """Tell the worker reading `instance` at once whether this collector holds its lease (it drops the stream's
        batches while not), and start a restarted one knowing it."""
        self.config["leases"][instance] = held
        channel = self.of(instance).channel
        if channel is not None:
            with contextlib.suppress(ChannelClosed):
                channel.tell("leases", {instance: held})

    def restarts(self) -> dict[str, int]:
        """Instance -> times the worker reading its stream ended unasked."""
        return {spec.instance: self.num_restarts[w.index] for w in self.workers for spec in w.specs}

    def up(self) -> dict[str, bool]:
        """Instance -> whether the worker reading its stream runs."""
        return {spec.instance: w.up for w in self.workers for spec in w.specs}

    def close(self) -> None:
        self.closing = True
        self.closed.set()
        for worker in self.workers:
            worker.close()


class RemoteSubscriber:
    """A worker's stream as the collector reads its subscriber (`KVEventSubscriber`'s names)."""

    def __init__(self, worker: StreamWorker, spec: KVStreamSpec, bind: bool) -> None:
        self.worker, self.spec, self.endpoint, self.bind = worker, spec, spec.endpoint, bind

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop_streams()

    @property
    def shapes(self) -> Counter[str]:
        return Counter(self.worker.stream_stats(self.spec.instance).get("shapes", {}))

    def __getattr__(self, name: str):
        return _stat(self.worker, self.spec.instance, name)


class RemoteIngest:
    """A worker's stream as the collector uses its `KVIngest`: snapshots, ties and totals across the channel."""

    def __init__(self, worker: StreamWorker, instance: str, held: Callable[[str], bool]) -> None:
        self.worker, self.instance, self.held = worker, instance, held
        self.recent: object | None = None  # (set by `infer_owners`: ownership by inference reads it as a switch)

    def infer_owners(self, hold_s: float, recent_s: float) -> None:
        """Before the pool starts: every worker keeps what ownership by inference reads."""
        self.worker.pool.config["infer"] = (hold_s, recent_s)
        self.recent = True

    def snapshot(self, *, final: bool = False) -> int:
        try:
            written, stats = self.worker.call(
                "snapshot", self.instance, final, {self.instance: self.held(self.instance)}
            )
        except ChannelClosed:  # its worker is starting again: its next snapshot covers this one's
            return 0
        self.worker._update(stats)
        return written

    def tie(self, frame, due_ids: list[str], since: float):
        return self.worker.call("tie", self.instance, frame, due_ids, since)

    def sequence_blocks(self, named: list[list[int]]) -> list[int]:
        return self.worker.call("sequence_blocks", self.instance, named)

    def adopt_sequences(self, asks: list[tuple[str, list[int]]]) -> int:
        return self.worker.call("adopt_sequences", self.instance, asks)

    @property
    def unknown_tiers(self) -> Counter[str]:
        return Counter(self.worker.stream_stats(self.instance).get("unknown_tiers", {}))

    @property
    def starts(self) -> SimpleNamespace:
        """The worker's `SharedStarts` totals, read as its attributes."""
        stats = self.worker.stream_stats(self.instance)
        return SimpleNamespace(**{name: stats.get(name, 0) for name in STARTS})

    def __getattr__(self, name: str):
        return _stat(self.worker, self.instance, name)


def _stat(worker: StreamWorker, instance: str, name: str):
    """One of a worker's stream's totals, read by a proxy as its in-process object's attribute."""
    stats = worker.stream_stats(instance)
    if name not in stats:
        raise AttributeError(name)
    return stats[name]


WORKER_LOOKUPS = ("session_ends", "latest_kv_ts", "block_history")  # what a worker may ask of the store
WORKER_ACTIVITY = ("resolve_pending", "idle_verdicts")  # ... and of the session activity


def answering(writer, *, lookups, activity, bridge, wait_s: float) -> Callable[[StreamWorker], Callable]:
    """What answers a worker's messages in the collector: its rows and records go to `writer` (waiting up to
    `wait_s` for room, as in process), its loss spans to `bridge`, its questions to the store's `lookups` and the
    session `activity`."""

    def for_worker(worker: StreamWorker) -> Callable[[str, tuple], object]:
        def handle(kind: str, args: tuple):
            if kind == "rows":
                instance, seq, columns = args
                writer.add_many(columns, wait_s=wait_s)
                if seq is not None:
                    worker.last_seq[instance] = seq
                return None
            if kind == "taken":  # (a worker that writes the store itself: the batch's rows are stored)
                instance, seq = args
                worker.last_seq[instance] = seq
                return None
            if kind == "first":  # ... and the first batch it received, stored or not
                instance, seq = args
                worker.first_seq.setdefault(instance, seq)
                return None
            if kind == "record":
                op, record = args
                return writer.add(record) if op == "add" else writer.insert_missing(record)
            if kind == "bridge":
                return None if bridge is None else bridge.on_batch(*args)
            if kind == "lookups" and args[0] in WORKER_LOOKUPS:
                return getattr(lookups, args[0])(*args[1])
            if kind == "activity" and args[0] in WORKER_ACTIVITY:
                return getattr(activity, args[0])(*args[1], **args[2])
            raise ValueError(f"a stream worker asked for {kind} {args[:1]}, which the collector does not answer")

        return handle

    return for_worker
