"""The share of an instance's prefill time its engine spent once (`prefill_overlap`), hand-computed."""

from __future__ import annotations

import pandas as pd
import pytest

from kvobs.analytics.cache import prefill_overlap


def _requests(rows):
    """(instance, scheduled, first token) -> request rows (arrived at 0, queued until scheduled)."""
    return pd.DataFrame(
        [{"instance": i, "arrival_ts": 0.0, "queue_s": s, "first_token_ts": f} for i, s, f in rows],
    )


def test_overlapping_prefills_share_the_engine_time_and_instances_are_apart():
    # a: [0, 2] and [1, 3] overlap by 1, [5, 6] alone: 4 s of engine time for 5 s of requests' prefill
    # b: [0, 4] holds [1, 2] inside it: 4 s for 5 s; c: one at a time; a request with no prefill time is left out
    rows = [("a", 0, 2), ("a", 1, 3), ("a", 5, 6), ("b", 0, 4), ("b", 1, 2), ("c", 0, 1), ("c", 2, 3), ("c", 3, 3)]
    shares = prefill_overlap(_requests(rows))
    assert shares == {"a": pytest.approx(0.8), "b": pytest.approx(0.8), "c": pytest.approx(1.0)}


def test_four_prefills_at_once_count_the_engine_time_once():
    assert prefill_overlap(_requests([("x", 10, 14)] * 4)) == {"x": pytest.approx(0.25)}
