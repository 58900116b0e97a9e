"""What each dashboard page shows, computed from the store through `kvobs.store.queries` and `kvobs.analytics`.

Plain functions of (store, window), no Streamlit: the pages cache them, `bench/dashboard_queries.py` times them.
`instances` narrows snapshots, requests and KV events to those instances (None: the whole fleet); agent steps and
sessions are the fleet's (a session's requests may go to any instance).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboard.series import fill_windows, per_window
from kvobs.analytics.attribution import ATTRIBUTION_KINDS, attribute_steps, failure_summary
from kvobs.analytics.chains import eviction_churn, prefix_reuse
from kvobs.analytics.footprints import footprint_timeline, session_table
from kvobs.analytics.prefill_rates import RATE_WINDOW_S, PrefillRates
from kvobs.analytics.pressure import lagged_correlation, preemption_increase, pressure_windows, strongest_lag
from kvobs.analytics.step_causes import failure_verdicts
from kvobs.semconv.spans import KVEventKind
from kvobs.store import queries
from kvobs.store.db import Store

PREFIX_ROWS = 100_000  # stored blocks the prefix ranking walks at most (the latest in the window)
# per-instance series of the Overview's small multiples: `pressure_windows` columns -> (title, y unit, y format)
FLEET_SERIES = {"usage_mean": ("KV cache usage", "pinned KV usage", "%"), "hit_rate": ("Hit rate", "hit rate", "%"),
                "evictions_per_s": ("Blocks lost per second", "blocks / s", None),
                "requests": ("Requests per window", "requests / window", None),
                "ttft_mean": ("TTFT, mean of the window's requests", "seconds", None)}  # fmt: skip


def observed_range(store: Store) -> tuple[float, float] | None:
    """The store's time range, stretched to the newest alert evaluation (alerts are evaluated after the newest
    observed row, and a page's range must hold them)."""
    bounds = queries.time_range(store)
    if bounds is None:
        return None
    later = queries.alerts(store, since=bounds[1])
    return (bounds[0], max(bounds[1], float(later["ts"].max()))) if not later.empty else bounds


def sample_interval(store: Store, since: float, until: float, instances=None) -> float | None:
    """The instances' reporting interval in the range (median gap between one instance's snapshots), or None."""
    snaps = queries.instance_snapshots(store, since, until, instances=instances)
    gaps = snaps.sort_values("ts").groupby("instance")["ts"].diff().dropna()
    gaps = gaps[gaps > 0]
    return float(gaps.median()) if not gaps.empty else None


def overview(store: Store, since: float, until: float, window_s: float, instances=None, *,
             per_instance: bool = False) -> dict:  # fmt: skip
    """KPIs and the Overview's series on the window grid of [since, until]: counts 0 where their source watched and
    saw nothing, sampled values NaN (a gap) where nothing was sampled. With `per_instance`, also `fleet`: the same
    reads split by instance (`_fleet`)."""
    snaps = queries.instance_snapshots(store, since, until, instances=instances)
    counts = queries.kv_event_counts(store, since, until, bucket_s=window_s, instances=instances,
                                     by_instance=per_instance)  # fmt: skip
    losses = queries.losses_in(counts)  # "blocks lost", one definition
    reqs = queries.requests(store, since, until, instances=instances)
    steps = queries.steps(store, since, until)
    frame = pressure_windows(snaps, reqs, losses, window_s=window_s).set_index("window")

    def gaps(columns: list[str]) -> pd.DataFrame:
        present = frame[[c for c in columns if c in frame]]
        return fill_windows(present, since, until, window_s, value=np.nan) if len(present.columns) else pd.DataFrame()

    evictions = losses.assign(reason=losses["reason"].fillna(losses["kind"])).pivot_table(
        index="bucket", columns="reason", values="blocks", aggfunc="sum", fill_value=0) / window_s  # fmt: skip
    if not counts.empty:  # a KV event stream reported in this range: a window with no loss lost nothing
        evictions = fill_windows(evictions, since, until, window_s, value=0.0)
    step_windows = pd.DataFrame()
    if not steps.empty:
        failed = steps["status"] == "error"
        step_windows = (pd.DataFrame({"ok steps": ~failed, "failed steps": failed})
                        .groupby(np.floor(steps["started_at"] / window_s) * window_s).sum())  # fmt: skip
        step_windows = fill_windows(step_windows, since, until, window_s, value=0.0)
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
    return {
        "kpis": kpis,
        "fleet": _fleet(snaps, reqs, counts, since, until, window_s) if per_instance else None,
        "num_snapshots": len(snaps),
        "watching_kv": not counts.empty,
        "usage": fill_windows(
            per_window(snaps, "ts", window_s, "kv_usage", "instance"), since, until, window_s, value=np.nan
        ),  # fmt: skip
        "resident": fill_windows(
            per_window(snaps, "ts", window_s, "blocks_resident", "instance"), since, until, window_s, value=np.nan
        ),  # fmt: skip
        "hit_rate": gaps(["hit_rate"]),
        "latency": gaps(["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"]),
        "preemptions": gaps(["preemptions"]),
        "evictions": evictions,
        "steps": step_windows,
    }


def _fleet(snaps: pd.DataFrame, reqs: pd.DataFrame, counts: pd.DataFrame, since: float, until: float,
           window_s: float) -> dict:  # fmt: skip
    """Per instance, from the Overview's own reads (`counts` by instance): a row of totals (`table`, most blocks
    lost first) and, for each `FLEET_SERIES` measure, a frame of one column per instance on the window grid
    (`series`); an instance whose source did not report a measure has no column there (unknown, not zero)."""
    losses = queries.losses_in(counts)
    rows, series = [], {column: {} for column in FLEET_SERIES}
    for name in sorted(set(snaps["instance"]) | set(reqs["instance"]) | set(counts["instance"])):
        mine = (snaps[snaps["instance"] == name], reqs[reqs["instance"] == name], losses[losses["instance"] == name])
        frame = pressure_windows(*mine, window_s=window_s).set_index("window")
        watched = {"evictions_per_s": (counts["instance"] == name).any(), "requests": not mine[1].empty}
        for column in FLEET_SERIES:
            if column in frame and frame[column].notna().any():
                filled = fill_windows(frame[[column]], since, until, window_s,
                                      value=0.0 if watched.get(column) else np.nan)  # fmt: skip
                series[column][name] = filled[column]
        rows.append(_instance_row(name, *mine))
    table = pd.DataFrame(rows, columns=["instance", "blocks_lost", "preemptions", "requests", "ttft_p99_s", "hit_rate",
                                        "kv_usage_max", "last_ts"])  # fmt: skip
    table = table.sort_values(["blocks_lost", "instance"], ascending=[False, True], kind="stable", ignore_index=True)
    return {"table": table, "series": {c: pd.DataFrame(cols) for c, cols in series.items()}}


def _instance_row(name: str, snaps: pd.DataFrame, reqs: pd.DataFrame, losses: pd.DataFrame) -> dict:
    ttft, hit, usage = reqs["ttft_s"].dropna(), snaps["hit_rate"].dropna(), snaps["kv_usage"].dropna()
    seen = [frame[column].max() for frame, column in ((snaps, "ts"), (reqs, "finished_ts")) if not frame.empty]
    return {"instance": name, "blocks_lost": int(losses["blocks"].sum()),
            "preemptions": float(preemption_increase(snaps).sum()) if not snaps.empty else None,
            "requests": len(reqs), "ttft_p99_s": float(ttft.quantile(0.99)) if not ttft.empty else None,
            "hit_rate": float(hit.mean()) if not hit.empty else None,
            "kv_usage_max": float(usage.max()) if not usage.empty else None,
            "last_ts": max(seen) if seen else None}  # fmt: skip


def pressure(store: Store, since: float, until: float, window_s: float, x: str, y: str, max_lag: int = 6,
             instances=None) -> dict:  # fmt: skip
    snaps = queries.instance_snapshots(store, since, until, instances=instances)
    losses = queries.block_losses(store, since, until, bucket_s=window_s, instances=instances)
    frame = pressure_windows(snaps, queries.requests(store, since, until, instances=instances), losses,
                             window_s=window_s)  # fmt: skip
    correlation = lagged_correlation(frame, x, y, max_lag=max_lag, window_s=window_s)
    return {"windows": frame, "correlation": correlation, "strongest": strongest_lag(correlation)}


def sessions(store: Store, since: float, until: float, instances=None) -> pd.DataFrame:
    """The range's sessions, worst first: most failed steps, then most blocks lost while idle (footprints on
    `instances` only)."""
    steps = queries.steps(store, since, until)
    footprints = queries.session_footprints(store, since, until, instances=instances)
    table = session_table(queries.sessions(store), footprints, steps)
    if not steps.empty:
        table = table[table["session_id"].isin(set(steps["session_id"]) | set(footprints["session_id"]))]
    order = [c for c in ("failed", "lost_idle", "e2e_p50") if c in table]
    return table.sort_values(order, ascending=False, kind="stable", na_position="last").reset_index(drop=True)


def _worst_steps_first(steps: pd.DataFrame) -> pd.DataFrame:
    latency = steps["ttft_s"].astype(float).fillna(steps["e2e_s"].astype(float))
    ranked = steps.assign(failed=steps["status"] == "error", latency=latency)
    return ranked.sort_values(["failed", "latency"], ascending=False, kind="stable", na_position="last")


def steps_worst_first(store: Store, since: float, until: float) -> pd.DataFrame:
    """Sessions of the range's steps, worst first (most failed steps, then slowest step): `session_id`, `failed`."""
    steps = queries.steps(store, since, until)
    if steps.empty:
        return pd.DataFrame(columns=["session_id", "failed"])
    ranked = _worst_steps_first(steps).groupby("session_id", sort=False).agg(failed=("failed", "sum"),
                                                                          latency=("latency", "max"))  # fmt: skip
    ranked = ranked.sort_values(["failed", "latency"], ascending=False, kind="stable", na_position="last")
    return ranked.reset_index()[["session_id", "failed"]]


def session_steps_worst_first(store: Store, session_id: str) -> list[int]:
    """A session's step indexes: failed first, then the slowest (TTFT, else end-to-end)."""
    return [int(i) for i in _worst_steps_first(queries.steps(store, session_id=session_id))["step_index"]]


def session_detail(store: Store, session_id: str) -> dict:
    steps = queries.steps(store, session_id=session_id)
    events = queries.kv_events(store, kinds=ATTRIBUTION_KINDS, session_id=session_id)
    reqs = queries.requests(store, session_id=session_id)
    rates = None
    if not steps.empty:
        first, last = steps["started_at"].min(), steps[["started_at", "ended_at"]].max().max()
        # requests by time, not by session: vLLM's carry no session id (the attribution matches them by trace);
        # from the prefill rate's window before the first step
        reqs = queries.requests(store, first - RATE_WINDOW_S, last)
        rates = PrefillRates.from_store(store, first - RATE_WINDOW_S, last, requests=reqs)
        resets = queries.kv_events(store, first, last, kinds=[KVEventKind.CLEARED.value])
        events = pd.concat([events, resets], ignore_index=True) if not resets.empty else events
    snaps = queries.session_snapshots(store, session_id)
    return {
        "footprint": footprint_timeline(snaps) if not snaps.empty else snaps,
        "steps": attribute_steps(steps, reqs, events, rates=rates) if not steps.empty else pd.DataFrame(),
        "requests": reqs,
    }


def failures(store: Store, since: float, until: float) -> pd.DataFrame:
    """Failed steps in the window by failure cause (model errors as model errors; KV causes for timeouts only)."""
    return failure_summary(failure_verdicts(store, since, until))


def kv_events_page(store: Store, since: float, until: float, window_s: float, instances=None) -> dict:
    counts = queries.kv_event_counts(store, since, until, bucket_s=window_s, instances=instances)
    lifecycle = counts.pivot_table(index="bucket", columns="kind", values="events", aggfunc="sum", fill_value=0)
    if not lifecycle.empty:  # the stream reported in this range: a window without events had none
        lifecycle = fill_windows(lifecycle, since, until, window_s, value=0.0)
    losses = queries.losses_in(counts)  # "blocks lost", from the counts just read
    reasons = losses.assign(reason=losses["reason"].fillna("(none)")).groupby(["kind", "reason"])["blocks"].sum()
    stored = queries.stored_blocks(store, since, until, latest=PREFIX_ROWS, instances=instances)
    return {
        "lifecycle": lifecycle,
        "reasons": reasons.rename("blocks").reset_index(),
        "prefixes": prefix_reuse(stored).head(20),
        "restored": queries.top_restored_blocks(store, since, until, limit=20, instances=instances),
        "churn": eviction_churn(stored),
        "prefix_rows": len(stored),
    }


def alerts_page(store: Store, since: float, until: float, instances=None) -> dict:
    """Alerts firing now and the range's transitions; with `instances`, those of these instances and those of no
    instance (a session's, the fleet's)."""
    history = queries.alerts(store, since, until)
    latest = queries.alerts(store).drop_duplicates(["rule", "instance", "session_id"], keep="first")
    if instances is not None:  # a few rows per rule and key: narrowed here
        history, latest = (f[f["instance"].isna() | f["instance"].isin(instances)] for f in (history, latest))
    return {"active": latest[latest["state"] == "firing"], "history": history}
