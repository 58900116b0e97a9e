"""What the per-minute rollups of snapshots and requests cost the writer: the same rows written with them and
without them, into SQLite and into chDB, in one run.

Rows as an engine or a collector writes them: `--instances` instances each taking an instance snapshot every
second (usage, resident blocks, waiting, a preemption counter) and `--requests` requests spread over the same time
(with latencies and cached tokens), through `StoreWriter` in its batches. "without rollups" is the same writer with
the batch's rollup step left out (`BatchRollups.partials` answering nothing): the baseline, measured in this run.
Each case writes into a fresh store, in a process of its own; rows/s and microseconds per row are over the whole
write, until the writer has committed every row.

    python bench/rollup_writes.py [--seconds 3600] [--instances 4] [--requests 50000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from results import Result, record  # bench/ is on sys.path when a script in it runs

from kvobs.store import StoreWriter, open_store
from kvobs.store.rollups import BatchRollups
from kvobs.store.rows import RequestRecord, SnapshotRecord

T0 = 1_800_000_000.0


def rows(seconds: int, instances: int, requests: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    out: list = []
    counts = [0] * instances
    for second in range(seconds):
        for i in range(instances):
            counts[i] += rng.random() < 0.05
            out.append(
                SnapshotRecord(
                    ts=T0 + second + i / instances,
                    instance=f"vllm-{i}",
                    kv_usage=rng.random(),
                    blocks_resident=rng.randrange(4096),
                    num_waiting=rng.randrange(8),
                    preemptions_total=counts[i],
                )
            )
    for n in range(requests):
        arrival = T0 + seconds * n / requests
        first = arrival + rng.lognormvariate(-2.0, 1.0)
        out.append(
            RequestRecord(
                request_id=f"r{n}",
                instance=f"vllm-{n % instances}",
                arrival_ts=arrival,
                first_token_ts=first,
                finished_ts=first + rng.random() * 4,
                queue_s=rng.random() / 20,
                prompt_tokens=rng.randrange(100, 4000),
                cached_tokens=rng.randrange(0, 100),
                completion_tokens=rng.randrange(1, 400),
            )
        )
    out.sort(key=lambda r: getattr(r, "ts", None) or r.arrival_ts)
    return out


@contextmanager
def rollups_left_out():
    """The writer as it is, but for the batch's rollup step."""
    partials = BatchRollups.partials
    BatchRollups.partials = lambda self, *a, **k: ([], dict(self.counts))  # type: ignore[method-assign]
    try:
        yield
    finally:
        BatchRollups.partials = partials  # type: ignore[method-assign]


def write_seconds(url: str, mode: str, seconds: int, instances: int, requests: int) -> float:
    """One case, in a process of its own (chDB holds one data directory per process): the rows written into a
    fresh store at `url`, with the rollups or without them (`mode`)."""
    records = rows(seconds, instances, requests)
    store = open_store(url)
    writer = StoreWriter(store)
    with rollups_left_out() if mode == "without" else nullcontext():
        start = time.perf_counter()
        writer.add_many(records)
        writer.close()  # every row committed
        elapsed = time.perf_counter() - start
    store.close()
    return elapsed


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=3600)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    total = args.seconds * args.instances + args.requests
    print(
        f"\n{total:,} rows: {args.seconds * args.instances:,} instance snapshots and {args.requests:,} requests "
        f"over {args.seconds:,} s on {args.instances} instances; median of {args.repeats}\n"
    )
    print("| store | without rollups (rows/s) | with rollups (rows/s) | µs per row added | cost |")
    print("|---|---|---|---|---|")
    results = []
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="kvobs-rollups-") as tmp, spawn.Pool(1, maxtasksperchild=1) as pool:
        for backend in ("sqlite", "chdb"):
            timings: dict[str, list[float]] = {"without": [], "with": []}
            for k in range(args.repeats):
                for mode in ("without", "with"):  # alternated, so drift in the machine falls on both
                    path = Path(tmp) / f"{backend}-{mode}-{k}"
                    url = f"sqlite:///{path}.db" if backend == "sqlite" else f"chdb:///{path}"
                    case = (url, mode, args.seconds, args.instances, args.requests)
                    timings[mode].append(pool.apply(write_seconds, case))
            without, with_ = (statistics.median(timings[m]) for m in ("without", "with"))
            added_us = (with_ - without) / total * 1e6
            print(
                f"| {backend} | {total / without:,.0f} | {total / with_:,.0f} | {added_us:.1f} | "
                f"{with_ / without - 1:+.0%} |"
            )
            results.append(
                Result(
                    "rollup_writes",
                    f"snapshots and requests into {backend}, with rollups",
                    total / with_,
                    "rows/s",
                    without / with_,
                    "without rollups",
                )
            )
    return results


if __name__ == "__main__":
    record(main)
