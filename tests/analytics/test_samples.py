"""No statistic without its sample: quantiles and correlations refuse too little data, and a correlation comes with
its interval and p-value (checked against values computed independently of the code under test)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvobs.analytics.cache.pressure import lagged_correlation, pressure_windows, strongest_lag, why_no_lag
from kvobs.analytics.samples import MIN_PAIRS, correlation, min_sample, quantile
from kvobs.analytics.windows import RangeSums
from kvobs.store.latency_sketch import SKETCH_ACCURACY


def test_a_quantile_needs_enough_values_for_it_to_mean_something():
    assert min_sample(0.5) == 5 and min_sample(0.9) == 10 and min_sample(0.99) == 100
    values = list(range(1, 21))  # 20 values: p99 would be their maximum
    assert math.isnan(quantile(values, 0.99))
    assert quantile(values, 0.9) == pytest.approx(np.quantile(values, 0.9))
    assert quantile(list(range(100)), 0.99) == pytest.approx(np.quantile(range(100), 0.99))
    assert math.isnan(quantile([1.0, 2.0, None, float("nan")], 0.5))  # two known values


def test_three_strongly_correlated_points_are_not_a_correlation():
    """What the Pressure page crowned: r = 0.98 from 3 pairs. Now: no r, and nothing crowned."""
    x, y = [0.0, 5.0, 13.0], [0.1, 0.3, 0.52]
    assert np.corrcoef(x, y)[0, 1] > 0.97  # the number that was shown
    c = correlation(x, y)
    assert not c.shown and c.n == 3 and math.isnan(c.p)
    frame = pd.DataFrame({"evictions_per_s": x, "ttft_p90": y})
    table = lagged_correlation(frame, "evictions_per_s", "ttft_p90", max_lag=2, window_s=5)
    assert table["r"].isna().all() and table["pairs"].max() == 3
    assert strongest_lag(table) is None
    assert why_no_lag(table).startswith(
        f"Not enough windows: at most 3 with both values known; a correlation needs at least {MIN_PAIRS}"
    )


def test_fisher_interval_and_p_value_match_the_textbook_formulas():
    rng = np.random.default_rng(3)
    x = rng.normal(size=30)
    y = 0.5 * x + rng.normal(size=30)
    c = correlation(x, y)
    r = np.corrcoef(x, y)[0, 1]
    z, se = np.arctanh(r), 1 / np.sqrt(27)
    assert c.r == pytest.approx(r) and c.n == 30
    assert (c.ci_low, c.ci_high) == pytest.approx((np.tanh(z - 1.959964 * se), np.tanh(z + 1.959964 * se)))
    # two-sided normal tail of z / se, computed with the error function's complement
    assert c.p == pytest.approx(math.erfc(abs(z) / se / math.sqrt(2)))
    assert c.ci_low < c.r < c.ci_high


def test_a_real_lead_is_crowned_and_chance_is_not():
    rng = np.random.default_rng(7)
    pressure = rng.normal(size=60)
    latency = np.roll(pressure, 2) * 0.9 + rng.normal(scale=0.3, size=60)  # latency follows pressure by 2 windows
    frame = pd.DataFrame({"evictions_per_s": pressure, "ttft_p90": latency})
    best = strongest_lag(lagged_correlation(frame, "evictions_per_s", "ttft_p90", max_lag=4, window_s=30))
    assert best is not None and best["lag"] == 2 and best["lag_s"] == 60 and best["p_adjusted"] < 0.05
    noise = pd.DataFrame({"evictions_per_s": rng.normal(size=12), "ttft_p90": rng.normal(size=12)})
    table = lagged_correlation(noise, "evictions_per_s", "ttft_p90", max_lag=1)
    assert table["r"].notna().any()  # 10 to 12 pairs: r is shown ...
    assert strongest_lag(table) is None  # ... but nothing in noise is crowned
    assert why_no_lag(table).startswith("No lag stands out from chance")


def test_window_latencies_need_enough_requests_per_window():
    arrivals = [0.5] * 3 + [10.5] * 12  # window 0: 3 requests, window 10: 12 requests
    ttft = np.linspace(0.1, 1.5, 15)
    requests = pd.DataFrame(
        {
            "instance": "a",
            "arrival_ts": arrivals,
            "first_token_ts": np.array(arrivals) + ttft,
            "finished_ts": np.array(arrivals) + ttft + 0.2,  # 10 tokens after the first: 0.02 s each
            "completion_tokens": 11,
            "queue_s": 0.01,
            "prompt_tokens": 100,
            "cached_tokens": None,
        }
    )
    sums = RangeSums.from_rows(pd.DataFrame(), requests, 10)
    frame = pressure_windows(sums, pd.DataFrame(), window_s=10).set_index("window")
    assert frame.loc[0.0, "requests"] == 3 and math.isnan(frame.loc[0.0, "ttft_p50"])
    assert frame.loc[10.0, "requests"] == 12
    exact = np.quantile(ttft[3:], 0.9)  # read off the latency sketch: within its accuracy
    assert frame.loc[10.0, "ttft_p90"] == pytest.approx(exact, rel=SKETCH_ACCURACY)
    assert math.isnan(frame.loc[10.0, "ttft_p99"])  # 12 requests: no p99
