"""Reuse times (a block's latest store to its first hit after it), hand-computed and on the recorded vLLM run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.cache import range_reuse_times, reuse_times, reuse_words
from kvobs.analytics.cache.ages_at_eviction import ALL


def test_reuse_times_by_hand():
    # blocks 1 and 2 stored at 0, block 1 again at 50 (its copy was evicted in between); r1 finds both at 10 (10 s,
    # 10 s), r2 finds the same copies at 20 (not counted again), r3 finds block 1's new copy at 70 (20 s); r4 finds
    # block 3, whose store the events never showed: unknown; r5 finds blocks 4 and 5 (stored at 0) at 30 (30 s each)
    stored = pd.DataFrame({"block_hash": [1, 2, 1, 4, 5], "ts": [0.0, 0.0, 50.0, 0.0, 0.0]})
    lookups = pd.DataFrame(
        {
            "request_id": ["r1", "r2", "r3", "r4", "r5"],
            "session_id": ["s1", "s2", "s1", "s2", "s1"],
            "lookup_ts": [10.0, 20.0, 70.0, 5.0, 30.0],
            "own_blocks": [2, 2, 1, 1, 2],
        }
    )
    chains = {"r1": [1, 2], "r2": [1, 2, 9], "r3": [1, 2], "r4": [3], "r5": [4, 5]}
    sessions = pd.DataFrame({"session_id": ["s1", "s2"], "agent_name": ["coder", "planner"]})
    reuse = reuse_times(lookups, chains, stored, sessions)
    assert list(reuse) == [ALL, "coder", "planner"]
    assert (reuse[ALL].count, reuse[ALL].unknown, reuse[ALL].quantiles[0.5]) == (5, 1, 20.0)  # 10, 10, 20, 30, 30
    assert (reuse["coder"].count, reuse["coder"].unknown) == (5, 0)
    assert (reuse["planner"].count, reuse["planner"].unknown) == (0, 1)
    assert np.isnan(reuse[ALL].quantiles[0.9])  # (fewer than 10)
    words = reuse_words(reuse)
    assert "- every session: 5 hits: p50 20.0 s, p90 not shown (fewer than 10)" in words
    assert "1 more whose store was not seen" in words
    assert "- planner: no hits with a known time (1 whose store was not seen)" in words


def test_on_the_recorded_run_each_hit_is_timed_from_a_store_before_it(vllm_run):
    store = vllm_run.store
    reuse = range_reuse_times(store, None, None)[ALL]
    assert reuse.count > 0 and reuse.quantiles[0.5] > 0
    # no more first hits than blocks stored: each store's copy is counted once at most
    stored = store.reads.kv_events(kinds=["stored"])
    assert reuse.count <= len(stored)
