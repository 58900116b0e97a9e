"""A range's snapshots and requests per window from the per-minute rollups (`kvobs.analytics.windows.range_sums`)
answer what the rows answer, on real runs: the recorded vLLM run, the same recording as a fleet of two, and the
rollup tables our engine's writer and the collector kept. Counts, sums, means, maxima and preemptions exactly;
quantiles off the latency sketch, within its accuracy of numpy's exact quantile of the rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvobs.analytics.cache.pressure import pressure_windows
from kvobs.analytics.samples import quantile
from kvobs.analytics.windows import BIN_KEYS, KEYS, RangeSums, range_sums, sketch_quantile, window_quantiles
from kvobs.store.latency_sketch import SKETCH_ACCURACY, bin_values, value_bins
from kvobs.store.rollups import LATENCY_MINUTES, PREEMPTIONS, REQUEST_MINUTES, SNAPSHOT_MINUTES


def from_rows(store, since, until, window_s, instances=None) -> RangeSums:
    """The definition: every row of the range, summed per window."""
    snaps = store.reads.instance_snapshots(since, until, instances=instances)
    reqs = store.reads.requests(since, until, instances=instances)
    before = store.lookups.instance_counter_before(PREEMPTIONS, since)
    return RangeSums.from_rows(snaps, reqs, window_s, before)


def assert_same(got: pd.DataFrame, want: pd.DataFrame, keys: list[str]) -> None:
    got, want = (f.sort_values(keys, ignore_index=True) for f in (got, want))
    assert list(got[keys].itertuples(index=False)) == list(want[keys].itertuples(index=False))
    for column in want.columns.difference(keys):
        assert np.allclose(got[column].astype(float), want[column].astype(float), equal_nan=True, rtol=1e-9), column


def ranges(store) -> list[tuple[float, float, float]]:
    first, last = store.reads.time_range()
    return [
        (first, last, 60.0),  # everything, minute windows
        (first + 37.5, last - 11.25, 120.0),  # partial minutes at both edges
        (first + 0.5 * (last - first), last, 300.0),  # a range that starts mid-run: preemptions counted from before
        (first, last, 30.0),  # not whole minutes: every row read
    ]


@pytest.mark.parametrize("run", ["vllm_run", "fleet_run"])
def test_the_rollups_answer_what_the_rows_answer(run, request):
    store = request.getfixturevalue(run).store
    seen = []
    first, last = store.reads.time_range()
    for since, until, window_s in ranges(store):
        rolled, rows = range_sums(store, since, until, window_s), from_rows(store, since, until, window_s)
        assert rolled.from_rollups == (window_s % 60 == 0)
        if rolled.from_rollups and (since, until) == (first, last):  # nothing beyond: every minute from the rollups
            assert rolled.row_minutes == ()
        elif rolled.from_rollups:  # only an edge minute holding rows beyond the range is read from its rows
            assert rolled.row_minutes and set(rolled.row_minutes) <= {math.floor(t / 60) * 60 for t in (since, until)}
        assert_same(rolled.snapshots, rows.snapshots, KEYS)
        assert_same(rolled.requests, rows.requests, KEYS)
        assert_same(rolled.latency, rows.latency, BIN_KEYS)
        by_rollups = pressure_windows(rolled, pd.DataFrame(), window_s=window_s)
        by_rows = pressure_windows(rows, pd.DataFrame(), window_s=window_s)
        assert_same(by_rollups, by_rows, ["window"])
        name = rolled.instances[-1]
        scoped = from_rows(store, since, until, window_s, [name])
        assert_same(range_sums(store, since, until, window_s, [name]).snapshots, scoped.snapshots, KEYS)
        assert_same(range_sums(store, since, until, window_s, [name]).latency, scoped.latency, BIN_KEYS)
        seen.append((len(rows.snapshots), int(rows.requests["requests"].sum()), rolled.from_rollups))
    assert all(snapshots and requests for snapshots, requests, _ in seen) and any(r for _, _, r in seen), seen


@pytest.mark.parametrize("run", ["agent_run", "two_runs", "vllm_run"])
def test_each_writer_keeps_the_rollups_of_its_rows(run, request):
    """Every minute the engine's store recorder (`kvobs serve --store`, twice into one store) and the collector
    wrote, against the rows: the rollup tables themselves."""
    store = request.getfixturevalue(run).store
    first, last = store.reads.time_range()
    rows = from_rows(store, first - 60, last + 60, 60.0)
    assert len(rows.snapshots) and len(rows.requests)
    for rollup, want, keys in (
        (SNAPSHOT_MINUTES, rows.snapshots, KEYS),
        (REQUEST_MINUTES, rows.requests, KEYS),
        (LATENCY_MINUTES, rows.latency, BIN_KEYS),
    ):
        stored = store.reads.minute_rollup(rollup.table, first - 60, last + 60).rename(columns={"minute": "window"})
        assert_same(stored, want, keys)


def test_preemptions_count_the_counters_rise_over_the_range(vllm_run):
    """Independently of `preemption_increase`: the recorded counter's rises inside the range, from its value before."""
    store = vllm_run.store
    first, last = store.reads.time_range()
    snaps = store.reads.instance_snapshots().dropna(subset=[PREEMPTIONS])
    assert snaps[PREEMPTIONS].max() > snaps[PREEMPTIONS].min()  # the recording preempts
    for since in (first, first + 0.4 * (last - first)):
        value, rises = None, 0
        for ts, count in zip(snaps["ts"], snaps[PREEMPTIONS]):
            if ts >= since and value is not None:
                rises += count - value if count >= value else count
            value = count
        sums = range_sums(store, since, last, 60.0)
        assert sums.from_rollups and sums.snapshots["preemptions"].sum() == rises


def test_quantiles_off_the_sketch_are_within_its_accuracy(vllm_run, agent_run):
    for store in (vllm_run.store, agent_run.store):
        first, last = store.reads.time_range()
        reqs = store.reads.requests(first, last)
        sums = range_sums(store, first, last, 60.0)
        for metric in ("ttft", "itl"):
            values = reqs[f"{metric}_s"].dropna()
            for q in (0.5, 0.9):
                got, n = sketch_quantile(sums.latency, metric, q)
                assert n == len(values) >= 10
                assert got == pytest.approx(values.quantile(q), rel=SKETCH_ACCURACY)


def test_the_sketch_bounds_every_quantile_of_a_heavy_tail():
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.lognormal(-3.0, 1.5, 5000), [0.0, 1e-9]])  # 0 and ~0 fall in the zero bin
    bins = pd.DataFrame({"metric": "ttft", "value_bin": value_bins(values), "n": 1})
    for q in (0.01, 0.25, 0.5, 0.9, 0.99, 0.999):
        got, n = sketch_quantile(bins, "ttft", q)
        assert n == len(values) and got == pytest.approx(np.quantile(values, q), rel=SKETCH_ACCURACY, abs=1e-6)
    assert (np.abs(bin_values(value_bins(values[values > 1e-6])) / values[values > 1e-6] - 1) <= SKETCH_ACCURACY).all()
    few = bins.head(4)
    assert np.isnan(sketch_quantile(few, "ttft", 0.5)[0])  # a p50 of 4 values is not shown (samples.min_sample)


def test_a_rollup_merges_as_its_table_does():
    """Sums add, maxima and minima keep the extreme, a missing maximum stays missing."""
    parts = [
        pd.DataFrame({"window": [0.0], "instance": ["a"], **{c: [1] for c in SNAPSHOT_MINUTES.sums}}).assign(
            usage_max=[None], last_ts=[10.0], first_ts=[5.0]
        ),
        pd.DataFrame({"window": [0.0], "instance": ["a"], **{c: [2] for c in SNAPSHOT_MINUTES.sums}}).assign(
            usage_max=[0.5], last_ts=[20.0], first_ts=[1.0]
        ),
    ]
    merged = SNAPSHOT_MINUTES.merge(parts, KEYS).iloc[0]
    assert merged["samples"] == 3 and merged["usage_max"] == 0.5 and merged["last_ts"] == 20 and merged["first_ts"] == 1
    assert REQUEST_MINUTES.merge([], KEYS).empty


def test_each_windows_quantile_is_the_quantile_of_its_requests(vllm_run):
    store = vllm_run.store
    first, last = store.reads.time_range()
    reqs = store.reads.requests(first, last)
    sums = range_sums(store, first, last, 60.0)
    windows = np.floor(reqs["arrival_ts"] / 60.0) * 60.0
    for q in (0.5, 0.9):
        found = window_quantiles(sums.latency, "ttft", q)
        assert len(found) == windows.nunique() > 1
        for window, value in found.items():
            mine = reqs.loc[windows == window, "ttft_s"]
            one = sums.latency[sums.latency["window"] == window]
            assert value == pytest.approx(sketch_quantile(one, "ttft", q)[0], nan_ok=True)
            assert value == pytest.approx(quantile(mine, q), rel=SKETCH_ACCURACY, nan_ok=True)


@pytest.mark.parametrize("window_s", [60.0, 30.0])
def test_each_windows_means_counts_and_maxima_are_those_of_its_rows(fleet_run, window_s):
    """Independently of the rollups' functions: each window's rows grouped by pandas, as the pages read them."""
    store = fleet_run.store
    first, last = store.reads.time_range()
    frame = pressure_windows(range_sums(store, first, last, window_s), pd.DataFrame(), window_s=window_s)
    frame = frame.set_index("window")
    snaps, reqs = store.reads.instance_snapshots(first, last), store.reads.requests(first, last)
    by_snap = snaps.groupby(np.floor(snaps["ts"] / window_s) * window_s)
    by_req = reqs.groupby(np.floor(reqs["arrival_ts"] / window_s) * window_s)
    want = pd.DataFrame(
        {
            "usage_mean": by_snap["kv_usage"].mean(),
            "usage_max": by_snap["kv_usage"].max(),
            "resident_blocks": by_snap["blocks_resident"].mean(),
            "waiting": by_snap["num_waiting"].mean(),
            "requests": by_req.size(),
            "ttft_mean": by_req["ttft_s"].mean(),
            "itl_mean": by_req["itl_s"].mean(),
            "queue_mean": by_req["queue_s"].mean(),
        }
    )
    assert want["requests"].sum() > 10 and want["usage_mean"].notna().sum() > 2
    for column in want.columns:
        got = frame[column].reindex(want.index)
        assert np.allclose(got.astype(float), want[column].astype(float), equal_nan=True, rtol=1e-9), column
