"""The measured prefill rate behind every recompute estimate: fitted on request rows, summed on counters, refused on
too little, and on the recorded vLLM run taken from vLLM's own counters."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvobs.analytics.cache.prefill_rates import COUNTERS, MIN_FIT_SAMPLES, RATE_WINDOW_S, PrefillRates
from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS, attribute_steps
from kvobs.analytics.steps.causes import step_causes


def _requests(tokens, seconds, *, start=1000.0, instance="e0", cached=0):
    n = len(tokens)
    arrival = start + np.arange(n, dtype=float)
    return pd.DataFrame(
        {
            "instance": instance,
            "arrival_ts": arrival,
            "queue_s": 0.01,
            "first_token_ts": arrival + 0.01 + np.asarray(seconds, float),
            "prompt_tokens": np.asarray(tokens) + (cached or 0),
            "cached_tokens": cached,
            "num_preemptions": 0,
        }
    )


def test_the_fit_separates_the_fixed_part_from_the_cost_per_token():
    rng = np.random.default_rng(1)
    tokens = rng.integers(16, 600, 40)
    seconds = 0.03 + tokens / 4000.0  # each prefill: 30 ms of step, then 4,000 tokens/s
    rate = PrefillRates(_requests(tokens, seconds)).at("e0", 1100.0)
    assert rate.source == "requests" and rate.num_requests == 40
    assert rate.tokens_per_s == pytest.approx(4000.0) and rate.overhead_s == pytest.approx(0.03)
    assert rate.seconds(160) == pytest.approx(0.04)
    # the ratio of the sums would have called 160 tokens far dearer
    assert 160 * seconds.sum() / tokens.sum() > 1.3 * rate.seconds(160)


def test_few_requests_give_the_ratio_of_the_sums_and_fewer_than_three_none():
    few = PrefillRates(_requests([100, 300, 500], [0.1, 0.2, 0.3])).at("e0", 1010.0)
    assert few.overhead_s == 0 and few.tokens_per_s == pytest.approx(900 / 0.6) and MIN_FIT_SAMPLES > 3
    assert PrefillRates(_requests([100, 300], [0.1, 0.2])).at("e0", 1010.0) is None
    assert PrefillRates(_requests([100, 300, 500], [0.1, 0.2, 0.3])).at("other", 1010.0) is None


def test_only_the_window_before_counts_and_unclean_prefills_are_left_out():
    old = _requests([400] * 5, [0.1] * 5, start=0.0)  # 4,000 tokens/s, long ago
    recent = _requests([400] * 5, [0.4] * 5, start=RATE_WINDOW_S + 10)  # 1,000 tokens/s
    preempted = _requests([400] * 5, [5.0] * 5, start=RATE_WINDOW_S + 20).assign(num_preemptions=1)
    unknown = _requests([400] * 5, [5.0] * 5, start=RATE_WINDOW_S + 30).assign(cached_tokens=None)
    rates = PrefillRates(pd.concat([old, recent, preempted, unknown], ignore_index=True))
    assert rates.at("e0", 5.0).tokens_per_s == pytest.approx(4000.0)
    assert rates.at("e0", RATE_WINDOW_S + 40).tokens_per_s == pytest.approx(1000.0)


def test_counters_give_the_rate_where_requests_do_not_say_what_was_cached():
    requests = _requests([400] * 5, [0.4] * 5, cached=None)  # vLLM's spans carry no cached tokens
    counters = pd.DataFrame(
        [
            {"ts": 1000.0 + 2 * k, "instance": "e0", "name": COUNTERS[key], "value": value}
            for k in range(4)
            for key, value in (("prompt", 900.0), ("cached", 100.0), ("seconds", 0.4), ("count", 2.0))
        ]
    )
    rate = PrefillRates(requests, counters).at("e0", 1010.0)
    assert rate.source == "counters" and rate.num_requests == 8 and rate.tokens_per_s == pytest.approx(2000.0)
    incomplete = counters[counters["name"] != COUNTERS["cached"]]
    assert PrefillRates(requests, incomplete).at("e0", 1010.0) is None  # uncached tokens unknown: no rate


def test_the_recorded_vllm_run_is_costed_from_its_own_prefills_and_counters(vllm_run):
    """A lost prefix costs its share of the step's own measured prefill (never more than the prefill); a preemption
    a server counts but does not time is estimated from the instance's counters, and said to be unknown without them.
    (vLLM's spans carry no preemption count: the run's slowest prefill is taken as one preempted request.)"""
    store = vllm_run.store
    frame = step_causes(store, None, None)
    lost = frame[(frame["blocks_lost_in_pause"] > 0) & (frame["prefill_s"] > 0)]
    assert len(lost) > 0 and lost["prefill_rate"].notna().all()  # every recomputed loss has a cost
    assert (lost["lost_recompute_s"] > 0).all()
    assert (lost["lost_recompute_s"] <= lost["prefill_s"] + 1e-9).all()  # a share of the prefill, never more
    assert (lost["lost_excess_s"] == lost["lost_recompute_s"]).all()  # a loss is never usual: it counts whole
    steps, events = store.reads.steps(), store.reads.kv_events(kinds=ATTRIBUTION_KINDS)
    reqs = store.reads.requests()
    prefill = reqs["first_token_ts"] - reqs["arrival_ts"] - reqs["queue_s"]
    slowest = prefill.idxmax()
    reqs.loc[slowest, "num_preemptions"] = 1
    first, last = store.reads.time_range()
    counted = attribute_steps(steps, reqs, events, rates=PrefillRates.from_store(store, first, last, requests=reqs))
    (row,) = counted[counted["preemptions"] > 0].to_dict("records")
    assert row["preemption"] == "estimated" and 0 < row["preempted_s"] <= prefill[slowest] + 1e-9
    assert abs(row["preempted_s"] + row["prefill_s"] - prefill[slowest]) < 1e-6  # moved out of the prefill, whole
    assert "the server does not say when" in row["evidence"]
    unknown = attribute_steps(steps, reqs, events)  # the request rows alone, without cached tokens: no rate
    (row,) = unknown[unknown["preemptions"] > 0].to_dict("records")
    assert row["preemption"] == "unknown" and row["preempted_s"] == 0 and "not separated" in row["evidence"]
