"""Which writer holds which instance: the lease rows that keep two collectors from writing one replica.

    leases = store.leases                                          # a Leases: SqlLeases or ClickHouseLeases
    taken = leases.claim(["vllm-a", "vllm-b"], holder, ttl_s=LEASE_TTL_S)   # every lease taken, or LeaseRefused
    lost = leases.renew(["vllm-a", "vllm-b"], holder, ttl_s=LEASE_TTL_S)    # the instances no longer this holder's
    leases.release(["vllm-a", "vllm-b"], holder)                             # at shutdown
    leases.current()                                                         # who holds what (kvobs doctor)
    keeper = LeaseKeeper(leases, ["vllm-a"], role="collect")                 # what a writer process uses

A collector keeps per-instance state in memory (each replica's block chains, its footprints, its runs) and writes
that replica's KV events, snapshots and runs; two collectors given the same replica would store every block twice
and each count only half of its sessions. So a writer claims each instance it reads before it starts: a lease row
(instance, holder, until when) in the store itself, taken when the instance is free, its lease has expired, or
it is already this holder's; renewed every `LEASE_TTL_S / 4`; released at shutdown. A writer that dies without
releasing holds its instances until `LEASE_TTL_S` passes, then anyone may take them. Times are the writers' own
clocks: hosts are expected to agree within seconds (NTP), far inside the lease's minute.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kvobs.times import local_time

log = logging.getLogger(__name__)

LEASE_TTL_S = 60.0  # a lease not renewed this long is free to take
RENEW_EVERY_S = LEASE_TTL_S / 4


@dataclass(frozen=True)
class Lease:
    instance: str
    holder: str  # "collect@host:pid/nonce": the process that writes the instance
    acquired_at: float  # epoch s, since when this holder holds it
    expires_at: float  # epoch s, free to take after this unless renewed

    def describe(self, now: float) -> str:
        left = self.expires_at - now
        state = f"expires in {left:.0f} s" if left >= 0 else f"expired {-left:.0f} s ago"
        return f"{self.instance} held by {self.holder} since {local_time(self.acquired_at)} ({state})"


class LeaseRefused(RuntimeError):
    """Some instance is held by another live writer: nothing was taken."""

    def __init__(self, held: list[Lease], now: float) -> None:
        self.held = held
        names = ", ".join(lease.describe(now) for lease in held)
        super().__init__(
            f"{names}: each replica is written by one collector (its KV chains and sessions live in that process); "
            f"stop that one, give this collector other replicas, or wait until the lease expires ({LEASE_TTL_S:.0f} s "
            "after its holder stopped renewing)"
        )


class Leases(Protocol):
    """The lease rows of a store (every backend: SQLite, PostgreSQL, ClickHouse)."""

    def claim(self, instances: list[str], holder: str, *, ttl_s: float, now: float | None = None) -> list[Lease]:
        """Take every instance for `holder` until now + `ttl_s`, all or none: raises `LeaseRefused` (naming the
        holders) when another holder's lease on any of them has not expired."""
        ...

    def renew(self, instances: list[str], holder: str, *, ttl_s: float, now: float | None = None) -> list[str]:
        """Extend `holder`'s leases; returns the instances it no longer holds (another writer took them)."""
        ...

    def release(self, instances: list[str], holder: str) -> None:
        """Give up `holder`'s leases on `instances` (those another holder has are left alone)."""
        ...

    def current(self, now: float | None = None) -> list[Lease]:
        """Every lease not yet expired, by instance."""
        ...


_OURS: set[str] = set()  # the holder names this process made: alive as long as it runs


def holder_name(role: str) -> str:
    """This process as a lease holder: `role@host:pid/nonce` (the nonce tells a restarted process with a reused
    pid from its predecessor)."""
    name = f"{role}@{socket.gethostname()}:{os.getpid()}/{uuid.uuid4().hex[:8]}"
    _OURS.add(name)
    return name


def is_dead_holder(holder: str, me: str) -> bool:
    """Whether `holder` is a process of this host that no longer runs: its pid is gone, or it is this process's pid
    under a nonce this process never made (a container restarted: the same hostname, the same small pid). Such a
    lease is taken at once instead of after its expiry; another host's holder is never judged."""
    try:
        host, rest = holder.split("@", 1)[1].rsplit(":", 1)
        pid = int(rest.split("/", 1)[0])
    except (IndexError, ValueError):
        return False
    if host != socket.gethostname() or holder == me or holder in _OURS:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class LeaseKeeper:
    """One process's leases on its instances: claimed at start, renewed, released at stop.

        keeper = LeaseKeeper(store.leases, ["vllm-a", "vllm-b"], role="collect")
        keeper.claim()           # raises LeaseRefused (the command exits 2 with its message) when one is held
        keeper.held("vllm-a")    # False once another writer took it (a collector stops writing it, and counts)
        keeper.renew(now)        # from the caller's tick; every RENEW_EVERY_S at most
        keeper.release()         # at stop, after the last rows are written

    A lease held by a process of this host that no longer runs is taken at start (`is_dead_holder`). A holder
    whose lease was taken while it stalled past the lease is told by `held`, logged as an error and counted
    (`num_lost`); each renewal tries to take it back (the other writer may have stopped)."""

    def __init__(self, leases: Leases, instances: list[str], *, role: str, ttl_s: float = LEASE_TTL_S) -> None:
        self.leases, self.ttl_s = leases, ttl_s
        self.instances = sorted(set(instances))
        self.holder = holder_name(role)
        self.lost: set[str] = set()
        self.num_lost: Counter[str] = Counter()  # times each instance's lease was found taken
        self.on_change: list[Callable[[str, bool], object]] = []  # told (instance, held) as a lease is lost or back
        self._renewed_at = 0.0

    def claim(self) -> None:
        try:
            self.leases.claim(self.instances, self.holder, ttl_s=self.ttl_s)
        except LeaseRefused as refused:
            if not all(is_dead_holder(lease.holder, self.holder) for lease in refused.held):
                raise
            for lease in refused.held:
                log.warning("%s: its holder %s no longer runs on this host; taking it", lease.instance, lease.holder)
                self.leases.release([lease.instance], lease.holder)
            self.leases.claim(self.instances, self.holder, ttl_s=self.ttl_s)
        log.info("holding %s as %s", ", ".join(self.instances), self.holder)

    def held(self, instance: str) -> bool:
        return instance not in self.lost

    def renew(self, now: float) -> None:
        if not self.instances or now - self._renewed_at < min(RENEW_EVERY_S, self.ttl_s / 4):
            return
        self._renewed_at = now
        for instance in self.leases.renew(self.instances, self.holder, ttl_s=self.ttl_s, now=now):
            if instance not in self.lost:
                self.lost.add(instance)
                self.num_lost[instance] += 1
                self._changed(instance, False)
                log.error(
                    "lost the lease on %s to another writer (this process stopped renewing it for over %.0f s); "
                    "taken back once it is free",
                    instance,
                    self.ttl_s,
                )
        for instance in sorted(self.lost):  # the other writer may have stopped: take it back when free
            try:
                self.leases.claim([instance], self.holder, ttl_s=self.ttl_s, now=now)
            except LeaseRefused:
                continue
            self.lost.discard(instance)
            self._changed(instance, True)
            log.warning("took the lease on %s back: writing it again", instance)

    def _changed(self, instance: str, held: bool) -> None:
        for tell in self.on_change:
            try:
                tell(instance, held)
            except Exception:
                log.exception("telling that the lease on %s is %s failed", instance, "back" if held else "lost")

    def release(self) -> None:
        self.leases.release(self.instances, self.holder)
