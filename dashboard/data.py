"""What each dashboard page shows, computed from the store through the store's reads and lookups and `kvobs.analytics`.

Plain functions of (store, window), no Streamlit: the pages cache them, `bench/dashboard_queries.py` times them.
`instances` narrows snapshots, requests and KV events to those instances (None: the whole fleet); agent steps and
sessions are the fleet's (a session's requests may go to any instance).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboard.page_data import AlertsPage, FleetRouting, FleetTable, KVEventsPage, Overview, Pressure
from dashboard.series import activity, fill_windows, unwatched
from kvobs.alerts.holding import holding_rules
from kvobs.analytics.cache import (
    HITS,
    QUANTILES,
    QUERIES,
    SUMMARY_COLUMNS,
    FleetCheck,
    eviction_churn,
    hit_rate_of_sums,
    hit_rate_spread,
    hit_rate_windows,
    lagged_correlation,
    prefix_reuse,
    pressure_windows,
    routing_summary,
    routing_summary_of_sums,
    shortfall,
    shortfall_of_sums,
    shortfall_tax,
    store_lookups,
    strongest_lag,
)
from kvobs.analytics.runs import run_table
from kvobs.analytics.windows import RangeSums, arrivals, lookup_range_sums, range_sums, sketch_quantile
from kvobs.semconv.reasons import RELEASE_REASONS
from kvobs.semconv.spans import BLOCK_LOSS_KINDS, KVEventKind
from kvobs.store import composed
from kvobs.store.interface import Store

PREFIX_ROWS = 20_000  # stored blocks the prefix, restore and churn tables walk at most (the latest of the range)
BLOCK_KINDS = (KVEventKind.STORED.value, *BLOCK_LOSS_KINDS)  # kinds stored as a row per block
RELEASED = "released"  # the KV events page's series of blocks the agent released (no loss)
INTERVAL_WINDOW_S = 900.0  # the stretch at a range's end its reporting interval is measured over
SIZE_SAMPLE = 200  # stored blocks of each replica its block size is read from (the most common: one size a run)
SIZE_RECENT_S = 600.0  # looked for in the range's last minutes first: a read bounded whatever the range
MAX_POINTS = 2_000  # requests drawn one by one on the latency chart; beyond, only the windows' percentiles
# per-instance series of the Overview's small multiples: `pressure_windows` columns -> (title, y unit, y format)
LATENCY_DRAWN = ("ttft_p50", "ttft_p90")  # the Overview's latency lines
LATENCY_METRICS_DRAWN = ("ttft",)  # the latencies they (and the TTFT p90 KPI) read off the sketch
FLEET_SERIES = {
    "usage_mean": ("KV cache usage", "pinned KV usage", "%"),
    "hit_rate": ("Prefix-cache hit rate", "hit rate (cached / prompt tokens)", "%"),
    "evictions_per_s": ("Blocks lost per second", "blocks / s", None),
    "requests": ("Requests per window", "requests / window", None),
    "ttft_mean": ("TTFT, mean of the window's requests", "seconds", None),
}


def observed_range(store: Store) -> tuple[float, float] | None:
    """The store's time range, stretched to the newest alert evaluation (alerts are evaluated after the newest
    observed row, and a page's range must hold them)."""
    bounds = store.reads.time_range()
    if bounds is None:
        return None
    later = store.reads.alerts(since=bounds[1])
    return (bounds[0], max(bounds[1], float(later["ts"].max()))) if not later.empty else bounds


def sample_interval(store: Store, since: float, until: float, instances=None) -> float | None:
    """The instances' reporting interval in the range (median gap between one instance's snapshots), or None. Read
    from the range's last `INTERVAL_WINDOW_S` (a page's cost must not grow with its range), and from the whole range
    only when that holds no two snapshots of one instance."""
    if until - since > INTERVAL_WINDOW_S:
        found = _median_gap(store.reads.instance_snapshots(until - INTERVAL_WINDOW_S, until, instances=instances))
        if found is not None:
            return found
    return _median_gap(store.reads.instance_snapshots(since, until, instances=instances))


def _median_gap(snaps: pd.DataFrame) -> float | None:
    gaps = snaps.sort_values("ts").groupby("instance")["ts"].diff().dropna()
    gaps = gaps[gaps > 0]
    return float(gaps.median()) if not gaps.empty else None


def overview(
    store: Store, since: float, until: float, window_s: float, instances=None, *, per_instance: bool = False
) -> Overview:
    """KPIs and the Overview's series on the window grid of [since, until]: counts 0 where their source watched and
    saw nothing, NaN where nothing was watching (between runs); sampled values NaN (a gap) where nothing was
    sampled; percentiles only for windows with enough requests (`kvobs.analytics.samples`), from the latency sketch.
    Snapshots and requests are read as per-minute rollups (`kvobs.analytics.windows.range_sums`), steps counted per
    window in the database: the page's cost follows its windows, not its rows. With `per_instance`, also `fleet`:
    the same sums split by instance (`_fleet`)."""
    sums = range_sums(store, since, until, window_s, instances, metrics=LATENCY_METRICS_DRAWN)
    counts = store.reads.kv_event_counts(since, until, bucket_s=window_s, instances=instances, by_instance=per_instance)
    losses = composed.losses_in(counts)  # "blocks lost", one definition
    counters = _hit_counters(store, since, until, instances)
    steps = store.reads.step_windows(since, until, window_s)
    runs = run_table(store.reads.runs(instances=instances))
    watched = activity([*sums.times(), steps["first_ts"], steps["last_ts"]], runs)
    frame = pressure_windows(sums, losses, window_s=window_s, quantiles=LATENCY_DRAWN).set_index("window")

    def gaps(columns: list[str]) -> pd.DataFrame:
        present = frame[[c for c in columns if c in frame]]
        return fill_windows(present, since, until, window_s, value=np.nan) if len(present.columns) else pd.DataFrame()

    evictions = (
        losses.assign(reason=losses["reason"].fillna(losses["kind"])).pivot_table(
            index="bucket", columns="reason", values="blocks", aggfunc="sum", fill_value=0
        )
        / window_s
    )
    if not counts.empty:  # a KV event stream reported in this range: a window with no loss lost nothing
        evictions = unwatched(fill_windows(evictions, since, until, window_s, value=0.0), window_s, watched)
    step_windows = pd.DataFrame()
    if not steps.empty:
        step_windows = pd.DataFrame(
            {"ok steps": steps["steps"] - steps["failed"], "failed steps": steps["failed"]}
        ).set_index(steps["bucket"])
        step_windows = unwatched(fill_windows(step_windows, since, until, window_s, value=0.0), window_s, watched)
    hit_windows = hit_rate_windows(sums.requests, counters, window_s)
    num_requests = int(sums.requests["requests"].sum())
    kpis = {
        "requests": num_requests,
        "agent steps": int(steps["steps"].sum()),
        "failed steps": int(steps["failed"].sum()),
        "hit rate": hit_rate_of_sums(sums.requests, counters),
        "blocks lost": int(losses["blocks"].sum()),
        "blocks released": int(composed.releases_in(counts)["blocks"].sum()),
        "preemptions": int(frame["preemptions"].sum()) if "preemptions" in frame else None,
        "TTFT p90 (s)": sketch_quantile(sums.latency, "ttft", 0.9),
    }
    points = None
    if num_requests <= MAX_POINTS:  # few enough to draw one by one: their rows
        points = store.reads.requests(since, until, instances=instances)[["arrival_ts", "ttft_s"]].dropna()
    return Overview(
        kpis=kpis,
        fleet=_fleet(sums, counts, counters, since, until, window_s) if per_instance else None,
        num_snapshots=int(sums.snapshots["samples"].sum()),
        watching_kv=not counts.empty,
        num_kv_events=int(counts["events"].sum()) if not counts.empty else 0,
        usage=fill_windows(_per_instance(sums.snapshots, "usage"), since, until, window_s, value=np.nan),
        resident=fill_windows(_per_instance(sums.snapshots, "resident"), since, until, window_s, value=np.nan),
        hit_rate=fill_windows(hit_windows.rename("hit rate").to_frame(), since, until, window_s, value=np.nan)
        if not hit_windows.empty
        else pd.DataFrame(),
        latency=gaps(list(LATENCY_DRAWN)),
        ttft_points=points,
        preemptions=gaps(["preemptions"]),
        evictions=evictions,
        steps=step_windows,
    )


def _per_instance(snapshots: pd.DataFrame, name: str) -> pd.DataFrame:
    """The mean of a snapshot value per window (rows) and instance (columns), from the summed snapshots; empty
    when no instance sampled it."""
    known = snapshots[snapshots[f"{name}_n"] > 0]
    if known.empty:
        return pd.DataFrame()
    mean = known.assign(mean=known[f"{name}_sum"] / known[f"{name}_n"])
    return mean.pivot_table(index="window", columns="instance", values="mean", aggfunc="sum")


def fleet_routing(
    store: Store, since: float, until: float, instances=None, *, replay: bool = True
) -> FleetRouting | None:
    """Routing loss over the range (`kvobs.analytics.cache.routing`): per instance and for the fleet (`summary`, the
    fleet's row last), what could not be compared and why (`notes`); and the hit-rate shortfall split
    (`kvobs.analytics.cache.shortfall_split`: `shortfall` per instance and for the fleet, `spread` of the replicas' hit
    rates). From the lookups a collector measured (`source` "measured": the writer's rollup, whatever the range) where
    it measured any in the range; else replayed from the range's KV events (`source` "replay"), unless `replay` is False
    (None then: its cost grows with the range)."""
    sums = lookup_range_sums(store, since, until, instances)
    if not sums.empty:
        return _measured_routing(store, sums, since, until, instances)
    if not replay:
        return None
    reqs = store.reads.requests(since, until, instances=instances)
    lookups, check = store_lookups(store, reqs, store.reads.steps(since, until), since, until)
    losses = lookups[lookups["replicas_compared"] > 0]
    summary = routing_summary(losses, since, until) if not losses.empty else pd.DataFrame(columns=SUMMARY_COLUMNS)
    table = shortfall(lookups, "instance")
    return FleetRouting(
        source="replay",
        summary=summary,
        notes=check.notes,
        compared=len(losses),
        requests=len(reqs),
        shortfall=table if not lookups.empty else table.iloc[0:0],
        spread=hit_rate_spread(table),
        tax=shortfall_tax(store, since, until, table) if not lookups.empty else None,
    )


def _measured_routing(store: Store, sums: pd.DataFrame, since: float, until: float, instances) -> FleetRouting:
    """`fleet_routing` from the measured lookups' sums per instance (`windows.lookup_range_sums`), over the span
    measured: from the first lookup measured to where the collectors have measured every instance
    (`lookup_progress`); the requests that arrived after that are pending (`pending`, `measured_to`), and instances
    no collector measures are named (`unmeasured`). The replicas' block sizes from each one's latest stored blocks
    (`SIZE_SAMPLE` each, `latest_stored`)."""
    first = float(sums["first_ts"].min())
    names = sorted(store.reads.instances() if instances is None else instances)
    progress = store.reads.lookup_progress(instances=names)
    marks = {str(i): float(t) for i, t in zip(progress["instance"], progress["measured_to"])}
    to = min(min(marks.values()), until) if marks else float(sums["last_ts"].max())
    pending = sum(
        arrivals(store, float(np.nextafter(mark, np.inf)), until, [i for i in marks if marks[i] == mark])
        for mark in set(marks.values())
        if mark < until
    )
    table = shortfall_of_sums(sums, "instance")
    stored = [frame for frame in (latest_stored(store, since, until, name) for name in names) if not frame.empty]
    notes = []
    if stored:  # block sizes only: whether hash chains meet is the meter's to say (`replicas_compared`)
        blocks = pd.concat(stored, ignore_index=True).assign(kind=KVEventKind.STORED.value)
        notes = FleetCheck.of(blocks, blocks.iloc[0:0], hashes=False).notes
    return FleetRouting(
        source="measured",
        summary=routing_summary_of_sums(sums, first, max(to, first)),
        notes=notes,
        compared=int(sums["compared_requests"].sum()),
        requests=int(sums["requests"].sum()),
        shortfall=table,
        spread=hit_rate_spread(table),
        measured_from=first,
        measured_to=to,
        pending=pending,
        unmeasured=[name for name in names if name not in marks],
        tax=shortfall_tax(store, since, until, table),
    )


def latest_stored(store: Store, since: float, until: float, instance: str) -> pd.DataFrame:
    """An instance's latest `SIZE_SAMPLE` stored blocks in the range: from its last `SIZE_RECENT_S` when it stored
    any there, else from the whole range."""
    start = max(since, until - SIZE_RECENT_S)
    recent = store.reads.stored_blocks(start, until, latest=SIZE_SAMPLE, instances=[instance])
    if not recent.empty or start == since:
        return recent
    return store.reads.stored_blocks(since, until, latest=SIZE_SAMPLE, instances=[instance])


def _hit_counters(store: Store, since, until, instances) -> pd.DataFrame:
    """The scraped prefix-cache counters (`kvobs.analytics.cache.hit_rate`'s other source), of `instances` only."""
    counters = store.reads.metric_series([HITS, QUERIES], since, until)
    return counters if instances is None else counters[counters["instance"].isin(list(instances))]


def _fleet(
    sums: RangeSums,
    counts: pd.DataFrame,
    counters: pd.DataFrame,
    since: float,
    until: float,
    window_s: float,
) -> FleetTable:
    """Per instance, from the Overview's own reads (`counts` by instance): a row of totals (`table`, most blocks
    lost first) and, for each `FLEET_SERIES` measure, a frame of one column per instance on the window grid
    (`series`); an instance whose source did not report a measure has no column there (unknown, not zero)."""
    losses = composed.losses_in(counts)
    rows: list[dict] = []
    series: dict[str, dict] = {column: {} for column in FLEET_SERIES}
    for name in sorted(set(sums.instances) | set(counts["instance"])):
        mine, lost = sums.of([name]), losses[losses["instance"] == name]
        frame = pressure_windows(mine, lost, window_s=window_s, quantiles=()).set_index("window")
        frame["hit_rate"] = hit_rate_windows(mine.requests, counters[counters["instance"] == name], window_s)
        watched = {"evictions_per_s": (counts["instance"] == name).any(), "requests": not mine.requests.empty}
        for column in FLEET_SERIES:
            if column in frame and frame[column].notna().any():
                filled = fill_windows(
                    frame[[column]], since, until, window_s, value=0.0 if watched.get(column) else np.nan
                )
                series[column][name] = filled[column]
        rows.append(_instance_row(name, mine, lost, counters[counters["instance"] == name]))
    table = pd.DataFrame(
        rows,
        columns=[
            "instance",
            "blocks_lost",
            "preemptions",
            "requests",
            "ttft_p90_s",
            "hit_rate",
            "kv_usage_max",
            "last_ts",
        ],
    )
    table = table.sort_values(["blocks_lost", "instance"], ascending=[False, True], kind="stable", ignore_index=True)
    return FleetTable(table, {c: pd.DataFrame(cols) for c, cols in series.items()})


def _instance_row(name: str, sums: RangeSums, losses: pd.DataFrame, counters: pd.DataFrame) -> dict:
    snaps, reqs = sums.snapshots, sums.requests
    usage = snaps["usage_max"].dropna()
    seen = [frame["last_ts"].max() for frame in (snaps, reqs) if not frame.empty]
    return {
        "instance": name,
        "blocks_lost": int(losses["blocks"].sum()),
        "preemptions": int(snaps["preemptions"].sum()) if not snaps.empty else None,
        "requests": int(reqs["requests"].sum()),
        "ttft_p90_s": sketch_quantile(sums.latency, "ttft", 0.9)[0],
        "hit_rate": hit_rate_of_sums(reqs, counters).rate,
        "kv_usage_max": float(usage.max()) if not usage.empty else None,
        "last_ts": max(seen) if seen else None,
    }


def pressure(
    store: Store, since: float, until: float, window_s: float, x: str, y: str, max_lag: int = 6, instances=None
) -> Pressure:
    """`x` (a pressure measure) against `y` (a latency: a mean, or a quantile such as `ttft_p90`) per window, and
    their lagged correlation. Only `y`'s latency is read off the sketch, and only `y` computed of its quantiles."""
    losses = store.reads.block_losses(since, until, bucket_s=window_s, instances=instances)
    metric, _, label = y.rpartition("_")
    quantiles = (y,) if label in QUANTILES else ()
    sums = range_sums(store, since, until, window_s, instances, metrics=(metric,) if quantiles else ())
    frame = pressure_windows(sums, losses, window_s=window_s, quantiles=quantiles)
    correlation = lagged_correlation(frame, x, y, max_lag=max_lag, window_s=window_s)
    return Pressure(frame, correlation, strongest_lag(correlation))


SESSION_ROWS = 500  # sessions a page lists: those the cache cost most (the table and the chooser stay bounded)


def kv_events_page(store: Store, since: float, until: float, window_s: float, instances=None) -> KVEventsPage:
    """The KV events page: blocks stored and lost per window and lost by reason over the whole range (from the
    per-minute rollup); the reused prefixes, the most recomputed blocks and the churn over the latest `PREFIX_ROWS`
    stored blocks of the range (`sample_since`: from when; `stored_in_range`: how many the range holds), so the
    page's cost does not grow with its range."""
    counts = store.reads.kv_event_counts(since, until, bucket_s=window_s, instances=instances)
    per_block = counts[counts["kind"].isin(BLOCK_KINDS)]  # rows of one block each: their `blocks` count blocks
    released = per_block["reason"].isin(list(RELEASE_REASONS))  # the agent let them go: a series of their own
    per_block = per_block.assign(kind=per_block["kind"].where(~released, RELEASED))
    lifecycle = per_block.pivot_table(index="bucket", columns="kind", values="blocks", aggfunc="sum", fill_value=0)
    if not lifecycle.empty:  # the stream reported in this range: a window without events had none
        times = store.reads.snapshot_times(since, until, window_s, instances=instances)  # when each run reported
        runs = run_table(store.reads.runs(instances=instances))
        watched = activity([times["first_ts"], times["last_ts"]], runs) or [(since, until)]
        lifecycle = unwatched(fill_windows(lifecycle, since, until, window_s, value=0.0), window_s, watched)
    losses = composed.losses_in(counts)  # "blocks lost", from the counts just read
    reasons = losses.assign(reason=losses["reason"].fillna("(none)")).groupby(["kind", "reason"])["blocks"].sum()
    released_blocks = int(composed.releases_in(counts)["blocks"].sum())
    stored = store.reads.stored_blocks(_latest_from(counts, since), until, latest=PREFIX_ROWS, instances=instances)
    in_range = int(counts.loc[counts["kind"] == KVEventKind.STORED.value, "events"].sum())  # rows, as `stored`
    sample_since = float(stored["ts"].iloc[0]) if len(stored) >= PREFIX_ROWS else since  # the sample's first block
    return KVEventsPage(
        lifecycle=lifecycle,
        reasons=reasons.rename("blocks").reset_index(),
        prefixes=prefix_reuse(stored).head(20),
        restored=store.reads.top_restored_blocks(sample_since, until, limit=20, instances=instances),
        churn=eviction_churn(stored),
        released=released_blocks,
        prefix_rows=len(stored),
        sample_since=sample_since,
        stored_in_range=in_range,
    )


def _latest_from(counts: pd.DataFrame, since: float) -> float:
    """The start of the latest buckets that hold `PREFIX_ROWS` stored blocks (from the counts per bucket), so the
    latest blocks are read from there, not searched for over the whole range (the same rows either way)."""
    stored = counts[counts["kind"] == KVEventKind.STORED.value].groupby("bucket")["events"].sum()
    from_end = stored.sort_index(ascending=False).cumsum()
    enough = from_end[from_end >= PREFIX_ROWS]
    return max(since, float(enough.index[0])) if len(enough) else since


def alerts_page(store: Store, since: float, until: float, instances=None) -> AlertsPage:
    """Alerts firing now and the range's transitions; with `instances`, those of these instances and those of no
    instance (a session's, the fleet's)."""
    history = store.reads.alerts(since, until)
    latest = store.reads.alerts().drop_duplicates(["rule", "instance", "session_id"], keep="first")
    if instances is not None:  # a few rows per rule and key: narrowed here
        history, latest = (f[f["instance"].isna() | f["instance"].isin(instances)] for f in (history, latest))
    active = latest[latest["state"] == "firing"]
    steps, failed = store.lookups.step_counts(since, until)
    firing = set(zip(active["rule"], active["instance"], active["session_id"]))
    return AlertsPage(active, history, holding_rules(store, until, firing, instances), (int(failed), int(steps)))
