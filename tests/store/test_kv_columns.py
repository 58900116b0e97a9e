"""`KVEventColumns`: KV events handed to the writer as columns are stored exactly as the same rows given as records
(values, hashes at the edges of 64 bits, NULLs, the clock's columns, the per-minute rollup) on SQLite, PostgreSQL
and chDB; a refused row among them is dropped alone; the spool keeps them across a restart; a misspelt or ragged
column fails at once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvobs.store import StoreWriter
from kvobs.store.rows import KVEventColumns, KVEventRecord
from kvobs.store.runs import Runs, as_list, is_null
from kvobs.store.spool import Spool

HASHES = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, None]


def _records(instance: str) -> list[KVEventRecord]:
    rows = []
    for i, block in enumerate(HASHES):
        rows.append(
            KVEventRecord(
                ts=59.5 + i * 0.25,
                instance=instance,
                kind="stored" if i % 2 else "removed",
                block_hash=block,
                parent_hash=HASHES[i - 1] if i else None,
                num_tokens=16,
                session_id=f"s{i % 2}",
                medium="GPU",
                first_owner=None if block is None else 1,
                reason="capacity" if i == 5 else None,
                lifetime_s=None if i % 2 else 0.25 * i,  # on the removals
                restored=i // 3 if i % 2 else None,
                restored_after_s=2.5 if i == 3 else None,
            )
        )
    return rows


def _columns(records: list[KVEventRecord]) -> KVEventColumns:
    names = KVEventRecord._columns
    return KVEventColumns(**{name: [getattr(r, name) for r in records] for name in names})


def test_columns_store_what_the_same_records_store(any_store, caplog):
    writer = StoreWriter(any_store)
    writer.add_many(_records("as-records"))
    writer.add_many(_columns(_records("as-columns")))
    writer.close()
    assert "refused" not in caplog.text  # written in one batch, not row by row after a failure
    events = any_store.reads.kv_events().drop(columns=["id"], errors="ignore")
    given = events[events["instance"] == "as-records"].drop(columns="instance").reset_index(drop=True)
    columns = events[events["instance"] == "as-columns"].drop(columns="instance").reset_index(drop=True)
    assert len(given) == len(HASHES) and given.astype(str).equals(columns.astype(str))
    assert [None if h != h else h for h in columns["block_hash"]] == HASHES  # every edge of 64 bits, and NULL
    counts = any_store.reads.kv_event_counts(bucket_s=60.0, by_instance=True)
    per = {inst: frame.drop(columns="instance").reset_index(drop=True) for inst, frame in counts.groupby("instance")}
    assert per["as-records"].equals(per["as-columns"]) and per["as-columns"]["events"].sum() == len(HASHES)


def test_a_refused_row_among_columns_is_dropped_alone(any_store):
    writer = StoreWriter(any_store)
    records = _records("e")
    bad = KVEventRecord(ts=61.0, instance="e", kind="stored", block_hash=2**64)  # no column holds it
    writer.add_many(_columns([*records[:3], bad, *records[3:]]))
    writer.close()
    assert (writer.num_written, writer.num_dropped) == (len(HASHES), 1)
    assert len(any_store.reads.kv_events()) == len(HASHES)


def test_the_spool_keeps_columns_across_a_restart(tmp_path):
    spool = Spool(tmp_path / "spool")
    spool.append("insert", _columns(_records("e")))
    runs = _columns(_records("e")).lists()
    spool.append("insert", KVEventColumns(**{**runs, "instance": Runs.of("e", len(HASHES))}))  # (as the ingest's)
    spool.close()
    (seq, op, columns), (_, _, held_as_runs), *rest = list(Spool(tmp_path / "spool").backlog())
    assert not rest and op == "insert" and isinstance(columns, KVEventColumns)
    assert list(columns) == _records("e") and list(held_as_runs) == _records("e")


def test_columns_are_checked_when_made():
    with pytest.raises(TypeError, match="blok_hash"):
        KVEventColumns(ts=[1.0], instance=["e"], kind=["stored"], blok_hash=[1])
    with pytest.raises(ValueError, match="differ in length"):
        KVEventColumns(ts=[1.0, 2.0], instance=["e"], kind=["stored"])
    with pytest.raises(TypeError, match="'kind'"):
        KVEventColumns(ts=[1.0], instance=["e"])
    assert len(KVEventColumns()) == 0


def test_the_collectors_row_builder_fills_every_column_of_the_record_from_each_setter():
    """The collector's batch builder (`BatchRows`) has `KVEventRecord`'s columns, less the batch's own `ts` and
    `instance` and the `request_id` no engine's KV events carry; each of its setters (a store, a removal, a single
    row) fills every one of them, so a field added to the record fails here until its setter writes it."""
    from collectors.kv.batch_rows import COLUMNS, BatchRows
    from kvobs.block_events import Stored

    rows = BatchRows()
    assert set(COLUMNS) | {"ts", "instance", "request_id"} == set(KVEventRecord._columns)
    rows.stored(Stored([7, 8], 6, 16, "GPU", 0, "s1", lora_name="a", extra_keys=['["img"]', None]))
    assert {len(values) for values in rows.columns().values()} == {2}
    rows.removed([7], [6], ["s1"], [1], [3.0], medium="GPU", num_tokens=16, group_idx=0, reason="ttl")
    assert {len(values) for values in rows.columns().values()} == {3}
    rows.add("cleared", reason="reset", num_blocks=3)
    assert {len(values) for values in rows.columns().values()} == {4} and len(rows) == 4
    with pytest.raises(TypeError, match="medum"):
        rows.add("cleared", medum="GPU")
    made = {name: as_list(values) for name, values in rows.columns().items()}
    by_row = [dict(zip(made, values)) for values in zip(*made.values())]
    assert {k: v for k, v in by_row[1].items() if v is not None} == {
        "kind": "stored",
        "block_hash": 8,
        "parent_hash": 7,
        "session_id": "s1",
        "medium": "GPU",
        "first_owner": 1,
        "num_tokens": 16,
        "group_idx": 0,
        "lora_name": "a",
        "restored": 0,  # (no clock said it came back)
    }
    assert {k: v for k, v in by_row[2].items() if v is not None} == {
        "kind": "removed",
        "block_hash": 7,
        "parent_hash": 6,
        "session_id": "s1",
        "medium": "GPU",
        "first_owner": 1,
        "num_tokens": 16,
        "group_idx": 0,
        "reason": "ttl",
        "lifetime_s": 3.0,
    }
    assert by_row[0]["extra_keys"] == '["img"]' and by_row[3]["num_blocks"] == 3
    KVEventColumns(ts=[0.0] * 4, instance=["vllm-a"] * 4, **rows.columns())  # every name one the store takes


def test_columns_held_as_runs_store_what_the_same_lists_store(any_store):
    """Runs (a value a run of rows: what the collector's rows share within an event) store the rows their lists
    store, on every backend: a run of one value, of several, a column of NULL runs (left out of ClickHouse's
    insert), and runs joined from batches written together."""
    records = _records("as-lists")
    records[1] = replace(records[1], ts=records[2].ts)  # (two rows of one time, at the rollup's minute edge)
    lists = _columns(records).lists()
    runs = dict(lists, instance=Runs.of("as-runs", len(records)), num_tokens=Runs.of(16, len(records)))
    runs["kind"] = Runs(["removed", "stored"] * 3, [1] * 6)
    runs["reason"] = Runs([None, "capacity"], [5, 1])
    runs["group_idx"] = Runs.of(None, len(records))
    runs["ts"] = Runs(lists["ts"][:2] + lists["ts"][3:], [1, 2, 1, 1, 1])
    half = len(records) // 2
    first = {name: (values.expanded() if isinstance(values, Runs) else values)[:half] for name, values in runs.items()}
    rest = {name: (values.expanded() if isinstance(values, Runs) else values)[half:] for name, values in runs.items()}
    first["kind"], first["num_tokens"] = Runs(["removed", "stored", "removed"], [1, 1, 1]), Runs.of(16, half)
    writer = StoreWriter(any_store)
    writer.add_many(_columns(records))
    writer.add_many(KVEventColumns(**runs))
    # every key column's runs of the same edges (the rollup sums a run, not a row), and a run of no rows at the end
    edges, n = [1] * len(records) + [0], len(records)
    shared = dict(runs, instance=Runs.of("event-runs", n), ts=Runs([*lists["ts"], 61.0], edges, n))
    shared.update(kind=Runs([*lists["kind"], "cleared"], edges, n), reason=Runs([*lists["reason"], "reset"], edges, n))
    writer.add_many(KVEventColumns(**shared))
    writer.add_many(KVEventColumns(**{**first, "instance": Runs.of("joined", half)}))
    writer.add_many(KVEventColumns(**{**rest, "instance": Runs.of("joined", len(records) - half)}))
    writer.close()
    events = any_store.reads.kv_events().drop(columns=["id"], errors="ignore")
    by = {inst: frame.drop(columns="instance").reset_index(drop=True) for inst, frame in events.groupby("instance")}
    assert len(by["as-lists"]) == len(HASHES)
    assert by["as-lists"].astype(str).equals(by["as-runs"].astype(str))
    assert by["as-lists"].astype(str).equals(by["joined"].astype(str))
    assert by["as-lists"].astype(str).equals(by["event-runs"].astype(str))
    # the per-minute rollup, summed a row or a run (where every key's runs share their edges), equals the rows'
    counts = any_store.reads.kv_event_counts(bucket_s=60.0, by_instance=True)
    per = {inst: frame.drop(columns="instance").reset_index(drop=True) for inst, frame in counts.groupby("instance")}
    assert all(per["as-lists"].equals(per[name]) for name in ("as-runs", "joined", "event-runs"))
    assert per["as-runs"]["events"].sum() == len(HASHES)


def test_parts_whose_event_columns_share_their_runs_store_what_their_lists_store(any_store):
    """One write of several parts, each part's event columns sharing one list of run lengths as the collector's row
    builder makes them (ClickHouse joins those lengths once and takes by one index), a column of one value over many
    runs, a column NULL in some parts only: the rows of the same lists, on every backend."""
    sizes = (2, 3, 1)
    groups = [group for group, size in enumerate(sizes) for _ in range(size)]
    records = [replace(record, group_idx=group) for record, group in zip(_records("lists"), groups)]
    lists = _columns(records).lists()
    parts, start = [], 0
    for group, size in enumerate(sizes):
        rows = slice(start, start + size)
        lengths = [1] * size  # one list, shared by the part's event columns (`BatchRows.columns`)
        part = {name: values[rows] for name, values in lists.items()}
        part.update({name: Runs(lists[name][rows], lengths, size) for name in ("kind", "reason", "num_tokens")})
        part.update(instance=Runs.of("parts", size), medium=Runs(["GPU"] * size, lengths, size))
        part["group_idx"] = Runs.of(group, size)  # (runs of their own lengths, a value a part)
        part["ts"] = Runs(lists["ts"][rows], lengths, size)
        parts.append(("insert", KVEventColumns(**part)))
        start += size
    assert start == len(records) and [p.columns["reason"].is_null() for _, p in parts] == [True, True, False]
    any_store.write([("insert", _columns(records))])
    any_store.write(parts)  # (alone: a part of lists in the same write would make every column a list)
    events = any_store.reads.kv_events().drop(columns=["id"], errors="ignore")
    by = {inst: frame.drop(columns="instance").reset_index(drop=True) for inst, frame in events.groupby("instance")}
    assert len(by["lists"]) == len(HASHES)
    assert by["lists"].astype(str).equals(by["parts"].astype(str))


def test_a_part_of_no_rows_among_runs_stores_nothing_and_fails_nothing(any_store):
    """Columns of runs with no run at all (a batch that made no row) beside a part with rows."""
    empty = Runs([], [], 0)
    records = _records("rows")
    rows = {name: Runs(values, [1] * len(values)) for name, values in _columns(records).lists().items()}
    any_store.write(
        [("insert", KVEventColumns(ts=empty, instance=empty, kind=empty)), ("insert", KVEventColumns(**rows))]
    )
    any_store.write([("insert", KVEventColumns(ts=empty, instance=empty, kind=empty))])
    assert len(any_store.reads.kv_events()) == len(records)


def test_runs_expand_and_join():
    kind = Runs(["stored", "removed"], [3, 1])
    assert len(kind) == 4 and kind.expanded() == ["stored"] * 3 + ["removed"]
    joined = Runs.joined([kind, Runs.of(None, 2)])
    assert joined.expanded() == [*kind.expanded(), None, None] and not joined.is_null()
    assert Runs.of(None, 3).is_null() and as_list([1, 2]) == [1, 2]
    assert is_null([]) and is_null([None, None]) and not is_null([None, 0, None]) and not is_null([None, "s"])
    assert Runs.joined([]).is_null() and len(Runs.joined([Runs([], [], 0)])) == 0
    with pytest.raises(ValueError, match="2 values for 1 runs"):
        Runs([1, 2], [3])
    columns = KVEventColumns(ts=Runs.of(1.0, 4), instance=["e"] * 4, kind=kind)
    assert [r.kind for r in columns] == kind.expanded() and columns.column("ts") == [1.0] * 4
    with pytest.raises(ValueError, match="differ in length"):
        KVEventColumns(ts=Runs.of(1.0, 3), instance=["e"] * 4, kind=kind)
