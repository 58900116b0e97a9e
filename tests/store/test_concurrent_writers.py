"""Several writers into one store at once (collectors of one fleet, an engine beside them): a new store migrated by
all of them at the same moment, and upserts of the same sessions in opposite orders, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading

from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import KVEventRecord, SessionRecord


def test_writers_opening_a_new_store_at_once_all_migrate_it(store_url):
    """Unserialised, all but one of three processes failed creating tables that another had just created."""
    code = f"from kvobs.store import open_store; open_store({store_url!r}).close()"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], errors
    store = open_store(store_url)
    assert store.reads.instances() == []
    store.close()


def test_writers_upserting_shared_sessions_in_opposite_orders_lose_nothing(store_url):
    """Two writers (two connections) upsert the same sessions, one in ascending and one in descending order, with
    each batch's KV events and minute rollup: rows are written in key order, so neither waits on the other in a
    cycle (PostgreSQL's deadlock), and nothing is dropped."""
    stores = [open_store(store_url) for _ in range(2)]
    sessions = [f"s{i:03d}" for i in range(60)]
    writers = [StoreWriter(store, batch_size=200, flush_interval_s=0.01) for store in stores]

    def write(k: int) -> None:
        order = sessions if k == 0 else sessions[::-1]
        for round_ in range(15):
            for session in order:
                writers[k].upsert(SessionRecord(session, num_steps=round_, agent_name=f"writer-{k}"))
                writers[k].add(KVEventRecord(ts=1000.0 + round_, instance=f"i{k}", kind="stored", session_id=session))
            writers[k].flush()

    threads = [threading.Thread(target=write, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for writer in writers:
        writer.close()
    assert [w.num_dropped for w in writers] == [0, 0]
    assert [w.num_failed_attempts for w in writers] == [0, 0]  # no deadlock to retry
    assert [w.num_written for w in writers] == [2 * 60 * 15] * 2
    store = stores[0]
    assert len(store.reads.sessions()) == 60 and set(store.reads.sessions()["num_steps"]) == {14}
    counts = store.reads.kv_event_counts()
    assert counts["events"].sum() == 2 * 60 * 15
    for s in stores:
        s.close()
