"""Time each dashboard page's queries on a synthetic store of 1M kv_events and 100k snapshots (SQLite).

    .venv/bin/python bench/dashboard_queries.py [--events 1000000] [--snapshots 100000] [--store sqlite:///bench.db]

The store is built once (reused when it already holds the rows) with the engine's row shapes: 64 sessions growing
hash chains, evictions per owner, hits, preemptions, per-session and instance snapshots, requests and steps over
six hours. Each page's data function (`dashboard.data`) runs cold (Streamlit's cache empty) over the default
range, everything, and the last hour; the baseline is one plain `SELECT count(*) FROM kv_events` in the same run.
Goal: <= 2 s per page.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from results import Result  # bench/ is on sys.path when a script in it runs
from sqlalchemy import func, select
from tqdm import tqdm

from dashboard import data
from kvobs.store import open_store, queries
from kvobs.store.schema import TABLES, KVEventRow

HOURS = 6
INSERT_EVENTS = (
    "INSERT INTO kv_events (ts, instance, kind, block_hash, parent_hash, num_tokens, session_id, request_id, "
    "reason, medium) VALUES (?,?,?,?,?,?,?,?,?,?)"
)


def build(store, events: int, snapshots: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    t0 = 1.79e9
    span = HOURS * 3600.0
    sessions = [f"sess-{i:03d}" for i in range(64)]
    conn = store.engine.raw_connection()
    cur = conn.cursor()
    kinds = (
        ["stored"] * 40 + ["hit"] * 20 + ["allocated"] * 20 + ["evicted"] * 17 + ["preempted"] * 1 + ["invalidated"] * 2
    )
    chains = {s: [] for s in sessions}
    rows = []
    for i in tqdm(range(events), desc="kv_events", unit="row", mininterval=1):
        ts = t0 + span * i / events
        session = rng.choice(sessions)
        kind = rng.choice(kinds)
        block = parent = None
        if kind in ("stored", "evicted", "invalidated"):
            block = rng.getrandbits(64)
            chain = chains[session]
            parent = chain[-1] if chain and kind == "stored" else None
            if kind == "stored":
                chain.append(block)
                if len(chain) > 40:
                    chain.clear()
        reason = {"evicted": "capacity", "invalidated": "weights_update", "preempted": "capacity"}.get(kind)
        block_text, parent_text = (None if h is None else str(h) for h in (block, parent))
        rows.append((ts, "engine-0", kind, block_text, parent_text, 16, session, f"req-{i // 20}", reason, "CPU"))
        if len(rows) == 50_000:
            cur.executemany(INSERT_EVENTS, rows)
            rows.clear()
    if rows:
        cur.executemany(INSERT_EVENTS, rows)
    snaps = []
    for i in range(snapshots):
        ts = t0 + span * i / snapshots
        session = None if i % 2 else rng.choice(sessions)
        snaps.append((ts, "engine-0", session, rng.random(), 511, rng.randint(0, 511), rng.randint(0, 300),
                      *((rng.randint(0, 50), i // 1000, i // 4000) if session else (None, None, None)),
                      rng.random(), rng.randint(0, 8), rng.randint(0, 4), i // 500, i // 10))  # fmt: skip
    cur.executemany("INSERT INTO snapshots (ts, instance, session_id, kv_usage, blocks_total, blocks_free, "
                    "blocks_resident, session_blocks, session_evicted_blocks, session_evicted_idle_blocks, hit_rate, "
                    "num_running, num_waiting, preemptions_total, evictions_total) VALUES "
                    "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", snaps)  # fmt: skip
    reqs, steps = [], []
    for i in range(20_000):
        ts = t0 + span * i / 20_000
        session = sessions[i % 64]
        reqs.append((f"req-{i}", "engine-0", session, ts, ts + rng.random(), ts + 2 + rng.random(), rng.random() * 0.5,
                     rng.randint(200, 2000), rng.randint(0, 1500), 64, 0, "length"))  # fmt: skip
        steps.append((session, i // 64, ts - 0.01, ts + 3, "error" if rng.random() < 0.05 else "ok", 3.0))
    cur.executemany("INSERT INTO requests (request_id, instance, session_id, arrival_ts, first_token_ts, finished_ts, "
                    "queue_s, prompt_tokens, cached_tokens, completion_tokens, num_preemptions, finish_reason) VALUES "
                    "(?,?,?,?,?,?,?,?,?,?,?,?)", reqs)  # fmt: skip
    cur.executemany("INSERT INTO steps (session_id, step_index, started_at, ended_at, status, e2e_s) VALUES "
                    "(?,?,?,?,?,?)", steps)  # fmt: skip
    cur.executemany("INSERT INTO sessions (session_id, agent_name, started_at, num_steps, num_failed_steps, source) "
                    "VALUES (?,?,?,?,?,?)", [(s, "bench", t0, 0, 0, "sdk") for s in sessions])  # fmt: skip
    conn.commit()
    conn.close()


def pages(store, since, until) -> dict:
    window = data.bucket_for(since, until)
    session = queries.sessions(store)["session_id"].iloc[0]
    return {
        "Overview": lambda: (data.overview(store, since, until, window), data.failures(store, since, until)),
        "Pressure vs latency": lambda: data.pressure(store, since, until, window, "evictions_per_s", "ttft_p99"),
        "Sessions": lambda: (data.sessions(store, since, until), data.session_detail(store, session)),
        "KV events": lambda: data.kv_events_page(store, since, until, window),
        "Alerts": lambda: data.alerts_page(store, since, until),
    }


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", default="sqlite:///bench-dashboard.db")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--snapshots", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    store = open_store(args.store)
    with store.engine.connect() as conn:
        have = conn.execute(select(func.count()).select_from(KVEventRow)).scalar()
    if have < args.events:
        with store.engine.begin() as conn:
            for table in TABLES.values():
                conn.execute(table.__table__.delete())
        build(store, args.events, args.snapshots)

    def baseline():
        with store.engine.connect() as conn:
            conn.execute(select(func.count()).select_from(KVEventRow)).scalar()

    base = timed(baseline, args.repeats)
    first, last = queries.time_range(store)
    print(f"store: {args.events:,} kv_events, {args.snapshots:,} snapshots, 20,000 requests and steps over {HOURS} h; "
          f"median of {args.repeats}")  # fmt: skip
    print()
    print("| page | everything (s) | last hour (s) | vs count(*) (everything) |")
    print("|---|---|---|---|")
    print(f"| baseline: SELECT count(*) FROM kv_events | {base:.3f} | - | 1.0x |")
    hour = pages(store, last - 3600, last)
    rows = []
    for name, fn in tqdm(list(pages(store, first, last).items()), desc="pages", leave=False):
        whole, recent = timed(fn, args.repeats), timed(hour[name], args.repeats)
        print(f"| {name} | {whole:.3f} | {recent:.3f} | {whole / base:.1f}x |")
        rows.append(Result("dashboard_queries", f"{name}, whole range", whole, "s", whole / base, "count(*)"))
        rows.append(Result("dashboard_queries", f"{name}, last hour", recent, "s", recent / base, "count(*)"))
    store.close()
    return rows


if __name__ == "__main__":
    main()
