"""A collector's leases on its replicas: a second collector naming a held replica does not start; one whose lease was
taken while it stalled stops writing that replica (logged, counted) and takes it back once it is free."""

from __future__ import annotations

import logging
import time

import pytest

from collectors.collector import Collector, CollectorOptions
from kvobs.store import open_store
from kvobs.store.leases import LeaseKeeper, LeaseRefused


def test_a_second_collector_naming_a_held_replica_does_not_start(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    options = CollectorOptions(kv_events=["vllm-a=tcp://127.0.0.1:0"], kv_events_bind=True, interval_s=3600)
    first = Collector(options, store=store)
    first.start()
    try:
        second = Collector(options, store=store)
        with pytest.raises(LeaseRefused, match=f"vllm-a held by {first.leases.holder}"):
            second.start()
        second.stop()  # a collector that did not start stops cleanly, and leaves the first's lease alone
        assert [lease.holder for lease in store.leases.current()] == [first.leases.holder]
    finally:
        first.stop()
    assert store.leases.current() == []  # released at stop: a successor starts at once
    third = Collector(options, store=store)
    third.start()
    third.stop()
    store.close()


def test_a_lease_taken_while_stalled_is_said_counted_and_taken_back(tmp_path, caplog):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    mine = LeaseKeeper(store.leases, ["vllm-a", "vllm-b"], role="collect", ttl_s=8.0)
    other = LeaseKeeper(store.leases, ["vllm-a"], role="collect", ttl_s=8.0)
    mine.claim()
    t = time.time() + 20  # no renewal for longer than the lease: the other collector takes vllm-a
    other.leases.claim(other.instances, other.holder, ttl_s=8.0, now=t)
    with caplog.at_level(logging.ERROR, logger="kvobs.store.leases"):
        mine.renew(t + 1)
    assert not mine.held("vllm-a") and mine.held("vllm-b")
    assert mine.num_lost == {"vllm-a": 1}
    assert "lost the lease on vllm-a" in caplog.text
    mine.renew(t + 3)  # still the other's: stays lost, counted once
    assert not mine.held("vllm-a") and mine.num_lost == {"vllm-a": 1}
    other.release()
    mine.renew(t + 5)
    assert mine.held("vllm-a")
    assert {lease.instance: lease.holder for lease in store.leases.current(now=t + 5)} == {
        "vllm-a": mine.holder,
        "vllm-b": mine.holder,
    }
    store.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_collector_whose_lease_was_taken_drops_that_replicas_batches_and_counts_them(tmp_path, workers):
    """A real collector and a real ZMQ stream: batches are stored while the collector holds `vllm-a`; once another
    writer took the lease (this collector stalled past its expiry), every batch of `vllm-a` is dropped, counted under
    the `kv_events` component with its reason, and nothing of it reaches the store; once the lease is free again and
    taken back, batches are stored again. With `--workers 2` (a second replica, silent, so that there is a pool) the
    worker reading `vllm-a` is told at once, not at its next snapshot (an interval away)."""
    from sqlalchemy import func, select

    from kvobs.store.schema import KVEventRow
    from kvobs.vllm import kv_events as wire
    from tests.collectors.replay import publisher, wait_subscribed
    from tests.server.conftest import free_port
    from tests.waiting import wait_for

    def batch(seq: int) -> tuple[bytes, bytes, bytes]:
        stored = wire.BlockStored([seq + 1], None, [], 16, None, "GPU", None)  # one block, as vLLM's publisher
        return b"", wire.seq_bytes(seq), wire.encode_batch(wire.KVEventBatch(ts=1000.0 + seq, events=[stored]))

    def rows() -> int:
        with store.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(KVEventRow)).scalar_one()

    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    port = free_port()
    streams = [f"vllm-a=tcp://127.0.0.1:{port}", f"vllm-b=tcp://127.0.0.1:{free_port()}"][:workers]
    options = CollectorOptions(kv_events=streams, kv_events_bind=True, interval_s=3600, workers=workers)
    collector = Collector(options, store=store)
    other = LeaseKeeper(store.leases, ["vllm-a"], role="collect")
    collector.start()
    try:
        assert (collector.pool is not None) == (workers == 2)
        with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub:
            wait_subscribed(pub)
            sub = collector.streams[0].subscriber
            pub.send_multipart(batch(0))
            wait_for(lambda: sub.num_batches == 1)
            collector.writer.flush()
            assert rows() == 1
            t = time.time() + 120  # the collector stalled past its lease; another writer took vllm-a
            other.leases.claim(other.instances, other.holder, ttl_s=600.0, now=t)
            collector.leases.renew(t + 1)
            assert not collector.leases.held("vllm-a")
            before = collector.dropped_totals().get("kv_events", 0)
            for seq in (1, 2, 3):
                pub.send_multipart(batch(seq))
            wait_for(lambda: sub.num_batches == 4)
            collector.writer.flush()
            assert rows() == 1  # nothing of vllm-a's batches while another writer holds it
            assert collector.dropped_totals()["kv_events"] == before + 3
            other.release()
            collector.leases.renew(t + 30)  # (renewals come RENEW_EVERY_S apart at most)
            assert collector.leases.held("vllm-a")
            pub.send_multipart(batch(4))
            wait_for(lambda: sub.num_batches == 5)
            collector.writer.flush()
            assert rows() == 2
    finally:
        collector.stop()
    store.close()
