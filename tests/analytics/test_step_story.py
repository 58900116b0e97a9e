"""One step's story on the engine run and the recorded vLLM run: the same requests and verdict as the attribution,
everything in time order, and each lost block's taker the request the engine really evicted it for."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from kvobs.analytics.cache.prefill_rates import PrefillRates
from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS, attribute_steps
from kvobs.analytics.steps.story import step_story


def stories(run):
    steps = run.store.reads.steps()
    return [(step, step_story(run.store, step.session_id, int(step.step_index))) for step in steps.itertuples()]


def _same(got, want) -> bool:
    """A verdict's value as its record holds it against the frame's: equal, or both missing (None, NaN, or no
    evidence)."""
    missing = [v is None or v == "" or (isinstance(v, float) and pd.isna(v)) for v in (got, want)]
    return all(missing) or (not any(missing) and got == want)


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
            assert _same(story.step.value(column), verdict[column]), column
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
        assert set(phases["phase"]) <= {"queue", "preemption", "prefill", "decode"}


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
            assert int(in_pause["blocks"].sum()) == story.step.facts.blocks_lost_in_pause
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
            assert _same(story.step.value(column), verdict[column]), column
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
    from dashboard.session_data import session_detail

    store = request.getfixturevalue(run_name).store
    steps = store.reads.steps()
    assert len(steps) >= 10
    for session_id, indexes in steps.groupby("session_id")["step_index"]:
        read = session_detail(store, session_id).read
        for index in indexes:
            alone, shared = (step_story(store, session_id, int(index), read=r) for r in (None, read))
            assert alone is not None and shared is not None
            assert (shared.step.facts, shared.step.decided) == (alone.step.facts, alone.step.decided)
            assert replace(shared.step.record, decided_at=0) == replace(alone.step.record, decided_at=0)  # (when)
            assert shared.pause == alone.pause
            for got, want in [(shared.requests, alone.requests), (shared.timeline, alone.timeline)]:
                pd.testing.assert_frame_equal(got, want)
            pd.testing.assert_frame_equal(shared.events, alone.events)


def test_a_preemption_is_drawn_as_preemption_from_its_own_events(agent_run):
    """A request the engine preempted: its lane draws, from its `preempted` row (or, before its first token, from
    its scheduling) to its re-admission and the recompute after, a preemption, never decode over it: the interval
    the latency split counts as preempted (`latency_parts.request_intervals`)."""
    checked = 0
    for _, story in stories(agent_run):
        events = story.events
        preempted_at = set(events.loc[events["kind"] == "preempted", "ts"]) | set(
            events.loc[events["kind"] == "scheduled", "ts"]
        )
        readmitted = events.loc[
            (events["kind"] == "hit") & events["what"].str.contains("(readmission)", regex=False), "ts"
        ]
        for _, bars in story.timeline[story.timeline["lane"].str.startswith("request")].groupby("lane"):
            decode = bars[bars["phase"] == "decode"]
            for bar in bars[bars["phase"] == "preemption"].itertuples():
                assert any(abs(bar.start - ts) < 1e-6 for ts in preempted_at), bar
                assert ((readmitted >= bar.start - 1e-6) & (readmitted <= bar.end + 1e-6)).any(), bar
                assert not ((decode["start"] < bar.end - 1e-9) & (decode["end"] > bar.start + 1e-9)).any()
                checked += 1
    assert checked > 0  # 30 blocks for three growing contexts: the engine preempts


def test_blocks_that_named_no_session_are_on_their_sessions_story_with_how_they_were_tied(vllm_run, tmp_path):
    """The recorded vLLM run with six sessions' stores written without their session (as a framework agent's
    requests send no header): every block found for one of those sessions is one the header had named that
    session's (its truth), and their stories show them, each said to be tied by inference."""
    from dataclasses import replace

    from kvobs.analytics.cache.chains import with_sessions
    from kvobs.analytics.cache.inferred_events import tied_events
    from kvobs.store import StoreWriter
    from tests.store.test_contract import _open, _rows

    records = _rows(vllm_run.store)
    unnamed = {f"sess-{i:02d}" for i in range(6)}
    truth = {
        (r.instance, int(r.block_hash), r.ts): r.session_id
        for r in records["kv_events"]
        if r.kind == "stored" and r.session_id in unnamed
    }
    records["kv_events"] = [
        replace(r, session_id=None) if r.kind == "stored" and r.session_id in unnamed else r
        for r in records["kv_events"]
    ]
    store, _ = _open("sqlite", tmp_path)
    writer = StoreWriter(store)
    for table, rows in records.items():
        for row in rows:
            (writer.upsert if table == "sessions" else writer.add)(row)
    writer.close()
    found, told = 0, 0
    try:
        for session in sorted(unnamed):
            steps = store.reads.steps(session_id=session)
            first, last = float(steps["started_at"].min()), float(steps["ended_at"].max())
            requests = with_sessions(store.reads.requests(first - 1, last + 1), steps)
            ids = requests.loc[requests["session_id"] == session, "request_id"]
            tied = tied_events(store, session, first - 1, last + 1, ids)
            stores = tied[tied["kind"] == "stored"] if not tied.empty else tied
            for row in stores.itertuples():
                assert truth[(row.instance, int(row.block_hash), row.ts)] == session, row
            found += len(stores)
            for index in steps["step_index"]:
                story = step_story(store, session, int(index))
                shown = story.events[story.events["kind"] == "stored"]
                assert shown["what"].str.contains("tied to this session by inference").all()
                told += len(shown)
    finally:
        store.close()
    assert found > 0 and told > 0, (found, told)
