"""What each dashboard page shows, computed from the store through `kvobs.store.queries` and `kvobs.analytics`.

Plain functions of (store, window), no Streamlit: the pages cache them, `bench/dashboard_queries.py` times them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.attribution import ATTRIBUTION_KINDS, attribute_steps, failure_summary
from kvobs.analytics.chains import BlockGraph, eviction_churn, prefix_reuse
from kvobs.analytics.footprints import footprint_timeline, session_table
from kvobs.analytics.pressure import lagged_correlation, pressure_windows, strongest_lag
from kvobs.analytics.step_causes import step_causes
from kvobs.semconv.spans import KVEventKind
from kvobs.store import queries
from kvobs.store.db import Store

PREFIX_ROWS = 100_000  # stored blocks the prefix ranking walks at most (the latest in the window)


def bucket_for(since: float, until: float, points: int = 120) -> float:
    """A round window length giving about `points` points over the range."""
    span = max(until - since, 1.0)
    for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400):
        if span / step <= points:
            return float(step)
    return 86400.0


def overview(store: Store, since: float, until: float, window_s: float) -> dict:
    snaps = queries.instance_snapshots(store, since, until)
    losses = queries.block_losses(store, since, until, bucket_s=window_s)  # "blocks lost", one definition
    reqs = queries.requests(store, since, until)
    steps = queries.steps(store, since, until)
    frame = pressure_windows(snaps, reqs, losses, window_s=window_s)
    evictions = losses.assign(reason=losses["reason"].fillna(losses["kind"])).pivot_table(
        index="bucket", columns="reason", values="blocks", aggfunc="sum", fill_value=0) / window_s  # fmt: skip
    failures = pd.DataFrame()
    if not steps.empty:
        failures = (
            steps.assign(window=np.floor(steps["started_at"] / window_s) * window_s, failed=steps["status"] == "error")
            .groupby("window")["failed"]
            .agg(["sum", "size"])
        )
        failures = failures.rename(columns={"sum": "failed steps", "size": "steps"})
    hit = snaps["hit_rate"].dropna()
    kpis = {
        "requests": len(reqs),
        "agent steps": len(steps),
        "failed steps": int((steps["status"] == "error").sum()) if not steps.empty else 0,
        "hit rate": float(hit.mean()) if not hit.empty else None,
        "blocks lost": int(losses["blocks"].sum()),
        "preemptions": float(frame["preemptions"].sum()) if "preemptions" in frame else 0.0,
        "TTFT p99 (s)": float(reqs["ttft_s"].quantile(0.99)) if reqs["ttft_s"].notna().any() else None,
    }
    return {"kpis": kpis, "snapshots": snaps, "windows": frame, "evictions": evictions, "failures": failures}


def pressure(store: Store, since: float, until: float, window_s: float, x: str, y: str, max_lag: int = 6) -> dict:
    snaps = queries.instance_snapshots(store, since, until)
    losses = queries.block_losses(store, since, until, bucket_s=window_s)
    frame = pressure_windows(snaps, queries.requests(store, since, until), losses, window_s=window_s)
    correlation = lagged_correlation(frame, x, y, max_lag=max_lag, window_s=window_s)
    return {"windows": frame, "correlation": correlation, "strongest": strongest_lag(correlation)}


def sessions(store: Store, since: float, until: float) -> pd.DataFrame:
    steps = queries.steps(store, since, until)
    footprints = queries.session_footprints(store, since, until)
    table = session_table(queries.sessions(store), footprints, steps)
    if not steps.empty:
        table = table[table["session_id"].isin(set(steps["session_id"]) | set(footprints["session_id"]))]
    return table


def session_detail(store: Store, session_id: str) -> dict:
    steps = queries.steps(store, session_id=session_id)
    reqs = queries.requests(store, session_id=session_id)
    events = queries.kv_events(store, kinds=ATTRIBUTION_KINDS, session_id=session_id)
    if not steps.empty:
        resets = queries.kv_events(store, steps["started_at"].min(), steps["ended_at"].max(),
                                   kinds=[KVEventKind.CLEARED.value])  # fmt: skip
        events = pd.concat([events, resets], ignore_index=True) if not resets.empty else events
    snaps = queries.session_snapshots(store, session_id)
    return {
        "footprint": footprint_timeline(snaps) if not snaps.empty else snaps,
        "steps": attribute_steps(steps, reqs, events) if not steps.empty else pd.DataFrame(),
        "requests": reqs,
    }


def failures(store: Store, since: float, until: float) -> pd.DataFrame:
    """Failed steps in the window by failure cause (model errors as model errors; KV causes for timeouts only)."""
    return failure_summary(step_causes(store, since, until, failed_only=True))


def kv_events_page(store: Store, since: float, until: float, window_s: float) -> dict:
    counts = queries.kv_event_counts(store, since, until, bucket_s=window_s)
    lifecycle = counts.pivot_table(index="bucket", columns="kind", values="events", aggfunc="sum", fill_value=0)
    losses = queries.losses_in(counts)  # "blocks lost", from the counts just read
    reasons = losses.assign(reason=losses["reason"].fillna("(none)")).groupby(["kind", "reason"])["blocks"].sum()
    stored = queries.stored_blocks(store, since, until, latest=PREFIX_ROWS)
    graph = BlockGraph.from_stored(stored)
    return {
        "lifecycle": lifecycle,
        "reasons": reasons.rename("blocks").reset_index(),
        "prefixes": prefix_reuse(stored, graph).head(20),
        "restored": queries.top_restored_blocks(store, since, until, limit=20),
        "churn": eviction_churn(graph),
        "prefix_rows": len(stored),
    }


def alerts_page(store: Store, since: float, until: float) -> dict:
    history = queries.alerts(store, since, until)
    latest = queries.alerts(store).drop_duplicates(["rule", "instance", "session_id"], keep="first")
    return {"active": latest[latest["state"] == "firing"], "history": history}
