"""The steps' verdicts a collector decides once their session settled (`collectors.jobs.step_verdicts`): on the
engine run (its failures as timeouts, each attributed from its KV events) and the recorded vLLM run, written through
the store's writer, they are the verdicts the page would work out itself; a session still running is left to the
page, and the page says which are which."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
from sqlalchemy import update

from collectors.jobs.step_verdicts import VerdictKeeper
from dashboard import session_data
from dashboard.verdicts import failures
from dashboard.views.overview import slow_words, verdict_words
from dashboard.views.sessions import STEP_COLUMNS
from kvobs.alerts.signals import cache_cost_share
from kvobs.analytics.steps import story
from kvobs.analytics.steps.causes import KEEPER_LIVE_S, VERDICT_COLUMNS, failure_verdicts, range_verdicts
from kvobs.analytics.steps.slow import slow_steps
from kvobs.analytics.steps.verdicts import DECIDED, WORKED_OUT, verdict_frame, verdict_records
from kvobs.store import open_store
from kvobs.store.rows import SessionRecord, VerdictProgressRecord
from kvobs.store.schema import SessionRow, StepRow
from tests.stores import copy_store


def _writer(store):
    return lambda records: store.write([("upsert", records)])


def _marker(store):
    return lambda record: store.write([("upsert", [record])])


@pytest.fixture
def timeouts(agent_run, tmp_path):
    """The engine run with every failure a timeout: each one's verdict read from its requests and KV events."""
    store = open_store(f"sqlite:///{tmp_path / 'timeouts.db'}")
    copy_store(agent_run.store, store)
    with store.session() as session, session.begin():
        session.execute(update(StepRow).where(StepRow.status == "error").values(error_type="timeout"))
    return store


def _own_copy(run, request, tmp_path):
    """The run's store, or a copy of a shared recording's (a keeper writes to it)."""
    fixture = request.getfixturevalue(run)
    if run == "timeouts":
        return fixture
    store = open_store(f"sqlite:///{tmp_path / 'copy.db'}")
    copy_store(fixture.store, store)
    return store


def _same(after: pd.DataFrame, before: pd.DataFrame) -> None:
    """Frames equal cell for cell, a missing value (None or NaN) as missing, numbers within float noise."""

    def plain(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.reset_index(drop=True).astype(object)
        return frame.where(frame.notna(), None)

    pd.testing.assert_frame_equal(plain(after), plain(before), check_dtype=False)


def _forbid_attribution(monkeypatch) -> None:
    """Every way a page could attribute a step raises."""

    def attributed(*args, **kwargs):
        raise AssertionError("a settled session's page attributed a step")

    monkeypatch.setattr(session_data, "attribute_steps", attributed)
    monkeypatch.setattr(story, "attribute_steps", attributed)


@pytest.mark.parametrize("run", ["timeouts", "vllm_run", "fleet_run"])
def test_settled_verdicts_are_what_the_pages_showed(run, request, tmp_path, monkeypatch):
    """Every step's verdict, decided once by the keeper, is what the pages showed before any was stored: the failure
    table's verdicts, and each session's steps as the Sessions page attributed them (failure and slow cause, the
    latency's parts, the evidence); after it, the pages show the decided verdicts, unchanged."""
    store = _own_copy(run, request, tmp_path)
    first, last = store.reads.time_range()
    steps = store.reads.steps()
    expected = failure_verdicts(store, first, last)
    assert len(expected) > 0, f"{run} has no failed step: nothing compared"
    sessions = sorted(set(steps["session_id"]))
    details = {s: session_data.session_detail(store, s) for s in sessions}
    shown = {s: detail.steps for s, detail in details.items()}
    assert all((frame["verdict"] == WORKED_OUT).all() for frame in shown.values())
    if run == "timeouts":  # a live run's few successful steps may leave none slow there: its timeouts compare
        assert (expected["evidence"].fillna("") != "").all(), "a timeout without its evidence"
    else:
        assert sum(frame["slow"].sum() for frame in shown.values()) > 0, f"{run} has no slow step: nothing compared"
    keeper = VerdictKeeper(store, _writer(store), lookback_s=last - first + 3600)
    assert keeper.run(last + 3600) == len(steps) == keeper.num_decided
    assert not keeper.pending
    stored = store.reads.step_verdicts(first, last)
    assert (stored["decided_at"] == last + 3600).all()
    failed = stored[stored["status"] == "error"].reset_index(drop=True)
    pd.testing.assert_frame_equal(
        failed[VERDICT_COLUMNS].fillna({"evidence": ""}), expected.fillna({"evidence": ""}), check_dtype=False
    )
    worked = verdict_frame(verdict_records(pd.concat(shown.values(), ignore_index=True), last + 3600))
    pd.testing.assert_frame_equal(verdict_frame(stored), worked, check_dtype=False)
    # the page's own records (no keeper had decided them) are the records the keeper wrote, but for when
    pages = verdict_frame([v for detail in details.values() for v in detail.verdicts]).drop(columns="decided_at")
    pd.testing.assert_frame_equal(pages, verdict_frame(stored).drop(columns="decided_at"), check_dtype=False)
    stories = {
        (s, i): story.step_story(store, s, i, read=details[s].read) for s in sessions for i in shown[s]["step_index"]
    }
    _forbid_attribution(monkeypatch)  # settled: the pages read what the keeper decided, whole
    for session_id in sessions:
        detail = session_data.session_detail(store, session_id)
        after = detail.steps
        assert (after["verdict"] == DECIDED).all()
        assert {v.decided_at for v in detail.verdicts} == {last + 3600}  # the keeper's, read back
        assert list(after.columns) == list(shown[session_id].columns)
        _same(after[STEP_COLUMNS[:-1]], shown[session_id][STEP_COLUMNS[:-1]])  # the Sessions page's table
        decided = ["verdict", "decided_at"]
        _same(after.drop(columns=decided), shown[session_id].drop(columns=decided))  # and every other column
        for index in after["step_index"]:
            told, before = story.step_story(store, session_id, index, read=detail.read), stories[session_id, index]
            assert told is not None and before is not None
            assert told.step.decided and not before.step.decided and told.step.facts == before.step.facts
            assert told.step.record == replace(before.step.record, decided_at=last + 3600)
            _same(told.events, before.events)
            _same(told.timeline, before.timeline)
            assert (told.pause, told.misses) == (before.pause, before.misses)
    read = range_verdicts(store, first, last)
    assert read["decided"].all() and len(read) == len(expected)
    assert verdict_words(failures(store, first, last)) == (
        f"All {len(expected):,} verdicts were decided once their session had settled."
    )
    slow = slow_steps(store, first, last, now=last + 3600)
    assert (slow.steps, slow.decided, slow.pending, slow.undecided) == (len(steps), len(steps), 0, 0)
    assert slow.slow == int(stored["slow"].fillna(False).astype(bool).sum())  # above 0 but on the timeouts run
    # the alert reads the steps decided in its window: the share the pages showed the cache cost
    shown_all = pd.concat(shown.values(), ignore_index=True)
    cache_causes = ["prefix_evicted_in_pause", "invalidated", "routed_away_from_prefix", "preempted"]
    by_cache = shown_all["failure_kind"].eq("cache") | shown_all["slow"] & shown_all["slow_cause"].isin(cache_causes)
    assert cache_cost_share(store, last + 3599, last + 3601, min_steps=1) == [(None, None, by_cache.mean())]
    assert cache_cost_share(store, last + 3599, last + 3601, min_steps=len(steps) + 1) == []  # too few
    assert cache_cost_share(store, first, last, min_steps=1) == []  # none decided then: nothing, never 0
    assert sum(keeper.decided_by_kind.values()) == len(steps) and keeper.decided_by_kind["cache"] == by_cache.sum()
    assert keeper.run(last + 3700) == 0  # nothing new, nothing decided twice


def _running(store) -> tuple[pd.DataFrame, list[str], float]:
    """The store as while its agents still run (no session has ended): its failed steps, their sessions, the latest
    step's end."""
    with store.session() as session, session.begin():
        session.execute(update(SessionRow).values(ended_at=None))
    steps = store.reads.steps()
    failed = steps[steps["status"] == "error"]
    sessions = sorted(set(failed["session_id"]))
    assert len(sessions) >= 2, "the engine run needs two sessions with failed steps"
    return failed, sessions, float(steps[["started_at", "ended_at"]].max(axis=1).max())


def test_a_running_session_waits_and_an_ended_one_is_decided_at_once(timeouts):
    """A session whose last step is newer than the end horizon waits (the page shows its timeouts as pending while
    the keeper's mark is fresh); the agent SDK's end of the session, or the horizon passing, settles it."""
    store = timeouts
    failed, sessions, latest = _running(store)
    keeper = VerdictKeeper(
        store, _writer(store), progress=_marker(store), delay_s=0.0, end_after_s=300.0, lookback_s=7200.0
    )
    assert keeper.run(latest + 1.0) == 0  # every session was seen within the horizon: none settled
    assert set(keeper.pending) == set(store.reads.steps()["session_id"])  # every session's, failed or not
    (mark,) = store.reads.verdict_progress().itertuples(index=False)
    assert (mark.keeper, mark.covers_from, mark.read_to, mark.updated_at) == (
        keeper.name,
        latest + 1.0 - 7200.0,
        latest + 1.0,
        latest + 1.0,
    )
    first, last = store.reads.time_range()
    read = range_verdicts(store, first, last, now=latest + 1.0)
    assert not read["decided"].any() and read["pending"].all() and len(read) == len(failed)
    assert set(read["failure_cause"]) == {"pending"} and set(read["failure_kind"]) == {"timeout"}
    words = verdict_words(failures(store, first, last, now=latest + 1.0))
    assert words.startswith(f"{len(failed):,} timeouts of sessions still running are pending")
    everything = len(store.reads.steps())
    slow = slow_steps(store, first, last, now=latest + 1.0)  # every step pending: none counted as not slow
    assert (slow.steps, slow.decided, slow.pending, slow.undecided, slow.slow) == (everything, 0, everything, 0, 0)
    assert "are pending" in slow_words(slow) and "were not decided" not in slow_words(slow)
    stale = slow_steps(store, first, last, now=latest + 1.0 + KEEPER_LIVE_S + 1.0)  # the keeper stopped
    assert (stale.pending, stale.undecided) == (0, everything) and "were not decided" in slow_words(stale)

    ended = sessions[0]  # the SDK says the session ended: decided at the next run, the others still wait
    store.write([("upsert", [SessionRecord(ended, ended_at=latest)])])
    decided = keeper.run(latest + 2.0)
    steps = store.reads.steps()
    assert decided == (steps["session_id"] == ended).sum() > 0  # every step of it, failed or not
    assert set(keeper.pending) == set(store.reads.steps()["session_id"]) - {ended}
    read = range_verdicts(store, first, last, now=latest + 2.0)
    assert set(read.loc[read["decided"], "session_id"]) == {ended} and len(read) == len(failed)
    assert set(read.loc[read["pending"], "session_id"]) == set(sessions[1:])
    expected = failure_verdicts(store, first, last)
    mine = (read["session_id"] == ended).to_numpy()
    pd.testing.assert_frame_equal(
        read[mine].drop(columns=["decided", "pending"]).reset_index(drop=True),
        expected[expected["session_id"] == ended].reset_index(drop=True),
        check_dtype=False,
    )
    decided_failed = int((failed["session_id"] == ended).sum())
    words = verdict_words(failures(store, first, last, now=latest + 2.0))
    assert words.startswith(f"{decided_failed:,} of {len(failed):,} verdicts were decided") and "are pending" in words

    assert keeper.run(latest + 301.0) == len(steps) - decided  # the horizon passed: every session settled
    assert not keeper.pending and range_verdicts(store, first, last)["decided"].all()


def test_without_a_running_keeper_the_page_works_the_verdicts_out(timeouts):
    """Pending only while a keeper runs and for what it covers: its mark gone stale (the collector stopped), or a
    step older than where it decides from, is worked out as the page opens, as without any keeper."""
    store = timeouts
    failed, sessions, latest = _running(store)
    first, last = store.reads.time_range()
    expected = failure_verdicts(store, first, last)
    keeper = VerdictKeeper(
        store, _writer(store), progress=_marker(store), delay_s=0.0, end_after_s=300.0, lookback_s=7200.0
    )
    keeper.run(latest + 1.0)
    read = range_verdicts(store, first, last, now=latest + 1.0 + KEEPER_LIVE_S + 1.0)  # the keeper stopped
    assert not read["pending"].any() and not read["decided"].any()
    pd.testing.assert_frame_equal(read.drop(columns=["decided", "pending"]), expected, check_dtype=False)
    late = float(failed["started_at"].sort_values().iloc[len(failed) // 2])  # a keeper started after half of them
    store.write([("upsert", [VerdictProgressRecord(keeper.name, late, latest + 1.0, latest + 1.0)])])
    read = range_verdicts(store, first, last, now=latest + 1.0)
    assert (read["pending"] == (read["started_at"] >= late)).all() and 0 < read["pending"].sum() < len(read)
    worked = read[~read["pending"]].drop(columns=["decided", "pending"]).reset_index(drop=True)
    older = expected[expected["started_at"] < late].reset_index(drop=True)
    pd.testing.assert_frame_equal(worked, older, check_dtype=False)


def test_a_running_collector_decides_them_from_its_tick(timeouts):
    """`kvobs collect` runs the keeper from its tick and writes through its store writer: the engine run's sessions
    ended (the SDK said so), so every step is decided at the first run, and counted for /metrics."""
    from collectors.collector import Collector, CollectorOptions
    from tests.waiting import wait_for

    store = timeouts
    steps = len(store.reads.steps())
    collector = Collector(CollectorOptions(otlp_http="127.0.0.1:0", interval_s=0.2), store=store)
    collector.verdicts.delay_s = 0.0  # the run's steps are seconds old; a deployed collector reads a minute behind
    collector.start()
    try:
        wait_for(lambda: len(store.reads.step_verdicts()) == steps, timeout_s=60)
    finally:
        collector.stop()
    assert collector.verdicts.num_decided == steps > 0
    assert range_verdicts(store, *store.reads.time_range())["decided"].all()


def test_an_ended_sessions_timeout_is_never_pending(timeouts):
    """Pending only while the verdict can change: a session the agent ended is worked out as the page opens, even
    while a keeper runs and has not decided it yet (its next run would)."""
    store = timeouts
    failed, sessions, latest = _running(store)
    keeper = VerdictKeeper(
        store, _writer(store), progress=_marker(store), delay_s=0.0, end_after_s=300.0, lookback_s=7200.0
    )
    keeper.run(latest + 1.0)  # every session still running: none decided, all pending
    ended = sessions[0]
    store.write([("upsert", [SessionRecord(ended, ended_at=latest)])])  # the SDK says it ended; no keeper ran since
    first, last = store.reads.time_range()
    read = range_verdicts(store, first, last, now=latest + 1.5)
    mine = read["session_id"] == ended
    assert mine.any() and not read.loc[mine, "pending"].any() and not read.loc[mine, "decided"].any()
    assert "pending" not in set(read.loc[mine, "failure_cause"])
    assert read.loc[~mine, "pending"].all()  # the others are still running


def test_a_stopped_collector_leaves_nothing_pending(timeouts):
    """At its stop a collector's keeper decides what has settled and marks itself stopped: right after it (well
    within `KEEPER_LIVE_S`), nothing is pending, whether its sessions had ended or not."""
    from collectors.collector import Collector, CollectorOptions

    store = timeouts
    failed, sessions, latest = _running(store)
    store.write([("upsert", [SessionRecord(sessions[0], ended_at=latest)])])  # one ended, the others never did
    collector = Collector(CollectorOptions(otlp_http="127.0.0.1:0", interval_s=0.2), store=store)
    collector.verdicts.delay_s = 0.0
    collector.start()
    collector.stop()
    first, last = store.reads.time_range()
    read = range_verdicts(store, first, last)  # now: seconds after the stop
    assert len(read) == len(failed) and not read["pending"].any()
    decided = set(read.loc[read["decided"], "session_id"])
    assert sessions[0] in decided  # it had ended: decided at the stop
    (mark,) = store.reads.verdict_progress().itertuples(index=False)
    assert mark.covers_from == float("inf")  # the stopped keeper covers nothing


def test_every_column_the_attribution_gives_is_kept_by_the_record_or_its_facts():
    """A settled page reads its steps whole only if the stored verdict keeps every column `attribute_steps` gives:
    the record's fields (two under other names) and its facts, each once."""
    from kvobs.analytics.steps.attribution import COLUMNS
    from kvobs.analytics.steps.step_verdict import FACTS
    from kvobs.analytics.steps.verdicts import _RENAMED, VERDICT_FIELDS

    recorded = {_RENAMED.get(name, name) for name in VERDICT_FIELDS}
    assert set(COLUMNS) <= recorded | set(FACTS)
    assert not recorded & set(FACTS)
    assert set(FACTS) <= set(COLUMNS)  # no fact the attribution does not give
