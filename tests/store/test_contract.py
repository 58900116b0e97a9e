"""One read API, every backend: the same recorded data (the real vLLM run and our engine's run) loaded into SQLite,
PostgreSQL and chDB gives the same answer from every read and lookup (`kvobs.store.interface`'s protocols).

Each run is copied row by row, in its original order, through `StoreWriter` into a fresh store of each backend;
then every read function is called with the same arguments on all three and the answers compared value by value
(the row `id`, which each database assigns its own way, aside). Set `KVOBS_TEST_CLICKHOUSE_URL` to a ClickHouse
server's database (it is emptied) to run the same contract against the server.
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import create_engine, select, text

from collectors.capture import read_export_bodies
from collectors.jobs.routing_meter import RoutingMeter
from collectors.jobs.step_verdicts import DELAY_S, VerdictKeeper
from collectors.traces.connector_spans import ConnectorSpans
from collectors.traces.span_ingest import attributes
from kvobs.alerts.evaluator import Evaluator
from kvobs.alerts.rules import builtin_rules
from kvobs.analytics.cache.routing import fleet_losses
from kvobs.analytics.cache.shortfall_split import shortfall, store_lookups
from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS
from kvobs.analytics.steps.causes import step_causes
from kvobs.store import StoreWriter, open_store
from kvobs.store.composed import losses_in, ordered_counts, releases_in
from kvobs.store.interface import Lookups, Reads
from kvobs.store.rollups import ROLLUPS
from kvobs.store.rows import RECORDS
from kvobs.store.schema import TABLES
from tests.collectors.fleet_recording import truth
from tests.runs import drive_meter
from tests.stores import POSTGRES, postgres_url

LMCACHE_SPANS = Path(__file__).parents[1] / "fixtures" / "lmcache-spans" / "otlp_traces.jsonl"

BACKENDS = ["sqlite", "postgresql", "chdb"] + (["clickhouse"] if os.environ.get("KVOBS_TEST_CLICKHOUSE_URL") else [])


def _rows(source) -> dict[str, list]:
    """Every row of every table of `source`, as records, in insertion order."""
    records = {}
    with source.engine.connect() as conn:
        for name, model in TABLES.items():
            if name == "verdict_progress":  # a keeper's mark of the wall clock (a stopped collector's), not the run's
                records[name] = []
                continue
            columns = [c for c in model.__table__.columns if c.name != "id"]
            order = model.__table__.c.id if "id" in model.__table__.c else list(model.__table__.primary_key)[0]
            result = conn.execute(select(*columns).order_by(order))
            records[name] = [RECORDS[name](**row._asdict()) for row in result]
    return records


def _connector_lookups(source) -> list:
    """LMCache's recorded lookups (`tests/fixtures/lmcache-spans`), moved into the run's time range."""
    first, _ = source.reads.time_range()
    spans = [
        ("lmcache-mp", span, attributes(span.attributes))
        for body in read_export_bodies(LMCACHE_SPANS)
        for resource in ExportTraceServiceRequest.FromString(body).resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    lookups = ConnectorSpans().take(spans)
    shift = first + 1.0 - min(r.started_at for r in lookups)
    return [replace(r, started_at=r.started_at + shift, ended_at=(r.ended_at or 0.0) + shift) for r in lookups]


def _open(backend: str, tmp_path):
    if backend == "sqlite":
        return open_store(f"sqlite:///{tmp_path / 'contract.db'}"), None
    if backend == "chdb":
        return open_store(f"chdb:///{tmp_path / 'contract-ch'}"), None
    if backend == "clickhouse":
        store = open_store(os.environ["KVOBS_TEST_CLICKHOUSE_URL"])
        for table in (
            "sessions",
            "steps",
            "requests",
            "kv_events",
            "kv_event_sessions",
            "kv_event_minutes",
            "snapshots",
            "metric_samples",
            "alerts",
            "step_verdicts",
        ):
            store.client.command(f"TRUNCATE TABLE {table}")
        return store, None
    schema = f"kvobs_contract_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop():
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    return open_store(postgres_url(schema)), drop


@pytest.fixture(scope="module", params=["vllm_run", "agent_run", "fleet_run", "served_fleet"])
def loaded(request, tmp_path_factory):
    """(run, {backend: store}, {backend: alert transitions}): each backend holding the same run, and the built-in
    alert rules evaluated on it at ten points through the run (their transitions stored in its `alerts`)."""
    records = _rows(request.getfixturevalue(request.param).store)
    assert sum(map(len, records.values())) > 300, "the recording is too small to test anything"
    records["connector_lookups"] += _connector_lookups(request.getfixturevalue(request.param).store)
    stores, cleanups = {}, []
    for backend in BACKENDS:
        store, cleanup = _open(backend, tmp_path_factory.mktemp(f"{request.param}-{backend}"))
        writer = StoreWriter(store)
        for table, table_records in records.items():
            for record in table_records:
                (writer.upsert if table == "sessions" else writer.add)(record)
        writer.close()
        assert (writer.num_written, writer.num_dropped) == (sum(map(len, records.values())), 0), backend
        stores[backend] = store
        cleanups += [cleanup] if cleanup else []
    first, last = stores["sqlite"].reads.time_range()
    steps, decided = len(records["steps"]), {}
    firsts = {}
    for record in records["steps"]:
        firsts[record.session_id] = min(firsts.get(record.session_id, record.started_at), record.started_at)
    # the keeper has read up to just before the last session's first step: that session is undecided
    *_, before, latest = [0.0, *sorted(set(firsts.values()))]  # (a run whose sessions all start at once: all)
    middle, step = (before + latest) / 2 + DELAY_S, (latest - before) / 4
    for backend, store in stores.items():  # steps' verdicts, decided as a collector does once sessions settle
        write = lambda verdicts, s=store: s.write([("upsert", verdicts)])  # noqa: E731
        mark = lambda record, s=store: s.write([("upsert", [record])])  # noqa: E731
        keeper = VerdictKeeper(store, write, progress=mark, lookback_s=last - first + 3600.0)
        keeper.name = "verdicts@contract"  # one name on every backend (a process's own carries its pid)
        decided[backend] = keeper.run(middle) + keeper.run(middle + step)  # a second mark replaces the first
        assert store.reads.verdict_progress()["updated_at"].tolist() == [middle + step], backend
    assert len(set(decided.values())) == 1 and 0 < decided["sqlite"] <= steps, decided
    for backend, store in stores.items():  # request lookups, measured as a collector does a minute behind
        meter = RoutingMeter(
            store,
            store.reads.instances(),
            write=lambda r, s=store: s.write([("insert", r)]),
            progress=lambda r, s=store: s.write([("upsert", [r])]),
        )
        drive_meter(meter, store)
        assert meter.num_measured > 0, backend
    # The built-in rules over a third of the run, without `for` (the runs are shorter), at any non-zero value.
    rules = [
        replace(r, window_s=(last - first) / 3, for_s=0.0, threshold=0.0 if r.op in (">", ">=") else r.threshold)
        for r in builtin_rules()
    ]
    transitions = {
        backend: [Evaluator(store, rules).evaluate(first + (last - first) * k / 9) for k in range(10)]
        for backend, store in stores.items()
    }
    yield request.param, stores, transitions
    for store in stores.values():
        store.close()
    for cleanup in cleanups:
        cleanup()


def _values(answer, *, ordered: bool):
    """An answer as comparable plain values: NaN/NA are None, floats to 9 digits, the row id left out."""

    def plain(value):
        if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, float):
            return round(value, 9)
        return value.item() if hasattr(value, "item") else value

    if isinstance(answer, pd.DataFrame):
        frame = answer.drop(columns=[c for c in ("id",) if c in answer.columns])
        rows = [tuple(plain(v) for v in row) for row in frame.itertuples(index=False)]
        return list(frame.columns), rows if ordered else sorted(rows, key=repr)
    if isinstance(answer, dict):
        return sorted((k, plain(v)) for k, v in answer.items())
    if isinstance(answer, (tuple, list)):
        return [plain(v) for v in answer]
    return plain(answer)


def _calls(store) -> list[tuple[str, tuple, dict, bool]]:
    """(function, args, kwargs, ordered): every read, over the whole run and over a window inside it."""
    first, last = store.reads.time_range()
    middle = (first + (last - first) / 3, first + 2 * (last - first) / 3)
    busiest = store.reads.kv_events().groupby("session_id").size().sort_values().index[-1]
    some_session = store.reads.steps()["session_id"].iloc[0]
    traces = list(store.reads.steps()["trace_id"].dropna()[:50])
    steps = store.reads.steps()
    windows = [
        (sid, start - 5.0, end if end == end else last)
        for sid, start, end in zip(steps["session_id"], steps["started_at"], steps["ended_at"])
    ] + [(busiest, first, last)]
    calls = [
        ("time_range", (), {}, True),
        ("instances", (), {}, True),
        ("sessions", (), {}, False),
        ("session_snapshots", (busiest,), {}, True),
        ("kv_events", (), {"session_id": busiest}, True),
        ("kv_events", (), {"kinds": ["stored"], "limit": 500}, True),
        ("requests", (), {"session_id": busiest}, False),
        ("steps", (), {"session_id": some_session}, False),
        ("latest_alert_states", (), {}, False),
        ("session_ends", ([some_session, busiest, "no-such-session"],), {}, True),
        ("trace_sessions", (traces + ["0" * 32],), {}, True),
        ("session_step_counts", ([some_session, busiest, "no-such-session"],), {}, True),
        ("metric_series", (["vllm:num_requests_running", "vllm:kv_cache_usage_perc"],), {}, False),
        ("session_idle_losses", (last,), {}, False),
        ("session_events", (windows,), {"kinds": ATTRIBUTION_KINDS}, True),
        ("session_events", (windows,), {"kinds": ATTRIBUTION_KINDS, "chunk": 3}, True),
        ("session_events", ([],), {"kinds": ATTRIBUTION_KINDS}, True),
        ("runs", (), {}, True),
        ("step_verdicts", (), {}, True),
        ("step_verdicts", (), {"status": "error"}, True),
        ("step_verdicts", (), {"session_id": busiest}, True),
        ("step_verdicts", (), {"slow": True}, True),
        ("undecided_steps", (), {}, True),
        ("verdict_counts", (), {}, True),
        ("runs", (), {"instances": store.reads.instances()[-1:]}, True),
        ("request_lookups", (), {"session_id": some_session}, True),
        ("lookup_progress", (), {}, True),
        ("connector_lookups", (), {}, True),
        ("verdict_progress", (), {}, True),
        ("lookup_progress", (), {"instances": store.reads.instances()[-1:]}, True),
    ]
    one, none = {"instances": store.reads.instances()[-1:]}, {"instances": []}
    for since, until in ((None, None), middle):
        window = () if since is None else (since, until)
        calls += [
            (name, window, {}, False)
            for name in (
                "instance_snapshots",
                "session_footprints",
                "requests",
                "steps",
                "step_outcomes",
                "step_verdicts",
                "undecided_steps",
                "kv_event_counts",
                "block_losses",
                "stored_blocks",
                "alerts",
            )
        ]
        calls += [
            (name, window, scope, False)
            for scope in (one, none)
            for name in (
                "instance_snapshots",
                "session_footprints",
                "requests",
                "kv_event_counts",
                "block_losses",
                "stored_blocks",
            )
        ]
        calls += [("top_restored_blocks", window, {**scope, "limit": 10_000}, False) for scope in (one, none)]
        calls += [
            ("snapshot_times", (since, until, bucket), scope, True)
            for bucket in (5.0, 60.0)
            for scope in ({}, one, none)
        ]
        calls += [
            ("kv_event_counts", window, {"by_instance": True, "bucket_s": bucket}, False) for bucket in (5.0, 60.0)
        ] + [("kv_event_counts", window, {**one, "by_instance": True}, False)]
        calls += [
            ("kv_events", window, {}, True),
            ("top_restored_blocks", window, {"limit": 10_000}, False),
            ("stored_blocks", window, {"latest": 100}, True),
            ("stored_blocks", window, {"latest": 1, "unnamed": True}, True),
            ("kv_event_counts", window, {"bucket_s": 5.0}, False),
        ]
    calls += [("latest_kv_ts", (instance,), {}, True) for instance in [*store.reads.instances(), "no-such-instance"]]
    for since, until in ((first, last), middle):
        calls += [
            (name, (since, until), {}, False) for name in ("restored_blocks", "block_lifetimes", "cached_prompt_tokens")
        ]
        calls += [("step_windows", (since, until, bucket), {}, True) for bucket in (5.0, 60.0)]
        calls += [("block_history", (instance, since, until), {}, True) for instance in store.reads.instances()]
        calls += [
            ("minute_rollup", (rollup.table, since - 60.0, until + 60.0), {**scope, **bucket}, True)
            for rollup in ROLLUPS
            for scope in ({}, one, none)
            for bucket in ({}, {"bucket_s": 300.0})
        ]
        calls += [("request_lookups", (since, until), scope, True) for scope in ({}, one, none)]
        calls += [("connector_lookups", (since, until), {}, True)]
        calls += [
            ("step_counts", (since, until), {}, True),
            ("step_counts", (since, until), {"exclude_errors": ("timeout",)}, True),
            ("verdict_counts", (since, until), {}, True),
            ("instance_counter_before", ("preemptions_total", until), {}, True),
            ("instance_counter_before", ("preemptions_total", until), one, True),
        ]
    return calls


def test_every_read_gives_the_same_answer_on_every_backend(loaded):
    run, stores, _ = loaded
    reference = stores["sqlite"]
    calls = _calls(reference)
    # request_rows: inside requests; raw and minute counts: inside kv_event_counts (and the rollup test below);
    # raw_snapshot_times: inside snapshot_times
    assert {name for name, *_ in calls} >= (_members(Reads) | _members(Lookups)) - {
        "request_rows",
        "raw_counts",
        "minute_counts",
        "raw_snapshot_times",
    }, "a read the contract does not call"
    for name, args, kwargs, ordered in calls:
        expected = _values(_read(reference, name)(*args, **kwargs), ordered=ordered)
        for backend, store in stores.items():
            answer = _values(_read(store, name)(*args, **kwargs), ordered=ordered)
            assert answer == expected, f"{run}: {name}{args}{kwargs} differs on {backend}"


def test_alert_rules_fire_and_resolve_alike_on_every_backend(loaded):
    run, _, transitions = loaded
    assert any(transitions["sqlite"]), f"{run}: no built-in rule fired; the comparison would be empty"
    for backend, rounds in transitions.items():
        assert rounds == transitions["sqlite"], f"{run}: alert transitions differ on {backend}"


def test_routing_losses_and_step_causes_are_the_same_on_every_backend(loaded):
    """The fleet analyses over the reads (each request's routing loss, each step's causes with it, the hit-rate
    shortfall split) answer alike; on the fleet recording, requests dealt to `vllm-b` find prefixes only `vllm-a`
    held from before `vllm-b` started."""
    run, stores, _ = loaded
    answers = {}
    for backend, store in stores.items():
        first, last = store.reads.time_range()
        losses, check = fleet_losses(store, store.reads.requests(), store.reads.steps(), first, last)
        causes = step_causes(store, first, last)[["session_id", "step_index", "causes", "routed_tokens", "evidence"]]
        lookups, _ = store_lookups(store, store.reads.requests(), store.reads.steps(), first, last)
        split = shortfall(lookups, "instance")
        answers[backend] = (
            _values(losses, ordered=False),
            check.notes,
            _values(causes, ordered=False),
            _values(split, ordered=True),
        )
        assert answers[backend] == answers["sqlite"], f"{run}: routing losses or step causes differ on {backend}"
    losses = answers["sqlite"][0][1]
    if run == "served_fleet":  # the truth of its recording: each request's loss as the block managers showed it
        recorded = {rid: v["routed_blocks"] for rid, v in truth()["requests"].items()}
        columns = answers["sqlite"][0][0]
        rows = [dict(zip(columns, row)) for row in losses]
        assert {row["request_id"]: row["routed_blocks"] for row in rows} == recorded
    if run in ("fleet_run", "served_fleet"):
        assert losses and sum(row[-3] for row in losses) > 0, "the fleet recording shows no routing loss"
    else:
        assert not losses  # one instance: nothing to compare with
    assert answers["sqlite"][3][1], f"{run}: no request's chain known: the shortfall split compared nothing"


def test_the_contract_compares_something(loaded):
    """The recordings exercise what the reads are for: losses (or, where the cache never had to evict, the blocks the
    agents released), restores, lifetimes, sessions with steps."""
    _, stores, _ = loaded
    store = stores["chdb"]
    first, last = store.reads.time_range()
    counts = store.reads.kv_event_counts(bucket_s=1e12)
    assert losses_in(counts)["blocks"].sum() + releases_in(counts)["blocks"].sum() > 0
    assert not store.lookups.block_lifetimes(first, last).empty
    assert store.lookups.restored_blocks(first, last)["stored"].sum() > 0
    assert store.lookups.step_counts(first, last)[0] > 0
    decided, weighed = store.lookups.verdict_counts()
    assert 0 < weighed == decided and decided + len(store.reads.undecided_steps()) == len(store.reads.steps())


def test_the_rollup_answers_what_the_raw_rows_answer(loaded):
    """Per-minute rollup plus raw edges (`kv_event_counts`) equals counting the raw rows, on every backend, for windows
    that start and end inside a minute, on one, and over everything."""
    _, stores, _ = loaded
    first, last = stores["sqlite"].reads.time_range()
    minute = math.floor(first / 60) * 60.0
    windows = [(None, None), (first + 7.3, last - 11.9), (minute + 60, minute + 180), (first + 1, first + 30)]
    fleet = stores["sqlite"].reads.instances()
    scopes = [{}, {"by_instance": True}, {"instances": fleet[-1:], "by_instance": True}]
    for backend, store in stores.items():
        for since, until in windows:
            for bucket in (60.0, 300.0, 3600.0):
                for scope in scopes:
                    rolled = store.reads.kv_event_counts(since, until, bucket_s=bucket, **scope)
                    raw = ordered_counts(
                        store.reads.raw_counts(since, until, bucket, None, **scope), scope.get("by_instance", False)
                    )
                    assert _values(rolled, ordered=False) == _values(raw, ordered=False), (backend, bucket, scope)
                assert rolled["events"].sum() == len(
                    store.reads.kv_events(since, until)[lambda e: e["instance"].isin(fleet[-1:])]
                )


def _members(protocol) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def _read(store, name: str):
    """A read by name: the store's `reads` or `lookups`, whichever protocol has it."""
    return getattr(store.reads if name in _members(Reads) else store.lookups, name)
