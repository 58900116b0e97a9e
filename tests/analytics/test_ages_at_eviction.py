"""Eviction ages (`kvobs.analytics.cache.ages_at_eviction`): a block's latest store to its eviction, counted once a
block, only for the cache's own evictions, with an unknown store counted apart; worked by hand, then on the recorded
vLLM run beside its TTL sweep."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.cache import ages_words, eviction_ages
from kvobs.analytics.cache.ages_at_eviction import ALL


def _removed(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["session_id", "first_owner", "reason", "lifetime_s"])


def test_only_the_caches_own_evictions_count_once_a_block_and_an_unknown_store_apart():
    rows = [("s1", 1, None, float(age)) for age in (10, 20, 30, 40, 50)]  # taken for room (vLLM names no reason)
    rows += [("s2", 1, "capacity", 100.0), ("s2", 1, "ttl", 200.0), ("s2", 1, "capacity", None)]
    rows += [("s1", 0, None, 999.0)]  # a further owner's row of a block counted already
    rows += [("s1", 1, "session_release", 999.0), ("s2", 1, "invalidation", 999.0), ("s2", 1, "reset", 999.0)]
    sessions = pd.DataFrame({"session_id": ["s1", "s2"], "agent_name": ["coder", None]})
    ages = eviction_ages(_removed(rows), sessions)
    assert list(ages) == [ALL, "coder"]
    assert (ages[ALL].count, ages[ALL].unknown) == (7, 1)
    assert ages[ALL].quantiles[0.5] == 40.0  # the median of 10, 20, 30, 40, 50, 100, 200
    assert np.isnan(ages[ALL].quantiles[0.9]) and np.isnan(ages[ALL].quantiles[0.99])  # (fewer than 10, 100 ages)
    assert (ages["coder"].count, ages["coder"].quantiles[0.5]) == (5, 30.0)
    words = ages_words(ages)
    assert "- every session: 7 evicted blocks: p50 40.0 s, p90 not shown (fewer than 10)" in words
    assert "1 more whose store was not seen" in words and "- coder: 5 evicted blocks: p50 30.0 s" in words


def test_no_removal_says_no_age():
    ages = eviction_ages(_removed([]))
    assert (ages[ALL].count, ages[ALL].unknown) == (0, 0)
    assert "- every session: no evicted blocks with a known time (0 whose store was not seen)" in ages_words(ages)


def test_the_recorded_runs_ages_are_its_removals_lifetimes_beside_the_ttl_sweep(vllm_run, capsys):
    from kvobs.cli import main

    flags = ["whatif", "--store", vllm_run.url, "--num-blocks", "24", "--policy", "session_ttl", "--ttl", "0,30,300"]
    assert main(flags) == 0
    printed = capsys.readouterr().out
    with vllm_run.store.engine.connect() as conn:
        lifetimes = [
            row[0]
            for row in conn.exec_driver_sql(
                "SELECT lifetime_s FROM kv_events WHERE kind = 'removed' AND first_owner = 1 "
                "AND (reason IS NULL OR reason IN ('capacity', 'ttl')) AND lifetime_s IS NOT NULL"
            )
        ]
    assert len(lifetimes) >= 100  # (the recording evicts: every quantile is shown)
    median, p90 = np.quantile(lifetimes, 0.5), np.quantile(lifetimes, 0.9)
    assert f"- every session: {len(lifetimes):,} evicted blocks: p50 {median:,.1f} s, p90 {p90:,.1f} s" in printed
    assert printed.index("Hit rate against the TTL:") < printed.index("Eviction ages")
