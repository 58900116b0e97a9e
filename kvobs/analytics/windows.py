"""A range's instance snapshots and requests summed per window and instance, from the per-minute rollups
(`kvobs.store.rollups`) wherever the windows are whole minutes, so a page's cost follows its windows, not its rows.

    sums = range_sums(store, since, until, window_s=300)     # RangeSums: snapshots, requests, latency (sketch bins)
    sums.of(["vllm-a"])                                       # one instance's
    sketch_quantile(sums.latency, "ttft", 0.9)                # (value, how many values), as `samples.quantile`

Every minute the range touches comes from the rollups, unless it is an edge minute with rows outside the range
(`first_ts`/`last_ts` say so): that minute, and every window that is not a whole number of minutes, is summed from
its rows by the writer's own functions. Counts, sums, means,
maxima and preemption increases are therefore exactly what the rows give; a quantile is read off the merged sketch
bins, within `SKETCH_ACCURACY` (1%) of the exact one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvobs.analytics.samples import min_sample
from kvobs.store.latency_sketch import bin_values
from kvobs.store.rollups import (
    LATENCY_MINUTES,
    LOOKUP_MINUTES,
    PREEMPTIONS,
    REQUEST_MINUTES,
    SNAPSHOT_MINUTES,
    lookup_sums,
    request_sums,
    snapshot_sums,
)
from kvobs.store.schema import MINUTE_S

KEYS = ["window", "instance"]
BIN_KEYS = [*KEYS, "metric", "value_bin"]


@dataclass(frozen=True)
class RangeSums:
    """Per `window` (its start) and `instance`: the instance snapshots' sums (`SNAPSHOT_MINUTES` columns), the
    requests' by arrival (`REQUEST_MINUTES`), and each latency's sketch bins (`latency`: `metric`, `value_bin`,
    `n`); `from_rollups`: whether minutes came from the rollups (else every row was read), and `row_minutes` which
    edge minutes did not."""

    snapshots: pd.DataFrame
    requests: pd.DataFrame
    latency: pd.DataFrame
    from_rollups: bool = False
    row_minutes: tuple[float, ...] = ()  # the edge minutes summed from their rows (they hold rows beyond the range)

    @classmethod
    def from_rows(
        cls, snapshots: pd.DataFrame, requests: pd.DataFrame, window_s: float, before: dict | None = None
    ) -> RangeSums:
        """The sums of these rows (`reads.instance_snapshots`, `reads.requests`); `before`: each instance's preemption
        count before the snapshots."""
        found = request_sums(requests, window_s)
        return cls(snapshot_sums(snapshots, window_s, dict(before or {})), found[0], found[1])

    def only(self, metrics: tuple[str, ...] | None) -> RangeSums:
        """These sums with the sketch bins of `metrics` alone (None: all)."""
        if metrics is None:
            return self
        latency = self.latency[self.latency["metric"].isin(metrics)]
        return RangeSums(self.snapshots, self.requests, latency, self.from_rollups, self.row_minutes)

    def of(self, instances) -> RangeSums:
        snaps, reqs, bins = (frame[frame["instance"].isin(set(instances))] for frame in self.frames)
        return RangeSums(snaps, reqs, bins, self.from_rollups, self.row_minutes)

    @property
    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        return self.snapshots, self.requests, self.latency

    @property
    def instances(self) -> list[str]:
        return sorted(set(self.snapshots["instance"]) | set(self.requests["instance"]))

    def times(self) -> list[pd.Series]:
        """The first and last time of each window's snapshots and requests (arrival or finish): when something
        was watching (`dashboard.series.activity`)."""
        return [frame[c] for frame in (self.snapshots, self.requests) for c in ("first_ts", "last_ts")]


def range_sums(
    store, since: float, until: float, window_s: float, instances=None, *, metrics: tuple[str, ...] | None = None
) -> RangeSums:
    """The instance snapshots and requests of [since, until] on `instances` (None: all), summed per window of
    `window_s` and instance: every minute the range touches from the rollups, but an edge minute that holds rows
    outside the range, which is summed from its rows (windows that are not whole minutes: every row). `metrics`:
    the latencies whose sketch bins are read (`LATENCIES`' names; None: all), for a page that draws only some."""
    scope = None if instances is None else list(instances)
    if window_s < MINUTE_S or window_s % MINUTE_S:
        return _rows(store, since, until, window_s, scope, upper_open=False).only(metrics)
    first, last = _minute_span(since, until)
    snaps, reqs = (_touched(store, rollup, since, until, scope) for rollup in (SNAPSHOT_MINUTES, REQUEST_MINUTES))
    outside = _outside(snaps, since, until, "last_ts") | _outside(reqs, since, until, "last_arrival_ts")
    low = first + MINUTE_S if first in outside else first  # the sketch bins merged per window in the database,
    high = last if last in outside else last + MINUTE_S  # but those of the edge minutes summed from their rows
    bins = store.reads.minute_rollup(
        LATENCY_MINUTES.table, low, high, instances=scope, bucket_s=window_s, metrics=metrics
    )
    snaps, reqs = (_windows(frame[~frame["minute"].isin(outside)], window_s) for frame in (snaps, reqs))
    parts = [RangeSums(snaps, reqs, bins.rename(columns={"minute": "window"})[[*BIN_KEYS, "n"]])]
    for low, high, upper_open in _edges(outside, since, until):
        parts.append(_rows(store, low, high, window_s, scope, upper_open=upper_open).only(metrics))
    return RangeSums(
        SNAPSHOT_MINUTES.merge([p.snapshots for p in parts], KEYS),
        REQUEST_MINUTES.merge([p.requests for p in parts], KEYS),
        LATENCY_MINUTES.merge([p.latency for p in parts], BIN_KEYS),
        from_rollups=True,
        row_minutes=tuple(sorted(outside)),
    )


def lookup_range_sums(store, since: float, until: float, instances=None) -> pd.DataFrame:
    """The request lookups a collector measured (`request_lookups`) of [since, until] on `instances` (None: all),
    summed per instance (`LOOKUP_MINUTES`' values): every minute from the rollup, but an edge minute that holds
    lookups outside the range, which is summed from its rows. Empty where none was measured."""
    scope = None if instances is None else list(instances)
    minutes = _touched(store, LOOKUP_MINUTES, since, until, scope)
    outside = _outside(minutes, since, until, "last_ts")
    parts = [minutes[~minutes["minute"].isin(outside)].drop(columns="minute")]
    for low, high, upper_open in _edges(outside, since, until):
        rows = store.reads.request_lookups(low, high, instances=scope)
        if upper_open:
            rows = rows[rows["lookup_ts"] < high]
        parts.append(lookup_sums(rows, MINUTE_S).drop(columns="window"))
    return LOOKUP_MINUTES.merge(parts, ["instance"])


def arrivals(store, since: float, until: float, instances=None) -> int:
    """How many requests arrived in [since, until] on `instances` (None: all): every minute from `request_minutes`,
    but an edge minute that holds arrivals outside the range, counted from its rows."""
    scope = None if instances is None else list(instances)
    minutes = _touched(store, REQUEST_MINUTES, since, until, scope)
    outside = _outside(minutes, since, until, "last_arrival_ts")
    count = int(minutes.loc[~minutes["minute"].isin(outside), "requests"].sum())
    for low, high, upper_open in _edges(outside, since, until):
        rows = store.reads.requests(low, high, instances=scope)
        count += int((rows["arrival_ts"] < high).sum() if upper_open else len(rows))
    return count


def _minute_span(since: float, until: float) -> tuple[float, float]:
    """The first and the last minute [since, until] touches (their starts)."""
    return math.floor(since / MINUTE_S) * MINUTE_S, math.floor(until / MINUTE_S) * MINUTE_S


def _touched(store, rollup, since: float, until: float, scope) -> pd.DataFrame:
    """A rollup's rows of every minute [since, until] touches."""
    first, last = _minute_span(since, until)
    return store.reads.minute_rollup(rollup.table, first, last + MINUTE_S, instances=scope)


def _edges(outside: set[float], since: float, until: float) -> list[tuple[float, float, bool]]:
    """The edge minutes (`_outside`: at most two) as the stretches of the range they cover, to sum from their rows:
    (low, high, whether `high` is left out: it is the next minute's start, not the range's end)."""
    stretches = [(max(minute, since), min(minute + MINUTE_S, until)) for minute in sorted(outside)]
    return [(low, high, high < until) for low, high in stretches]


def _outside(minutes: pd.DataFrame, since: float, until: float, last: str) -> set[float]:
    """The minutes of a rollup's rows that hold a row before `since` or after `until` (by `first_ts` and `last`):
    the edge minutes a range must sum from their rows."""
    beyond = (minutes["first_ts"] < since) | (minutes[last] > until)
    return set(minutes.loc[beyond, "minute"].astype(float))


def _windows(minutes: pd.DataFrame, window_s: float) -> pd.DataFrame:
    """A rollup's minutes merged per window."""
    rollup = next(r for r in (SNAPSHOT_MINUTES, REQUEST_MINUTES, LATENCY_MINUTES) if set(r.columns) == set(minutes))
    window = np.floor(minutes["minute"].to_numpy(float) / window_s) * window_s
    frame = minutes.drop(columns="minute").assign(window=window)
    return rollup.merge([frame], [k if k != "minute" else "window" for k in rollup.keys])


def _rows(store, since, until, window_s, scope, *, upper_open: bool) -> RangeSums:
    """The sums of the rows of [since, until] (`upper_open`: [since, until)), preemptions counted from each
    instance's count before `since`."""
    snaps = store.reads.instance_snapshots(since, until, instances=scope)
    reqs = store.reads.requests(since, until, instances=scope)
    if upper_open:
        snaps, reqs = snaps[snaps["ts"] < until], reqs[reqs["arrival_ts"] < until]
    before = store.lookups.instance_counter_before(PREEMPTIONS, since) if len(snaps) else {}
    return RangeSums.from_rows(snaps, reqs, window_s, before)


def sketch_quantile(bins: pd.DataFrame, metric: str, q: float) -> tuple[float, int]:
    """The q-quantile of a latency's values summed in `bins` (any windows and instances), and how many values there
    are; NaN below `samples.min_sample(q)`, as `samples.quantile`. Linear between the two nearest ranks, as pandas'
    quantile; each rank's value is its bin's, within `SKETCH_ACCURACY` of the exact value."""
    mine = bins[bins["metric"] == metric]
    found = window_quantiles(mine.assign(window=0.0), metric, q)  # every value as one window
    return (float(found.iloc[0]) if len(found) else float("nan")), int(mine["n"].sum())


def window_quantiles(bins: pd.DataFrame, metric: str, q: float) -> pd.Series:
    """`sketch_quantile` per window (NaN for a window with too few values), for every window at once."""
    mine = bins[bins["metric"] == metric]
    if mine.empty:
        return pd.Series(dtype=float)
    counts = mine.groupby(["window", "value_bin"])["n"].sum()  # sorted by window, then bin
    windows = counts.index.get_level_values(0).to_numpy(float)
    values, n = bin_values(counts.index.get_level_values(1).to_numpy(np.int64)), counts.to_numpy(np.int64)
    cumulative = np.cumsum(n)
    starts = np.flatnonzero(np.r_[True, windows[1:] != windows[:-1]])  # each window's first row
    totals = np.add.reduceat(n, starts)
    before = cumulative[starts] - n[starts]  # values in earlier windows
    rank = q * (totals - 1)
    low, high = np.floor(rank), np.ceil(rank)
    at_low = values[np.searchsorted(cumulative, before + low, side="right")]
    at_high = values[np.searchsorted(cumulative, before + high, side="right")]
    found = at_low + (at_high - at_low) * (rank - low)
    return pd.Series(np.where(totals >= min_sample(q), found, np.nan), index=windows[starts])
