"""The per-minute rollups of instance snapshots and requests (`kvobs.store.rollups`) on SQLite, PostgreSQL and chDB:
whatever batches the rows come in, and across a writer's restart, the rollup tables hold what the rows give; SQL
revision 0014 and ClickHouse version 10 fill them from rows stored before them."""

from __future__ import annotations

import random
from dataclasses import replace

import pandas as pd
from sqlalchemy import insert

from kvobs.analytics.windows import BIN_KEYS, KEYS, RangeSums
from kvobs.semconv.spans import CachedFrom
from kvobs.store import StoreWriter, open_store
from kvobs.store.rollups import (
    LATENCY_MINUTES,
    LOOKUP_MINUTES,
    MISS_PARTS,
    REQUEST_MINUTES,
    SNAPSHOT_MINUTES,
    lookup_sums,
)
from kvobs.store.rows import RequestLookupRecord, RequestRecord, SnapshotRecord
from kvobs.store.schema import TABLES
from kvobs.store.sql.store import upgrade
from tests.analytics.test_windows import assert_same

T0 = 1_800_000_017.0  # not on a minute: rows of one minute meet across batches


def _rows(seed: int = 1) -> list:
    """Snapshots of two instances every 2.5 s over 10 minutes (a preemption counter that rises and resets once,
    usage sometimes unknown) and requests between them (some with latencies or cached tokens unknown)."""
    rng = random.Random(seed)
    rows: list = []
    counts = {"a": 0, "b": 5}
    for i in range(240):
        ts = T0 + i * 2.5
        for name in counts:
            counts[name] = 0 if (name == "b" and i == 120) else counts[name] + rng.choice([0, 0, 1, 2])
            rows.append(
                SnapshotRecord(
                    ts=ts,
                    instance=name,
                    kv_usage=None if rng.random() < 0.1 else rng.random(),
                    blocks_resident=rng.randrange(100),
                    num_waiting=rng.randrange(4),
                    preemptions_total=None if rng.random() < 0.05 else counts[name],
                )
            )
        if rng.random() < 0.1:  # a session's own snapshot: not an instance's
            rows.append(SnapshotRecord(ts=ts, instance="a", session_id="s1", session_blocks=3))
        arrival = ts + rng.random()
        first = None if rng.random() < 0.1 else arrival + rng.lognormvariate(-2, 1)
        rows.append(
            RequestRecord(
                request_id=f"r{i}",
                instance=rng.choice(["a", "b"]),
                arrival_ts=arrival,
                first_token_ts=first,
                finished_ts=(first or arrival) + rng.random() * 3,
                queue_s=rng.random() / 10,
                prompt_tokens=rng.randrange(50, 500),
                cached_tokens=None if rng.random() < 0.2 else rng.randrange(50),
                completion_tokens=rng.randrange(1, 40),
            )
        )
    return rows


def _expected(rows: list) -> RangeSums:
    snaps = pd.DataFrame([r.to_row() for r in rows if isinstance(r, SnapshotRecord) and r.session_id is None])
    reqs = pd.DataFrame([r.to_row() for r in rows if isinstance(r, RequestRecord)])
    return RangeSums.from_rows(snaps, reqs, 60.0)


def _stored(store) -> dict[str, pd.DataFrame]:
    return {
        rollup.table: store.reads.minute_rollup(rollup.table, 0, 4e9).rename(columns={"minute": "window"})
        for rollup in (SNAPSHOT_MINUTES, REQUEST_MINUTES, LATENCY_MINUTES)
    }


def _assert_rollups(store, rows: list) -> None:
    want, got = _expected(rows), _stored(store)
    assert_same(got["snapshot_minutes"], want.snapshots, KEYS)
    assert_same(got["request_minutes"], want.requests, KEYS)
    assert_same(got["latency_minutes"], want.latency, BIN_KEYS)
    assert got["snapshot_minutes"]["preemptions"].sum() > 0


def test_the_rollups_hold_what_the_rows_give_whatever_the_batches(any_store, tmp_path):
    rows = _rows()
    writer = StoreWriter(any_store, batch_size=7)  # batches of 7 rows: a minute's rows in many batches
    writer.add_many(rows[: len(rows) // 2])
    writer.close()
    url = any_store.url
    if not url.startswith("chdb"):  # a restarted writer counts from the count it finds stored (chDB: one per dir)
        any_store.close()
        any_store = open_store(url)
    writer = StoreWriter(any_store, batch_size=500)
    writer.add_many(rows[len(rows) // 2 :])
    writer.close()
    _assert_rollups(any_store, rows)


def test_a_rollup_read_of_some_metrics_holds_their_rows_alone(any_store):
    """`metrics=` narrows the latency sketch to those latencies, per minute and merged per window alike (the
    Overview reads TTFT's alone), with the same rows as the whole read has for them."""
    writer = StoreWriter(any_store)
    writer.add_many(_rows())
    writer.close()
    table = LATENCY_MINUTES.table
    for bucket in (None, 300.0):
        whole = any_store.reads.minute_rollup(table, 0, 4e9, bucket_s=bucket)
        ttft = any_store.reads.minute_rollup(table, 0, 4e9, bucket_s=bucket, metrics=["ttft"])
        assert set(whole["metric"]) == {"ttft", "itl", "queue"} and set(ttft["metric"]) == {"ttft"}
        mine = whole[whole["metric"] == "ttft"].reset_index(drop=True)
        pd.testing.assert_frame_equal(ttft.reset_index(drop=True), mine, check_dtype=False)
        assert any_store.reads.minute_rollup(table, 0, 4e9, bucket_s=bucket, metrics=[]).empty


def test_revision_0014_fills_the_rollups_from_stored_rows(store):
    from alembic import command
    from alembic.config import Config

    from kvobs.store.sql.store import MIGRATIONS

    rows = _rows(2)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as connection:  # the store as it was before revision 0014
        config.attributes["connection"] = connection
        command.downgrade(config, "0013")
    early = [r for r in rows if getattr(r, "ts", getattr(r, "arrival_ts", 0)) < T0 + 300]
    with store.engine.begin() as conn:  # stored before the rollups existed: only the rows
        for table in ("snapshots", "requests"):
            old = [{k: v for k, v in r.to_row().items() if k != "cached_from"} for r in early if r.table == table]
            conn.execute(insert(TABLES[table]), old)  # (cached_from came with revision 0024)
    upgrade(store.engine)
    writer = StoreWriter(store)
    writer.add_many([r for r in rows if r not in early])
    writer.close()
    _assert_rollups(store, rows)


def test_clickhouse_version_10_fills_the_rollups_from_stored_rows(tmp_path):
    from kvobs.store.clickhouse import ddl
    from kvobs.store.clickhouse.store import _columns_of

    url = f"chdb:///{tmp_path / 'ch'}"
    first = open_store(url, migrate=False)
    ddl.migrate_to(first.client, 9)
    rows = _rows(3)
    early = [r for r in rows if getattr(r, "ts", getattr(r, "arrival_ts", 0)) < T0 + 300]
    for table in ("snapshots", "requests"):  # stored before the rollups existed: only the rows
        columns = _columns_of([r.to_row() for r in early if r.table == table])
        first.client.insert(table, first._arrow(table, columns))
    first.close()
    store = open_store(url)
    writer = StoreWriter(store)
    writer.add_many([r for r in rows if r not in early])
    writer.close()
    _assert_rollups(store, rows)
    store.close()


def _lookups(seed: int = 4) -> list[RequestLookupRecord]:
    """Request lookups of three instances over 10 minutes, as a routing meter writes them (some compared with
    another replica, some not)."""
    rng = random.Random(seed)
    out = []
    for i in range(300):
        size = rng.choice([16, 16, 32])
        blocks = rng.randrange(1, 40)
        own = rng.randrange(blocks + 1)
        parts = dict.fromkeys(MISS_PARTS, 0)
        for _ in range(blocks - own):
            parts[rng.choice(MISS_PARTS)] += 1
        compared = rng.choice([0, 1, 2])
        out.append(
            RequestLookupRecord(
                request_id=f"q{i}",
                instance=rng.choice(["a", "b", "c"]),
                lookup_ts=T0 + i * 2.0 + rng.random(),
                prompt_tokens=blocks * size + rng.randrange(1, size + 1),
                block_size=size,
                prompt_blocks=blocks,
                own_blocks=own,
                tier_blocks=rng.randrange(own + 1),
                available_blocks=blocks - parts["cold"],
                best_blocks=own + parts["routed"] if compared else 0,
                replicas_compared=compared,
                measured_at=T0 + 900.0,
                session_id=f"s{i % 7}",
                **{f"{part}_blocks": n for part, n in parts.items()},
            )
        )
    return out


def test_the_lookup_rollup_holds_what_the_measured_lookups_give(any_store):
    rows = _lookups()
    writer = StoreWriter(any_store, batch_size=7)
    writer.add_many(rows)
    writer.close()
    want = lookup_sums(pd.DataFrame([r.to_row() for r in rows]), 60.0)
    got = any_store.reads.minute_rollup(LOOKUP_MINUTES.table, 0, 4e9).rename(columns={"minute": "window"})
    assert_same(got, want, KEYS)
    assert want["compared_requests"].sum() > 0 and want["routed_tokens"].sum() > 0
    assert got["requests"].sum() == len(rows)
    stored = any_store.reads.request_lookups(T0 + 100.0, T0 + 200.0, instances=["a"])
    expected = sorted(r.request_id for r in rows if r.instance == "a" and T0 + 100.0 <= r.lookup_ts <= T0 + 200.0)
    assert sorted(stored["request_id"]) == expected and len(expected) > 5
    assert list(any_store.reads.request_lookups(session_id="s3")["session_id"].unique()) == ["s3"]


def test_cached_tokens_learnt_after_a_requests_row_fill_it_and_its_minute_once(any_store):
    """vLLM's request spans say no cached tokens; the joined step's reply does, later (`StoreWriter.fill_cached`).
    Each request with none is filled (some in their row's batch, some batches later), a request the server counted
    itself is left as it was, and a fill sent twice counts once: the rows say where each count came from, and the
    request minutes hold what the final rows give (a request counted once; its cached counts added by the fill)."""
    rows = [r for r in _rows(5) if isinstance(r, RequestRecord)]
    rows = [r if r.cached_tokens is None else replace(r, cached_from=CachedFrom.SERVER.value) for r in rows]
    unknown = [r for r in rows if r.cached_tokens is None]
    assert len(unknown) >= 10
    final = {r.request_id: r for r in rows}
    writer = StoreWriter(any_store, batch_size=7)
    for i, row in enumerate(rows):
        writer.add(row)
        if row.cached_tokens is None:
            filled = replace(row, cached_tokens=row.prompt_tokens // (2 + i % 3), cached_from=CachedFrom.REPLY.value)
            final[row.request_id] = filled
            writer.fill_cached(filled)
            if i % 4 == 0:
                writer.fill_cached(replace(filled, cached_tokens=1))  # told again: the first count stays
    known = next(r for r in rows if r.cached_tokens is not None)
    writer.fill_cached(replace(known, cached_tokens=known.cached_tokens + 1, cached_from=CachedFrom.REPLY.value))
    writer.close()
    stored = any_store.reads.request_rows(0, 4e9).set_index("request_id")
    assert len(stored) == len(rows) and stored["cached_tokens"].notna().all()
    for request_id, want in final.items():
        assert stored.at[request_id, "cached_tokens"] == want.cached_tokens
        assert stored.at[request_id, "cached_from"] == want.cached_from
    want, got = _expected(list(final.values())), _stored(any_store)
    assert_same(got["request_minutes"], want.requests, KEYS)
    assert got["request_minutes"]["requests"].sum() == len(rows)
    assert got["request_minutes"]["cached_said"].sum() == len(rows)
