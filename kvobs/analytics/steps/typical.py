"""A step's typical step: what each part of its latency is weighed against (`kvobs.analytics.steps.attribution`).

- A successful step: the median of its session's other successful steps (leave-one-out); a successful session of one
  step: of every successful step read with it.
- A failed step: the median of its session's successful steps of its kind and size: as many requests sent, and the
  largest prompt within `SIZE_FACTOR` of its own (a 4,000-token prompt's prefill is not an excess over a 60-token
  one's). None where there is none (none of its session's others succeeded, none is of its kind and size, or its size
  is not known): a timeout is then named by its largest part, never by its excess over other timeouts or over steps
  of another size.

It reads a step's session alone (but for a one-step session), so every page and the verdict keeper weigh a step alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIZE_FACTOR = 2.0  # of the same size: the largest prompt within this factor of the failed step's, either way
FROM_SESSION = "the median of its session's other successful steps"
FROM_RUN = "the median of the successful steps read with it (a session of one step)"
NO_PEER = "no successful step of its size to compare it with"
NO_SUCCESS = "no other step of its session succeeded to compare it with"


@dataclass(frozen=True)
class Typical:
    """Per step (in the order given): each column's typical value (NaN: none), what it comes from (None: none), and,
    where none, why."""

    values: dict[str, np.ndarray]
    taken_from: np.ndarray
    none_because: np.ndarray


def typical_steps(
    sessions: np.ndarray, ok: np.ndarray, columns: dict[str, np.ndarray], sizes: np.ndarray, kinds: np.ndarray
) -> Typical:
    """The typical values of every step (see the module's doc). `sessions` in order, each session's steps side by
    side; `ok`: which succeeded; `columns`: name -> values; `sizes`: each step's largest prompt (NaN: not known);
    `kinds`: the number of requests each sent. Slices of numpy arrays: a pandas assignment per session was half
    the failure table's time on a store of many sessions."""
    n = len(ok)
    values = {c: np.full(n, np.nan) for c in columns}
    taken_from = np.full(n, None, dtype=object)
    none_because = np.full(n, None, dtype=object)
    whole = {c: _median(v[ok]) for c, v in columns.items()}
    for start, end in session_slices(sessions):
        good = ok[start:end]
        if end - start == 1:
            if good[0]:
                taken_from[start] = FROM_RUN
                for c in columns:
                    values[c][start] = whole[c]
            else:
                none_because[start] = NO_SUCCESS
            continue
        for c, column in columns.items():
            good_values = column[start:end][good]
            if (~np.isnan(good_values)).sum() >= 2:
                values[c][start:end][good] = leave_one_out_medians(good_values)
        others = good.sum() - good
        for i in np.flatnonzero(good & (others > 0)):
            taken_from[start + i] = FROM_SESSION
        for i in np.flatnonzero(~good):
            at = start + i
            peers, said = _peers(good, sizes[start:end], kinds[start:end], int(i))
            if not peers.any():
                none_because[at] = said
                continue
            taken_from[at] = said
            for c, column in columns.items():
                values[c][at] = _median(column[start:end][peers])
    return Typical(values, taken_from, none_because)


def _peers(good: np.ndarray, sizes: np.ndarray, kinds: np.ndarray, i: int) -> tuple[np.ndarray, str]:
    """The successful steps of a session that failed step `i` is weighed against, and the words for them (or for why
    there are none)."""
    if not good.any():
        return good, NO_SUCCESS
    size, kind = sizes[i], int(kinds[i])
    requests = f"{kind} request{'s' if kind != 1 else ''}"
    if size != size:
        return np.zeros_like(good), f"its prompt's size is not known: {NO_PEER}"
    lo, hi = size / SIZE_FACTOR, size * SIZE_FACTOR
    peers = good & (kinds == kind) & (sizes >= lo) & (sizes <= hi)
    scope = f"{requests}, the largest prompt {lo:,.0f}-{hi:,.0f} tokens"
    count = int(peers.sum())
    if not count:
        return peers, f"none of its session's {int(good.sum())} successful steps is of its kind and size ({scope})"
    steps = (
        "its session's one successful step" if count == 1 else f"the median of its session's {count} successful steps"
    )
    return peers, f"{steps} of its kind and size ({scope})"


def _median(values: np.ndarray) -> float:
    known = values[~np.isnan(values)]
    return float(np.median(known)) if len(known) else np.nan


def session_slices(sessions: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each session's run of steps in `sessions` (in order, each session's steps side by side)."""
    starts = np.flatnonzero(np.r_[True, sessions[1:] != sessions[:-1]]) if len(sessions) else np.empty(0, int)
    return list(zip(starts.tolist(), [*starts[1:].tolist(), len(sessions)]))


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
