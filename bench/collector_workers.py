"""Attribution on every core: `kvobs collect` over `--streams` replicas' KV-event streams, with `--workers 1` (every
stream decoded and attributed in the collector's process: the baseline) and with `--workers N` (each stream in a
worker process of its own, `collectors.kv.workers`), into each store.

A real collector: its streams bound over ZMQ, each fed by a publisher sending `collector_ingest`'s synthetic vLLM
batches (the same for every stream, each its own replica) from a process of its own, as vLLM is, as fast as ZMQ takes
them. With workers, the rows go back to the collector's writer (SQLite, chDB) or are written by each worker's own
(PostgreSQL). A run's time is from the first
batch sent until every batch is handled and every row committed (the writers flushed); the workers are started
before the clock, as a collector starts them once, and the collector stops after it. CPU: the collector's process
and its workers' over that time (every thread; not a PostgreSQL server's).

    python bench/collector_workers.py [--streams 2] [--workers 2] [--batches 2000] [--events 50] [--repeats 3]
        [--postgres URL]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from unittest.mock import patch

import zmq
from collector_ingest import STORES, _cpu, _emptied, synthetic_payloads, workload_arguments
from ports import free_port
from results import Result, process_cpu_s, record  # bench/ is on sys.path when a script in it runs
from tqdm.auto import tqdm

from collectors.collector import Collector, CollectorOptions
from kvobs.store import open_store
from kvobs.store.db import takes_many_writers
from kvobs.vllm import kv_events as wire


def workers_cpu_s(collector: Collector) -> float:
    """The collector's worker processes' CPU seconds so far (user + system, from Linux's /proc/PID/stat)."""
    if collector.pool is None:
        return 0.0
    return sum(_cpu(worker.process.pid) for worker in collector.pool.workers if worker.process is not None)


def subscribed(port: int, queued: int, linger_ms: int = 30_000) -> zmq.Socket | None:
    """A publisher connected to the collector's bound socket on `port`, holding up to `queued` batches, once the
    collector's subscription has come (None when it did not in 30 s)."""
    pub = zmq.Context.instance().socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, queued + 10)
    pub.setsockopt(zmq.LINGER, linger_ms)
    pub.connect(f"tcp://127.0.0.1:{port}")
    if not pub.poll(30_000):
        return None
    pub.recv()  # the collector's subscription
    return pub


def publish(ports: list[int], payloads: list[bytes], ready, go) -> None:
    """A process of its own, as vLLM is: one publisher per port, each sending every payload once `go` is set."""
    pubs = []
    for port in ports:
        pub = subscribed(port, len(payloads))
        if pub is None:
            return
        pubs.append(pub)
    ready.set()
    go.wait()
    for seq, payload in enumerate(payloads):
        for pub in pubs:
            pub.send_multipart((b"", wire.seq_bytes(seq), payload))
    for pub in pubs:
        pub.close()


def one_run(url: str, payloads: list[bytes], streams: int, workers: int, *, direct: bool = True) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the collector taking every stream's payloads into `url`; `direct` False: a
    store that takes many writers still gets the workers' rows through the collector's writer (the comparison)."""
    if not direct:
        with patch("collectors.collector.takes_many_writers", return_value=False):
            return one_run(url, payloads, streams, workers)
    store = open_store(url)
    if url.startswith("postgresql"):
        _emptied(store)
    ports = [free_port() for _ in range(streams)]
    options = CollectorOptions(
        kv_events=[f"replica-{i}=tcp://127.0.0.1:{port}" for i, port in enumerate(ports)],
        kv_events_bind=True,
        interval_s=3600,
        workers=workers,
    )
    collector = Collector(options, store=store)
    collector.writer.max_queue = 10_000_000  # (the run measures the rate, not the queue's back-pressure)
    collector.start()
    spawn = multiprocessing.get_context("spawn")  # (a fresh interpreter: no fork of the collector's threads)
    ready, go = spawn.Event(), spawn.Event()
    sender = spawn.Process(target=publish, args=(ports, payloads, ready, go))
    sender.start()
    if not ready.wait(60):
        raise TimeoutError("the publishers were not subscribed to in 60 s")
    cpu, children, start = process_cpu_s(), workers_cpu_s(collector), time.perf_counter()
    go.set()
    deadline = time.monotonic() + 600
    while any(s.subscriber.num_batches < len(payloads) for s in collector.streams):
        if time.monotonic() > deadline:
            raise TimeoutError("the collector did not take every batch in 600 s")
        time.sleep(0.05)
    collector.writer.flush()  # every row committed
    if collector.pool is not None and collector.pool.config["direct"] is not None:  # (each worker's own writer's)
        last = len(payloads) - 1
        while any(collector.pool.of(s.spec.instance).last_seq.get(s.spec.instance) != last for s in collector.streams):
            if time.monotonic() > deadline:
                raise TimeoutError("the workers did not commit every batch in 600 s")
            time.sleep(0.01)
    wall = time.perf_counter() - start
    cpu = process_cpu_s() - cpu + workers_cpu_s(collector) - children
    collector.stop()
    sender.join(30)
    store.close()
    return wall, cpu


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_arguments(parser)
    parser.add_argument("--streams", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--postgres", metavar="URL", help="also PostgreSQL: a database of its own (emptied each run)")
    parser.add_argument("--stores", default="chDB,SQLite", help="which of chDB, SQLite (and PostgreSQL) to run")
    args = parser.parse_args(argv)
    payloads, per_stream = synthetic_payloads(args.batches, args.events, args.sessions)
    total = per_stream * args.streams
    stores = {name: STORES[name] for name in args.stores.split(",") if name}
    if args.postgres:
        stores["PostgreSQL"] = args.postgres
    times: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in tqdm(range(args.repeats), desc="collector runs", unit="round"):
            for name, template in stores.items():
                for workers in (1, args.workers):
                    url = template.format(dir=tmp, run=run, n=workers) if "{dir}" in template else template
                    times.setdefault((name, workers), []).append(one_run(url, payloads, args.streams, workers))
                    if workers > 1 and takes_many_writers(url):  # ... and through the collector's writer
                        times.setdefault((name, -workers), []).append(
                            one_run(url, payloads, args.streams, workers, direct=False)
                        )
    print(
        f"\n{args.streams} streams x {per_stream:,} events ({len(payloads):,} batches each): {total:,} events, median "
        f"of {args.repeats}; {os.cpu_count()} cores; CPU: the collector's and its workers', every thread"
    )
    print(
        f"{'store':<12} {'workers':>8} {'events/s':>12} {'vs 1 worker':>12} {'CPU cores busy':>15} {'CPU us/event':>13}"
    )
    rows = []
    for name in stores:
        base = statistics.median(total / wall for wall, _ in times[(name, 1)])
        for workers in (1, -args.workers, args.workers):
            if (name, workers) not in times:
                continue
            wall, cpu = sorted(times[(name, workers)])[len(times[(name, workers)]) // 2]
            rate = total / wall
            print(
                f"{name:<12} {abs(workers):>8} {rate:>12,.0f} {rate / base:>11.2f}x {cpu / wall:>15.2f} "
                f"{cpu / total * 1e6:>13.2f}{'  (rows through the collector)' if workers < 0 else ''}"
            )
            case = f"{args.streams} streams into {name}, --workers {abs(workers)}"
            if workers < 0:
                case += ", rows through the collector's writer"
            elif workers > 1 and (name, -workers) in times:
                case += ", each worker writing"
            rows.append(Result("collector_workers", case, rate, "events/s", rate / base, "--workers 1"))
    return rows


if __name__ == "__main__":
    record(main)
