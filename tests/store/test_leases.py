"""Lease rows on every backend (SQLite, the local PostgreSQL, chDB): one writer per instance, all or none, expiry,
renewal, release, and two claimers racing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from kvobs.store.leases import LeaseKeeper, LeaseRefused

T0 = 1_800_000_000.0
TTL = 60.0


@pytest.fixture
def leases(any_store):
    leases = any_store.leases
    if hasattr(leases, "settle_s"):
        leases.settle_s = 0.05  # chDB answers in this process: visible at once (the race test keeps the default)
    return leases


def test_a_free_instance_is_taken_and_a_held_one_refused_naming_its_holder(leases):
    taken = leases.claim(["b", "a"], "collect@one", ttl_s=TTL, now=T0)
    assert [(lease.instance, lease.holder, lease.acquired_at) for lease in taken] == [
        ("a", "collect@one", T0),
        ("b", "collect@one", T0),
    ]
    with pytest.raises(LeaseRefused) as refused:
        leases.claim(["c", "b"], "collect@two", ttl_s=TTL, now=T0 + 10)
    assert [lease.instance for lease in refused.value.held] == ["b"]
    assert "b held by collect@one" in str(refused.value)
    # all or none: the free instance the refused claim named was not taken
    assert [(lease.instance, lease.holder) for lease in leases.current(now=T0 + 10)] == [
        ("a", "collect@one"),
        ("b", "collect@one"),
    ]


def test_the_holder_claims_again_keeping_its_start_and_an_expired_lease_is_free(leases):
    leases.claim(["a"], "collect@one", ttl_s=TTL, now=T0)
    again = leases.claim(["a"], "collect@one", ttl_s=TTL, now=T0 + 30)
    assert (again[0].acquired_at, again[0].expires_at) == (T0, T0 + 30 + TTL)
    late = T0 + 30 + TTL + 1  # never renewed: expired
    assert leases.current(now=late) == []
    taken = leases.claim(["a"], "collect@two", ttl_s=TTL, now=late)
    assert (taken[0].holder, taken[0].acquired_at) == ("collect@two", late)
    # the first holder's renewal finds it taken; the second's keeps it
    assert leases.renew(["a"], "collect@one", ttl_s=TTL, now=late + 5) == ["a"]
    assert leases.renew(["a"], "collect@two", ttl_s=TTL, now=late + 5) == []
    assert leases.current(now=late + 5 + TTL - 1)[0].holder == "collect@two"


def test_a_released_lease_is_free_and_release_leaves_another_holders_alone(leases):
    leases.claim(["a", "b"], "collect@one", ttl_s=TTL, now=T0)
    leases.release(["a"], "collect@one")
    leases.release(["b"], "collect@two")  # not its lease: nothing happens
    assert [lease.instance for lease in leases.current(now=T0 + 1)] == ["b"]
    assert leases.claim(["a"], "collect@two", ttl_s=TTL, now=T0 + 1)[0].holder == "collect@two"


def test_of_claimers_racing_for_one_instance_exactly_one_wins(any_store):
    """Four threads (each its own connection on SQL) claim the same instances at once, in opposite orders, five
    rounds; every round has exactly one winner and the store names it. On chDB with the claim's real settle time."""
    for round_ in range(3 if any_store.dialect == "clickhouse" else 5):
        names = [f"r{round_}-a", f"r{round_}-b"]
        outcomes = _race(any_store.leases, names, claimers=4)
        won = [holder for holder, ok in outcomes.items() if ok]
        assert len(won) == 1 and len(outcomes) == 4, outcomes
        holders = {lease.instance: lease.holder for lease in any_store.leases.current() if lease.instance in names}
        assert holders == dict.fromkeys(names, won[0])


def _race(leases, names: list[str], *, claimers: int) -> dict[str, bool]:
    """Claimers released together, half naming the instances in the other order: holder -> whether it won."""
    start = threading.Barrier(claimers)
    outcomes: dict[str, bool] = {}

    def claim(holder: str, order: list[str]) -> None:
        start.wait()
        try:
            leases.claim(order, holder, ttl_s=TTL)
            outcomes[holder] = True
        except LeaseRefused:
            outcomes[holder] = False

    threads = [
        threading.Thread(target=claim, args=(f"collect@{i}", names if i % 2 else names[::-1])) for i in range(claimers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


def test_a_lease_of_a_process_of_this_host_that_no_longer_runs_is_taken_at_once(any_store):
    """A SIGKILLed writer restarted on the same host (or a restarted container, the same small pid under a new
    nonce) does not wait out the lease; a live process's lease, or another host's, is never taken."""
    leases = any_store.leases
    if hasattr(leases, "settle_s"):
        leases.settle_s = 0.05
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(dead.stdout)  # a pid that has exited (not reused this quickly)
    leases.claim(["a"], f"serve@{host}:{gone}/0000dead", ttl_s=TTL)
    leases.claim(["b"], f"collect@{host}:{os.getpid()}/0000prev", ttl_s=TTL)  # this pid, an earlier nonce
    keeper = LeaseKeeper(leases, ["a", "b"], role="serve")
    keeper.claim()
    assert {lease.instance: lease.holder for lease in leases.current()} == {"a": keeper.holder, "b": keeper.holder}
    leases.claim(["c"], f"collect@{host}:{os.getppid()}/0000live", ttl_s=TTL)  # alive: our parent
    leases.claim(["d"], f"collect@elsewhere.example:{gone}/00000far", ttl_s=TTL)  # another host: never judged
    for name in ("c", "d"):
        with pytest.raises(LeaseRefused):
            LeaseKeeper(leases, [name], role="serve").claim()
