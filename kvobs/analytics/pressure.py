"""Cache pressure against latency, per time window, and their lagged correlation.

    frame = pressure_windows(instance_snapshots, requests, block_losses, window_s=30)
    corr = lagged_correlation(frame, "evictions_per_s", "ttft_p90", max_lag=5)
    strongest_lag(corr)        # the lag to look at, or None: too few windows, or no lag beyond chance

Pressure: pinned usage (vLLM's `kv_cache_usage_perc`), resident cached blocks, blocks lost per second (evicted,
invalidated or removed), preemptions (increase of the instances' cumulative counts). Latency: TTFT, inter-token
latency and queue time of the requests that *arrived* in the window: the mean, and p50, p90 and p99, each only for a
window with enough requests for it (`kvobs.analytics.samples`: p99 needs 100); `requests` says how many.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from kvobs.analytics.samples import ALPHA, MIN_PAIRS, correlation, grouped_quantile
from kvobs.semconv.spans import BLOCK_LOSS_KINDS

PREEMPTIONS = "preemptions_total"  # the instance snapshots' cumulative preemption counter
LATENCIES = ("ttft", "itl", "queue")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def _bucket(ts: pd.Series, window_s: float) -> pd.Series:
    return np.floor(ts / window_s) * window_s


def preemption_increase(snapshots: pd.DataFrame, before: Mapping[str, float] | None = None) -> pd.Series:
    """Per snapshot row, preemptions since the instance's previous snapshot with a count (a counter reset counts from
    zero). An instance's first row is counted against its count before these rows (`before`: instance -> value, as
    `lookups.instance_counter_before` reads it), and as 0 when none is known: a counter's value at the start of a
    range holds what happened before it."""
    if snapshots.empty:
        return pd.Series(dtype=float)
    known = snapshots.dropna(subset=[PREEMPTIONS]).sort_values("ts", kind="stable")
    totals = known[PREEMPTIONS].astype(float)
    previous = totals.groupby(known["instance"]).shift()
    first = known.groupby("instance").cumcount().to_numpy() == 0
    previous[first] = known.loc[first, "instance"].map(dict(before or {})).astype(float).to_numpy()
    delta = totals - previous
    delta = delta.where(delta >= 0, totals).where(previous.notna(), 0.0)  # reset: the new value is the increase
    return delta.reindex(snapshots.index).fillna(0.0)


def pressure_windows(
    snapshots: pd.DataFrame,
    requests: pd.DataFrame,
    kv_counts: pd.DataFrame,
    *,
    window_s: float = 60.0,
    preemptions_before: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """One row per window (`window`, its start in epoch s) with pressure and latency columns; NaN where unknown.
    `kv_counts`: `reads.block_losses` (or `kv_event_counts`) rows; `evictions_per_s` sums their loss kinds' blocks;
    `preemptions_before`: each instance's preemption count before the snapshots (`preemption_increase`)."""
    parts = []
    if not snapshots.empty:
        increase = preemption_increase(snapshots, preemptions_before)
        snaps = snapshots.assign(window=_bucket(snapshots["ts"], window_s), preemptions=increase)
        parts.append(
            snaps.groupby("window").agg(
                usage_mean=("kv_usage", "mean"),
                usage_max=("kv_usage", "max"),
                resident_blocks=("blocks_resident", "mean"),
                waiting=("num_waiting", "mean"),
                preemptions=("preemptions", "sum"),
            )
        )
    if not kv_counts.empty:
        losses = kv_counts[kv_counts["kind"].isin(BLOCK_LOSS_KINDS)]
        lost = losses.assign(window=_bucket(losses["bucket"], window_s)).groupby("window")["blocks"].sum()
        parts.append((lost / window_s).rename("evictions_per_s").to_frame())
    if not requests.empty:
        reqs = requests.assign(
            window=_bucket(requests["arrival_ts"], window_s),
            queue=requests["queue_s"],
            ttft=requests["ttft_s"],
            itl=requests["itl_s"],
        )
        grouped = reqs.groupby("window")
        latency = {"requests": grouped.size()}
        for name in LATENCIES:
            latency[f"{name}_mean"] = grouped[name].mean()  # defined for one request: its own
            for label, q in QUANTILES.items():
                latency[f"{name}_{label}"] = grouped_quantile(grouped[name], q)
        parts.append(pd.DataFrame(latency))
    if not parts:
        return pd.DataFrame(columns=["window"])
    frame = pd.concat(parts, axis=1).sort_index()
    if "evictions_per_s" in frame:
        frame["evictions_per_s"] = frame["evictions_per_s"].fillna(0.0)
    return frame.rename_axis("window").reset_index()


def lagged_correlation(frame: pd.DataFrame, x: str, y: str, *, max_lag: int = 5, window_s: float | None = None):
    """Pearson r between `x` shifted by each lag and `y`: lag k > 0 means x leads y by k windows.

    Returns a DataFrame `lag`, `lag_s` (if `window_s` given), `r` (NaN with fewer than `MIN_PAIRS` pairs or a series
    that does not vary), `pairs`, `ci_low`, `ci_high` (its 95% interval), `p` (two-sided, this lag alone).
    """
    rows = []
    if x in frame and y in frame:
        series_x, series_y = frame[x].astype(float), frame[y].astype(float)
        for lag in range(-max_lag, max_lag + 1):
            c = correlation(series_x.shift(lag), series_y)
            rows.append({"lag": lag, "r": c.r, "pairs": c.n, "ci_low": c.ci_low, "ci_high": c.ci_high, "p": c.p})
    out = pd.DataFrame(rows, columns=["lag", "r", "pairs", "ci_low", "ci_high", "p"])
    if window_s is not None:
        out.insert(1, "lag_s", out["lag"] * window_s)
    return out


def strongest_lag(correlation: pd.DataFrame) -> dict | None:
    """The lag with the largest |r| among those shown, when it is beyond chance after testing every lag shown
    (Bonferroni: p x lags tested < `ALPHA`), with `p_adjusted`; else None (`why_no_lag` says why)."""
    best, _ = _largest_r(correlation)
    return best if best is not None and best["p_adjusted"] < ALPHA else None


def why_no_lag(correlation: pd.DataFrame) -> str:
    """Why `strongest_lag` names none, in one sentence."""
    best, tested = _largest_r(correlation)
    if best is None:
        most = int(correlation["pairs"].max()) if not correlation.empty else 0
        return (
            f"Not enough windows: at most {most} with both values known; a correlation needs at least "
            f"{MIN_PAIRS} (or one of the two did not vary)."
        )
    return (
        f"No lag stands out from chance: the largest |r| is {best['r']:.2f} ({int(best['pairs'])} windows), "
        f"p = {best['p_adjusted']:.2f} after testing {tested} lags."
    )


def _largest_r(correlation: pd.DataFrame) -> tuple[dict | None, int]:
    """The row with the largest |r| (None when no lag has one) with its `p_adjusted` for the lags tested, and how
    many lags were tested (those with an r)."""
    defined = correlation.dropna(subset=["r"])
    if defined.empty:
        return None, 0
    best = defined.loc[defined["r"].abs().idxmax()].to_dict()
    best["p_adjusted"] = min(1.0, float(best["p"]) * len(defined))
    return best, len(defined)
