"""Reuse times (a block's latest store to its first hit after it), hand-computed and on the recorded vLLM run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.cache import agent_kinds, range_reuse_times, reuse_times, reuse_words
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
    reuse = reuse_times(lookups, chains, stored, agent_kinds(lookups, sessions))
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


def test_by_tool_each_request_counts_under_the_tool_of_the_pause_before_its_step(agent_run):
    """Our engine's run under the SDK's agents (each step a tool): grouped by the tool of the pause before each
    step, every first hit and every unknown counts under exactly one kind, and the kinds are the steps' tools."""
    from kvobs.analytics.steps import request_tools

    store = agent_run.store
    tools = request_tools(store.reads.steps(), store.reads.requests())
    assert set(tools) == set(store.reads.requests()["request_id"])  # every request has its kind
    by_tool = range_reuse_times(store, None, None, tools)
    whole = by_tool.pop(ALL)
    assert whole.count > 0 and len(by_tool) >= 2
    assert sum(d.count for d in by_tool.values()) == whole.count
    assert sum(d.unknown for d in by_tool.values()) == whole.unknown
    assert "a session's first step" in by_tool  # (the system prompt another session stored, found by a first step)


def test_kvobs_whatif_groups_the_reuse_times_as_asked_and_refuses_it_without_a_sweep(agent_run):
    import subprocess
    import sys

    flags = ["whatif", "--store", agent_run.url, "--num-blocks", "30", "--policy", "session_ttl"]
    run = [sys.executable, "-m", "kvobs.cli", *flags]
    done = subprocess.run([*run, "--ttl", "0,30,60", "--reuse-by", "session"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    reuse = done.stdout.split("Reuse times (")[1].split("\n\n")[0].splitlines()[1:]
    sessions = set(agent_run.store.reads.requests()["session_id"])
    assert {line[2:].split(":")[0] for line in reuse[1:]} <= sessions and len(reuse) > 2
    refused = subprocess.run([*run, "--reuse-by", "tool"], capture_output=True, text=True)
    assert refused.returncode == 2 and "--reuse-by groups the ages and reuse times of a --ttl sweep" in refused.stderr


def test_a_loss_counts_under_the_tool_of_the_pause_it_fell_in():
    """By hand: session a's steps start at 0 (tool none), 10 (search) and 20 (edit); a loss at 5 fell in the pause
    before the step at 10, one at 15 before the step at 20, one at 30 after the last step; b has no steps."""
    from kvobs.analytics.steps import loss_tools

    steps = pd.DataFrame(
        {
            "session_id": ["a", "a", "a"],
            "started_at": [0.0, 10.0, 20.0],
            "tools": [None, '[{"name": "search"}]', '[{"name": "edit"}, {"name": "run"}]'],
        }
    )
    losses = pd.DataFrame({"session_id": ["a", "a", "a", "b"], "ts": [5.0, 15.0, 30.0, 1.0]}, index=[7, 8, 9, 10])
    tools = loss_tools(steps, losses)
    assert tools.loc[[7, 8, 9]].to_list() == ["search", "edit+run", "after the session's last step"]
    assert pd.isna(tools.loc[10])  # (no step of its session: no kind)


def test_by_tool_the_eviction_ages_count_each_eviction_once_under_its_pause(agent_run):
    from instrumented_engine.whatif.session_kinds import ages_and_reuse
    from kvobs.analytics.steps import request_tools

    store = agent_run.store
    ages, _ = ages_and_reuse(store, None, None, "tool")
    whole = ages.pop(ALL)
    assert whole.count > 0 and ages  # the run's sessions evicted each other in their tool pauses
    assert sum(a.count for a in ages.values()) == whole.count  # every evicted block's session has steps here
    tools = set(request_tools(store.reads.steps(), store.reads.requests()).values())
    assert set(ages) <= tools | {"after the session's last step"}
