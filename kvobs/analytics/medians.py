"""Leave-one-out medians: each value's "usual" among its peers, without itself (a step against its session's others)."""

from __future__ import annotations

import numpy as np


def leave_one_out_medians(values: np.ndarray) -> np.ndarray:
    """For each value, the median of all the others (NaN skipped, as pandas does; NaN when no other is known), in
    O(n log n): after one sort, removing the value at rank p shifts the middle ranks at or after p by one."""
    out = np.full(len(values), np.nan)
    valid = ~np.isnan(values)
    known = np.sort(values[valid])
    m = len(known)
    if m == 0:
        return out
    out[~valid] = np.median(known)  # a step without a latency: every known one is "another"
    if m == 1:
        return out
    ranks = np.empty(m, dtype=int)
    ranks[np.argsort(values[valid], kind="stable")] = np.arange(m)
    rest = m - 1

    def kth_without_own(k: int) -> np.ndarray:
        return np.where(k < ranks, known[k], known[min(k + 1, m - 1)])

    middle = rest // 2
    out[valid] = kth_without_own(middle) if rest % 2 else (kth_without_own(middle - 1) + kth_without_own(middle)) / 2
    return out
