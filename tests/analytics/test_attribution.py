"""Step attribution on stores from real runs, checked against what the engine itself classified."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS, attribute_steps, failure_summary
from kvobs.analytics.steps.causes import VERDICT_COLUMNS, failure_verdicts, step_causes
from kvobs.analytics.steps.excess import EXCESS_CAUSES, FAILURE_KIND_OF
from kvobs.analytics.steps.typical import leave_one_out_medians
from kvobs.store import open_store
from tests.stores import copy_store


def attributed(run):
    store = run.store
    return attribute_steps(store.reads.steps(), store.reads.requests(), store.reads.kv_events(kinds=ATTRIBUTION_KINDS))


def test_every_step_is_attributed_and_the_workload_failed_for_real(agent_run):
    frame = attributed(agent_run)
    assert len(frame) == agent_run.result.steps == 18
    assert set(frame["cause"]) <= {"invalidated", "prefix_evicted_in_pause", "preempted", "queue_wait", "none"}
    assert (frame["num_requests"] >= 1).all()  # every step found the request it sent
    failed = frame[frame["status"] == "error"]
    assert len(failed) == agent_run.result.num_failed > 0
    # the planner must answer JSON; SmolLM2-135M in 16 tokens never does: every planner step fails so, unless the
    # 5 s step deadline of this timed run came first (a loaded machine)
    planner = frame[frame["session_id"].str.startswith("planner")]
    assert (planner["status"] == "error").all()
    assert "invalid_response" in set(planner["error_type"]) <= {"invalid_response", "timeout"}
    summary = failure_summary(frame)
    assert summary["failed_steps"].sum() == len(failed)


def test_pause_losses_equal_the_engines_idle_evictions(agent_run):
    """The engine counts, per session, blocks evicted while the session had no request in flight; attribution finds
    them between a session's requests from the raw events. They must agree, session by session."""
    frame = attributed(agent_run)
    engine_idle = agent_run.store.reads.session_footprints().set_index("session_id")["session_evicted_idle_blocks"]
    ours = frame.groupby("session_id")["blocks_lost_in_pause"].sum()
    assert ours.sum() > 0  # 30 blocks for three growing contexts: prefixes really are lost in tool pauses
    theirs = engine_idle.reindex(ours.index).fillna(0).astype(int)
    pd.testing.assert_series_equal(ours.sort_index(), theirs.sort_index(), check_names=False)
    lost = frame[frame["blocks_lost_in_pause"] > 0]
    assert (lost["causes"].str.contains("prefix_evicted_in_pause")).all()
    assert lost["evidence"].str.contains("evicted during the").all()


def test_preempted_steps_are_those_whose_request_the_engine_preempted(agent_run):
    store = agent_run.store
    frame = attributed(agent_run)
    preempted_ids = set(store.reads.kv_events(kinds=["preempted"])["request_id"])
    reqs = store.reads.requests()
    expected = set()
    for req in reqs[reqs["request_id"].isin(preempted_ids)].itertuples():
        steps = store.reads.steps(session_id=req.session_id)
        hit = steps[(steps["started_at"] <= req.arrival_ts) & (steps["ended_at"] >= req.arrival_ts)]
        expected |= {(req.session_id, int(i)) for i in hit["step_index"]}
    got = {(r.session_id, r.step_index) for r in frame.itertuples() if r.preemptions > 0}
    assert got == expected


def test_invalidation_is_named_with_its_reason(agent_run):
    """A synthetic invalidation row between two steps of a session: the second step names it with its reason, with
    what it cost (its share of the prefill that recomputed it), and the step's cause is its costliest fact."""
    store = agent_run.store
    base = attributed(agent_run)
    second = base[base["step_index"] == 1].sort_values(["blocks_lost_in_pause", "session_id"])
    session = second["session_id"].iloc[0]  # one whose pause lost nothing, where the run has one
    lost_before = int(second["blocks_lost_in_pause"].iloc[0])
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    mine = steps[steps["session_id"] == session]
    reqs = store.reads.requests(session_id=session)
    gap_ts = (reqs["finished_ts"].iloc[0] + reqs["arrival_ts"].iloc[1]) / 2
    events = store.reads.kv_events(kinds=ATTRIBUTION_KINDS)
    extra = pd.DataFrame(
        [
            {
                "ts": gap_ts,
                "instance": "engine-test",
                "kind": "invalidated",
                "block_hash": 7,
                "parent_hash": None,
                "num_tokens": 16,
                "session_id": session,
                "request_id": None,
                "reason": "system_prompt_change",
                "medium": "CPU",
            }
        ]
    )
    frame = attribute_steps(mine, reqs, pd.concat([events, extra], ignore_index=True))
    second = frame[frame["step_index"] == 1].iloc[0]
    assert "invalidated" in second["causes"].split(",") and second["invalidation_reasons"] == "system_prompt_change"
    assert "cache invalidated (system_prompt_change): 1 of its blocks" in second["evidence"]
    if not lost_before:  # (after a lost prefix, an invented block may find no prefill left to cost)
        assert second["invalidated_excess_s"] > 0  # its share of the prefill that recomputed it
    part = {cause: part for part, (cause, _) in EXCESS_CAUSES.items()}[second["cause"]]
    assert second[f"{part}_excess_s"] >= second["invalidated_excess_s"]  # the cause named is the costliest fact
    assert frame[frame["step_index"] == 0].iloc[0]["cause"] != "invalidated"


def test_vllm_steps_join_their_requests_by_caller_span(vllm_run):
    frame = attributed(vllm_run)
    assert len(frame) == len(vllm_run.store.reads.steps())
    assert (frame["num_requests"] >= 1).mean() > 0.9
    failed = frame[frame["status"] == "error"]
    assert list(failed["session_id"]) == ["sess-10"]  # HTTP 400: context outgrew 2,048 tokens (fixture README)
    assert frame["blocks_lost_in_pause"].sum() > 0  # 32 blocks for 12 sessions


def test_failures_keep_their_own_error_and_only_timeouts_take_a_kv_cause(agent_run):
    frame = attributed(agent_run)
    failed = frame[frame["status"] == "error"]
    not_timeouts = failed[failed["error_type"] != "timeout"]
    assert not not_timeouts.empty  # the planner's invalid_response
    assert (not_timeouts["failure_cause"] == not_timeouts["error_type"]).all()
    assert set(not_timeouts["failure_kind"]) <= {"model", "request"}
    assert (failed.loc[failed["error_type"] == "invalid_response", "failure_kind"] == "model").all()
    for row in failed[failed["error_type"] == "timeout"].itertuples():  # (the 30 s deadline, on a loaded machine)
        assert row.evidence.startswith("timed out")  # the part that cost it, said with its seconds
        if row.failure_cause != "timeout":
            assert row.failure_kind == FAILURE_KIND_OF[row.failure_cause]
    assert frame.loc[frame["status"] == "ok", "failure_cause"].isna().all()
    summary = failure_summary(frame)
    assert summary["failed_steps"].sum() == len(failed)
    assert "prefix_evicted_in_pause" not in set(summary.loc[summary["failure_kind"] == "model", "failure_cause"])
    assert (frame.loc[~frame["slow"], "slow_cause"] == "none").all()


@pytest.mark.parametrize("run", ["agent_run", "vllm_run"])
def test_the_failure_table_reads_few_events_and_finds_what_the_full_analysis_finds(run, request):
    """`failed_only` (the Overview) reads only the events around failed steps and attributes only them; each failed
    step gets exactly the row, cause and evidence the analysis of every step and every event gives it."""
    store = request.getfixturevalue(run).store
    first, last = store.reads.time_range()
    full = step_causes(store, first, last)
    failed = full[full["status"] == "error"].reset_index(drop=True)
    narrow = step_causes(store, first, last, failed_only=True)
    assert len(failed) > 0, f"{run} has no failed step: nothing compared"
    pd.testing.assert_frame_equal(
        narrow.sort_values(["session_id", "step_index"]).reset_index(drop=True),
        failed.sort_values(["session_id", "step_index"]).reset_index(drop=True),
    )


@pytest.mark.parametrize("run", ["agent_run", "vllm_run"])
@pytest.mark.parametrize("as_timeouts", [False, True])
def test_failure_verdicts_equal_the_full_analysis(run, as_timeouts, request, tmp_path):
    """The Overview's failure table attributes timeouts only (the one failure a KV cause can explain); every failed
    step's verdict equals what the analysis of every step and event gives it. Once as recorded (model and request
    errors: no KV read), once with every failure turned into a timeout (each one attributed from its window)."""
    from sqlalchemy import event, update

    from kvobs.store.schema import StepRow

    store = request.getfixturevalue(run).store
    if as_timeouts:
        source, store = store, open_store(f"sqlite:///{tmp_path / 'timeouts.db'}")
        copy_store(source, store)
        with store.session() as session, session.begin():
            session.execute(update(StepRow).where(StepRow.status == "error").values(error_type="timeout"))
    first, last = store.reads.time_range()
    statements: list[str] = []

    def record(_conn, _cursor, sql, *_):
        statements.append(sql)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        got = failure_verdicts(store, first, last)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    timeouts = bool((got["error_type"] == "timeout").any())
    assert any("kv_events" in sql for sql in statements) == timeouts  # KV events are read for timeouts, only then
    full = step_causes(store, first, last)
    want = full.loc[full["status"] == "error", VERDICT_COLUMNS]
    want.loc[want["error_type"] != "timeout", "evidence"] = ""  # a model or request error's KV story is not its cause
    assert len(want) > 0, f"{run} has no failed step: nothing compared"
    if as_timeouts:
        assert set(got["failure_kind"]) <= {"cache", "queue", "engine", "tool", "outside", "timeout"}
    else:  # (a step of the engine run may really time out on a loaded machine: only the others are checked here)
        assert set(got.loc[got["error_type"] != "timeout", "failure_kind"]) <= {"model", "request"}
    pd.testing.assert_frame_equal(got, want.sort_values(["session_id", "step_index"]).reset_index(drop=True))
    assert failure_summary(got).equals(failure_summary(full))


def test_leave_one_out_medians_equal_pandas_dropping_each_value():
    rng = np.random.default_rng(0)
    for _ in range(500):
        values = rng.integers(0, 5, rng.integers(1, 12)).astype(float)
        values[rng.random(len(values)) < 0.3] = np.nan
        series = pd.Series(values)
        expected = [series.drop(i).median() for i in range(len(values))]
        np.testing.assert_allclose(leave_one_out_medians(values), expected, equal_nan=True)
