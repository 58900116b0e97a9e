"""Engine runs: each start with an empty KV cache, per instance, and which run a row of the store belongs to.

    table = run_table(store.reads.runs())       # ... and `ended_at`: the next run's start on its instance (NaN: open)
    overlapping(table, since, until)             # the runs a range touches
    run_of(table, frame["instance"], frame["arrival_ts"])   # each row's run id (None: before any recorded run)

A run lasts from its start until the next run of the same instance starts. Two runs of one instance are two caches:
counts may add over them, but a replay or a cache-size question is asked run by run (`kvobs whatif`, the What-if
page), and a hit rate over both is said to span both. Rows of an instance from before its first recorded run (a
store older than runs, a replica that says no start) belong to no recorded run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

COLUMNS = [
    "run_id",
    "instance",
    "started_at",
    "ended_at",
    "source",
    "model",
    "num_blocks",
    "block_size",
    "eviction_policy",
    "offload_blocks",
    "engine",
]


def run_table(runs: pd.DataFrame) -> pd.DataFrame:
    """`store.reads.runs()` with `ended_at` (the next start on its instance; NaN for each instance's latest run)."""
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    table = runs.sort_values(["instance", "started_at"], kind="stable").reset_index(drop=True)
    table["ended_at"] = table.groupby("instance")["started_at"].shift(-1).astype(float)
    return table[COLUMNS]


def overlapping(table: pd.DataFrame, since: float | None, until: float | None, instances=None) -> pd.DataFrame:
    """The runs with some time inside [since, until] (of `instances` only, when given), oldest first."""
    keep = pd.Series(True, index=table.index)
    if until is not None:
        keep &= table["started_at"] <= until
    if since is not None:
        keep &= table["ended_at"].isna() | (table["ended_at"] > since)
    if instances is not None:
        keep &= table["instance"].isin(list(instances))
    return table[keep].sort_values("started_at", kind="stable").reset_index(drop=True)


def restarted(table: pd.DataFrame) -> list[str]:
    """Instances with more than one run in `table` (say, `overlapping`'s)."""
    counts = table["instance"].value_counts()
    return sorted(counts[counts > 1].index)


def run_of(table: pd.DataFrame, instances, times) -> np.ndarray:
    """The run id of each (instance, time): the latest run of that instance started at or before it; None before
    its first recorded run."""
    instances = np.asarray(instances, dtype=object)
    times = np.asarray(times, dtype=float)
    out = np.full(len(times), None, dtype=object)
    for instance, runs in table.groupby("instance"):
        mine = np.flatnonzero(instances == instance)
        starts = runs["started_at"].to_numpy(float)
        position = np.searchsorted(starts, times[mine], side="right") - 1
        known = position >= 0
        out[mine[known]] = runs["run_id"].to_numpy(object)[position[known]]
    return out


@dataclass(frozen=True)
class Span:
    """A run's stretch inside a range: [since, until] of one instance."""

    run_id: str | None
    instance: str | None
    since: float | None
    until: float | None
    started_at: float | None = None  # the run's own start (before `since` when the range begins inside it)

    def label(self, clock_iso) -> str:
        """`demo-engine, run started 2026-11-24T23:06:24+01:00` (`clock_iso`: epoch s to text); `the range (no
        recorded runs)` for the span of a store without runs."""
        if self.run_id is None:
            return "the range (no recorded runs)"
        return f"{self.instance}, run started {clock_iso(self.started_at)}"


def spans(table: pd.DataFrame, since: float | None, until: float | None, instances=None) -> list[Span]:
    """The range cut at every run start inside it, per run (oldest first): what a per-run question (a replay) asks
    about. Without recorded runs, the range itself as one span of unknown run."""
    runs = overlapping(table, since, until, instances)
    if runs.empty:
        return [Span(None, None, since, until)]
    cut = []
    for run in runs.itertuples(index=False):
        low = run.started_at if since is None else max(since, run.started_at)
        high = until if run.ended_at != run.ended_at else (run.ended_at if until is None else min(until, run.ended_at))
        cut.append(Span(run.run_id, run.instance, low, high, run.started_at))
    return cut


def describe(table: pd.DataFrame, clock_iso) -> str:
    """`2 runs of demo-engine (started 2026-11-24T23:06:24+01:00, 2026-11-24T23:10:02+01:00)` and so on, one
    clause per instance; `clock_iso` turns an epoch time into text."""
    parts = []
    for instance, runs in table.groupby("instance", sort=True):
        starts = ", ".join(clock_iso(t) for t in runs["started_at"])
        parts.append(f"{len(runs)} run{'s' if len(runs) > 1 else ''} of {instance} (started {starts})")
    return "; ".join(parts)
