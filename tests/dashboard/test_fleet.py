"""The fleet view: a store holding two vLLM replicas (`fleet_run`: the recorded run behind one collector as
`vllm-a` and `vllm-b`). The sidebar chooses instances; every count on a page is of the chosen ones; the Overview
shows one row per instance and a measure as small multiples on the page's x-range."""

from __future__ import annotations

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import data, session_data
from dashboard.clock import Clock
from dashboard.views import PAGES
from dashboard.views.kv_events import sample_caption
from instrumented_engine.whatif.fleet import POLICIES, FleetPlan, fleet_rows, simulate_fleet
from kvobs.analytics.cache.routing import MISS_PARTS, fleet_losses
from kvobs.analytics.cache.shortfall_split import shortfall, store_lookups
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import AlertRecord
from tests.dashboard.test_app import APP, assert_clean, charts, open_page, x_axes
from tests.runs import FLEET, measured_copy


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_renders_on_a_fleet(monkeypatch, fleet_run, page):
    at = open_page(monkeypatch, fleet_run.url, page)
    assert_clean(at)
    chooser = at.multiselect(key="instances")
    assert chooser.options == list(FLEET) and chooser.value == list(FLEET)


def _facets(at: AppTest) -> list[dict]:
    return [spec for spec in charts(at) if "facet" in spec]


def test_the_overview_has_a_row_and_a_small_chart_per_instance(monkeypatch, fleet_run):
    at = open_page(monkeypatch, fleet_run.url, "overview")
    assert_clean(at)
    assert "Per instance" in [s.value for s in at.subheader]
    table = next(frame.value for frame in at.dataframe if "blocks_lost" in frame.value)
    assert sorted(table["instance"]) == list(FLEET)
    first, last = fleet_run.store.reads.time_range()
    for name, lost, requests in zip(table["instance"], table["blocks_lost"], table["requests"]):
        assert lost == fleet_run.store.reads.block_losses(instances=[name])["blocks"].sum() > 0
        assert requests == len(fleet_run.store.reads.requests(first, last, instances=[name])) > 0
    assert list(table["blocks_lost"]) == sorted(table["blocks_lost"], reverse=True)  # most lost first
    domain = {tuple(x["scale"]["domain"]) for spec in charts(at) for x in x_axes(spec)}
    for measure in data.FLEET_SERIES:
        at.selectbox(key="fleet_measure").set_value(measure).run()
        assert_clean(at)
        (facet,) = _facets(at)
        shown = {row["series"] for row in facet["data"]["values"]} if "values" in facet.get("data", {}) else None
        assert facet["spec"]["encoding"]["x"]["scale"]["domain"] == list(next(iter(domain)))  # the page's x-range
        if shown is not None:
            assert shown <= set(FLEET)


def test_the_overview_gives_the_routing_loss_per_instance_and_for_the_fleet(monkeypatch, fleet_run):
    """The routing-loss table is the analysis's (`routing_summary` of `fleet_losses` over the page's range): per
    instance and the fleet's row, with the KPI the fleet's share; `vllm-b`, started half-way, recomputed prefixes
    `vllm-a` held."""
    at = open_page(monkeypatch, fleet_run.url, "overview")
    assert_clean(at)
    assert "Routing loss" in [s.value for s in at.subheader]
    table = next(frame.value for frame in at.dataframe if "routed_share" in frame.value)
    store = fleet_run.store
    first, last = store.reads.time_range()
    losses, _ = fleet_losses(store, store.reads.requests(first, last), store.reads.steps(first, last), first, last)
    expected = losses.groupby("instance")["routed_tokens"].sum()
    rows = table.set_index("instance")
    assert list(rows.index) == [*FLEET, "fleet"]
    for name in FLEET:
        assert rows.loc[name, "routed_tokens"] == expected.get(name, 0)
    assert rows.loc["fleet", "routed_tokens"] == expected.sum() > 0
    kpi = {m.label: m.value for m in at.metric}["routing loss"]
    assert kpi == f"{rows.loc['fleet', 'routed_share']:.1%}"
    split = next(frame.value for frame in at.dataframe if "available_rate" in frame.value).set_index("instance")
    lookups, _ = store_lookups(store, store.reads.requests(first, last), store.reads.steps(first, last), first, last)
    expected = shortfall(lookups, "instance").set_index("instance")
    assert list(split.index) == [*FLEET, "fleet"]
    parts = [f"{p}_tokens" for p in MISS_PARTS]
    assert (split[parts].sum(axis=1) + split["achieved_tokens"] == split["prompt_block_tokens"]).all()  # adds up
    compared = ["prompt_block_tokens", "achieved_tokens", *parts]
    assert (split[compared] == expected[compared]).all().all()
    assert split.loc["fleet", "routed_tokens"] == rows.loc["fleet", "routed_tokens"]  # one routing loss
    assert any("Achieved hit rate across the 2 replicas" in c.value for c in at.caption)
    # the recompute tax of the same split: the routed part is the routing loss, vLLM's preemptions not measured
    tax = next(frame.value for frame in at.dataframe if "recompute_tax" in frame.value).set_index("instance")
    assert list(tax.index) == [*FLEET, "fleet"]
    assert (tax["recomputed_routed_tokens"] == split["routed_tokens"]).all()
    prefilled = split["prompt_block_tokens"] - split["achieved_tokens"]
    assert (tax["prefill_tokens"] == prefilled).all()  # (no preemption's recompute added: not measured)
    assert tax["recomputed_preempted_tokens"].isna().all()
    recomputed = prefilled - split["cold_tokens"]
    assert (tax["recomputed_tokens"] == recomputed).all() and tax.loc["fleet", "recompute_tax"] > 0


def test_choosing_an_instance_narrows_every_count(monkeypatch, fleet_run):
    at = open_page(monkeypatch, fleet_run.url, "overview")
    whole = {m.label: m.value for m in at.metric}
    at.multiselect(key="instances").set_value(["vllm-b"]).run()
    assert_clean(at)
    narrowed = {m.label: m.value for m in at.metric}
    store = fleet_run.store
    first, last = store.reads.time_range()
    assert narrowed["requests"] == str(len(store.reads.requests(first, last, instances=["vllm-b"])))
    assert narrowed["blocks lost"] == f"{store.reads.block_losses(instances=['vllm-b'])['blocks'].sum():,}"
    assert int(narrowed["requests"]) < int(whole["requests"])
    assert narrowed["agent steps"] == whole["agent steps"]  # steps are the fleet's (as the KPI's help says)
    assert "Per instance" not in [s.value for s in at.subheader]  # one instance: nothing to compare
    assert any("1 of 2 instances (vllm-b)" in c.value for c in at.caption)


def test_an_instance_link_preselects_it(monkeypatch, fleet_run):
    monkeypatch.setenv("KVOBS_STORE_URL", fleet_run.url)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "kv_events"
    at.query_params["instance"] = "vllm-a"
    at.run()
    assert_clean(at)
    assert at.multiselect(key="instances").value == ["vllm-a"]
    restored = at.dataframe[0].value
    assert set(restored["instance"]) <= {"vllm-a"}


def test_alerts_of_other_instances_are_left_out(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'alerts.db'}")
    writer = StoreWriter(store)
    for i, instance in enumerate(["vllm-a", "vllm-b", None]):
        writer.add(AlertRecord(ts=100.0 + i, rule=f"rule-{i}", severity="warning", state="firing", instance=instance))
    writer.close()
    page = data.alerts_page(store, 0.0, 200.0, ("vllm-a",))
    assert set(page.history["rule"]) == set(page.active["rule"]) == {"rule-0", "rule-2"}
    assert len(data.alerts_page(store, 0.0, 200.0).history) == 3


def test_the_whatif_page_replays_the_fleet_under_each_router(monkeypatch, fleet_run):
    """On a fleet the What-if page adds the routers (`kvobs whatif --replicas`): one row per router, the same rows
    as the command's."""
    at = open_page(monkeypatch, fleet_run.url, "whatif")
    assert_clean(at)
    assert "Routers" in [s.value for s in at.subheader]
    table = next(t.value for t in at.table if "router" in t.value.columns)
    assert list(table["router"]) == list(POLICIES)
    fleet = FleetPlan.from_store(fleet_run.store, *fleet_run.store.reads.time_range())
    expected = fleet_rows([simulate_fleet(fleet, policy) for policy in POLICIES])
    assert [f"{row['hit rate']:.1%}" for row in expected] == list(table["hit rate"])


def test_a_long_range_analyses_the_routing_loss_when_asked(monkeypatch, fleet_run):
    """Its cost grows with the KV events of the range: past `AUTO_ROUTING_EVENTS` the page opens without it (no KPI,
    a button), and the button brings the same table."""
    from dashboard.views import overview

    monkeypatch.setattr(overview, "AUTO_ROUTING_EVENTS", 10)
    at = open_page(monkeypatch, fleet_run.url, "overview")
    assert_clean(at)
    assert "routing loss" not in {m.label for m in at.metric}
    assert not any("routed_share" in frame.value for frame in at.dataframe)
    at.button(key="routing_go").click().run()
    assert_clean(at)
    assert "routing loss" in {m.label for m in at.metric}
    assert any("routed_share" in frame.value for frame in at.dataframe)


def test_the_kv_events_page_counts_reuse_over_the_latest_stored_blocks_and_says_so(monkeypatch, fleet_run):
    """Past `PREFIX_ROWS` stored blocks the reuse tables and churn are over the latest ones only (the page's cost
    stays flat in its range): the page names how many of how many and from when, and its most recomputed blocks are
    those of exactly that stretch; the losses by reason stay the whole range's."""
    store = fleet_run.store
    first, last = store.reads.time_range()
    stored = store.reads.stored_blocks(first, last)
    whole = data.kv_events_page(store, first, last, 60.0)
    assert whole.prefix_rows == whole.stored_in_range == len(stored) > 40
    assert whole.sample_since == first
    monkeypatch.setattr(data, "PREFIX_ROWS", 40)
    page = data.kv_events_page(store, first, last, 60.0)
    assert page.prefix_rows == 40 and page.stored_in_range == len(stored)
    assert page.sample_since == stored["ts"].iloc[-40]
    expected = store.reads.top_restored_blocks(page.sample_since, last, limit=20)
    pd.testing.assert_frame_equal(page.restored, expected)
    pd.testing.assert_frame_equal(page.reasons, whole.reasons)
    words = sample_caption(page, Clock.named("UTC"))
    assert f"latest 40 of the {len(stored):,} blocks stored" in words
    assert sample_caption(whole, Clock.named("UTC")) == f"Over all {len(stored):,} blocks stored in the range."


def test_measured_lookups_give_the_routing_loss_at_once_and_the_same_answer(monkeypatch, fleet_run, tmp_path):
    """Where a collector measured the lookups, the Overview reads their rollup whatever the range (no replay, no
    button, even past `AUTO_ROUTING_EVENTS`), and its tables are the replay's of the same requests."""
    from dashboard.views import overview

    store = measured_copy(fleet_run, tmp_path)
    measured = store.reads.request_lookups()
    whole, _ = store_lookups(store, store.reads.requests(), store.reads.steps(), None, None)
    assert sorted(measured["request_id"]) == sorted(whole["request_id"])  # each request the replay can measure
    monkeypatch.setattr(overview, "AUTO_ROUTING_EVENTS", 10)
    at = open_page(monkeypatch, store.url, "overview")
    assert_clean(at)
    assert not at.button  # nothing to ask for
    assert any("Measured by the collector" in c.value for c in at.caption)
    rows = next(frame.value for frame in at.dataframe if "routed_share" in frame.value).set_index("instance")
    first, last = store.reads.time_range()
    reqs, steps = store.reads.requests(first, last), store.reads.steps(first, last)
    losses, _ = fleet_losses(store, reqs, steps, first, last)
    # the collector compares a replica from the first block it read of it (the replay: over the whole range): the
    # requests before vllm-b ran were compared with no replica, so they are in neither share
    compared = measured.loc[measured["replicas_compared"] > 0, "request_id"]
    expected = losses[losses["request_id"].isin(compared)].groupby("instance")[["routed_tokens", "prompt_tokens"]].sum()
    assert list(rows.index) == [*FLEET, "fleet"]
    for name in FLEET:
        assert rows.loc[name, "routed_tokens"] == expected.loc[name, "routed_tokens"]
        assert rows.loc[name, "prompt_tokens"] == expected.loc[name, "prompt_tokens"]
    assert rows.loc["fleet", "routed_tokens"] == expected["routed_tokens"].sum() > 0
    assert {m.label: m.value for m in at.metric}["routing loss"] == f"{rows.loc['fleet', 'routed_share']:.1%}"
    split = next(frame.value for frame in at.dataframe if "available_rate" in frame.value).set_index("instance")
    lookups, _ = store_lookups(store, reqs, steps, first, last)
    want = shortfall(lookups, "instance").set_index("instance")
    compared = ["requests", "prompt_block_tokens", "achieved_tokens", *(f"{p}_tokens" for p in MISS_PARTS)]
    assert (split[compared] == want[compared]).all().all()
    assert not any("Pending" in i.value for i in at.info)
    store.close()


def test_lookups_not_yet_measured_are_pending_not_guessed(monkeypatch, fleet_run, tmp_path):
    """A collector a few minutes behind: the requests after the last lookup it measured are named as pending, and
    counted nowhere else."""
    first, last = fleet_run.store.reads.time_range()
    store = measured_copy(fleet_run, tmp_path, until=first + 0.5 * (last - first))
    measured = store.reads.request_lookups()
    (to,) = set(store.reads.lookup_progress()["measured_to"])  # one collector measured both replicas
    assert measured["lookup_ts"].max() <= to
    reqs = store.reads.requests()
    later = int((reqs["arrival_ts"] > to).sum())
    assert 0 < len(measured) < len(reqs) and later > 0
    at = open_page(monkeypatch, store.url, "overview")
    assert_clean(at)
    (pending,) = [i.value for i in at.info if "Pending" in i.value]
    assert f"Pending: {later:,} request(s) arrived after " in pending
    rows = next(frame.value for frame in at.dataframe if "routed_share" in frame.value).set_index("instance")
    assert rows.loc["fleet", "requests"] == int((measured["replicas_compared"] > 0).sum())
    store.close()


def test_a_sessions_drill_in_reads_its_measured_lookups_with_the_replays_answer(fleet_run, tmp_path):
    """A session every request of which the collector measured: its shortfall split is the whole run's replay of
    its requests, and its steps' routing causes are the replay's; a session with a request the collector could not
    measure (its hash chain unknown) is replayed."""
    from kvobs.analytics.cache.chains import with_sessions
    from kvobs.analytics.cache.shortfall_split import measured_lookups

    store = measured_copy(fleet_run, tmp_path)
    reqs = with_sessions(store.reads.requests(), store.reads.steps())
    whole, _ = store_lookups(store, store.reads.requests(), store.reads.steps(), None, None)
    measured = set(store.reads.request_lookups()["request_id"])
    full = [s for s, group in reqs.groupby("session_id") if set(group["request_id"]) <= measured]
    partial = [s for s, group in reqs.groupby("session_id") if not set(group["request_id"]) <= measured]
    assert full and partial
    same_steps = 0
    for session_id in full:
        assert measured_lookups(store, reqs[reqs["session_id"] == session_id]) is not None
        got = session_data.session_shortfall(store, session_id)
        want = shortfall(whole[whole["session_id"] == session_id], "session_id", total=None)
        pd.testing.assert_frame_equal(got, want, check_dtype=False)
        replayed = session_data.session_shortfall(fleet_run.store, session_id)
        if int(replayed["requests"].iloc[0]) == int(got["requests"].iloc[0]):
            got_steps = session_data.session_detail(store, session_id).steps
            want_steps = session_data.session_detail(fleet_run.store, session_id).steps
            for column in ("slow_cause", "evidence"):
                assert got_steps[column].tolist() == want_steps[column].tolist(), (session_id, column)
            same_steps += 1
    assert same_steps == len(full)
    assert measured_lookups(store, reqs[reqs["session_id"] == partial[0]]) is None
    store.close()


def test_a_sessions_replay_reads_the_blocks_its_requests_stored_after_its_last_step(fleet_run):
    """A replica's KV events run after the agent's step ends (vLLM publishes a block once full, then its batch): the
    replay of a session's span reads `STORED_WITHIN_S` beyond it, so it knows every request the whole run's replay
    knows (it read to the step's end only, and lost 1-2 of the 3 requests of two sessions of the recording)."""
    from kvobs.analytics.cache.chains import with_sessions

    store = fleet_run.store
    whole, _ = store_lookups(store, store.reads.requests(), store.reads.steps(), None, None)
    reqs = with_sessions(store.reads.requests(), store.reads.steps())
    for session_id in sorted(set(reqs["session_id"].dropna())):
        split = session_data.session_shortfall(store, session_id)
        mine = whole[whole["session_id"] == session_id]
        assert int(split["requests"].iloc[0]) == len(mine), session_id
        assert int(split["prompt_block_tokens"].iloc[0]) == int((mine["prompt_blocks"] * mine["block_size"]).sum())


def test_a_replicas_block_size_is_read_from_its_latest_blocks_recent_ones_first(fleet_run):
    """The block-size check reads each replica's latest stored blocks from the range's last minutes (bounded
    whatever the range); a replica that stored nothing there is read over the whole range, so it is still checked."""
    store = fleet_run.store
    first, last = store.reads.time_range()
    for name in FLEET:
        stored = store.reads.stored_blocks(instances=[name])
        end = float(stored["ts"].max())
        whole = store.reads.stored_blocks(first, end, latest=data.SIZE_SAMPLE, instances=[name])
        got, recent = data.latest_stored(store, first, end, name), end - data.SIZE_RECENT_S
        assert not got.empty and (got["ts"] >= recent).all()  # the range's last minutes held some: read from there
        in_recent = whole[whole["ts"] >= recent].reset_index(drop=True)  # ... the latest of the whole range's
        pd.testing.assert_frame_equal(got.reset_index(drop=True), in_recent)
        quiet = end + data.SIZE_RECENT_S + 1.0  # nothing stored in the range's last minutes: the whole range
        pd.testing.assert_frame_equal(data.latest_stored(store, first, quiet, name), whole)
        assert data.latest_stored(store, quiet - 1.0, quiet, name).empty
