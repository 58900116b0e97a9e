"""Per-minute rollups of instance snapshots, requests and request lookups, kept by the writer, so a page's
whole-range series cost what the range's minutes cost, not what its rows cost.

    sums = snapshot_sums(snapshots, MINUTE_S, previous)   # per (window, instance): samples, usage sum and max, ...
    sums, latency = request_sums(requests, MINUTE_S)       # ... and each latency's sketch: (window, instance, metric,
                                                           # value_bin) -> n
    SNAPSHOT_MINUTES.merge(frames, ["window", "instance"]) # partial rows of the same keys added together

Four rollups, one row per minute and instance (`MINUTE_S`, the KV-event rollup's step):
- `snapshot_minutes`, of the instance-level snapshots: how many, the first and last time, the sum and count of
  usage, resident blocks and waiting requests (their mean over any whole minutes is sum / count), the highest
  usage, and the preemptions: the increase of `preemptions_total` over the instance's previous snapshot, counted
  at write time (`preemption_increase`), so a window's preemptions are a sum, exactly as counted over the rows.
- `request_minutes`, of the requests by arrival: how many, the first and last arrival, the last arrival or finish, each
  latency's sum and count, and the prompt tokens cached of the requests that say (`kvobs.analytics.cache.hit_rate`).
- `latency_minutes`, each latency's sketch (TTFT, inter-token, queue): how many values fell in each logarithmic bin
  (`value_bin`, `kvobs.store.latency_sketch`). Any quantile of any window is read off the merged bins within
  `SKETCH_ACCURACY` of the exact one, where rows would have to be read again.
- `lookup_minutes`, of the request lookups the collector measured (`request_lookups`) by lookup: how many, the
  tokens of their whole prompt blocks found (and of those, found only in a lower tier), available and missed by why
  (`lookup_tokens`, what the shortfall split sums), and the requests compared with another replica and their prompt
  tokens (the routing loss's share).

The writer adds a batch's partial rows to the stored ones in the batch's transaction (SQL: sums added, maxima and
minima kept; ClickHouse: an AggregatingMergeTree of the same functions), so a rollup always equals its raw rows.
The same functions compute a range's partial minutes at its edges from the rows (`kvobs.analytics.windows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvobs.store.composed import latencies
from kvobs.store.latency_sketch import BIN_SPAN, ZERO_BIN, value_bins
from kvobs.store.schema import MINUTE_S

PREEMPTIONS = "preemptions_total"  # the instance snapshots' cumulative preemption counter
LATENCIES = ("ttft", "itl", "queue")  # the sketched latencies: `<name>_s` of `reads.requests`


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
        return self.grouped(frame, keys)

    def grouped(self, frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        """`frame`'s rows merged per key: one grouping, each kind of merge over its columns at once (a merge per
        column, pandas' `agg` of a dict, cost a writer's batch several milliseconds)."""
        groups = frame.groupby(keys, sort=True)
        parts = [
            getattr(groups[list(columns)], how)()
            for how, columns in (("sum", self.sums), ("max", self.maxima), ("min", self.minima))
            if columns
        ]
        return pd.concat(parts, axis=1).reset_index()[[*keys, *self.values]]


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
# why a missed prompt block missed (`kvobs.analytics.cache.routing.request_lookups`), in the order a block is judged
MISS_PARTS = ("routed", "cold", "invalidated", "pause", "capacity", "unexplained")
LOOKUP_TOKENS = (  # a request lookup's tokens of whole prompt blocks: what the shortfall split sums
    "prompt_block_tokens",
    "achieved_tokens",
    "tier_tokens",  # of the achieved, those found only in a lower tier of its replica (loaded, not recomputed)
    "available_tokens",
    *(f"{part}_tokens" for part in MISS_PARTS),
)
LOOKUP_MINUTES = Rollup(
    "lookup_minutes",
    ("minute", "instance"),
    sums=("requests", *LOOKUP_TOKENS, "compared_requests", "compared_prompt_tokens"),
    maxima=("last_ts",),
    minima=("first_ts",),
)
ROLLUPS = (SNAPSHOT_MINUTES, REQUEST_MINUTES, LATENCY_MINUTES, LOOKUP_MINUTES)


SNAPSHOT_COLUMNS = ["ts", "instance", "kv_usage", "blocks_resident", "num_waiting", PREEMPTIONS]  # what is summed
LOOKUP_COLUMNS = [
    "instance",
    "lookup_ts",
    "prompt_tokens",
    "block_size",
    "prompt_blocks",
    "own_blocks",
    "tier_blocks",
    "available_blocks",
    *(f"{part}_blocks" for part in MISS_PARTS),
    "replicas_compared",
]
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
        self,
        snapshots: list[dict],
        requests: list[dict],
        before: Callable[[list[str], float], dict[str, float]],
        lookups: list[dict] | None = None,
    ) -> tuple[list[tuple[Rollup, pd.DataFrame]], dict[str, float | None]]:
        """The batch's rows (instance-level snapshots, requests, request lookups) as partial minutes of each rollup,
        and the counts after the batch: `commit` them once the batch is stored, so a batch written again counts the
        same."""
        counts = dict(self.counts)
        parts: list[tuple[Rollup, pd.DataFrame]] = []
        if snapshots:
            frame = _columns(snapshots, SNAPSHOT_COLUMNS)
            new = sorted(set(frame["instance"]) - set(counts))
            if new:
                counts.update({**dict.fromkeys(new), **before(new, min(frame["ts"]))})
            parts.append((SNAPSHOT_MINUTES, snapshot_sums(frame, MINUTE_S, counts)))
        if requests:
            sums, bins = request_sums(_columns(requests, REQUEST_COLUMNS), MINUTE_S)
            parts += [(REQUEST_MINUTES, sums), (LATENCY_MINUTES, bins)]
        if lookups:
            parts.append((LOOKUP_MINUTES, lookup_sums(_columns(lookups, LOOKUP_COLUMNS), MINUTE_S)))
        return parts, counts

    def commit(self, counts: dict[str, float | None]) -> None:
        self.counts = counts


CACHED_SUMS = ("cached_said", "hit_requests", "cached_tokens", "prompt_tokens")  # request minutes' cached counts


def cached_fill_sums(requests: list[dict]) -> pd.DataFrame:
    """`REQUEST_MINUTES` partial rows for requests (row dicts) whose cached tokens were filled after their rows were
    counted (`StoreWriter.fill_cached`): only the cached counts are added. The request and its latencies were counted
    with its row; its times, the same again, move no maximum or minimum."""
    sums, _ = request_sums(_columns(requests, REQUEST_COLUMNS), MINUTE_S)
    for name in REQUEST_MINUTES.sums:
        if name not in CACHED_SUMS:
            sums[name] = 0
    return sums


def _columns(rows: list[dict], names: list[str]) -> dict[str, list]:
    """Row dicts as column lists (a missing value None): what the sums take, without a DataFrame per batch."""
    return {name: [row.get(name) for row in rows] for name in names}


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


def preemption_increase(snapshots: pd.DataFrame, before: Mapping[str, float | None] | None = None) -> pd.Series:
    """Per snapshot row, preemptions since the instance's previous snapshot with a count (a counter reset counts from
    zero). An instance's first row is counted against its count before these rows (`before`: instance -> value, as
    `lookups.instance_counter_before` reads it), and as 0 when none is known: a counter's value at the start of a
    range holds what happened before it."""
    if snapshots.empty:
        return pd.Series(dtype=float)
    names, codes = np.unique(snapshots["instance"].to_numpy(str), return_inverse=True)
    increase, _ = _increase(_floats(snapshots["ts"]), codes, names, _floats(snapshots[PREEMPTIONS]), before or {})
    return pd.Series(increase, index=snapshots.index)


def _increase(ts, codes, names, totals, before: Mapping[str, float | None]) -> tuple[np.ndarray, dict[str, float]]:
    """`preemption_increase` on arrays (`codes` index `names`), and each instance's last count after the rows."""
    order = np.lexsort((ts, codes))  # by instance, then time (stable)
    order = order[~np.isnan(totals[order])]
    mine, values = codes[order], totals[order]
    previous = np.empty(len(order))
    previous[1:] = values[:-1]
    first = np.r_[True, mine[1:] != mine[:-1]] if len(order) else np.zeros(0, bool)
    known = {name: value for name, value in before.items() if value is not None}
    previous[first] = [known.get(names[code], np.nan) for code in mine[first]]
    delta = values - previous
    delta = np.where(delta >= 0, delta, values)  # a reset: the new value is the increase
    increase = np.zeros(len(ts))
    increase[order] = np.where(np.isnan(previous), 0.0, delta)
    last = np.r_[mine[1:] != mine[:-1], True] if len(order) else np.zeros(0, bool)
    return increase, {str(names[code]): float(value) for code, value in zip(mine[last], values[last])}


def _floats(values) -> np.ndarray:
    """A column (pandas, or a list with None) as float64, missing as NaN."""
    if isinstance(values, pd.Series):
        return values.to_numpy(dtype=float, na_value=np.nan)
    return np.array(values, dtype=float)


@dataclass(frozen=True)
class _Groups:
    """Rows grouped by (window, instance), in key order: each row's group (`of`), each group's window and instance."""

    of: np.ndarray
    windows: np.ndarray
    instances: np.ndarray
    size: int
    names: np.ndarray  # the instances' names, sorted
    codes: np.ndarray  # each row's instance, as its index in `names`

    @classmethod
    def by(cls, ts: np.ndarray, instance, bucket_s: float) -> _Groups:
        names, codes = np.unique(np.asarray(instance, dtype=str), return_inverse=True)
        windows = np.floor(ts / bucket_s).astype(np.int64)
        keys, of = np.unique(windows * len(names) + codes, return_inverse=True)
        instances = names[keys % len(names)].astype(object)
        return cls(of, (keys // len(names)) * bucket_s, instances, len(keys), names, codes)

    def sum(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.of, weights=values, minlength=self.size)

    def count(self, known: np.ndarray) -> np.ndarray:
        return np.bincount(self.of, weights=known.astype(float), minlength=self.size).astype(np.int64)

    def extreme(self, values: np.ndarray, ufunc) -> np.ndarray:
        """The highest (`np.maximum`) or lowest (`np.minimum`) known value per group; NaN for none."""
        start = -np.inf if ufunc is np.maximum else np.inf
        out = np.full(self.size, start)
        known = ~np.isnan(values)
        ufunc.at(out, self.of[known], values[known])
        return np.where(np.isinf(out), np.nan, out)


def snapshot_sums(snapshots, bucket_s: float, previous: dict) -> pd.DataFrame:
    """Instance-level snapshot rows (a frame, or a dict of column lists, of `SNAPSHOT_COLUMNS`) summed per `window`
    (of `bucket_s`) and instance, as `SNAPSHOT_MINUTES` holds them; `previous`: each instance's preemption count
    before these rows (None: none known), updated to its count after them."""
    keys = ["window", "instance"]
    if not len(snapshots) or not len(snapshots["ts"]):  # (a frame with no rows, or no columns)
        return SNAPSHOT_MINUTES.empty(keys)
    ts = _floats(snapshots["ts"])
    groups = _Groups.by(ts, snapshots["instance"], bucket_s)
    counts = _floats(snapshots[PREEMPTIONS])
    increase, last = _increase(ts, groups.codes, groups.names, counts, previous)
    previous.update(last)
    usage, resident, waiting = (_floats(snapshots[c]) for c in ("kv_usage", "blocks_resident", "num_waiting"))
    out = {"window": groups.windows, "instance": groups.instances, "samples": groups.count(np.ones(len(ts), bool))}
    for name, values in (("usage", usage), ("resident", resident), ("waiting", waiting)):
        out[f"{name}_n"] = groups.count(~np.isnan(values))
        out[f"{name}_sum"] = groups.sum(np.nan_to_num(values))
    out.update(
        counted=groups.count(~np.isnan(counts)),
        preemptions=groups.sum(increase),
        usage_max=groups.extreme(usage, np.maximum),
        last_ts=groups.extreme(ts, np.maximum),
        first_ts=groups.extreme(ts, np.minimum),
    )
    return pd.DataFrame(out, columns=[*keys, *SNAPSHOT_MINUTES.values])


def request_sums(requests, bucket_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Request rows (a frame, or a dict of column lists, of `REQUEST_COLUMNS`) summed per `window` of arrival and
    instance, as `REQUEST_MINUTES` holds them, and their latencies' sketch bins, as `LATENCY_MINUTES` does."""
    keys = ["window", "instance"]
    bin_keys = [*keys, "metric", "value_bin"]
    if not len(requests) or not len(requests["arrival_ts"]):
        return REQUEST_MINUTES.empty(keys), LATENCY_MINUTES.empty(bin_keys)
    arrival, finished = _floats(requests["arrival_ts"]), _floats(requests["finished_ts"])
    first, completion = _floats(requests["first_token_ts"]), _floats(requests["completion_tokens"])
    ttft, itl, _ = latencies(arrival, first, finished, completion)
    measured = {"ttft": ttft, "itl": itl, "queue": _floats(requests["queue_s"])}
    cached, prompt = _floats(requests["cached_tokens"]), _floats(requests["prompt_tokens"])
    said = ~np.isnan(cached)
    hit = said & ~np.isnan(prompt)
    groups = _Groups.by(arrival, requests["instance"], bucket_s)
    out = {
        "window": groups.windows,
        "instance": groups.instances,
        "requests": groups.count(np.ones(len(arrival), bool)),
    }
    for name in LATENCIES:
        out[f"{name}_n"] = groups.count(~np.isnan(measured[name]))
        out[f"{name}_sum"] = groups.sum(np.nan_to_num(measured[name]))
    out.update(
        cached_said=groups.count(said),
        hit_requests=groups.count(hit),
        cached_tokens=groups.sum(np.where(hit, cached, 0.0)).round().astype(np.int64),
        prompt_tokens=groups.sum(np.where(hit, prompt, 0.0)).round().astype(np.int64),
        last_ts=groups.extreme(np.fmax(arrival, finished), np.maximum),
        last_arrival_ts=groups.extreme(arrival, np.maximum),
        first_ts=groups.extreme(arrival, np.minimum),
    )
    sums = pd.DataFrame(out, columns=[*keys, *REQUEST_MINUTES.values])
    metrics = sorted(LATENCIES)  # the table's key order
    bins, of, metric = [], [], []
    for name in metrics:
        known = ~np.isnan(measured[name])
        bins.append(value_bins(measured[name][known]))
        of.append(groups.of[known])
        metric.append(np.full(int(known.sum()), metrics.index(name)))
    value_bin, group, which = np.concatenate(bins), np.concatenate(of), np.concatenate(metric)
    if not len(value_bin):
        return sums, LATENCY_MINUTES.empty(bin_keys)
    key = (group * len(metrics) + which) * BIN_SPAN + (value_bin - ZERO_BIN)
    found, n = np.unique(key, return_counts=True)
    group, rest = found // (len(metrics) * BIN_SPAN), found % (len(metrics) * BIN_SPAN)
    latency = pd.DataFrame(
        {
            "window": groups.windows[group],
            "instance": groups.instances[group],
            "metric": np.array(metrics, dtype=object)[rest // BIN_SPAN],
            "value_bin": rest % BIN_SPAN + ZERO_BIN,
            "n": n.astype(np.int64),
        }
    )
    return sums, latency


def lookup_tokens(lookups) -> dict[str, np.ndarray]:
    """Per request lookup (a frame, or a dict of column lists, of `LOOKUP_COLUMNS`): its tokens of whole prompt
    blocks (`LOOKUP_TOKENS`: the blocks times the block size), whether it was compared with another replica, and
    its prompt tokens if so. The one definition the rollup and the shortfall split sum."""
    size = _floats(lookups["block_size"])
    out = {
        "prompt_block_tokens": _floats(lookups["prompt_blocks"]) * size,
        "achieved_tokens": _floats(lookups["own_blocks"]) * size,
        "tier_tokens": _floats(lookups["tier_blocks"]) * size,
        "available_tokens": _floats(lookups["available_blocks"]) * size,
    }
    for part in MISS_PARTS:
        out[f"{part}_tokens"] = _floats(lookups[f"{part}_blocks"]) * size
    compared = _floats(lookups["replicas_compared"]) > 0
    out["compared_requests"] = compared.astype(float)
    out["compared_prompt_tokens"] = np.where(compared, _floats(lookups["prompt_tokens"]), 0.0)
    return out


def lookup_sums(lookups, bucket_s: float) -> pd.DataFrame:
    """Request lookups summed per `window` of their lookup and instance, as `LOOKUP_MINUTES` holds them."""
    keys = ["window", "instance"]
    if not len(lookups) or not len(lookups["lookup_ts"]):
        return LOOKUP_MINUTES.empty(keys)
    ts = _floats(lookups["lookup_ts"])
    groups = _Groups.by(ts, lookups["instance"], bucket_s)
    out: dict = {
        "window": groups.windows,
        "instance": groups.instances,
        "requests": groups.count(np.ones(len(ts), bool)),
    }
    for name, values in lookup_tokens(lookups).items():
        out[name] = groups.sum(np.nan_to_num(values)).round().astype(np.int64)
    out.update(last_ts=groups.extreme(ts, np.maximum), first_ts=groups.extreme(ts, np.minimum))
    return pd.DataFrame(out, columns=[*keys, *LOOKUP_MINUTES.values])
