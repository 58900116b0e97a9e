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
