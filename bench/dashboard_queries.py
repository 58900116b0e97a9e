"""Time each dashboard page's queries on a synthetic store of kv_events, snapshots, requests and steps.

    .venv/bin/python bench/dashboard_queries.py --backend sqlite --events 1000000
    .venv/bin/python bench/dashboard_queries.py --backend chdb --events 10000000
    .venv/bin/python bench/dashboard_queries.py --store postgresql://postgres@127.0.0.1/test --events 1000000

The store (a file or directory under `--dir`, reused when it already holds the rows; or `--store URL`) is filled
through the store's own batch writer (`Store.write`: the engine's row shapes, the per-minute rollup kept as in
production): 64 sessions growing hash chains, evictions, hits, preemptions, per-session and instance snapshots,
requests and steps over six hours. Each page's data function (`dashboard.data`) runs cold (Streamlit's cache
empty) over everything and over the last hour; then each page is rendered whole through Streamlit's AppTest (the
app script as a browser's first visit runs it: the sidebar, the range, the data, the charts and tables), with
Streamlit's caches cleared first, over everything. The baseline is a plain `count()` of `kv_events` in the same
run. Goal: <= 1 s per page.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

from results import Result  # bench/ is on sys.path when a script in it runs
from tqdm import tqdm

from dashboard import data
from dashboard.context import bucket_for
from kvobs.analytics.step_story import step_story
from kvobs.store import open_store
from kvobs.store.rows import KVEventRecord, RequestRecord, SessionRecord, SnapshotRecord, StepRecord
from kvobs.store.sql_store import SqlStore

HOURS = 6
T0 = 1.79e9
SESSIONS = [f"sess-{i:03d}" for i in range(64)]
KINDS = ["stored"] * 40 + ["hit"] * 20 + ["allocated"] * 20 + ["evicted"] * 17 + ["preempted"] * 1 + ["invalidated"] * 2
REASONS = {"evicted": "capacity", "invalidated": "weights_update", "preempted": "capacity"}
CHUNK = 200_000
FAILURES = ("timeout", "invalid_response", "503")


def build(store, events: int, snapshots: int, seed: int = 0) -> None:
    """Fill `store` through `store.write`, in chunks (one transaction or insert each)."""
    rng = random.Random(seed)
    span = HOURS * 3600.0
    chains: dict[str, list[int]] = {s: [] for s in SESSIONS}
    chunk = []
    for i in tqdm(range(events), desc="kv_events", unit="row", mininterval=1, unit_scale=True):
        session, kind = rng.choice(SESSIONS), rng.choice(KINDS)
        block = parent = None
        if kind in ("stored", "evicted", "invalidated"):
            block = rng.getrandbits(64)
            chain = chains[session]
            if kind == "stored":
                parent = chain[-1] if chain else None
                chain.append(block)
                if len(chain) > 40:
                    chain.clear()
        chunk.append(
            KVEventRecord(
                ts=T0 + span * i / events,
                instance="engine-0",
                kind=kind,
                block_hash=block,
                parent_hash=parent,
                num_tokens=16,
                session_id=session,
                request_id=f"req-{i // 20}",
                reason=REASONS.get(kind),
                medium="CPU",
                first_owner=None if block is None else 1,
            )
        )
        if len(chunk) == CHUNK:
            store.write([("insert", chunk)])
            chunk = []
    rows = chunk
    for i in range(snapshots):
        session = None if i % 2 else rng.choice(SESSIONS)
        extra = (
            dict(
                session_blocks=rng.randint(0, 50),
                session_evicted_blocks=i // 1000,
                session_evicted_idle_blocks=i // 4000,
            )
            if session
            else {}
        )
        rows.append(
            SnapshotRecord(
                ts=T0 + span * i / snapshots,
                instance="engine-0",
                session_id=session,
                kv_usage=rng.random(),
                blocks_total=511,
                blocks_free=rng.randint(0, 511),
                blocks_resident=rng.randint(0, 300),
                hit_rate=rng.random(),
                num_running=rng.randint(0, 8),
                num_waiting=rng.randint(0, 4),
                preemptions_total=i // 500,
                evictions_total=i // 10,
                **extra,
            )
        )
    for i in range(20_000):
        ts, session = T0 + span * i / 20_000, SESSIONS[i % 64]
        rows.append(
            RequestRecord(
                request_id=f"req-{i}",
                instance="engine-0",
                session_id=session,
                arrival_ts=ts,
                first_token_ts=ts + rng.random(),
                finished_ts=ts + 2 + rng.random(),
                queue_s=rng.random() * 0.5,
                prompt_tokens=rng.randint(200, 2000),
                cached_tokens=rng.randint(0, 1500),
                completion_tokens=64,
                num_preemptions=0,
                finish_reason="length",
            )
        )
        rows.append(
            StepRecord(
                session_id=session, step_index=i // 64, started_at=ts - 0.01, ended_at=ts + 3, e2e_s=3.0, **failure(rng)
            )
        )
    store.write([("insert", rows)])
    store.write(
        [
            (
                "upsert",
                [
                    SessionRecord(s, agent_name="bench", started_at=T0, num_steps=0, num_failed_steps=0, source="sdk")
                    for s in SESSIONS
                ],
            )
        ]
    )


def failure(rng: random.Random) -> dict:
    """A step's outcome: 5% fail, a third each by timeout (the one failure a KV cause can explain, so the Overview
    attributes it), invalid response and HTTP 503."""
    if rng.random() >= 0.05:
        return {"status": "ok"}
    return {"status": "error", "error_type": rng.choice(FAILURES)}


def count_events(store) -> int:
    """The baseline: a plain count of kv_events, in the store's own SQL."""
    if isinstance(store, SqlStore):
        with store.engine.connect() as conn:
            return conn.exec_driver_sql("SELECT count(*) FROM kv_events").scalar()
    return int(store.frame("SELECT count() AS n FROM kv_events")["n"].iloc[0])


def pages(store, since, until) -> dict:
    window = bucket_for(since, until, at_least=data.sample_interval(store, since, until))
    session = store.reads.sessions()["session_id"].iloc[0]
    step = int(store.reads.steps(session_id=session)["step_index"].iloc[0])
    return {
        "Overview": lambda: (data.overview(store, since, until, window), data.failures(store, since, until)),
        "Pressure vs latency": lambda: data.pressure(store, since, until, window, "evictions_per_s", "ttft_mean"),
        "Sessions": lambda: (data.sessions(store, since, until), data.session_detail(store, session)),
        # the page: its sessions by what the cache cost them, the session's steps likewise, the step's story
        "Step timeline": lambda: (
            data.sessions_with_steps(store, since, until),
            data.steps_by_cache_cost(data.session_detail(store, session)["steps"]),
            step_story(store, session, step),
        ),
        "KV events": lambda: data.kv_events_page(store, since, until, window),
        "Alerts": lambda: data.alerts_page(store, since, until),
        # a fleet's Overview adds these, as it opens for a range up to an hour (a button beyond): every KV event of
        # the range replayed in time order; measured on this one-instance store, the same reads and sweep
        "Overview: routing loss and shortfall": lambda: data.fleet_routing(store, since, until),
    }


PAGE_KEYS = {
    "Overview": "overview",
    "Pressure vs latency": "pressure",
    "Sessions": "sessions",
    "Step timeline": "step",
    "KV events": "kv_events",
    "Alerts": "alerts",
}


def first_render(url: str, page: str) -> float:
    """Seconds for one cold run of the app script on `page` (AppTest; Streamlit's caches cleared first)."""
    import os

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    os.environ["KVOBS_STORE_URL"] = url
    st.cache_data.clear()
    st.cache_resource.clear()
    app = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py"), default_timeout=600)
    app.query_params["page"] = page
    start = time.perf_counter()
    app.run()
    elapsed = time.perf_counter() - start
    if app.exception:
        raise RuntimeError(f"{page}: {app.exception[0].value}")
    return elapsed


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "chdb"), default="sqlite")
    parser.add_argument("--dir", default=".", help="where the store file or directory is kept (and reused)")
    parser.add_argument("--store", help="a store URL instead of --backend/--dir (its tables must be empty or full)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--snapshots", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    where = Path(args.dir) / f"bench-dashboard-{args.events}"
    where.parent.mkdir(parents=True, exist_ok=True)
    url = args.store or (f"sqlite:///{where}.db" if args.backend == "sqlite" else f"chdb:///{where}.ch")
    store = open_store(url)
    have = count_events(store)
    if have == 0:
        build(store, args.events, args.snapshots)
    elif have != args.events:
        raise SystemExit(f"{url} holds {have:,} KV events, not {args.events:,}: remove it or pick another --dir")

    base = timed(lambda: count_events(store), args.repeats)
    first, last = store.reads.time_range()
    print(
        f"store: {store.dialect}, {args.events:,} kv_events, {args.snapshots:,} snapshots, 20,000 requests and "
        f"steps over {HOURS} h; median of {args.repeats}"
    )
    print()
    print("| page | data, everything (s) | data, last hour (s) | vs count() (everything) | first render, AppTest (s) |")
    print("|---|---|---|---|---|")
    print(f"| baseline: count() of kv_events | {base:.3f} | - | 1.0x | - |")
    hour = pages(store, last - 3600, last)
    rows = []
    for name, fn in tqdm(list(pages(store, first, last).items()), desc="pages", leave=False):
        whole, recent = timed(fn, args.repeats), timed(hour[name], args.repeats)
        # the app opens its own store, so a chDB store (one process, one holder) is closed while it renders
        chdb = store.url.startswith("chdb") and not args.store
        render = None if chdb or name not in PAGE_KEYS else first_render(url, PAGE_KEYS[name])
        shown = "-" if render is None else f"{render:.3f}"
        print(f"| {name} | {whole:.3f} | {recent:.3f} | {whole / base:.1f}x | {shown} |")
        label = f"{name} ({store.dialect}, {args.events:,} events)"
        rows.append(Result("dashboard_queries", f"{label}, whole range", whole, "s", whole / base, "count()"))
        rows.append(Result("dashboard_queries", f"{label}, last hour", recent, "s", recent / base, "count()"))
        if render is not None:
            rows.append(Result("dashboard_queries", f"{label}, first render", render, "s", render / base, "count()"))
    store.close()
    return rows


if __name__ == "__main__":
    main()
