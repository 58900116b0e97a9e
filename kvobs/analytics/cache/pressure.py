"""Cache pressure against latency, per time window, and their lagged correlation.

    frame = pressure_windows(range_sums(store, since, until, 30), block_losses, window_s=30)
    corr = lagged_correlation(frame, "evictions_per_s", "ttft_p90", max_lag=5)
    strongest_lag(corr)        # the lag to look at, or None: too few windows, or no lag beyond chance

Pressure: pinned usage (vLLM's `kv_cache_usage_perc`, SGLang's `token_usage`, TensorRT-LLM's used blocks), resident
cached blocks, blocks lost per second (evicted, invalidated or removed), preemptions (increase of the instances'
cumulative counts). Latency: TTFT, inter-token latency and queue time of the requests that *arrived* in the window:
the mean, and p50, p90 and p99, each only for a window with enough requests for it (`kvobs.analytics.samples`: p99
needs 100); `requests` says how many.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pandas as pd

from kvobs.analytics.samples import ALPHA, MIN_PAIRS, correlation
from kvobs.analytics.windows import RangeSums, window_quantiles
from kvobs.semconv.spans import BLOCK_LOSS_KINDS
from kvobs.store.rollups import LATENCIES

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def pressure_windows(
    sums: RangeSums, kv_counts: pd.DataFrame, *, window_s: float = 60.0, quantiles: Collection[str] | None = None
) -> pd.DataFrame:
    """One row per window (`window`, its start in epoch s) with pressure and latency columns; NaN where unknown.
    `sums`: the range's snapshots and requests per window (`kvobs.analytics.windows.range_sums`, or
    `RangeSums.from_rows`); `kv_counts`: `reads.block_losses` (or `kv_event_counts`) rows, whose loss kinds' blocks
    `evictions_per_s` sums. Means are the windows' exact means; p50, p90 and p99 come from the latency sketch, each
    (`ttft_p90`, ...) only when among `quantiles` (None: all of them)."""
    parts = []
    if not sums.snapshots.empty:
        snaps = sums.snapshots.groupby("window").sum(numeric_only=True)
        parts.append(
            pd.DataFrame(
                {
                    "usage_mean": _mean(snaps, "usage"),
                    "usage_max": sums.snapshots.groupby("window")["usage_max"].max(),
                    "resident_blocks": _mean(snaps, "resident"),
                    "waiting": _mean(snaps, "waiting"),
                    "preemptions": snaps["preemptions"],
                }
            )
        )
    if not kv_counts.empty:
        losses = kv_counts[kv_counts["kind"].isin(BLOCK_LOSS_KINDS)]
        lost = losses.assign(window=_bucket(losses["bucket"], window_s)).groupby("window")["blocks"].sum()
        parts.append((lost / window_s).rename("evictions_per_s").to_frame())
    if not sums.requests.empty:
        reqs = sums.requests.groupby("window").sum(numeric_only=True)
        latency = {"requests": reqs["requests"]}
        for name in LATENCIES:
            latency[f"{name}_mean"] = _mean(reqs, name, "n", "sum")  # defined for one request: its own
            for label, q in QUANTILES.items():
                if quantiles is None or f"{name}_{label}" in quantiles:
                    latency[f"{name}_{label}"] = window_quantiles(sums.latency, name, q)
        parts.append(pd.DataFrame(latency))
    if not parts:
        return pd.DataFrame(columns=["window"])
    frame = pd.concat(parts, axis=1).sort_index()
    if "evictions_per_s" in frame:
        frame["evictions_per_s"] = frame["evictions_per_s"].fillna(0.0)
    return frame.rename_axis("window").reset_index()


def _bucket(ts: pd.Series, window_s: float) -> pd.Series:
    return np.floor(ts / window_s) * window_s


def _mean(frame: pd.DataFrame, name: str, count: str = "n", total: str = "sum") -> pd.Series:
    """`<name>_<total>` / `<name>_<count>`: NaN where nothing was counted."""
    n = frame[f"{name}_{count}"]
    return frame[f"{name}_{total}"] / n.where(n > 0)


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
