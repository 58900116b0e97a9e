"""Time series on a page's window grid, with what is zero told apart from what is unknown (no Streamlit here).

A count whose source was watching is 0 in a window where nothing happened; a sampled value (usage, hit rate,
latency) is NaN in a window with no sample, and a chart breaks its line there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def window_grid(since: float, until: float, window_s: float) -> np.ndarray:
    """The starts of every window overlapping [since, until]."""
    start = np.floor(since / window_s) * window_s
    return start + window_s * np.arange(int(np.floor((until - start) / window_s)) + 1)


def fill_windows(frame: pd.DataFrame, since: float, until: float, window_s: float, *, value: float) -> pd.DataFrame:
    """`frame` (indexed by window start) over every window of [since, until], missing windows set to `value`."""
    grid = window_grid(since, until, window_s)
    if len(frame):
        grid = np.union1d(grid, frame.index.to_numpy(float))
    out = frame.reindex(grid)
    return out if np.isnan(value) else out.fillna(value)


def is_empty(frame: pd.DataFrame, *, zero_is_empty: bool = False) -> bool:
    """Nothing to draw: no rows, only NaN, or (`zero_is_empty`) only zeros and NaN."""
    if frame.empty or not len(frame.columns):
        return True
    values = frame.to_numpy(dtype=float, na_value=np.nan)
    finite = values[np.isfinite(values)]
    return finite.size == 0 or (zero_is_empty and not finite.any())


def per_window(frame: pd.DataFrame, ts: str, window_s: float, values: str, by: str) -> pd.DataFrame:
    """The mean of `values` per window (rows) and `by` (columns)."""
    if frame.empty:
        return pd.DataFrame()
    windows = np.floor(frame[ts] / window_s) * window_s
    return frame.assign(window=windows).pivot_table(index="window", columns=by, values=values, aggfunc="mean")
