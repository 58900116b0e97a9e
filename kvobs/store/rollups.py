"""Per-minute rollups of instance snapshots and requests, kept by the writer, so a page's whole-range series cost
what the range's minutes cost, not what its rows cost.

    sums = snapshot_sums(snapshots, MINUTE_S, previous)   # per (window, instance): samples, usage sum and max, ...
    sums, latency = request_sums(requests, MINUTE_S)       # ... and each latency's sketch: (window, instance, metric,
                                                           # value_bin) -> n
    SNAPSHOT_MINUTES.merge(frames, ["window", "instance"]) # partial rows of the same keys added together

Three rollups, one row per minute and instance (`MINUTE_S`, the KV-event rollup's step):
- `snapshot_minutes`, of the instance-level snapshots: how many, the first and last time, the sum and count of
  usage, resident blocks and waiting requests (their mean over any whole minutes is sum / count), the highest
  usage, and the preemptions: the increase of `preemptions_total` over the instance's previous snapshot, counted
  at write time (`preemption_increase`), so a window's preemptions are a sum, exactly as counted over the rows.
- `request_minutes`, of the requests by arrival: how many, the first and last arrival, the last arrival or finish, each
  latency's sum and count, and the prompt tokens cached of the requests that say (`kvobs.analytics.hit_rate`).
- `latency_minutes`, each latency's sketch (TTFT, inter-token, queue): how many values fell in each logarithmic bin
  (`value_bin`). Any quantile of any window is read off the merged bins within `SKETCH_ACCURACY` of the exact one
  (the DDSketch construction: Masson, Rim and Lee, VLDB 2019), where rows would have to be read again.

The writer adds a batch's partial rows to the stored ones in the batch's transaction (SQL: sums added, maxima and
minima kept; ClickHouse: an AggregatingMergeTree of the same functions), so a rollup always equals its raw rows.
The same functions compute a range's partial minutes at its edges from the rows (`kvobs.analytics.windows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvobs.store.composed import with_latencies
from kvobs.store.schema import MINUTE_S

PREEMPTIONS = "preemptions_total"  # the instance snapshots' cumulative preemption counter
LATENCIES = ("ttft", "itl", "queue")  # the sketched latencies: `<name>_s` of `reads.requests`
SKETCH_ACCURACY = 0.01  # relative: a sketched quantile is within 1% of the exact one
_GAMMA = (1 + SKETCH_ACCURACY) / (1 - SKETCH_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
MIN_SKETCHED_S = 1e-6  # values at or below it (a zero TTFT, clock skew) fall in the zero bin, read as 0
ZERO_BIN = -(2**15)


@dataclass(frozen=True)
class Rollup:
    """A rollup table: its key columns and how each other column merges (sum, max, min)."""

    table: str
    keys: tuple[str, ...]
    sums: tuple[str, ...]
    maxima: tuple[str, ...] = ()
    minima: tuple[str, ...] = ()

    @property
    def values(self) -> tuple[str, ...]:
        return (*self.sums, *self.maxima, *self.minima)

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.keys, *self.values)

    def how(self) -> dict[str, str]:
        """Column -> its merge (`sum`, `max`, `min`), the aggregate a read or an upsert applies."""
        return {
            **dict.fromkeys(self.sums, "sum"),
            **dict.fromkeys(self.maxima, "max"),
            **dict.fromkeys(self.minima, "min"),
        }

    def empty(self, keys: Iterable[str]) -> pd.DataFrame:
        return pd.DataFrame(columns=[*keys, *self.values])

    def merge(self, frames: Iterable[pd.DataFrame], keys: list[str]) -> pd.DataFrame:
        """Partial rows of these keys merged into one row per key (sums added, the highest maximum, lowest minimum)."""
        parts = [f for f in frames if not f.empty]
        if not parts:
            return self.empty(keys)
        frame = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
        return frame.groupby(keys, as_index=False, sort=True).agg(self.how())


SNAPSHOT_MINUTES = Rollup(
    "snapshot_minutes",
    ("minute", "instance"),
    sums=(
        "samples",
        "usage_n",
        "usage_sum",
        "resident_n",
        "resident_sum",
        "waiting_n",
        "waiting_sum",
        "counted",
        "preemptions",
    ),
    maxima=("usage_max", "last_ts"),
    minima=("first_ts",),
)
REQUEST_MINUTES = Rollup(
    "request_minutes",
    ("minute", "instance"),
    sums=(
        "requests",
        *(f"{name}_{part}" for name in LATENCIES for part in ("n", "sum")),
        "cached_said",
        "hit_requests",
        "cached_tokens",
        "prompt_tokens",
    ),
    maxima=("last_ts", "last_arrival_ts"),
    minima=("first_ts",),
)
LATENCY_MINUTES = Rollup("latency_minutes", ("minute", "instance", "metric", "value_bin"), sums=("n",))
ROLLUPS = (SNAPSHOT_MINUTES, REQUEST_MINUTES, LATENCY_MINUTES)


SNAPSHOT_COLUMNS = ["ts", "instance", "kv_usage", "blocks_resident", "num_waiting", PREEMPTIONS]  # what is summed
REQUEST_COLUMNS = [
    "instance",
    "arrival_ts",
    "first_token_ts",
    "finished_ts",
    "queue_s",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
]


@dataclass
class BatchRollups:
    """A writer's side of the rollups: a batch's partial minutes, and each instance's latest preemption count, so
    the next batch's increases count from it. Only the writer of an instance writes its snapshots (a lease per
    instance: `kvobs.store.leases`), so the count it remembers is the store's; at its first batch of an instance it
    looks the count up (`before`: instances, ts -> their latest stored count before ts)."""

    counts: dict[str, float | None] = field(default_factory=dict)  # None: looked up, none stored

    def partials(
        self, snapshots: list[dict], requests: list[dict], before: Callable[[list[str], float], dict[str, float]]
    ) -> tuple[list[tuple[Rollup, pd.DataFrame]], dict[str, float | None]]:
        """The batch's rows (instance-level snapshots, requests) as partial minutes of each rollup, and the counts
        after the batch: `commit` them once the batch is stored, so a batch written again counts the same."""
        counts = dict(self.counts)
        parts: list[tuple[Rollup, pd.DataFrame]] = []
        if snapshots:
            frame = pd.DataFrame(snapshots, columns=SNAPSHOT_COLUMNS)
            new = sorted(set(frame["instance"]) - set(counts))
            if new:
                counts.update({**dict.fromkeys(new), **before(new, float(frame["ts"].min()))})
            parts.append((SNAPSHOT_MINUTES, snapshot_sums(frame, MINUTE_S, counts)))  # type: ignore[arg-type]
        if requests:
            sums, bins = request_sums(pd.DataFrame(requests, columns=REQUEST_COLUMNS), MINUTE_S)
            parts += [(REQUEST_MINUTES, sums), (LATENCY_MINUTES, bins)]
        return parts, counts

    def commit(self, counts: dict[str, float | None]) -> None:
        self.counts = counts


def stored_rollups(
    snapshot_chunks: Iterable[pd.DataFrame], request_chunks: Iterable[pd.DataFrame]
) -> list[tuple[Rollup, pd.DataFrame]]:
    """The rollups of rows stored before them (a migration's fill): instance snapshots in chunks in time order
    (`SNAPSHOT_COLUMNS`), requests in chunks (`REQUEST_COLUMNS`); each rollup's minutes merged, keyed by `window`."""
    previous: dict = {}
    snaps = [snapshot_sums(chunk, MINUTE_S, previous) for chunk in snapshot_chunks]
    sums, bins = [], []
    for chunk in request_chunks:
        found = request_sums(chunk, MINUTE_S)
        sums.append(found[0])
        bins.append(found[1])
    keys = ["window", "instance"]
    return [
        (SNAPSHOT_MINUTES, SNAPSHOT_MINUTES.merge(snaps, keys)),
        (REQUEST_MINUTES, REQUEST_MINUTES.merge(sums, keys)),
        (LATENCY_MINUTES, LATENCY_MINUTES.merge(bins, [*keys, "metric", "value_bin"])),
    ]


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


def snapshot_sums(snapshots: pd.DataFrame, bucket_s: float, previous: dict[str, float]) -> pd.DataFrame:
    """Instance-level snapshot rows summed per `window` (of `bucket_s`) and instance, as `SNAPSHOT_MINUTES` holds
    them; `previous`: each instance's preemption count before these rows, updated to its count after them."""
    keys = ["window", "instance"]
    if snapshots.empty:
        return SNAPSHOT_MINUTES.empty(keys)
    increase = preemption_increase(snapshots, previous)
    counts = snapshots.dropna(subset=[PREEMPTIONS]).sort_values("ts", kind="stable")
    previous.update(counts.groupby("instance")[PREEMPTIONS].last().astype(float).to_dict())

    def known(column: str) -> pd.Series:
        return snapshots[column].notna()

    frame = pd.DataFrame(
        {
            "window": np.floor(snapshots["ts"].to_numpy(float) / bucket_s) * bucket_s,
            "instance": snapshots["instance"].to_numpy(object),
            "samples": 1,
            "usage_n": known("kv_usage"),
            "usage_sum": snapshots["kv_usage"].fillna(0.0),
            "resident_n": known("blocks_resident"),
            "resident_sum": snapshots["blocks_resident"].fillna(0.0),
            "waiting_n": known("num_waiting"),
            "waiting_sum": snapshots["num_waiting"].fillna(0.0),
            "counted": known(PREEMPTIONS),
            "preemptions": increase,
            "usage_max": snapshots["kv_usage"],
            "last_ts": snapshots["ts"],
            "first_ts": snapshots["ts"],
        }
    ).astype({c: float for c in ("usage_sum", "resident_sum", "waiting_sum", "preemptions", "usage_max")})
    out = frame.groupby(keys, as_index=False, sort=True).agg(SNAPSHOT_MINUTES.how())
    return out.astype(dict.fromkeys(("samples", "usage_n", "resident_n", "waiting_n", "counted"), "int64"))


def request_sums(requests: pd.DataFrame, bucket_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Request rows (`reads.request_rows`, or `reads.requests` with their latencies) summed per `window` of arrival
    and instance, as `REQUEST_MINUTES` holds them, and their latencies' sketch bins, as `LATENCY_MINUTES` does."""
    keys = ["window", "instance"]
    if requests.empty:
        return REQUEST_MINUTES.empty(keys), LATENCY_MINUTES.empty([*keys, "metric", "value_bin"])
    reqs = requests if "ttft_s" in requests else with_latencies(requests)
    window = np.floor(reqs["arrival_ts"].to_numpy(float) / bucket_s) * bucket_s
    instance = reqs["instance"].to_numpy(object)
    said = reqs["cached_tokens"].notna()
    hit = said & reqs["prompt_tokens"].notna()
    columns: dict[str, object] = {"window": window, "instance": instance, "requests": 1}
    for name in LATENCIES:
        values = reqs[f"{name}_s"].astype(float)
        columns[f"{name}_n"] = values.notna().to_numpy()
        columns[f"{name}_sum"] = values.fillna(0.0).to_numpy()
    columns.update(
        cached_said=said.to_numpy(),
        hit_requests=hit.to_numpy(),
        cached_tokens=reqs["cached_tokens"].where(hit, 0).fillna(0).astype("int64").to_numpy(),
        prompt_tokens=reqs["prompt_tokens"].where(hit, 0).fillna(0).astype("int64").to_numpy(),
        last_ts=np.fmax(reqs["arrival_ts"].to_numpy(float), reqs["finished_ts"].to_numpy(float)),
        last_arrival_ts=reqs["arrival_ts"].to_numpy(float),
        first_ts=reqs["arrival_ts"].to_numpy(float),
    )
    sums = pd.DataFrame(columns).groupby(keys, as_index=False, sort=True).agg(REQUEST_MINUTES.how())
    counts_of = ["requests", "cached_said", "hit_requests", *(f"{name}_n" for name in LATENCIES)]
    sums = sums.astype(dict.fromkeys(counts_of, "int64"))
    bins = []
    for name in LATENCIES:
        values = reqs[f"{name}_s"].to_numpy(float)
        known = ~np.isnan(values)
        if known.any():
            bins.append(
                pd.DataFrame(
                    {
                        "window": window[known],
                        "instance": instance[known],
                        "metric": name,
                        "value_bin": value_bins(values[known]),
                        "n": 1,
                    }
                )
            )
    latency = LATENCY_MINUTES.merge(bins, [*keys, "metric", "value_bin"])
    return sums, latency.astype({"value_bin": "int64", "n": "int64"})


def value_bins(values: np.ndarray) -> np.ndarray:
    """Each value's sketch bin: k with gamma^(k-1) < value <= gamma^k; `ZERO_BIN` at or below `MIN_SKETCHED_S`."""
    values = np.asarray(values, float)
    out = np.full(values.shape, ZERO_BIN, dtype=np.int64)
    positive = values > MIN_SKETCHED_S
    out[positive] = np.ceil(np.log(values[positive]) / _LOG_GAMMA - 1e-12).astype(np.int64)
    return out


def bin_values(bins: np.ndarray) -> np.ndarray:
    """The value a bin stands for: 2 gamma^k / (gamma + 1), within `SKETCH_ACCURACY` of every value in it; 0 for
    the zero bin."""
    bins = np.asarray(bins, np.int64)
    out = 2.0 * np.exp(bins.astype(float) * _LOG_GAMMA) / (_GAMMA + 1.0)
    return np.where(bins == ZERO_BIN, 0.0, out)


def minute_rows(frame: pd.DataFrame) -> list[dict]:
    """Partial rows keyed by `window` as the rollup tables' rows (`minute`), in key order (a writer's upserts go in
    key order: `kvobs.store.sql_write`), with plain Python values."""
    frame = frame.rename(columns={"window": "minute"})
    records = frame.to_dict("records")
    for row in records:
        for key, value in row.items():
            if isinstance(value, float) and math.isnan(value):
                row[key] = None
            elif isinstance(value, np.generic):
                row[key] = value.item()
    return records
