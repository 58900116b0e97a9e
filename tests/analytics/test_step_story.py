"""One step's story on the engine run and the recorded vLLM run: the same requests and verdict as the attribution,
everything in time order, and each lost block's taker the request the engine really evicted it for."""

from __future__ import annotations

import pandas as pd
import pytest

from kvobs.analytics.attribution import ATTRIBUTION_KINDS, attribute_steps
from kvobs.analytics.prefill_rates import PrefillRates
from kvobs.analytics.step_story import step_story


def stories(run):
    steps = run.store.reads.steps()
    return [(step, step_story(run.store, step.session_id, int(step.step_index))) for step in steps.itertuples()]


def test_every_step_has_a_story_agreeing_with_its_verdict(agent_run):
    store = agent_run.store
    events = store.reads.kv_events(kinds=ATTRIBUTION_KINDS)
    verdicts = attribute_steps(store.reads.steps(), store.reads.requests(), events)
    verdicts = verdicts.set_index(["session_id", "step_index"])
    told = stories(agent_run)
    assert len(told) == 18
    for step, story in told:
        verdict = verdicts.loc[(step.session_id, step.step_index)]
        for column in ("status", "cause", "slow_cause", "failure_cause", "evidence", "blocks_lost_in_pause"):
            assert story.step[column] == verdict[column] or (pd.isna(story.step[column]) and pd.isna(verdict[column]))
        assert len(story.requests) == verdict["num_requests"] >= 1
        assert story.events["ts"].is_monotonic_increasing
        assert (story.pause is None) == (step.step_index == 0)
        lanes = set(story.timeline["lane"])
        assert "agent step" in lanes and ("tool pause" in lanes) == (story.pause is not None)


def test_blocks_told_are_the_block_managers_own_counts(agent_run):
    """A hit or an allocation covers several blocks: the story counts them as the block manager did (it once said
    "1 block found in the cache" of a 10-block hit), and sizes its markers by them."""
    counts = agent_run.engine_counts
    checked = {"hit": 0, "allocated": 0}
    for _, story in stories(agent_run):
        low, high = story.span
        for kind, engine in (("hit", counts.hits), ("allocated", counts.allocations)):
            told = story.events[(story.events["source"] == "kv") & (story.events["kind"] == kind)]
            for request_id, rows in told.groupby("request_id"):
                own = [n for ts, rid, n in engine if rid == request_id and low <= ts <= high]
                assert rows["blocks"].sum() == sum(own), (kind, request_id)
                assert all(f"{int(n)} block" in what for n, what in zip(rows["blocks"], rows["what"]))
                checked[kind] += int(sum(own) > len(own))  # a row that covers more than one block
    assert checked["hit"] > 0 and checked["allocated"] > 0, checked


def test_a_requests_lifecycle_is_told_in_order(agent_run):
    for _, story in stories(agent_run):
        for request in story.requests.itertuples():
            told = story.events[
                story.events["what"].str.contains(request.request_id, regex=False)
                & (story.events["source"] == "request")
            ]
            assert told["kind"].tolist() == ["arrived", "finished"]
        phases = story.timeline[story.timeline["lane"].str.startswith("request")]
        assert (phases["end"] >= phases["start"]).all()
        assert set(phases["phase"]) <= {"queue", "prefill", "decode"}


def test_the_pause_losses_told_are_the_verdicts_and_their_takers_were_running(agent_run):
    """The engine names on each `evicted` row the request it evicted for; that request must have been in flight
    at that moment, and belong to the session the story names."""
    reqs = agent_run.store.reads.requests().set_index("request_id")
    checked = 0
    for _, story in stories(agent_run):
        lost = story.events[story.events["kind"] == "evicted"]
        for event in lost.itertuples():
            taker = reqs.loc[event.request_id]
            assert event.by_session == taker["session_id"]
            assert taker["arrival_ts"] <= event.ts <= taker["finished_ts"]
            assert f"request {event.request_id}" in event.what
            checked += 1
        if story.pause:
            in_pause = lost[(lost["ts"] > story.pause[0]) & (lost["ts"] <= story.pause[1])]
            assert int(in_pause["blocks"].sum()) == story.step["blocks_lost_in_pause"]
    assert checked > 0  # 30 blocks for three growing contexts: sessions do evict each other


def test_vllm_steps_find_their_requests_by_trace_and_say_removals_name_no_taker(vllm_run):
    told = stories(vllm_run)
    store = vllm_run.store  # each story reads only its step's window, and still gives the whole run's verdict
    verdicts = attribute_steps(
        store.reads.steps(),
        store.reads.requests(),
        store.reads.kv_events(kinds=ATTRIBUTION_KINDS),
        rates=PrefillRates.from_store(store, None, None),  # vLLM's rate: from its scraped counters
    ).set_index(["session_id", "step_index"])
    for step, story in told:
        verdict = verdicts.loc[(step.session_id, step.step_index)]
        for column in ("cause", "slow_cause", "failure_cause", "evidence", "blocks_lost_in_pause"):
            assert story.step[column] == verdict[column] or (pd.isna(story.step[column]) and pd.isna(verdict[column]))
    # vLLM's requests carry no session id; every step that succeeded sent one (one recorded step failed in 15 ms,
    # before its request reached vLLM: its story has none)
    assert all(len(story.requests) >= 1 for step, story in told if step.status == "ok")
    assert sum(len(story.requests) == 0 for _, story in told) == 1
    removed = pd.concat([story.events[story.events["kind"] == "removed"] for _, story in told])
    assert not removed.empty and removed["by_session"].isna().all()
    assert removed["what"].str.contains("vLLM does not say which request").all()


def test_an_unknown_step_has_no_story(agent_run):
    assert step_story(agent_run.store, "no-such-session", 0) is None
    session = agent_run.store.reads.steps()["session_id"].iloc[0]
    assert step_story(agent_run.store, session, 99) is None


@pytest.mark.parametrize("run_name", ["agent_run", "vllm_run", "fleet_run"])
def test_a_story_over_its_sessions_detail_is_the_story_it_reads_itself(request, run_name):
    """The dashboard gives a story its session's reads and verdicts (`SessionRead`, from `session_detail`): every
    step's story is then the one it works out alone, verdict, requests, pause, timeline and rows alike."""
    from dashboard.data import session_detail

    store = request.getfixturevalue(run_name).store
    steps = store.reads.steps()
    assert len(steps) >= 10
    for session_id, indexes in steps.groupby("session_id")["step_index"]:
        read = session_detail(store, session_id).read
        for index in indexes:
            alone, shared = (step_story(store, session_id, int(index), read=r) for r in (None, read))
            assert alone is not None and shared is not None
            assert shared.step.keys() == alone.step.keys()
            for column, value in alone.step.items():
                assert shared.step[column] == value or (pd.isna(value) and pd.isna(shared.step[column])), column
            assert shared.pause == alone.pause
            for got, want in [(shared.requests, alone.requests), (shared.timeline, alone.timeline)]:
                pd.testing.assert_frame_equal(got, want)
            pd.testing.assert_frame_equal(shared.events, alone.events)
