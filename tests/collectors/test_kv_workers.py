"""`kvobs collect --workers N`: each KV-event stream decoded and attributed in a worker process of its own. The truth
is the collector's own process: on the recorded two-replica `kvobs serve` run (real frames over real ZMQ, its spans
over OTLP, its scrapes over HTTP), two workers store exactly the rows one process stores; and a worker killed
mid-run (SIGKILL) is started again and resumes from the publisher's replay socket, so no batch is lost or stored
twice. On SQLite the workers' rows go through the collector's writer; on PostgreSQL each worker writes its own."""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack, contextmanager

import pytest
import zmq
from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from collectors.kv.workers import default_workers
from kvobs.commands.doctor import exposition_checks
from kvobs.store import open_store
from kvobs.store.db import takes_many_writers
from kvobs.vllm import kv_events as wire
from tests.collectors.fleet_recording import REPLICAS, collect_fleet_recording, replica_frames
from tests.collectors.replay import publisher, replay_router, wait_subscribed
from tests.server.conftest import free_port
from tests.stores import postgres_schema, postgres_url
from tests.waiting import wait_for

KV_ROWS = (
    "SELECT ts, instance, kind, block_hash, parent_hash, session_id, medium, first_owner, num_tokens, reason, "
    "num_blocks, group_idx, lifetime_s, restored, restored_after_s FROM kv_events ORDER BY 1, 2, 3, 4, 6, 8"
)
FOOTPRINTS = (
    "SELECT ts, instance, session_id, session_blocks, session_evicted_blocks, session_evicted_idle_blocks, "
    "session_pending_idle_blocks FROM snapshots WHERE session_id IS NOT NULL ORDER BY 1, 2, 3"
)
SESSIONS = "SELECT session_id, started_at, ended_at, num_steps, source FROM sessions ORDER BY 1"


BACKENDS = ["sqlite", "postgresql"]  # the workers' rows through the collector's writer; each worker's own writer


@contextmanager
def store_urls(backend: str, tmp_path, names: tuple[str, ...]):
    """A fresh store URL per name: SQLite files, or schemas of the local PostgreSQL (dropped afterwards)."""
    if backend == "sqlite":
        yield {name: f"sqlite:///{tmp_path / (name + '.db')}" for name in names}
        return
    with ExitStack() as stack:
        yield {name: postgres_url(stack.enter_context(postgres_schema())) for name in names}


def rows(url: str, query: str) -> list[tuple]:
    store = open_store(url, migrate=False)
    try:
        with store.engine.connect() as conn:
            return [tuple(row) for row in conn.exec_driver_sql(query).all()]
    finally:
        store.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_workers_store_exactly_what_one_process_stores(tmp_path, backend):
    with store_urls(backend, tmp_path, ("one", "two")) as urls:
        for workers, url in ((1, urls["one"]), (2, urls["two"])):
            store = open_store(url)
            spool = tmp_path / "spool" if workers == 2 else None  # (a worker's own writer acknowledges on spooling)
            with collect_fleet_recording(store, workers=workers, spool_dir=spool) as collector:
                pool = collector.pool
                if workers == 1:
                    assert pool is None  # (in the collector's own process)
                else:
                    assert pool is not None and len({w.process.pid for w in pool.workers}) == 2
                    assert [s.instance for w in pool.workers for s in w.specs] == list(REPLICAS)
                    assert (pool.config["direct"] is not None) == (backend == "postgresql") == takes_many_writers(url)
                    counted = {s.spec.instance: s.subscriber.num_batches for s in collector.streams}
                    assert counted == {name: len(replica_frames(name)) for name in REPLICAS}
                    _worker_queues_shown(collector, direct=backend == "postgresql")
            if pool is not None:  # on PostgreSQL, each worker's own writer wrote its stream's rows
                written = [w.stats["written"] for w in pool.workers]
                assert all(n > 0 for n in written) if backend == "postgresql" else written == [None, None]
                assert (spool / "worker-0").is_dir() == (spool / "worker-1").is_dir() == (backend == "postgresql")
            store.close()
        for query in (KV_ROWS, FOOTPRINTS, SESSIONS):
            assert rows(urls["two"], query) == rows(urls["one"], query)
        assert len(rows(urls["one"], KV_ROWS)) > 100 and len(rows(urls["one"], FOOTPRINTS)) > 0  # (it compared some)


def _worker_queues_shown(collector, *, direct: bool) -> None:
    """Where each worker writes the store itself, its own writer's queue is on /metrics (a series a worker) and in
    doctor (a line a worker); where its rows go to the collector's writer, that writer's queue says them."""
    exposed = generate_latest(collector.registry).decode()
    checks = {name: (ok, words) for name, ok, words in exposition_checks(exposed)}
    for worker in ("worker-0", "worker-1"):
        assert (f'kvobs_store_worker_queue_capacity_rows{{worker="{worker}"}}' in exposed) == direct
        assert (f"(store queue of {worker})" in checks) == direct
        if direct:
            ok, words = checks[f"(store queue of {worker})"]
            assert ok and "rows waiting to be committed" in words
    assert "(store queue)" in checks  # (the collector's own writer, always)


def test_the_default_uses_the_cores_up_to_the_streams():
    assert default_workers(1) == 1
    assert default_workers(64) == (os.cpu_count() or 1)
    assert default_workers(2) == min(2, os.cpu_count() or 1)


def _run(url: str, *, workers: int, kill: bool) -> tuple[Collector, list[str]]:
    """Both replicas' frames through a collector whose streams have replay sockets, and its /metrics text (with
    `kill`: while the worker is down, then at the end). With `kill`, replica-a's worker is killed halfway through its
    frames; another socket holds its port until its first start again has failed, and the rest of the frames are
    published once it runs again."""
    frames = {name: replica_frames(name) for name in REPLICAS}
    ports = {name: (free_port(), free_port()) for name in REPLICAS}
    store = open_store(url)
    exposed = []
    with ExitStack() as stack:
        for name in REPLICAS:
            stack.enter_context(
                replay_router(f"tcp://127.0.0.1:{ports[name][1]}", [tuple(f) for f in frames[name]], form="0.33")
            )
        options = CollectorOptions(
            kv_events=[f"{name}=tcp://127.0.0.1:{ports[name][0]}" for name in REPLICAS],
            kv_events_replay=[f"{name}=tcp://127.0.0.1:{ports[name][1]}" for name in REPLICAS],
            kv_events_bind=True,
            interval_s=3600,
            settle_s=0.0,
            workers=workers,
        )
        collector = Collector(options, store=store)
        collector.start()
        try:
            pubs = {}
            for name in REPLICAS:
                pubs[name] = stack.enter_context(publisher(f"tcp://127.0.0.1:{ports[name][0]}", bind=False))
                wait_subscribed(pubs[name])
            a, b = REPLICAS
            half = len(frames[a]) // 2
            for message in frames[a][:half] + frames[b]:
                pubs[a if message in frames[a] else b].send_multipart(message)
            last = {name: wire.seq_from_bytes(frames[name][-1][1]) for name in REPLICAS}
            if kill:
                worker, pool = collector.pool.of(a), collector.pool
                wait_for(lambda: collector.streams[0].subscriber.num_batches == half)
                taken = stack.enter_context(zmq.Context().socket(zmq.SUB))
                restart = pool.before_restart

                def take_the_port_first() -> None:  # as another process binding it meanwhile would
                    if not worker.num_failed_restarts:
                        taken.bind(f"tcp://127.0.0.1:{ports[a][0]}")
                    restart()

                pool.before_restart = take_the_port_first
                os.kill(worker.process.pid, signal.SIGKILL)
                wait_for(lambda: worker.num_failed_restarts == 1, timeout_s=60)
                exposed.append(generate_latest(collector.registry).decode())
                taken.close(linger=0)
                wait_for(lambda: worker.num_starts == 2, timeout_s=60)
            for message in frames[a][half:]:
                pubs[a].send_multipart(message)
            for stream in collector.streams:
                name = stream.spec.instance
                if collector.pool is not None:  # every batch's rows taken by the collector
                    worker = collector.pool.of(name)
                    wait_for(lambda w=worker, n=name: w.last_seq.get(n) == last[n], timeout_s=30)
                else:
                    count = len(frames[name])
                    wait_for(lambda s=stream, n=count: s.subscriber.num_batches == n)
            exposed.append(generate_latest(collector.registry).decode())
        finally:
            collector.stop()
    store.close()
    return collector, exposed


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_worker_killed_mid_run_loses_nothing_acknowledged(tmp_path, backend):
    """Replica-a's worker is killed halfway; the collector starts it again, and its stream resumes after the last
    batch acknowledged (its rows taken by the collector's writer; on PostgreSQL, committed by the worker's own): what
    the dead worker had not handed on or stored, and what was published while no worker listened, comes from the
    replay socket. Every block stored, removed and cleared is stored once, as the
    collector's own process stores it. (The new worker's chains start empty, as after a collector restart, so a
    removal of a block stored before the kill names no session: owners are not compared.) Its first start again
    fails (another socket holds its port): it is tried again, and /metrics and `kvobs doctor` say it was down."""
    with store_urls(backend, tmp_path, ("one", "killed")) as urls:
        _check_the_kill(urls)


def _check_the_kill(urls: dict[str, str]) -> None:
    reference, _ = _run(urls["one"], workers=1, kill=False)
    killed, (while_down, after) = _run(urls["killed"], workers=2, kill=True)
    assert reference.pool is None and killed.pool is not None
    a, b = REPLICAS
    assert killed.pool.restarts() == {a: 1, b: 0}
    for text, up in ((while_down, 0.0), (after, 1.0)):  # its /metrics, and what `kvobs doctor --collector` says
        assert f'kvobs_collector_kv_worker_restarts_total{{instance="{a}"}} 1.0' in text
        assert f'kvobs_collector_kv_worker_restarts_total{{instance="{b}"}} 0.0' in text
        assert f'kvobs_collector_kv_worker_up{{instance="{a}"}} {up}' in text
        assert f'kvobs_collector_kv_worker_up{{instance="{b}"}} 1.0' in text
        checks = {name: (ok, said) for name, ok, said in exposition_checks(text)}
        assert not checks[a][0] and "its worker process ended 1 time(s) unasked" in checks[a][1]
        assert ("its worker process is down" in checks[a][1]) == (up == 0.0)
        assert "worker process" not in checks.get(b, (True, ""))[1]
    events = (
        "SELECT ts, instance, kind, block_hash, parent_hash, num_blocks FROM kv_events WHERE {} ORDER BY 1, 2, 3, 4"
    )
    stored = events.format("kind IN ('stored', 'tier_stored', 'cleared')")
    removed = events.format("kind IN ('removed', 'tier_removed') AND first_owner = 1")
    for query in (stored, removed):
        assert rows(urls["killed"], query) == rows(urls["one"], query)
    assert len(rows(urls["one"], stored)) > 50
