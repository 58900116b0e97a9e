"""What the collector's block registry costs: memory per tracked block, and the time to feed it.

The registry is each tier's `ChainTracker` (a resident block's parent and owners: footprints, losses) and, since
revision 0021, its `BlockClock` (when each resident block was stored, when each recently lost one was lost: the
`lifetime_s` and `restored` columns). Each case runs in a fresh process that stores `--blocks` blocks (64-bit
hashes) in chains of `--chain` (sessions of their own), as a cache under no pressure holds them, then loses and stores
back a tenth:

- baseline: the chains alone (what the registry was before the clock);
- chains + clock: both, as `KVIngest` feeds them.

Printed per case: the process's RSS growth over the structure, per million blocks, and the CPU time per block
stored.

    python bench/block_registry.py [--blocks 1000000 10000000] [--chain 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import time

from results import Result, record  # bench/ is on sys.path when a script in it runs

from collectors.kv.chains import ChainTracker
from kvobs.block_clock import BlockClock

CASES = ("chains alone", "chains + clock")
HASH0 = 1 << 63  # block hashes are 64-bit: an int object of that size, as the wire's are (not a small int's)


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _case(case: str, blocks: int, chain: int, out) -> None:
    before = rss_mb()
    chains = ChainTracker(max_blocks=blocks + 1)
    clock = BlockClock(max_blocks=blocks + 1) if case == "chains + clock" else None
    started = time.process_time()
    for first in range(0, blocks, chain):
        hashes = list(range(HASH0 + first + 1, HASH0 + first + chain + 1))
        ts = 1.8e9 + first * 1e-4
        chains.stored(hashes, None, f"s{first // chain}")
        if clock is not None:
            clock.stored(hashes, ts)
    stored_s = time.process_time() - started
    held = rss_mb() - before
    tenth = list(range(HASH0 + 1, HASH0 + blocks // 10 + 1))
    for block_hash in tenth:  # a tenth lost, then stored back: the clock's lost side too
        chains.removed(block_hash)
    if clock is not None:
        clock.lost(tenth, 1.8e9 + blocks * 1e-4)
        clock.stored(tenth, 1.8e9 + blocks * 1e-4 + 1)
    out.send((held, stored_s))


def measure(case: str, blocks: int, chain: int) -> tuple[float, float]:
    """(RSS MB held by `blocks` resident blocks, CPU s to store them), in a fresh process."""
    receive, send = multiprocessing.Pipe(duplex=False)
    proc = multiprocessing.get_context("fork").Process(target=_case, args=(case, blocks, chain, send))
    proc.start()
    result = receive.recv()
    proc.join()
    return result


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--chain", type=int, default=8)
    args = parser.parse_args(argv)
    results = []
    print("| resident blocks | case | RSS held (MB) | MB per million blocks | CPU µs per block stored |")
    print("|---|---|---|---|---|")
    for blocks in args.blocks:
        baseline = None
        for case in CASES:
            held, stored_s = measure(case, blocks, args.chain)
            per_million = held / (blocks / 1e6)
            print(f"| {blocks:,} | {case} | {held:,.0f} | {per_million:,.0f} | {stored_s / blocks * 1e6:.2f} |")
            baseline = baseline or (held, stored_s)
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
    return results


if __name__ == "__main__":
    record(main)
