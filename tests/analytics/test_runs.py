"""Two engine runs in one store (the engine started twice under one name, as `kvobs demo` twice into one
`kvobs.db`): each is a run with its start in the store, What-if never replays across the restart, the pages choose
a run, and the terminal, the Overview and What-if give one hit rate."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

import numpy as np
import pytest

from dashboard import data
from instrumented_engine.whatif.replay import ReplayPlan, simulate
from instrumented_engine.whatif.runs import observed_total, replay_plans, simulate_runs
from kvobs.analytics.cache.hit_rate import hit_rate_in
from kvobs.analytics.runs import overlapping, run_of, run_table, spans
from kvobs.commands.demo import hit_rate_line
from tests.dashboard.test_app import assert_clean, open_page
from tests.runs import NUM_BLOCKS, TWO_RUNS_INSTANCE


def test_each_engine_start_is_a_run_with_its_start_and_cache(two_runs):
    runs = run_table(two_runs.store.reads.runs())
    assert len(runs) == 2 and set(runs["instance"]) == {TWO_RUNS_INSTANCE}
    assert (runs["source"] == "engine").all() and (runs["num_blocks"] == NUM_BLOCKS - 1).all()  # the null block
    first, second = runs.itertuples()
    assert first.ended_at == second.started_at and np.isnan(second.ended_at)
    for (start, _), run in zip(two_runs.rounds, runs.itertuples()):
        assert run.started_at <= start  # the run began before its workload did
    reqs = two_runs.store.reads.requests()
    owners = run_of(runs, reqs["instance"], reqs["arrival_ts"])
    for (start, end), run in zip(two_runs.rounds, runs.itertuples()):
        mine = (reqs["arrival_ts"] >= start) & (reqs["arrival_ts"] <= end)
        assert mine.any() and set(owners[mine]) == {run.run_id}


def test_what_if_replays_each_run_through_its_own_cache(two_runs):
    """At the observed size and policy each run's replay is the run; one replay across the restart (what the page
    did) carries the first run's cache into the second and is not."""
    store = two_runs.store
    plans = replay_plans(store)
    assert [p.span.run_id for p in plans] == list(run_table(store.reads.runs())["run_id"])
    total, per_run = simulate_runs(plans, num_blocks=NUM_BLOCKS)
    observed = observed_total(plans, store, None, None)
    for plan, result in zip(plans, per_run):
        assert result.hit_tokens / result.query_tokens == pytest.approx(plan.observed["hit_rate"])
        assert result.evicted_blocks == plan.observed["evicted_blocks"]
    assert total.hit_rate == pytest.approx(observed["hit_rate"])
    assert total.evicted_blocks == observed["evicted_blocks"]
    across = simulate(ReplayPlan.from_store(store), num_blocks=NUM_BLOCKS)  # one cache through the restart
    assert across.hit_rate != pytest.approx(observed["hit_rate"]) or across.evicted_blocks != total.evicted_blocks


@pytest.mark.parametrize("which", ["first", "second", "both"])
def test_the_terminal_the_overview_and_what_if_give_one_hit_rate(two_runs, which):
    store = two_runs.store
    (s1, e1), (s2, e2) = two_runs.rounds
    since, until = {"first": (s1, e1), "second": (s2, e2), "both": (s1, e2)}[which]
    hit = hit_rate_in(store, since, until, [TWO_RUNS_INSTANCE])
    terminal = hit_rate_line(store, since, until, TWO_RUNS_INSTANCE)
    overview = data.overview(store, since, until, 5.0).kpis["hit rate"]
    what_if = observed_total(replay_plans(store, since, until), store, since, until)["hit_rate"]
    assert hit.rate is not None and hit.num_requests > 0
    assert f"{hit.rate:.1%} of {hit.query_tokens:,.0f} prompt tokens" in terminal  # as the Overview shows it
    assert re.search(r"([\d.]+)% of ([\d,]+) prompt tokens", terminal).group(2) == f"{overview.query_tokens:,.0f}"
    assert overview.rate == pytest.approx(hit.rate) and what_if == pytest.approx(hit.rate)


def test_a_range_cut_at_the_restart(two_runs):
    runs = run_table(two_runs.store.reads.runs())
    (s1, _), (_, e2) = two_runs.rounds
    cut = spans(runs, s1, e2)
    assert len(cut) == 2 and cut[0].until == cut[1].since == runs["started_at"].iloc[1]
    assert len(overlapping(runs, s1, runs["started_at"].iloc[1] - 0.001)) == 1


def test_the_pages_look_at_the_latest_run_and_say_when_a_range_spans_both(monkeypatch, two_runs):
    at = open_page(monkeypatch, two_runs.url, "overview")
    assert_clean(at)
    runs = run_table(two_runs.store.reads.runs())
    latest = runs["run_id"].iloc[-1]
    assert at.selectbox(key="run").value == latest  # one instance, restarted: its latest run by default
    kpis = {m.label: m.value for m in at.metric}
    second = two_runs.store.reads.requests(runs["started_at"].iloc[-1], None)
    assert kpis["requests"] == f"{len(second):,}"
    assert not at.warning
    at.selectbox(key="run").set_value("all runs in the range").run()
    assert_clean(at)
    assert "spans engine restarts: 2 runs of engine-twice" in at.warning[0].value
    assert {m.label: m.value for m in at.metric}["requests"] == f"{len(two_runs.store.reads.requests()):,}"


def test_between_runs_nothing_was_watching(two_runs):
    """The agent-steps counts are 0 in a quiet window of a run, and unknown (NaN) in the gap between the runs."""
    store = two_runs.store
    (s1, e1), (s2, e2) = two_runs.rounds
    frame = data.overview(store, s1, e2, 1.0).steps
    runs = run_table(store.reads.runs())
    gap = frame[(frame.index > e1 + 1) & (frame.index + 1 < runs["started_at"].iloc[1])]
    assert len(gap) > 0 and gap.isna().all().all()
    # watched up to the run's last record (its last step here), not the harness's end of the round: on a loaded
    # machine the round ends seconds after its last step, and a window past the last record is rightly unknown
    last = float(store.reads.steps(s2, e2)["started_at"].max())
    inside = frame[(frame.index >= s2) & (frame.index <= last)]
    assert len(inside) > 0 and inside.notna().all().all()


def test_what_if_on_every_run_shows_each_runs_table_labelled_in_the_pages_zone(monkeypatch, two_runs):
    """The per-run tables' labels use the zone chosen in the sidebar, not the server's (here +05:30)."""
    with monkeypatch.context() as env:
        env.setenv("TZ", "Asia/Kolkata")
        time.tzset()
        at = open_page(monkeypatch, two_runs.url, "whatif")
        at.selectbox(key="run").set_value("all runs in the range").run()
        at.radio(key="zone").set_value("UTC").run()
    time.tzset()
    assert_clean(at)
    runs = run_table(two_runs.store.reads.runs())
    utc = [datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds") for t in runs["started_at"]]
    assert [e.label for e in at.expander] == [f"{TWO_RUNS_INSTANCE}, run started {t}" for t in utc]
    assert "2 runs, each replayed through a cache of its own" in at.caption[0].value
    total, saved, first, second = (t.value for t in at.table[:4])  # (the time each size saves; then the tier sweep)
    assert list(saved["blocks"]) == list(total["blocks"][1:])  # a row of time saved per replayed size, both runs
    assert list(first["configuration"]) == list(second["configuration"]) == list(total["configuration"])
