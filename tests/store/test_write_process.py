"""Writes in a process of their own (`kvobs.store.sql.write_process`, `kvobs collect --write-process`): the same rows
and rollups as the writer in process, on SQLite and PostgreSQL; a child killed mid-run started again with nothing
lost; a refused row dropped alone; chDB refused with its reason."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pandas as pd
import pytest
from sqlalchemy import select

from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import KVEventColumns, RequestRecord, SessionRecord, SnapshotRecord, StepRecord
from kvobs.store.schema import ROLLUPS, TABLES
from kvobs.store.sql.write_process import WriteProcess
from tests.stores import postgres_schema, postgres_url

T0 = 1_800_000_000.0


def records(seed: int = 0) -> list[list]:
    """Batches as a collector makes them: KV events as columns (hashes across 64 bits), session upserts that give
    some columns only, instance snapshots with a preemption counter, requests and a step."""
    rng = random.Random(seed)
    batches = []
    for b in range(20):
        n = rng.randint(1, 300)
        ts = T0 + b * 7.5
        batches.append(
            [
                KVEventColumns(
                    ts=[ts] * n,
                    instance=["a"] * n,
                    kind=[rng.choice(["stored", "removed"]) for _ in range(n)],
                    block_hash=[rng.getrandbits(64) for _ in range(n)],
                    parent_hash=[None if i == 0 else rng.getrandbits(64) for i in range(n)],
                    session_id=[rng.choice(["s1", "s2", None]) for _ in range(n)],
                    first_owner=[1] * n,
                    num_tokens=[16] * n,
                )
            ]
        )
        batches.append(
            [
                SessionRecord("s1", started_at=T0) if b == 0 else SessionRecord("s1", num_steps=b),
                SnapshotRecord(ts=ts, instance="a", kv_usage=rng.random(), preemptions_total=b // 3),
                RequestRecord(request_id=f"r{b}", instance="a", arrival_ts=ts, first_token_ts=ts + 0.2),
                StepRecord(session_id="s1", step_index=b, started_at=ts, ended_at=ts + 1, status="ok"),
            ]
        )
    return batches


def write(target, batches: list[list]) -> None:
    writer = StoreWriter(target, batch_size=400, flush_interval_s=0.05)
    for batch in batches:
        for item in batch:
            if isinstance(item, KVEventColumns):
                writer.add_many(item)
            elif isinstance(item, SessionRecord):
                writer.upsert(item)
            else:
                writer.add(item)
    writer.close()


def table(store, row_class) -> pd.DataFrame:
    columns = [c for c in row_class.__table__.columns if c.name != "id"]
    with store.engine.connect() as conn:
        frame = pd.DataFrame(conn.execute(select(*columns)).all(), columns=[c.name for c in columns])
    for name in frame.columns:  # JSON values (labels, attributes) as text, so rows sort and compare
        if frame[name].map(lambda v: isinstance(v, dict | list)).any():
            frame[name] = frame[name].map(lambda v: json.dumps(v, sort_keys=True))
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def two_urls(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'in.db'}", f"sqlite:///{tmp_path / 'child.db'}"
        return
    with postgres_schema() as first, postgres_schema() as second:
        yield (postgres_url(s) for s in (first, second))


def test_the_write_process_stores_what_the_writer_in_process_stores(two_urls, caplog):
    here_url, child_url = two_urls
    here, there = open_store(here_url), open_store(child_url)  # both migrated by the open
    write(here, records())
    writes = WriteProcess(child_url)
    write(writes, records())
    writes.close()
    assert writes.num_starts == 1
    for row_class in (*TABLES.values(), *ROLLUPS.values()):
        pd.testing.assert_frame_equal(table(there, row_class), table(here, row_class), check_dtype=False)
    sessions = table(there, TABLES["sessions"])
    assert sessions.loc[0, "started_at"] == T0 and sessions.loc[0, "num_steps"] == 19  # upserts kept what they left
    assert len(table(there, TABLES["kv_events"])) > 1000
    assert "refused" not in caplog.text  # every batch written whole, none row by row
    here.close(), there.close()


def test_a_killed_write_process_is_started_again_and_nothing_is_lost(tmp_path):
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    store = open_store(url)
    writes = WriteProcess(url)
    assert writes._process is not None
    os.kill(writes._process.pid, signal.SIGKILL)
    writes._process.wait(10)
    writer = StoreWriter(writes, max_backoff_s=0.2)
    writer.add(SnapshotRecord(ts=T0, instance="a", kv_usage=0.5))
    writer.close()
    writes.close()
    assert writes.num_starts == 2 and writer.num_written == 1 and writer.num_dropped == 0
    assert store.reads.instance_snapshots()["kv_usage"].tolist() == [0.5]
    store.close()


def test_a_row_the_database_refuses_is_dropped_alone(tmp_path):
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    store = open_store(url)
    writes = WriteProcess(url)
    writer = StoreWriter(writes)
    bad = KVEventColumns(ts=[T0] * 3, instance=["a"] * 3, kind=["stored"] * 3, block_hash=[1, 2**64, 3])
    writer.add_many(bad)  # 2**64 is no unsigned 64-bit hash: the row is refused, its neighbours kept
    writer.close()
    writes.close()
    assert writer.num_dropped == 1 and writer.num_written == 2
    assert sorted(store.reads.kv_events()["block_hash"]) == [1, 3]
    store.close()


def test_chdb_is_refused_with_its_reason(tmp_path):
    with pytest.raises(ValueError, match="one holder per process"):
        WriteProcess(f"chdb:///{tmp_path / 'ch'}")


def test_a_script_without_a_main_guard_can_start_it(tmp_path):
    """The child is a fresh `python -m kvobs.store.sql.write_process`, so the script that starts it is never run again
    there (multiprocessing's spawn runs the parent's `__main__` in the child: under Streamlit's AppTest that was the
    dashboard app, and the child died as it started)."""
    script = tmp_path / "no_guard.py"
    script.write_text(
        "from kvobs.store import StoreWriter, open_store\n"
        "from kvobs.store.rows import SnapshotRecord\n"
        "from kvobs.store.sql.write_process import WriteProcess\n"
        f"url = 'sqlite:///{tmp_path / 'kvobs.db'}'\n"
        "store = open_store(url)\n"
        "writes = WriteProcess(url)\n"
        "writer = StoreWriter(writes)\n"
        "writer.add(SnapshotRecord(ts=1.0, instance='a', kv_usage=0.25))\n"
        "writer.close(); writes.close()\n"
        "print(store.reads.instance_snapshots()['kv_usage'].tolist(), writes.num_starts)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[0.25] 1"
