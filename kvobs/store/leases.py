"""Which writer holds which instance: the lease rows that keep two collectors from writing one replica.

    leases = store.leases                                          # a Leases: SqlLeases or ClickHouseLeases
    taken = leases.claim(["vllm-a", "vllm-b"], holder, ttl_s=LEASE_TTL_S)   # every lease taken, or LeaseRefused
    lost = leases.renew(["vllm-a", "vllm-b"], holder, ttl_s=LEASE_TTL_S)    # the instances no longer this holder's
    leases.release(["vllm-a", "vllm-b"], holder)                             # at shutdown
    leases.current()                                                         # who holds what (kvobs doctor)

A collector keeps per-instance state in memory (each replica's block chains, its footprints, its runs) and writes
that replica's KV events, snapshots and runs; two collectors given the same replica would store every block twice
and each count only half of its sessions. So a writer claims each instance it reads before it starts: a lease row
(instance, holder, until when) in the store itself, taken when the instance is free, its lease has expired, or
it is already this holder's; renewed every `LEASE_TTL_S / 4`; released at shutdown. A writer that dies without
releasing holds its instances until `LEASE_TTL_S` passes, then anyone may take them. Times are the writers' own
clocks: hosts are expected to agree within seconds (NTP), far inside the lease's minute.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Protocol

from kvobs.times import local_time

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


def holder_name(role: str) -> str:
    """This process as a lease holder: `role@host:pid/nonce` (the nonce tells a restarted process with a reused
    pid from its predecessor)."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}/{uuid.uuid4().hex[:8]}"
