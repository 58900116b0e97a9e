"""Time series on a page's window grid, with what is zero told apart from what is unknown (no Streamlit here).

A count whose source was watching is 0 in a window where nothing happened; a sampled value (usage, hit rate,
latency) is NaN in a window with no sample, and a chart breaks its line there. Between two engine runs (the first
stopped, the next not started) nothing was watching: counts are NaN there too (`unwatched`), not zero.
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


def activity(times: list[pd.Series], runs: pd.DataFrame) -> list[tuple[float, float]]:
    """The stretches something was watching: per engine run (`kvobs.analytics.runs.run_table` rows), from its start
    to the last time anything of it was recorded (`times`: the page's times, of any source); without runs, from
    the first time to the last."""
    known = [np.asarray(t, float) for t in times if len(t)]  # (a store of one source: the others' times are empty)
    stamps = np.sort(np.concatenate(known)) if known else np.empty(0)
    stamps = stamps[~np.isnan(stamps)]
    if not len(stamps):
        return []
    if runs.empty:
        return [(float(stamps[0]), float(stamps[-1]))]
    out, starts = [], np.sort(runs["started_at"].to_numpy(float))
    if stamps[0] < starts[0]:  # before the first recorded run
        out.append((float(stamps[0]), float(stamps[stamps < starts[0]][-1])))
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else np.inf
        mine = stamps[(stamps >= start) & (stamps < end)]
        if len(mine):
            out.append((float(start), float(mine[-1])))
    return out


def unwatched(frame: pd.DataFrame, window_s: float, stretches: list[tuple[float, float]]) -> pd.DataFrame:
    """`frame` (indexed by window start) with NaN in every window that no stretch of activity overlaps."""
    if frame.empty or not stretches:
        return frame
    starts = frame.index.to_numpy(float)
    seen = np.zeros(len(starts), bool)
    for low, high in stretches:
        seen |= (starts + window_s > low) & (starts <= high)
    out = frame.astype(float)
    out.loc[~seen] = np.nan
    return out
