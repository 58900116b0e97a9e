"""The failed steps' verdicts a collector decides once their session settled (`collectors.step_verdicts`): on the
engine run (its failures as timeouts, each attributed from its KV events) and the recorded vLLM run, written through
the store's writer, they are the verdicts the page would work out itself; a session still running is left to the
page, and the page says which are which."""

from __future__ import annotations

import pandas as pd
import pytest
from sqlalchemy import update

from collectors.step_verdicts import VerdictKeeper
from dashboard import data
from dashboard.views.overview import verdict_words
from kvobs.analytics.step_causes import VERDICT_COLUMNS, failure_verdicts, range_verdicts
from kvobs.store import open_store
from kvobs.store.rows import SessionRecord
from kvobs.store.schema import SessionRow, StepRow
from tests.stores import copy_store


def _writer(store):
    return lambda records: store.write([("upsert", records)])


@pytest.fixture
def timeouts(agent_run, tmp_path):
    """The engine run with every failure a timeout: each one's verdict read from its requests and KV events."""
    store = open_store(f"sqlite:///{tmp_path / 'timeouts.db'}")
    copy_store(agent_run.store, store)
    with store.session() as session, session.begin():
        session.execute(update(StepRow).where(StepRow.status == "error").values(error_type="timeout"))
    return store


@pytest.mark.parametrize("run", ["timeouts", "vllm_run"])
def test_settled_verdicts_are_what_the_page_would_work_out(run, request):
    fixture = request.getfixturevalue(run)
    store = fixture if run == "timeouts" else fixture.store
    first, last = store.reads.time_range()
    expected = failure_verdicts(store, first, last)
    assert len(expected) > 0, f"{run} has no failed step: nothing compared"
    keeper = VerdictKeeper(store, _writer(store), lookback_s=last - first + 3600)
    assert keeper.run(last + 3600) == len(expected) == keeper.num_decided
    assert not keeper.pending
    stored = store.reads.step_verdicts(first, last)
    assert (stored["decided_at"] == last + 3600).all()
    pd.testing.assert_frame_equal(
        stored[VERDICT_COLUMNS].fillna({"evidence": ""}), expected.fillna({"evidence": ""}), check_dtype=False
    )
    read = range_verdicts(store, first, last)
    assert read["decided"].all() and len(read) == len(expected)
    assert verdict_words(data.failures(store, first, last)) == (
        f"All {len(expected):,} verdicts were decided once their session had settled."
    )
    assert keeper.run(last + 3700) == 0  # nothing new, nothing decided twice


def test_a_running_session_waits_and_an_ended_one_is_decided_at_once(timeouts):
    """A session whose last step is newer than the end horizon stays pending (the page works its verdicts out); the
    agent SDK's end of the session, or the horizon passing, settles it."""
    store = timeouts
    with store.session() as session, session.begin():  # as while the agents still run: no session has ended
        session.execute(update(SessionRow).values(ended_at=None))
    steps = store.reads.steps()
    failed = steps[steps["status"] == "error"]
    sessions = sorted(set(failed["session_id"]))
    assert len(sessions) >= 2, "the engine run needs two sessions with failed steps"
    last_seen = steps[["started_at", "ended_at"]].max(axis=1).groupby(steps["session_id"]).max()
    latest = float(last_seen.max())
    keeper = VerdictKeeper(store, _writer(store), delay_s=0.0, end_after_s=300.0, lookback_s=7200.0)
    assert keeper.run(latest + 1.0) == 0  # every session was seen within the horizon: none settled
    assert set(keeper.pending) == set(sessions)
    first, last = store.reads.time_range()
    read = range_verdicts(store, first, last)
    assert not read["decided"].any() and len(read) == len(failed)
    words = verdict_words(data.failures(store, first, last))
    assert words.startswith(f"The {len(failed):,} verdicts were worked out as this page opened")

    ended = sessions[0]  # the SDK says the session ended: decided at the next run, the others still wait
    store.write([("upsert", [SessionRecord(ended, ended_at=latest)])])
    decided = keeper.run(latest + 2.0)
    assert decided == (failed["session_id"] == ended).sum() > 0
    assert set(keeper.pending) == set(sessions[1:])
    read = range_verdicts(store, first, last)
    assert set(read.loc[read["decided"], "session_id"]) == {ended} and len(read) == len(failed)
    expected = failure_verdicts(store, first, last)
    pd.testing.assert_frame_equal(read.drop(columns="decided"), expected, check_dtype=False)
    assert f"{decided:,} of {len(failed):,} verdicts were decided" in verdict_words(data.failures(store, first, last))

    assert keeper.run(latest + 301.0) == len(failed) - decided  # the horizon passed: every session settled
    assert not keeper.pending and range_verdicts(store, first, last)["decided"].all()


def test_a_running_collector_decides_them_from_its_tick(timeouts):
    """`kvobs collect` runs the keeper from its tick and writes through its store writer: the engine run's sessions
    ended (the SDK said so), so every failed step is decided at the first run, and counted for /metrics."""
    from collectors.collector import Collector, CollectorOptions
    from tests.waiting import wait_for

    store = timeouts
    failed = int((store.reads.steps()["status"] == "error").sum())
    collector = Collector(CollectorOptions(otlp_http="127.0.0.1:0", interval_s=0.2), store=store)
    collector.verdicts.delay_s = 0.0  # the run's steps are seconds old; a deployed collector reads a minute behind
    collector.start()
    try:
        wait_for(lambda: len(store.reads.step_verdicts()) == failed, timeout_s=60)
    finally:
        collector.stop()
    assert collector.verdicts.num_decided == failed > 0
    assert range_verdicts(store, *store.reads.time_range())["decided"].all()
