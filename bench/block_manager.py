"""How fast the engine's KV-cache bookkeeping runs: the block manager (its pool, sessions and events) per request,
against hashing the same requests' blocks alone (the baseline: what every lookup must do anyway).

    .venv/bin/python bench/block_manager.py                 # 3,000 requests over 8 shared prefixes, best of 3
    .venv/bin/python bench/block_manager.py --requests 300  # smaller

Each request: a session's request begins, its prefix is looked up, blocks are allocated for the rest, the computed
blocks are registered (hashed, cached, `BlocksStored`), the request is freed and ends; the events are taken. A
512-block pool under 8 sessions whose prompts share a 256-token prefix evicts as it goes. CPU time, one thread.
"""

from __future__ import annotations

import argparse
import random
import time

from results import Result, record  # bench/ is on sys.path when a script in it runs

from instrumented_engine.engine.kv_cache.hashing import hash_chain
from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.sampling_params import SamplingParams

BLOCK_SIZE = 16


def workload(num_requests: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(50_000) for _ in range(256)] for _ in range(8)]
    return [
        (f"s{i % 8}", prefixes[i % 8] + [rng.randrange(50_000) for _ in range(rng.randrange(16, 200))])
        for i in range(num_requests)
    ]


def time_manager(requests: list[tuple[str, list[int]]]) -> tuple[float, int]:
    """(CPU seconds, events emitted) for every request through a fresh block manager."""
    manager, num_events = BlockManager(512, BLOCK_SIZE), 0
    start = time.process_time()
    for i, (session, tokens) in enumerate(requests):
        seq = Sequence(f"r{i}", tokens, SamplingParams(), 0.0, session_id=session)
        manager.begin_request(seq)
        hits = manager.lookup(seq)
        if manager.allocate(seq, seq.num_tokens - len(hits) * BLOCK_SIZE, hits):
            seq.num_computed_tokens = seq.num_tokens
            manager.register_computed_blocks(seq)
            manager.free(seq)
        manager.end_request(seq)
        num_events += len(manager.take_events())
    return time.process_time() - start, num_events


def time_hashing(requests: list[tuple[str, list[int]]]) -> float:
    start = time.process_time()
    for _, tokens in requests:
        hash_chain(tokens, BLOCK_SIZE, (0,))
    return time.process_time() - start


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    requests = workload(args.requests)
    managed = min(time_manager(requests)[0] for _ in range(args.repeats))
    hashed = min(time_hashing(requests) for _ in range(args.repeats))
    num_events = time_manager(requests)[1]
    rate, base = args.requests / managed, args.requests / hashed
    print(f"\n{args.requests:,} requests ({num_events:,} events), best of {args.repeats}, CPU time")
    print("| case | requests/s | vs hashing alone |")
    print("|---|---|---|")
    print(f"| hashing the blocks alone (baseline) | {base:,.0f} | 1.00x |")
    print(f"| block manager: lookup, allocate, register, free, events | {rate:,.0f} | {rate / base:.2f}x |")
    return [Result("block_manager", "lookup, allocate, register, free", rate, "requests/s", rate / base, "hashing")]


if __name__ == "__main__":
    record(main)
