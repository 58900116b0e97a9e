"""The writer's on-disk spool: what was accepted survives a kill or a shutdown while the store is down; a frame cut
off mid-write is ignored; committed segments are deleted; session upserts keep which columns they write."""

from __future__ import annotations

import sqlite3

from sqlalchemy import func, select

from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import UNSET, KVEventRecord, SessionRecord
from kvobs.store.schema import KVEventRow, SessionRow
from kvobs.store.spool import Spool


def _event(i: int) -> KVEventRecord:
    return KVEventRecord(ts=1000.0 + i, instance="e", kind="stored", block_hash=2**64 - 1 - i, session_id="s")


def test_items_round_trip_and_a_cut_off_frame_is_ignored(tmp_path):
    spool = Spool(tmp_path)
    first = spool.append("insert", [_event(0), _event(1)])
    spool.append("upsert", [SessionRecord("s", num_steps=3)])
    spool.close()
    segment = next(tmp_path.glob("seg-*.log"))
    with segment.open("ab") as f:
        f.write(b"\x00\x00\x10\x00partial")  # a kill in the middle of the next write
    again = Spool(tmp_path)
    items = list(again.backlog())
    assert [seq for seq, *_ in items] == [first, first + 1] and again.num_backlog == 2
    assert items[0][1:] == ("insert", [_event(0), _event(1)])
    session = items[1][2][0]
    assert session.num_steps == 3 and session.agent_name is UNSET  # only the columns it writes
    assert again.append("insert", [_event(2)]) == first + 2  # numbering goes on after the backlog


def test_committed_items_are_not_replayed_and_their_segments_are_deleted(tmp_path):
    spool = Spool(tmp_path, segment_bytes=400)  # a few items a segment
    seqs = [spool.append("insert", [_event(i)]) for i in range(20)]
    assert len(list(tmp_path.glob("seg-*.log"))) > 3
    spool.commit(seqs[14])
    spool.close()
    again = Spool(tmp_path)
    assert [seq for seq, *_ in again.backlog()] == seqs[15:]
    assert len(list(tmp_path.glob("seg-*.log"))) <= 3


def _count(store, row) -> int:
    with store.session() as s:
        return s.scalar(select(func.count()).select_from(row))


def test_a_shutdown_while_the_store_is_down_keeps_the_rows_for_the_next_start(tmp_path):
    """Without a spool these rows are dropped and counted ("store unreachable at shutdown")."""
    path = tmp_path / "kvobs.db"
    store = open_store(f"sqlite:///{path}")
    writer = StoreWriter(store, spool=Spool(tmp_path / "spool"), max_backoff_s=0.1)
    holder = sqlite3.connect(path, timeout=0)
    holder.execute("BEGIN EXCLUSIVE")  # the store cannot commit: as unreachable as a server that is down
    for i in range(500):
        writer.add(_event(i))
    writer.upsert(SessionRecord("s", num_steps=2, agent_name="ops"))
    writer.close(timeout_s=10)
    holder.rollback()
    holder.close()
    assert writer.num_dropped == 0 and _count(store, KVEventRow) == 0
    restarted = StoreWriter(store, spool=Spool(tmp_path / "spool"))
    restarted.add(_event(500))
    restarted.close()
    assert _count(store, KVEventRow) == 501 and restarted.num_written == 502
    with store.session() as s:
        assert s.scalars(select(SessionRow.num_steps)).one() == 2
    assert list(Spool(tmp_path / "spool").backlog()) == []  # all committed now
    store.close()
