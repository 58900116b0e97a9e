"""The collector's routing meter (`collectors.jobs.routing_meter`) measures each request's lookup once, fed in time
order a slice at a time, and finds what the store analysis finds over the whole run at once
(`kvobs.analytics.cache.routing.request_lookups`): on the recorded vLLM run as a fleet of two replicas and as one
replica, request for request, every part of the shortfall split included; its counters are the routing loss
`fleet_losses` finds."""

from __future__ import annotations

import pandas as pd
import pytest

from collectors.jobs.routing_meter import REQUEST_S, RoutingMeter
from kvobs.analytics.cache.routing import LOOKUP_COLUMNS, fleet_losses, pause_starts
from kvobs.analytics.cache.shortfall_split import store_lookups
from tests.runs import FLEET, drive_meter, missing_as_none


def _metered(store, instances, *, step_s: float, request_s: float = REQUEST_S):
    """The meter run every `step_s` over the whole store; its records and the meter."""
    written: list = []
    meter = RoutingMeter(store, list(instances), write=written.extend, request_s=request_s)
    drive_meter(meter, store, step_s=step_s)
    rows = pd.DataFrame([r.to_row() for r in written])
    return rows, meter


def _through_a_collector(collectors: list):
    """store -> the routing meter of a `kvobs collect` over both replicas' KV streams (kept in `collectors`; not
    started: nothing bound or claimed), for `measured_copy`."""
    from collectors.collector import Collector, CollectorOptions

    def meter(store):
        options = CollectorOptions(kv_events=[f"{name}=tcp://127.0.0.1:1" for name in FLEET], interval_s=3600)
        collectors.append(Collector(options, store=store))
        return collectors[-1].routing_meter

    return meter


def _whole(store) -> pd.DataFrame:
    lookups, _ = store_lookups(store, store.reads.requests(), store.reads.steps(), None, None)
    return lookups


def test_the_meter_counts_what_the_whole_run_analysis_finds(fleet_run):
    store = fleet_run.store
    first, last = store.reads.time_range()
    whole, _ = fleet_losses(store, store.reads.requests(), store.reads.steps(), first, last)
    assert whole["routed_tokens"].sum() > 0, "the recording shows no routing loss: nothing compared"
    _, meter = _metered(store, FLEET, step_s=30.0)
    per_instance = whole.groupby("instance")["routed_tokens"].sum().to_dict()
    assert dict(meter.routed_tokens) == {name: int(n) for name, n in per_instance.items()}
    # a replica is compared with from its first stored block the meter read (the range analysis: over the whole
    # range); each request before that is counted as compared with no other replica, none left out unsaid
    counted, alone = sum(meter.compared_requests.values()), sum(meter.uncomparable.values())
    assert {why for _, why in meter.uncomparable} <= {"no_other_replica"}
    assert counted + alone == meter.num_measured == len(whole)
    began = store.reads.kv_events(kinds=["stored"]).groupby("instance")["ts"].min().max()
    assert counted >= (whole["lookup_ts"] >= began).sum() >= 10, (counted, len(whole))
    assert meter.num_late == 0


@pytest.mark.parametrize("request_s", [REQUEST_S, 60.0])
def test_each_lookup_written_is_the_whole_run_analysis_of_that_request(fleet_run, request_s):
    """With a 60 s read-back, a session's previous request is often outside a run's read (its steps arrive up to
    two minutes apart): where its pause began comes from what the meter remembered. (Requests whose blocks were
    stored more than 60 s after their lookup, queued behind others on 2 cores, are then not measured: their chain
    is not known yet.)"""
    step_s = 5.0 if request_s < 60 else 30.0
    rows, meter = _metered(fleet_run.store, FLEET, step_s=step_s, request_s=request_s)
    whole = _whole(fleet_run.store).set_index("request_id")
    assert len(rows) >= (1.0 if request_s == REQUEST_S else 0.7) * len(whole) and rows["request_id"].is_unique
    assert meter.num_measured == len(rows)
    mine = whole.loc[rows["request_id"]]
    compared = [c for c in LOOKUP_COLUMNS if c in rows.columns and c != "request_id"]
    assert len(compared) == len(LOOKUP_COLUMNS) - 2  # all but the id and `routed_tokens` (blocks x block size)
    # a replica is compared with from its first stored block the meter has read: a shorter read-back reads it later
    stored = fleet_run.store.reads.kv_events(kinds=["stored"])
    known = rows["lookup_ts"].to_numpy() >= stored.groupby("instance")["ts"].min().max() + step_s + request_s
    assert known.sum() >= 10
    for column in compared:
        got, want = rows.set_index("request_id")[column], mine[column]
        if column == "replicas_compared":
            got, want = got[known], want[known]
        assert missing_as_none(got) == missing_as_none(want), column
    assert rows["routed_blocks"].sum() > 0 and rows["cold_blocks"].sum() > 0 and rows["pause_blocks"].sum() > 0
    if request_s < REQUEST_S:  # the case is there: pauses whose start no run that measured them had read
        reqs = fleet_run.store.reads.requests().set_index("request_id")
        previous = _previous_arrivals(fleet_run.store)
        unread = [
            rid
            for rid, ts in zip(rows["request_id"], rows["lookup_ts"])
            if previous.get(rid, float("inf")) < ts - step_s - request_s and reqs.loc[rid, "arrival_ts"] <= ts
        ]
        assert int(rows.set_index("request_id").loc[unread, "pause_blocks"].sum()) > 0


def _previous_arrivals(store) -> dict[str, float]:
    """request id -> when its session's previous request arrived."""
    from kvobs.analytics.cache.chains import with_sessions

    reqs = with_sessions(store.reads.requests(), store.reads.steps()).sort_values("arrival_ts")
    previous = reqs.groupby("session_id")["arrival_ts"].shift()
    return {rid: ts for rid, ts in zip(reqs["request_id"], previous) if ts == ts}


def test_a_single_replica_is_measured_with_nothing_to_compare(vllm_run):
    rows, meter = _metered(vllm_run.store, vllm_run.store.reads.instances(), step_s=30.0)
    whole = _whole(vllm_run.store).set_index("request_id")
    assert len(rows) >= 0.9 * len(whole)
    assert (rows["replicas_compared"] == 0).all() and rows["best_instance"].isna().all()
    assert rows["routed_blocks"].sum() == 0 and not meter.routed_tokens
    mine = whole.loc[rows["request_id"]]
    for column in ("own_blocks", "available_blocks", "cold_blocks", "capacity_blocks", "pause_blocks"):
        assert rows[column].tolist() == mine[column].tolist(), column


def test_a_pause_begins_where_the_sessions_previous_request_ended():
    requests = pd.DataFrame(
        {
            "request_id": ["r2", "r3", "x1"],
            "session_id": ["s", "s", "t"],
            "arrival_ts": [20.0, 30.0, 5.0],
            "finished_ts": [25.0, 31.0, 6.0],
        }
    )
    assert pause_starts(requests) == {"r3": 25.0}
    earlier = {"s": (10.0, 12.0), "t": (7.0, 8.0)}  # t's remembered request came after x1: not its previous
    assert pause_starts(requests, earlier) == {"r2": 12.0, "r3": 25.0}


def test_a_collector_writes_what_its_meter_measured_and_exports_the_routing_loss(fleet_run, tmp_path):
    """`kvobs collect` with both replicas' KV streams: its meter (run here at the recording's times, as its tick
    would) writes each lookup and its progress through the collector's own writer, and its /metrics counts the
    routing loss those rows hold."""
    from prometheus_client import generate_latest

    from tests.runs import measured_copy

    collectors = []
    store = measured_copy(fleet_run, tmp_path, meter=_through_a_collector(collectors))
    (collector,) = collectors
    text = generate_latest(collector.registry).decode()
    collector.stop()  # flushes its writer
    rows = store.reads.request_lookups()
    (tmp_path / "reference").mkdir()
    reference = measured_copy(fleet_run, tmp_path / "reference")  # the meter on its own
    assert sorted(rows["request_id"]) == sorted(reference.reads.request_lookups()["request_id"]) and len(rows) > 40
    progress = store.reads.lookup_progress()
    assert list(progress["instance"]) == list(FLEET) and (progress["measured_to"] >= rows["lookup_ts"].max()).all()
    routed = rows["routed_blocks"] * rows["block_size"]
    for name in FLEET:
        line = f'kvobs_collector_routing_loss_tokens_total{{instance="{name}"}} '
        (value,) = [float(x.split(" ")[-1]) for x in text.splitlines() if x.startswith(line)]
        assert value == routed[rows["instance"] == name].sum()
    assert routed.sum() > 0
    minutes = store.reads.minute_rollup("lookup_minutes", 0, 4e9)
    assert minutes["requests"].sum() == len(rows) and minutes["routed_tokens"].sum() == routed.sum()
    reference.close()
    store.close()


def test_replicas_whose_block_hashes_never_meet_are_left_out_counted_and_said(fleet_run, tmp_path, caplog):
    """The same recording, with vllm-b's block hashes seeded apart (each one complemented, as two vLLMs whose
    PYTHONHASHSEED differ hash alike prompts apart): sessions ran on both replicas and no block was ever stored on
    both, so no prefix of one could be found on the other. The meter leaves the pair out once it has seen that, as
    the range analysis does, counts each request it could compare with no replica by why, says so once in its log,
    and `kvobs doctor --collector` names each replica with the fix; before, it reported 0 tokens lost over every
    compared request, a 0% loss it could not show."""
    import sqlite3

    from prometheus_client import generate_latest

    from kvobs.commands.doctor import exposition_checks
    from tests.runs import Run, measured_copy

    apart = tmp_path / "apart.db"
    with sqlite3.connect(fleet_run.url.removeprefix("sqlite:///")) as source, sqlite3.connect(apart) as copy:
        source.backup(copy)
        copy.execute(
            "UPDATE kv_events SET block_hash = ~block_hash, parent_hash = ~parent_hash WHERE instance = ?", (FLEET[1],)
        )
    collectors = []
    (tmp_path / "measured").mkdir()
    with caplog.at_level("WARNING", logger="collectors.jobs.routing_meter"):
        store = measured_copy(
            Run(f"sqlite:///{apart}", None), tmp_path / "measured", meter=_through_a_collector(collectors)
        )
    (collector,) = collectors
    meter = collector.routing_meter
    text = generate_latest(collector.registry).decode()
    collector.stop()

    first, last = store.reads.time_range()
    _, check = fleet_losses(store, store.reads.requests(), store.reads.steps(), first, last)
    assert check.apart == {frozenset(FLEET)}  # the range analysis leaves the pair out
    measured = meter.num_measured
    left_out = sum(n for (_, why), n in meter.uncomparable.items() if why == "hashes_differ")
    compared = sum(meter.compared_requests.values())
    alone = sum(n for (_, why), n in meter.uncomparable.items() if why == "no_other_replica")  # before vllm-b ran
    assert measured > 40 and left_out + compared + alone == measured
    # until a session has run on both and its blocks were read, the pair is compared: from then on, never again
    rows = store.reads.request_lookups()
    paired, unpaired = rows[rows["replicas_compared"] > 0], rows[rows["replicas_compared"] == 0]
    after = unpaired[unpaired["lookup_ts"] > paired["lookup_ts"].min()]
    assert len(after) == left_out > compared and paired["lookup_ts"].max() < after["lookup_ts"].min()
    assert sum(meter.routed_tokens.values()) == 0
    told = [r.getMessage() for r in caplog.records if "never stored the same block" in r.getMessage()]
    assert len(told) == 1 and "PYTHONHASHSEED" in told[0], told
    for name in FLEET:
        line = f'kvobs_collector_routing_uncomparable_requests_total{{instance="{name}",reason="hashes_differ"}} '
        assert any(x.startswith(line) for x in text.splitlines()), name
    checks = {name: (ok, said) for name, ok, said in exposition_checks(text)}
    for name in FLEET:
        ok, said = checks[name]
        assert not ok and "block hashes never meet" in said and "PYTHONHASHSEED" in said, said
    store.close()


def test_a_restarted_meter_resumes_where_the_last_one_stopped_and_leaves_no_gap(fleet_run, tmp_path, caplog):
    """A collector stopped halfway through the run and started again five minutes later: its new meter reads where
    the old one's `lookup_progress` says it stopped, warms its index over the hour before, and measures every request
    since. The two meters together write exactly the lookups one meter writes without the restart, request for
    request, and the new one says where it resumed. Before, its first run only warmed the index: the requests of
    the restart's minutes were never measured."""
    from kvobs.store import StoreWriter
    from tests.runs import measured_copy

    first, last = fleet_run.store.reads.time_range()
    (tmp_path / "restarted").mkdir()
    store = measured_copy(fleet_run, tmp_path / "restarted", until=(first + last) / 2)  # the first collector
    mark = float(store.reads.lookup_progress()["measured_to"].min())
    before = store.reads.request_lookups()
    assert len(before) > 10 and before["lookup_ts"].max() <= mark < last - 60

    writer = StoreWriter(store)
    meter = RoutingMeter(store, list(FLEET), write=writer.add_many, progress=writer.upsert)
    now = mark + meter.delay_s + meter.request_s + 300.0  # its first run, five minutes after the last one's
    with caplog.at_level("INFO", logger="collectors.jobs.routing_meter"):
        while meter.done is None or meter.done < last:
            meter.run(now)
            now += 30.0
    writer.close()
    assert meter.resumed_from == mark and meter.num_late == 0
    assert any("resumes" in r.getMessage() and "vllm-a, vllm-b" in r.getMessage() for r in caplog.records)

    both = store.reads.request_lookups()
    (tmp_path / "reference").mkdir()
    reference = measured_copy(fleet_run, tmp_path / "reference").reads.request_lookups()  # no restart
    assert sorted(both["request_id"]) == sorted(reference["request_id"]) and both["request_id"].is_unique
    gap = both[(both["lookup_ts"] > mark) & (both["lookup_ts"] <= mark + 300.0)]
    assert len(both) > len(before) and len(gap) > 0  # the restart's minutes: a meter that did not resume missed them
    columns = ["own_blocks", "available_blocks", "routed_blocks", "cold_blocks", "pause_blocks", "replicas_compared"]
    got, want = both.set_index("request_id").sort_index(), reference.set_index("request_id").sort_index()
    for column in columns:
        assert missing_as_none(got[column]) == missing_as_none(want[column]), column
    assert got["routed_blocks"].sum() > 0
    store.close()


def test_a_meter_restarted_too_late_counts_and_says_the_stretch_it_left(fleet_run, tmp_path, caplog, monkeypatch):
    """Past `RESUME_S` a restarted meter measures no further back: the stretch it leaves unmeasured is counted per
    instance (`kvobs_collector_routing_unmeasured_seconds_total`), said in its log, and named by `kvobs doctor`."""
    from prometheus_client import generate_latest

    from collectors.jobs import routing_meter
    from kvobs.commands.doctor import exposition_checks
    from tests.runs import measured_copy

    monkeypatch.setattr(routing_meter, "RESUME_S", 60.0)  # a restart five minutes later is then too late
    first, last = fleet_run.store.reads.time_range()
    store = measured_copy(fleet_run, tmp_path, until=(first + last) / 2)
    mark = float(store.reads.lookup_progress()["measured_to"].min())
    collectors: list = []
    meter = _through_a_collector(collectors)(store)
    with caplog.at_level("WARNING", logger="collectors.jobs.routing_meter"):
        meter.run(mark + meter.delay_s + meter.request_s + 300.0)
    (collector,) = collectors
    text = generate_latest(collector.registry).decode()
    collector.stop()
    assert meter.resumed_from is not None and meter.unmeasured_s == meter.resumed_from - mark > 200.0
    assert any("not measured" in r.getMessage() for r in caplog.records)
    for name in FLEET:
        line = f'kvobs_collector_routing_unmeasured_seconds_total{{instance="{name}"}} {meter.unmeasured_s}'
        assert line in text, name
    checks = {name: (ok, said) for name, ok, said in exposition_checks(text)}
    for name in FLEET:
        ok, said = checks[name]
        assert not ok and "never measured" in said, said
    store.close()
