"""Cache pressure against latency, per time window, and their lagged correlation.

    frame = pressure_windows(instance_snapshots, requests, block_losses, window_s=30)
    corr = lagged_correlation(frame, "evictions_per_s", "ttft_p99", max_lag=5)

Pressure: pinned usage (vLLM's `kv_cache_usage_perc`), resident cached blocks, blocks lost per second (evicted,
invalidated or removed), preemptions (increase of the instances' cumulative counts). Latency: TTFT, inter-token
latency and queue time of the requests that *arrived* in the window, p50 and p99.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.semconv.spans import BLOCK_LOSS_KINDS

LATENCIES = ("ttft", "itl", "queue")


def _bucket(ts: pd.Series, window_s: float) -> pd.Series:
    return np.floor(ts / window_s) * window_s


def preemption_increase(snapshots: pd.DataFrame) -> pd.Series:
    """Per snapshot row, preemptions since the instance's previous snapshot (a counter reset counts from zero)."""
    if snapshots.empty:
        return pd.Series(dtype=float)
    ordered = snapshots.sort_values("ts")
    totals = ordered["preemptions_total"].astype(float)
    delta = totals.groupby(ordered["instance"]).diff()
    delta = delta.where(delta >= 0, totals)  # reset: the new value is the increase
    return delta.fillna(0.0).reindex(snapshots.index)


def pressure_windows(
    snapshots: pd.DataFrame, requests: pd.DataFrame, kv_counts: pd.DataFrame, *, window_s: float = 60.0
) -> pd.DataFrame:
    """One row per window (`window`, its start in epoch s) with pressure and latency columns; NaN where unknown.
    `kv_counts`: `queries.block_losses` (or `kv_event_counts`) rows; `evictions_per_s` sums their loss kinds' blocks."""
    parts = []
    if not snapshots.empty:
        snaps = snapshots.assign(window=_bucket(snapshots["ts"], window_s),
                                 preemptions=preemption_increase(snapshots))  # fmt: skip
        parts.append(snaps.groupby("window").agg(
            usage_mean=("kv_usage", "mean"), usage_max=("kv_usage", "max"),
            resident_blocks=("blocks_resident", "mean"), hit_rate=("hit_rate", "mean"),
            waiting=("num_waiting", "mean"), preemptions=("preemptions", "sum"),
        ))  # fmt: skip
    if not kv_counts.empty:
        losses = kv_counts[kv_counts["kind"].isin(BLOCK_LOSS_KINDS)]
        lost = losses.assign(window=_bucket(losses["bucket"], window_s)).groupby("window")["blocks"].sum()
        parts.append((lost / window_s).rename("evictions_per_s").to_frame())
    if not requests.empty:
        reqs = requests.assign(window=_bucket(requests["arrival_ts"], window_s), queue=requests["queue_s"],
                               ttft=requests["ttft_s"], itl=requests["itl_s"])  # fmt: skip
        grouped = reqs.groupby("window")
        latency = {"requests": grouped.size()}
        for name in LATENCIES:
            latency[f"{name}_p50"] = grouped[name].quantile(0.5)
            latency[f"{name}_p99"] = grouped[name].quantile(0.99)
        parts.append(pd.DataFrame(latency))
    if not parts:
        return pd.DataFrame(columns=["window"])
    frame = pd.concat(parts, axis=1).sort_index()
    if "evictions_per_s" in frame:
        frame["evictions_per_s"] = frame["evictions_per_s"].fillna(0.0)
    return frame.rename_axis("window").reset_index()


def lagged_correlation(frame: pd.DataFrame, x: str, y: str, *, max_lag: int = 5, window_s: float | None = None):
    """Pearson r between `x` shifted by each lag and `y`: lag k > 0 means x leads y by k windows.

    Returns a DataFrame `lag`, `lag_s` (if `window_s` given), `r` (NaN when fewer than 3 pairs or no variance),
    `pairs`.
    """
    rows = []
    if x in frame and y in frame:
        series_x, series_y = frame[x].astype(float), frame[y].astype(float)
        for lag in range(-max_lag, max_lag + 1):
            pairs = pd.concat([series_x.shift(lag), series_y], axis=1).dropna()
            r = np.nan
            if len(pairs) >= 3 and pairs.iloc[:, 0].std() > 0 and pairs.iloc[:, 1].std() > 0:
                r = float(np.corrcoef(pairs.iloc[:, 0], pairs.iloc[:, 1])[0, 1])
            rows.append({"lag": lag, "r": r, "pairs": len(pairs)})
    out = pd.DataFrame(rows, columns=["lag", "r", "pairs"])
    if window_s is not None:
        out.insert(1, "lag_s", out["lag"] * window_s)
    return out


def strongest_lag(correlation: pd.DataFrame) -> dict | None:
    """The lag with the largest |r|, or None when no lag has a defined correlation."""
    defined = correlation.dropna(subset=["r"])
    if defined.empty:
        return None
    return defined.loc[defined["r"].abs().idxmax()].to_dict()
