"""Time each dashboard page on stores of several sizes, and how its cost grows from the smallest to the largest.

    .venv/bin/python bench/dashboard_queries.py                                  # SQLite at 10k and 1M KV events
    .venv/bin/python bench/dashboard_queries.py --sizes sqlite:10000 sqlite:1000000 chdb:10000 chdb:10000000
    .venv/bin/python bench/dashboard_queries.py --store postgresql://postgres@127.0.0.1/test --sizes 1000000
    .venv/bin/python bench/dashboard_queries.py --instances 2 ...                # a fleet: its Overview, routing
    .venv/bin/python bench/dashboard_queries.py --shape agents kv-only ...       # and stores of KV events alone

With `--shape kv-only`, each size is a store a collector filled from KV events alone (`build_kv_only`). Else each
size is a store of that many KV events over six hours, with the other tables in proportion (a snapshot per 10
events, half of them an instance's; a request and an agent step per 50 events, 5% of the steps failed): 64 sessions at a
time, each of 20 steps and then followed by a new one (a store of 1M events holds 1,024 sessions), growing hash chains,
evictions of blocks the sessions stored (a tenth of the stores bring one back, with the lifetime and restore columns
a block clock gives, as the engine writes them), hits, preemptions. A store is a file or directory under `--dir`,
reused when it holds the rows (or `--store URL`, for one size), filled through the store's own batch writer
(`Store.write`: the engine's row shapes, the writer's rollups and the steps' verdicts as in production). For each
size: each page's data functions (`dashboard.data`)
run cold (Streamlit's cache empty) over everything and over the last hour; then each page is rendered whole through
Streamlit's AppTest (the app script as a browser's first visit runs it: the sidebar, the range, the data, the charts and
tables), with Streamlit's data cache cleared before each run (the median of `--repeats` cold runs), over everything,
after one untimed run of the app in that process (a served dashboard's process loads its modules, chDB's engine and
opens the store once). A collector runs beside the pages (`--no-collector`: none does): its verdict keeper's mark
is fresh, so the steps of the sessions still running at the store's end are shown pending, as it will decide them;
with none, the page works their failures out as it opens and counts their slow verdicts as not decided. The baseline
is a plain `count()` of `kv_events` in the same run. The last table puts the sizes side by side: the first render at
each size and the growth from a backend's smallest size to its largest. Goal: <= 1 s per page at the largest size,
<= 2x the smallest.

With `--baseline REF` (`bench/baseline.py`), the same flags run again at git REF after this run, on the same stores
(its `--dir` made absolute: the baseline reads the very rows this run read), and each figure is given against REF's
(seconds over REF's seconds: below 1x, this commit is faster).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path

from baseline import against, at_commit, baseline_argv  # bench/ is on sys.path when a script in it runs
from collector_ingest import synthetic_payloads
from results import Result, record  # bench/ is on sys.path when a script in it runs
from stores import count_events
from tqdm import tqdm

from collectors.jobs.step_verdicts import VerdictKeeper
from collectors.kv.ingest import KVIngest
from dashboard import data, session_data, verdicts
from dashboard.context import bucket_for
from kvobs.analytics.cache import session_ties
from kvobs.analytics.steps import step_story
from kvobs.block_clock import BlockClock
from kvobs.store import StoreWriter, open_store
from kvobs.store.rollups import MISS_PARTS
from kvobs.store.rows import (
    KVEventRecord,
    LookupProgressRecord,
    RequestLookupRecord,
    RequestRecord,
    SessionRecord,
    SnapshotRecord,
    StepRecord,
    VerdictProgressRecord,
)
from kvobs.vllm.normalize import decode

HOURS = 6
T0 = 1.79e9
SLOTS = 64  # sessions running at once; each is followed by a new one after STEPS steps
STEPS = 20  # steps (one request each) of a session
KINDS = ["stored"] * 40 + ["hit"] * 20 + ["allocated"] * 20 + ["evicted"] * 17 + ["preempted"] * 1 + ["invalidated"] * 2
REASONS = {"evicted": "capacity", "invalidated": "weights_update", "preempted": "capacity"}
CHUNK = 200_000
FAILURES = ("timeout", "invalid_response", "503")
ROUTING = "Overview: routing loss and shortfall"
BLOCK_SIZE = 16
MEASURE_LAG_S = 180.0  # a collector measures each request's lookup this long after it (`collectors.jobs.routing_meter`)


def build(store, events: int, seed: int = 0, instances: int = 1) -> None:
    """Fill `store` through `store.write`, in chunks (one transaction or insert each): `events` KV events and the
    other tables in proportion (`snapshots_for`, `requests_for`), over `instances` replicas (a session's rows on the
    replica of its slot; instance snapshots in turn), and each request's lookup as a collector measures it up to
    `MEASURE_LAG_S` before the last (`lookup_of`)."""
    snapshots, requests = snapshots_for(events), requests_for(events)
    rng = random.Random(seed)
    span = HOURS * 3600.0
    chains: dict[str, list[int]] = {}
    clocks = [BlockClock() for _ in range(instances)]  # the columns known at ingest, as the engine writes them
    lost: list[list[int]] = [[] for _ in range(instances)]  # each instance's recently lost blocks
    chunk = []
    for i in tqdm(range(events), desc="kv_events", unit="row", mininterval=1, unit_scale=True):
        slot = rng.randrange(SLOTS)
        session, kind = session_of(slot, i / events, requests), rng.choice(KINDS)
        ts, instance = T0 + span * i / events, slot % instances
        block = parent = None
        known: dict = {}
        if kind in ("stored", "evicted", "invalidated"):
            chain = chains.setdefault(session, [])
            if kind == "stored":  # a tenth bring back a block their instance lost
                block = lost[instance].pop() if lost[instance] and rng.random() < 0.1 else rng.getrandbits(64)
                parent = chain[-1] if chain else None
                chain.append(block)
                if len(chain) > 40:
                    chain.clear()
                gap = (clocks[instance].stored([block], ts) or [None])[0]
                known = {"restored": int(gap is not None), "restored_after_s": gap}
            else:  # a block its session stored, else one stored before the store began
                block = chain.pop(rng.randrange(len(chain))) if chain else rng.getrandbits(64)
                (known["lifetime_s"],) = clocks[instance].lost([block], ts)
                lost[instance] = [*lost[instance][-999:], block]
        chunk.append(
            KVEventRecord(
                ts=ts,
                instance=f"engine-{instance}",
                kind=kind,
                block_hash=block,
                parent_hash=parent,
                num_tokens=16,
                session_id=session,
                request_id=f"req-{i // 20}",
                reason=REASONS.get(kind),
                medium="CPU",
                first_owner=None if block is None else 1,
                **known,
            )
        )
        if len(chunk) == CHUNK:
            store.write([("insert", chunk)])
            chunk = []
    rows = chunk
    for i in range(snapshots):
        slot = rng.randrange(SLOTS)
        session = None if i % 2 else session_of(slot, i / snapshots, requests)
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
                instance=f"engine-{(slot if session else i // 2) % instances}",
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
    started: dict[str, float] = {}
    measured_to = T0 + span - MEASURE_LAG_S
    for i in range(requests):
        ts, session = T0 + span * i / requests, session_of(i % SLOTS, i / requests, requests)
        started.setdefault(session, ts)
        request = RequestRecord(
            request_id=f"req-{i}",
            instance=f"engine-{i % SLOTS % instances}",
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
        rows.append(request)
        if request.arrival_ts + request.queue_s <= measured_to:
            rows.append(lookup_of(request, rng, instances))
        rows.append(
            StepRecord(
                session_id=session,
                step_index=i // SLOTS % STEPS,
                started_at=ts - 0.01,
                ended_at=ts + 3,
                e2e_s=3.0,
                **failure(rng),
            )
        )
    store.write([("insert", rows)])
    progress = [LookupProgressRecord(f"engine-{k}", measured_to, measured_to) for k in range(instances)]
    store.write(
        [
            ("upsert", progress),
            (
                "upsert",
                [
                    SessionRecord(
                        s, agent_name="bench", started_at=start, num_steps=0, num_failed_steps=0, source="sdk"
                    )
                    for s, start in started.items()
                ],
            ),
        ]
    )
    # The steps' verdicts a collector decides once their sessions settle, decided as the store's last step ends: the
    # sessions of the last minutes are still running and left to the page (pending), as in production.
    keeper = VerdictKeeper(store, lambda verdicts: store.write([("upsert", verdicts)]), lookback_s=span + 3600)
    keeper.run(T0 + span)


def build_kv_only(store, events: int, seed: int = 0) -> None:
    """Fill `store` as a collector of KV events alone fills it (`kvobs collect --kv-events`, no traces, no scrapes):
    vLLM-format batches of the ingest benchmark's workload (`synthetic_payloads`: agent sessions' chains under
    pressure, each session followed by a new one after STEPS stores) over six hours, decoded and attributed by the
    collector's own ingest and written by its store writer, until at least `events` block rows are made."""
    per_batch, rows_per_batch = 50, 90  # (a batch of 50 events makes about 90 block rows)
    batches = -(-events // rows_per_batch)
    payloads, _ = synthetic_payloads(
        batches, per_batch, SLOTS, seed, every_s=HOURS * 3600.0 / batches, session_stores=STEPS
    )
    writer = StoreWriter(store, max_queue=10_000_000)
    ingest = KVIngest(writer, instance="engine-0")
    for seq, payload in enumerate(tqdm(payloads, desc="kv batches", unit="batch", mininterval=1)):
        ingest.on_batch(seq, decode(payload).batch)
    writer.close(timeout_s=3600)


def lookup_of(request: RequestRecord, rng: random.Random, instances: int) -> RequestLookupRecord:
    """A request's lookup as `collectors.jobs.routing_meter` writes it: its prompt's whole blocks, those its cached
    tokens found, and the rest missed for one reason or another (another replica held some, on a fleet)."""
    blocks = (request.prompt_tokens - 1) // BLOCK_SIZE
    own = min(request.cached_tokens // BLOCK_SIZE, blocks)
    parts = dict.fromkeys(MISS_PARTS, 0)
    for _ in range(blocks - own):
        parts[rng.choice(MISS_PARTS if instances > 1 else MISS_PARTS[1:])] += 1
    return RequestLookupRecord(
        request_id=request.request_id,
        instance=request.instance,
        session_id=request.session_id,
        lookup_ts=request.arrival_ts + request.queue_s,
        prompt_tokens=request.prompt_tokens,
        block_size=BLOCK_SIZE,
        prompt_blocks=blocks,
        own_blocks=own,
        available_blocks=blocks - parts["cold"],
        best_blocks=own + parts["routed"],
        best_instance=f"engine-{rng.randrange(instances)}" if parts["routed"] else None,
        replicas_compared=instances - 1,
        measured_at=request.arrival_ts + request.queue_s + MEASURE_LAG_S,
        **{f"{part}_blocks": n for part, n in parts.items()},
    )


def session_of(slot: int, at: float, requests: int) -> str:
    """The session running in `slot` at `at` (0 to 1: the fraction of the six hours gone) in a store of `requests`
    requests: each slot's sessions follow one another every STEPS of its requests."""
    return f"sess-{slot:03d}-{int(at * requests) // (SLOTS * STEPS):04d}"


def snapshots_for(events: int) -> int:
    """Snapshots of a store of `events` KV events: one per 10 events (half an instance's, half a session's)."""
    return events // 10


def requests_for(events: int) -> int:
    """Requests (and agent steps, one each) of a store of `events` KV events: one per 50 events, at least 200."""
    return max(events // 50, 200)


def failure(rng: random.Random) -> dict:
    """A step's outcome: 5% fail, a third each by timeout (the one failure a KV cause can explain, so the Overview
    attributes it), invalid response and HTTP 503."""
    if rng.random() >= 0.05:
        return {"status": "ok"}
    return {"status": "error", "error_type": rng.choice(FAILURES)}


def pages(store, since, until) -> dict:
    window = bucket_for(since, until, at_least=data.sample_interval(store, since, until))
    sessions = store.reads.sessions()["session_id"]
    session = sessions.iloc[0] if len(sessions) else "none"  # (a KV-events-only store may hold no session)
    steps = store.reads.steps(session_id=session)["step_index"]
    step = int(steps.iloc[0]) if len(steps) else 0
    return {
        "Overview": lambda: (
            data.overview(store, since, until, window),
            verdicts.failures(store, since, until),
            verdicts.slow(store, since, until),
        ),
        "Pressure vs latency": lambda: data.pressure(store, since, until, window, "evictions_per_s", "ttft_mean"),
        # the page: the range's sessions, the session's detail and how its blocks were tied to it
        "Sessions": lambda: (
            session_data.sessions(store, since, until),
            session_data.session_detail(store, session),
            session_ties(store, session),
        ),
        # the page: its sessions by what the cache cost them, the session's steps likewise, the step's story over
        # the session's reads (as `dashboard.views.cache.step_story` gives them)
        "Step timeline": lambda: _step_page(store, since, until, session, step),
        "KV events": lambda: data.kv_events_page(store, since, until, window),
        "Alerts": lambda: data.alerts_page(store, since, until),
        # a fleet's Overview adds these (in its render with --instances 2 or more): the lookups a collector
        # measured, from their rollup
        ROUTING: lambda: data.fleet_routing(store, since, until, replay=False),
    }


def _step_page(store, since, until, session, step) -> tuple:
    detail = session_data.session_detail(store, session)
    return (
        session_data.sessions_with_steps(store, since, until),
        session_data.steps_by_cache_cost(detail.steps),
        step_story(store, session, step, read=detail.read),
    )


PAGE_KEYS = {
    "Overview": "overview",
    "Pressure vs latency": "pressure",
    "Sessions": "sessions",
    "Step timeline": "step",
    "KV events": "kv_events",
    "Alerts": "alerts",
}


def first_render(url: str, page: str) -> float:
    """Seconds for one cold run of the app script on `page` (AppTest; Streamlit's data cache cleared first)."""
    import os

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    os.environ["KVOBS_STORE_URL"] = url
    st.cache_data.clear()  # every read cold; the store stays open (`cache.get_store`, once per served process)
    app = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py"), default_timeout=600)
    # A served dashboard scans the installed packages for Streamlit components once, at start; AppTest does it on each
    # new AppTest's first run (0.6 s here), so that scan is done once for the whole benchmark, as a server would.
    app._bidi_component_manager = _components()
    app.query_params["page"] = page
    start = time.perf_counter()
    app.run()
    elapsed = time.perf_counter() - start
    if app.exception:
        raise RuntimeError(f"{page}: {app.exception[0].value}")
    return elapsed


@functools.cache
def _components():
    from streamlit.components.v2.component_manager import BidiComponentManager

    manager = BidiComponentManager()
    manager.discover_and_register_components(start_file_watching=False)
    return manager


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(
    url: str,
    events: int,
    repeats: int,
    render: bool,
    instances: int = 1,
    collector: bool = True,
    shape: str = "agents",
) -> dict:
    """One size: the store at `url` (filled when empty, of `shape`), its baseline, each page's data over everything
    and the last hour, and its first render (`render`); printed as a table, returned as {page: (whole, recent,
    render)}."""
    store = open_store(url)
    have = count_events(store)
    if have == 0 and shape == KV_ONLY:
        build_kv_only(store, events)
        have = count_events(store)
    elif have == 0:
        build(store, events, instances=instances)
    elif have != events and shape != KV_ONLY:
        raise SystemExit(f"{url} holds {have:,} KV events, not {events:,}: remove it or pick another --dir")
    running(store, collector)
    base = timed(lambda: count_events(store), repeats)
    first, last = store.reads.time_range()
    held = (
        f"{have:,} kv_events made by the collector's ingest from KV events alone (no snapshot, request or step)"
        if shape == KV_ONLY
        else f"{events:,} kv_events, {snapshots_for(events):,} snapshots, {requests_for(events):,} requests and steps"
    )
    print(f"\nstore: {store.dialect}, {held} over {HOURS} h on {instances} instance(s); median of {repeats}\n")
    print("| page | data, everything (s) | data, last hour (s) | vs count() (everything) | first render, AppTest (s) |")
    print("|---|---|---|---|---|")
    print(f"| baseline: count() of kv_events | {base:.3f} | - | 1.0x | - |")
    hour = pages(store, last - 3600, last)
    found = {"baseline": (base, None, None)}
    for name, fn in tqdm(list(pages(store, first, last).items()), desc="pages", leave=False):
        found[name] = (timed(fn, repeats), timed(hour[name], repeats), None)
    store.close()  # the app opens its own (a chDB directory has one holder per process)
    if render:  # a served dashboard's process is started once: the first run of the app in a process also loads
        first_render(url, "alerts")  # its modules and chDB's engine (0.3 s here), so one untimed run comes first
    for name, (whole, recent, _) in list(found.items())[1:]:
        shown = render and name in PAGE_KEYS
        seconds = statistics.median(first_render(url, PAGE_KEYS[name]) for _ in range(repeats)) if shown else None
        found[name] = (whole, recent, seconds)
        cell = "-" if seconds is None else f"{seconds:.3f}"
        print(f"| {name} | {whole:.3f} | {recent:.3f} | {whole / max(base, 1e-6):.1f}x | {cell} |")
    return found


KEEPER = "verdicts@bench"
KV_ONLY = "kv-only"  # the shape of a store a collector filled from KV events alone


def running(store, collector: bool) -> None:
    """A collector running now beside the pages, or none: its verdict keeper's mark, fresh (written now, as its runs
    write it every minute), covering the store from its start; or no mark at all."""
    first, last = store.reads.time_range()
    mark = VerdictProgressRecord(KEEPER, first, last, time.time() if collector else 0.0)
    store.write([("upsert", [mark])])  # updated_at 0: a keeper that stopped long ago, the same as none


def growth_table(sizes: list[tuple[str, int]], found: list[dict]) -> list[str]:
    """The pages' first renders side by side, with each backend's growth from its smallest size to its largest and
    the goal (<= 1 s at the largest, <= 2x the smallest)."""
    backends = sorted({b for b, _ in sizes})
    head = [f"{b} {n:,}" for b, n in sizes] + [f"{b}: growth" for b in backends] + ["goal met"]
    lines = ["| page, first render (s) | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for name in PAGE_KEYS:
        renders = [f[name][2] for f in found]
        cells = ["-" if r is None else f"{r:.3f}" for r in renders]
        met = []
        for backend in backends:
            mine = [(n, r) for (b, n), r in zip(sizes, renders, strict=True) if b == backend and r is not None]
            if len(mine) < 2:
                cells.append("-")
                continue
            (_, small), (_, large) = min(mine), max(mine)
            cells.append(f"{large / small:.1f}x")
            met.append(large <= 1.0 and large <= 2 * small)
        cells.append("-" if not met else "yes" if all(met) else "no")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| goal | " + " | ".join(["<= 1 s at the largest"] * len(sizes) + ["<= 2x"] * len(backends)) + " | |")
    return lines


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["sqlite:10000", "sqlite:1000000"],
        help="BACKEND:EVENTS (sqlite or chdb), or EVENTS with --store",
    )
    parser.add_argument("--dir", default=".", help="where the store files or directories are kept (and reused)")
    parser.add_argument("--store", help="a store URL instead of --dir, for one size (its tables empty or full)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-render", action="store_true", help="time the data functions only")
    parser.add_argument(
        "--instances", type=int, default=1, help="replicas the store's rows are spread over (2+: a fleet's Overview)"
    )
    parser.add_argument(
        "--shape",
        nargs="+",
        choices=("agents", KV_ONLY),
        default=["agents"],
        help="agents: every table in proportion; kv-only: a store a collector filled from KV events alone (its own "
        "ingest; no snapshot, request or step), at least EVENTS block rows; both: each size of each, in turn",
    )
    parser.add_argument(
        "--no-collector",
        action="store_true",
        help="no collector runs beside the pages: failed steps without a verdict are worked out as a page opens",
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run this benchmark, with the same flags and stores, at git REF (the code before a change) after "
        "this run, and give each figure against REF's instead of against count()",
    )
    args = parser.parse_args(argv)
    sizes = [_size(text, args.store) for text in args.sizes]
    if args.store and (len(sizes) > 1 or len(args.shape) > 1):
        parser.error("--store takes one size of one shape")
    rows = []
    for shape in args.shape:
        found = []
        for backend, events in sizes:
            found.append(measure_size(args, backend, events, shape))
            rows += size_results(found[-1], backend, events, shape, args.instances)
        if not args.no_render:
            print(f"\nstores of shape {shape}:")
            print("\n".join(growth_table(sizes, found)))
    if args.baseline:
        flags = baseline_flags(sys.argv[1:] if argv is None else argv, args.dir)
        found = at_commit(args.baseline, Path(__file__).name, flags)
        rows = against(rows, args.baseline, found, what="Pages, on the same stores (seconds: below 1x, faster)")
    return rows


def measure_size(args: argparse.Namespace, backend: str, events: int, shape: str) -> dict:
    """`measure` on the store of one size and shape under `--dir` (or `--store`), in a process of its own: chDB holds
    one data directory per process (a second one crashes it), and every size starts as cold as the first."""
    named = "" if shape == "agents" else f"-{shape}"
    where = Path(args.dir) / f"bench-dashboard-{events}-{STEPS}-step-sessions-{args.instances}-instances{named}"
    where.parent.mkdir(parents=True, exist_ok=True)
    url = args.store or (f"sqlite:///{where}.db" if backend == "sqlite" else f"chdb:///{where}.ch")
    flags = (url, events, args.repeats, not args.no_render, args.instances, not args.no_collector, shape)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(measure, flags)


def size_results(found: dict, backend: str, events: int, shape: str, instances: int) -> list[Result]:
    """One size's figures as results rows, each against the same run's count()."""
    rows, base = [], max(found["baseline"][0], 1e-6)
    kind = ", KV events alone" if shape == KV_ONLY else ""
    for name, (whole, recent, render) in list(found.items())[1:]:
        label = f"{name} ({backend}, {events:,} events{kind}, {instances} instance(s))"
        rows.append(Result("dashboard_queries", f"{label}, whole range", whole, "s", whole / base, "count()"))
        rows.append(Result("dashboard_queries", f"{label}, last hour", recent, "s", recent / base, "count()"))
        if render is not None:
            rows.append(Result("dashboard_queries", f"{label}, first render", render, "s", render / base, "count()"))
    return rows


def baseline_flags(flags: list[str], store_dir: str) -> list[str]:
    """This run's flags for the baseline's: no `--baseline`, and `--dir` absolute (the baseline runs in a worktree of
    its own, where a relative one would name new, empty stores)."""
    out, given = [], iter(baseline_argv(flags))
    for flag in given:
        if flag == "--dir":
            next(given, None)  # (and its value)
        elif not flag.startswith("--dir="):
            out.append(flag)
    return [*out, "--dir", str(Path(store_dir).resolve())]


def _size(text: str, store: str | None) -> tuple[str, int]:
    backend, _, events = text.rpartition(":")
    if store:
        return store.split(":", 1)[0], int(events)
    if backend not in ("sqlite", "chdb"):
        raise SystemExit(f"--sizes {text}: BACKEND:EVENTS with BACKEND sqlite or chdb")
    return backend, int(events)


if __name__ == "__main__":
    record(main)
