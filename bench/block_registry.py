"""What the collector's block registry costs: memory per tracked block, and the time to feed it.

The registry is each tier's `ChainTracker` (a resident block's parent, owners and latest store: footprints, losses,
the `lifetime_s` column) and its `BlockClock` (when each recently lost block was lost: the `restored` columns). Each
case runs in a fresh process that stores `--blocks` blocks (64-bit hashes) in chains of `--chain` (sessions of their
own), as a cache under no pressure holds them, then loses and stores back a tenth:

- baseline: the chains alone (no restore looked for, no loss remembered);
- chains + clock: both, as `KVIngest` feeds them;
- compiled chains + clock: the same on the compiled ingest core (`collectors.kv.core`, built by scripts/install.sh).

Printed per case: the process's RSS growth over the structure, per million blocks, the CPU time per block stored,
and the whole process's RSS at the end (Python, the modules `kvobs collect` loads, the registry; not its queues nor
its sessions' state).

Then the clock on a stream past its horizon (`--churn-lost`: that many losses within the horizon, each block stored
and lost again at once, for three times as many losses): the CPU time per store and loss once its oldest losses
expire, against the same stream on a clock whose horizon never ends (nothing expires), in the same run.

Then the chains at their bound (`--churn-bound`: that many resident blocks, the bound of a tracker whose stream's
removals never come, as a lost stream's), each new store past it dropping the oldest blocks a stretch at a time:
the CPU time per store, against a tracker holding as many blocks whose oldest block is removed at each store (the
cache's own evictions, which a healthy stream sends), in the same run.

Then a restarted collector's rebuild (`Collector.start`): a store holding `--rebuild-rows` KV-event rows of one
instance within the clock's horizon (stores, and a tenth of them lost), read back a window at a time and fed to the
clocks (`collectors.kv.rebuild.rebuild_clocks`), in a fresh process: its seconds and the process's peak RSS growth.
The baseline is a plain count of the rows, in the same run.

    python bench/block_registry.py [--blocks 1000000 10000000] [--chain 8]
    python bench/block_registry.py --rebuild-rows 1000000 --rebuild-store chdb:////tmp/ch  # (SQLite by default)
    python bench/block_registry.py --blocks --rebuild-rows --churn-lost 100000 1000000      # the churn alone
    python bench/block_registry.py --blocks --rebuild-rows --churn-lost --churn-bound 2000000  # the bound alone
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import resource
import tempfile
import time

from results import Result, record  # bench/ is on sys.path when a script in it runs
from stores import count_events
from tqdm import tqdm

from collectors.kv.batch_rows import STORED
from collectors.kv.chains import STORED_AT, ChainTracker
from collectors.kv.core import load
from collectors.kv.ingest import KVIngest
from collectors.kv.rebuild import rebuild_clocks
from kvobs.block_clock import HORIZON_S, BlockClock
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import KVEventRecord

CASES = ("chains alone", "chains + clock", "compiled chains + clock")
COLLECTOR = "collectors.command"  # what `kvobs collect` runs
HASH0 = 1 << 63  # block hashes are 64-bit: an int object of that size, as the wire's are (not a small int's)


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _case(case: str, blocks: int, chain: int, out) -> None:
    importlib.import_module(COLLECTOR)  # (the process RSS printed is then a collector's: its modules loaded)
    before = rss_mb()
    core = load("compiled" if case.startswith("compiled") else "python")
    if case.startswith("compiled") and not core.compiled:
        raise RuntimeError(f"the compiled ingest core is not loaded: {core.why}")
    chains = core.new_chains(max_blocks=blocks + 1, clock=core.new_clock(max_blocks=blocks + 1))
    clock = chains.clock if case.endswith("chains + clock") else None
    started = time.process_time()
    for first in range(0, blocks, chain):
        hashes = list(range(HASH0 + first + 1, HASH0 + first + chain + 1))
        ts = 1.8e9 + first * 1e-4
        chains.stored(hashes, None, f"s{first // chain}", ts)
        if clock is not None:
            clock.came_back(hashes, ts)
    stored_s = time.process_time() - started
    held = rss_mb() - before
    tenth, ts = list(range(HASH0 + 1, HASH0 + blocks // 10 + 1)), 1.8e9 + blocks * 1e-4
    lost = [chains.removed(block_hash) for block_hash in tenth]  # a tenth lost, then stored back: the clock's side
    if clock is not None:
        clock.lost(tenth, ts, [block[STORED_AT] for block in lost])
        clock.came_back(tenth, ts + 1)
    out.send((held, stored_s, rss_mb()))


def _fill(url: str, rows: int, instance: str, out) -> None:
    """Unless the store holds them: `rows` KV-event rows of `instance` within the clock's horizon, stores in chains
    of 8 and a tenth of the blocks lost."""
    store, chunk, t0 = open_store(url), [], 1.8e9
    todo = rows - count_events(store)
    for i in tqdm(range(todo), desc="kv_events", unit="row", mininterval=1, unit_scale=True):
        ts, kind, block = t0 + HORIZON_S * 0.99 * i / todo, STORED, HASH0 + i
        if i % 10 == 9:  # the store of 9 rows back lost
            kind, block = "evicted", HASH0 + i - 9
        chunk.append(KVEventRecord(ts=ts, instance=instance, kind=kind, block_hash=block, medium="GPU", first_owner=1))
        if len(chunk) == 50_000:
            store.write([("insert", chunk)])
            chunk = []
    store.write([("insert", chunk)])
    store.close()
    out.send(None)


def _rebuild(url: str, instance: str, out) -> None:
    store = open_store(url)
    before = max(rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    started = time.perf_counter()
    count_events(store)
    count_s = time.perf_counter() - started
    started = time.perf_counter()
    read = rebuild_clocks(KVIngest(StoreWriter(store), instance=instance), store.lookups)
    rebuild_s = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    store.close()
    out.send((count_s, read, rebuild_s, peak))


def _churn(lost: int, expiring: bool, out) -> None:
    """A block stored and lost a millisecond of stream time apart, 3 x `lost` times; the last two thirds timed."""
    clock = BlockClock(max_blocks=lost * 4, horizon_s=lost * 1e-3 if expiring else float("inf"))
    ts, timed = 1.8e9, 0.0
    for i in tqdm(range(3 * lost), desc="churn" + (" past the horizon" if expiring else ""), unit="loss"):
        if i == lost:
            timed = time.process_time()
        ts += 1e-3
        clock.stored([HASH0 + i], ts)
        clock.lost([HASH0 + i], ts)
    out.send(((time.process_time() - timed) / (2 * lost) * 1e6, len(clock.lost_at)))


def churn(lost: int) -> list[Result]:
    (within_us, _), (past_us, held) = (in_child(_churn, lost, expiring) for expiring in (False, True))
    print(f"| {lost:,} | {within_us:.2f} | {past_us:.2f} | {held:,} |")
    return [
        Result(
            "block_registry",
            f"CPU per store and loss, {lost:,} losses within the horizon, past it",
            past_us,
            "µs",
            past_us / within_us,
            "a horizon that never ends",
        )
    ]


def _at_bound(blocks: int, bounded: bool, out) -> None:
    """`blocks` resident blocks, then twice as many stores of new ones, timed: with `bounded`, on a tracker whose bound
    is `blocks` (no removal comes: the bound drops the oldest); else each followed by the removal of the oldest block
    (the cache's own eviction), on a tracker whose bound is never reached."""
    chains = ChainTracker(max_blocks=blocks if bounded else 4 * blocks)
    ts = 1.8e9
    for i in range(blocks):
        chains.stored([HASH0 + i], None, "s", ts)
    start = time.process_time()
    for i in tqdm(range(blocks, 3 * blocks), desc="at the bound" if bounded else "evicted", unit="store"):
        ts += 1e-3
        chains.stored([HASH0 + i], None, "s", ts)
        if not bounded:
            chains.removed(HASH0 + i - blocks)
    out.send(((time.process_time() - start) / (2 * blocks) * 1e6, len(chains.blocks)))


def at_bound(blocks: int) -> list[Result]:
    (evicted_us, _), (bound_us, held) = (in_child(_at_bound, blocks, bounded) for bounded in (False, True))
    print(f"| {blocks:,} | {evicted_us:.2f} | {bound_us:.2f} | {held:,} |")
    return [
        Result(
            "block_registry",
            f"CPU per store, chains at a bound of {blocks:,} blocks (no removals)",
            bound_us,
            "µs",
            bound_us / evicted_us,
            "a store and an eviction, as many resident",
        )
    ]


def in_child(target, *args):
    """`target(*args, pipe)` in a fresh process (chDB: one process per data directory); what it sent."""
    receive, send = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.get_context("fork").Process(target=target, args=(*args, send))
    proc.start()
    result = receive.recv()
    proc.join()
    return result


def rebuild(url: str, rows: int) -> list[Result]:
    """Fill a store at `url` (unless it holds the rows), then time the rebuild against a count."""
    in_child(_fill, url, rows, "vllm-0")
    count_s, read, rebuild_s, peak = in_child(_rebuild, url, "vllm-0")
    backend = url.split(":", 1)[0]
    print(f"| {backend} | {read:,} | {count_s:.3f} | {rebuild_s:.2f} | {read / rebuild_s:,.0f} | {peak:,.0f} |")
    case = f"restart rebuild from {read:,} rows ({backend})"
    return [
        Result("block_registry", f"{case}: rebuild_clocks", rebuild_s, "s", rebuild_s / count_s, "count of the rows"),
        Result("block_registry", f"{case}: peak RSS growth", peak, "MB", 1.0, "itself"),
    ]


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, nargs="*", default=[1_000_000, 10_000_000], help="none: no registry case")
    parser.add_argument("--chain", type=int, default=8)
    parser.add_argument("--rebuild-rows", type=int, nargs="*", default=[1_000_000], help="none: no rebuild case")
    parser.add_argument("--churn-lost", type=int, nargs="*", default=[1_000_000], help="none: no churn case")
    parser.add_argument("--churn-bound", type=int, nargs="*", default=[2_000_000], help="none: no bound case")
    parser.add_argument("--rebuild-store", help="a store URL (one size); default: SQLite in a temporary directory")
    args = parser.parse_args(argv)
    results = []
    if args.blocks:
        print(
            "| resident blocks | case | RSS held (MB) | MB per million | CPU µs per block stored | process RSS (MB) |"
        )
        print("|---|---|---|---|---|---|")
    for blocks in args.blocks:
        baseline = None
        for case in CASES:
            held, stored_s, rss = in_child(_case, case, blocks, args.chain)  # (RSS MB held, CPU s to store, RSS MB)
            per_million = held / (blocks / 1e6)
            cpu_us = stored_s / blocks * 1e6
            print(f"| {blocks:,} | {case} | {held:,.0f} | {per_million:,.0f} | {cpu_us:.2f} | {rss:,.0f} |")
            baseline = baseline or (held, stored_s, rss)
            results.append(
                Result(
                    "block_registry",
                    f"process RSS at {blocks:,} resident blocks (Python, a collector's modules, the registry): {case}",
                    rss,
                    "MB",
                    rss / baseline[2],
                    "chains alone",
                )
            )
            results.append(
                Result(
                    "block_registry",
                    f"RSS held at {blocks:,} resident blocks: {case}",
                    held,
                    "MB",
                    held / baseline[0],
                    "chains alone",
                )
            )
            results.append(
                Result(
                    "block_registry",
                    f"CPU per block stored at {blocks:,} resident blocks: {case}",
                    stored_s / blocks * 1e6,
                    "µs",
                    stored_s / baseline[1],
                    "chains alone",
                )
            )
    if args.churn_lost:
        print(
            "\n| losses within the horizon | CPU µs a store and loss, no expiry | past the horizon | held at the end |"
        )
        print("|---|---|---|---|")
    for lost in args.churn_lost:
        results += churn(lost)
    if args.churn_bound:
        print("\n| resident blocks | CPU µs a store and an eviction | a store at the bound | held at the end |")
        print("|---|---|---|---|")
    for blocks in args.churn_bound:
        results += at_bound(blocks)
    if args.rebuild_rows:
        print("\n| store | rows read | count (s) | rebuild (s) | rows/s | peak RSS growth (MB) |")
        print("|---|---|---|---|---|---|")
    for rows in args.rebuild_rows:
        if args.rebuild_store:
            results += rebuild(args.rebuild_store, rows)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            results += rebuild(f"sqlite:///{tmp}/kvobs.db", rows)
    return results


if __name__ == "__main__":
    record(main)
