"""What the routing-loss analysis costs on a fleet: one pass of the fleet index (which replica holds which block)
over the replicas' KV events in time order, then each request's lookup against it, and the same with each missed
block's reason (what the collector's routing meter writes), against reading the same events once in Python (the
baseline: what any one pass must do).

    .venv/bin/python bench/fleet_index.py                         # 1M events over 8 replicas
    .venv/bin/python bench/fleet_index.py --events 10000000       # the issue's 10M (about 3 GB, a few minutes)

The fleet: `--replicas` replicas of `--capacity` blocks each; agent sessions of 5 to 30 steps (32 a replica at a
time, sharing 16 system prompts) send steps round robin over the replicas, each step storing on its replica the
blocks of its session's prompt that replica lacks; a full replica removes its oldest blocks (vLLM's `removed`).
CPU time, one thread.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque

import pandas as pd
from results import Result, record  # bench/ is on sys.path when a script in it runs

from kvobs.analytics.cache import FleetCheck, FleetIndex, request_lookups, routing_losses

BLOCK_SIZE = 16


def fleet(num_events: int, replicas: int, capacity: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(KV events, requests) of the synthetic fleet, about `num_events` events."""
    rng = random.Random(seed)
    names = [f"replica-{i}" for i in range(replicas)]
    resident = {name: deque() for name in names}
    held = {name: set() for name in names}
    columns = ("ts", "instance", "kind", "block_hash", "parent_hash", "num_tokens", "request_id", "session_id")
    ev: dict[str, list] = {c: [] for c in columns}
    reqs = {c: [] for c in ("request_id", "instance", "session_id", "arrival_ts", "queue_s", "prompt_tokens")}
    reqs["cached_tokens"], reqs["finished_ts"] = [], []
    prompts = [[rng.getrandbits(63) for _ in range(8)] for _ in range(16)]  # system prompts, 8 blocks each
    sessions: dict[int, list[int]] = {}
    sid_of: dict[int, int] = {}
    next_hash, ts, turn, i = 1 << 62, 1_000_000.0, 0, 0

    def event(kind, name, block_hash, parent, rid, session=None):
        for column, value in zip(ev, (ts, name, kind, block_hash, parent, BLOCK_SIZE, rid, session)):
            ev[column].append(value)

    steps_left: dict[int, int] = {}
    while len(ev["ts"]) < num_events:
        slot = rng.randrange(4 * replicas * 8)  # a live session; after its 5 to 30 steps, a new one takes its slot
        if steps_left.get(slot, 0) == 0:
            steps_left[slot], sessions[slot] = rng.randrange(5, 31), list(prompts[slot % 16])
            sid_of[slot] = len(sid_of)
        steps_left[slot] -= 1
        sid, chain = sid_of[slot], sessions[slot]
        chain.extend(range(next_hash, next_hash + rng.randrange(1, 6)))  # the step's new blocks
        next_hash += 8
        name, rid = names[turn % replicas], f"r{i}"
        turn, i, ts = turn + 1, i + 1, ts + 0.01
        own = 0
        while own < len(chain) - 1 and chain[own] in held[name]:
            own += 1
        for position in range(own, len(chain)):
            block_hash = chain[position]
            if block_hash in held[name]:
                continue
            event("stored", name, block_hash, chain[position - 1] if position else None, rid, f"s{sid}")
            held[name].add(block_hash)
            resident[name].append(block_hash)
            while len(resident[name]) > capacity:
                gone = resident[name].popleft()
                held[name].discard(gone)
                event("removed", name, gone, None, None)
        for column, value in zip(
            reqs,
            (rid, name, f"s{sid}", ts - 0.005, 0.0, len(chain) * BLOCK_SIZE + 1, own * BLOCK_SIZE, ts + 0.001),
        ):
            reqs[column].append(value)
    frame = pd.DataFrame(ev).assign(medium="GPU")  # one tier, named as vLLM names its device cache
    for column in ("block_hash", "parent_hash"):  # Python ints and None, as the store's reads give them
        frame[column] = pd.Series(ev[column], dtype=object)
    return frame, pd.DataFrame(reqs)


def time_baseline(events: pd.DataFrame) -> float:
    """One Python pass over the same columns, doing nothing with them."""
    start, n = time.process_time(), 0
    for kind, _instance, block_hash, _parent in zip(
        events["kind"].to_numpy(object),
        events["instance"].to_numpy(object),
        events["block_hash"].to_numpy(object),
        events["parent_hash"].to_numpy(object),
    ):
        n += kind == "stored" and block_hash is not None
    return time.process_time() - start


def time_index(events: pd.DataFrame) -> float:
    columns = [events[c].to_numpy(object) for c in ("kind", "instance", "block_hash", "parent_hash", "ts", "medium")]
    start = time.process_time()
    FleetIndex().apply(*columns)  # with each event's tier, as the analysis passes them
    return time.process_time() - start


def time_losses(events: pd.DataFrame, requests: pd.DataFrame) -> tuple[float, pd.DataFrame]:
    start = time.process_time()
    check = FleetCheck.of(events, requests, hashes=False)
    losses = routing_losses(requests, events, check)
    return time.process_time() - start, losses


def time_lookups(events: pd.DataFrame, requests: pd.DataFrame) -> float:
    """What the collector's routing meter runs: every request's lookup with each missed block's reason (the index
    tracking where and why each block was lost, and which blocks were ever stored)."""
    start = time.process_time()
    request_lookups(requests, events, FleetCheck.of(events, requests, hashes=False))
    return time.process_time() - start


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--capacity", type=int, default=4096, help="blocks per replica")
    args = parser.parse_args(argv)
    events, requests = fleet(args.events, args.replicas, args.capacity)
    n = len(events)
    base, index = time_baseline(events), time_index(events)
    whole, losses = time_losses(events, requests)
    split = time_lookups(events, requests)
    routed = int(losses["routed_tokens"].sum())
    print(
        f"\n{n:,} KV events of {args.replicas} replicas ({args.capacity:,} blocks each), {len(requests):,} requests; "
        f"{len(losses):,} compared, {routed:,} tokens of routing loss; CPU time"
    )
    print("| stage | CPU seconds | events/s | time vs one pass |")
    print("|---|---|---|---|")
    rows = [
        ("one Python pass over the events (baseline)", base),
        ("fleet index, one pass", index),
        ("routing loss of every request (chains, index, lookups)", whole),
        ("... and the shortfall split: the collector's meter (losses tracked)", split),
    ]
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {n / seconds:,.0f} | {seconds / base:.2f}x |")
    return [
        Result("fleet_index", name, n / seconds, "events/s", seconds / base, "one Python pass (time)")
        for name, seconds in rows[1:]
    ]


if __name__ == "__main__":
    record(main)
