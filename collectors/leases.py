"""This collector's leases on its replicas (`kvobs.store.leases`): claimed at start, renewed, released at stop.

    keeper = LeaseKeeper(store.leases, ["vllm-a", "vllm-b"])
    keeper.claim()                 # raises LeaseRefused (kvobs collect exits 2 with its message) when one is held
    keeper.held("vllm-a")          # False once another writer took it: its KV events and scrapes are dropped, counted
    keeper.renew(now)              # from the collector's tick; every RENEW_EVERY_S
    keeper.release()               # at stop, after the last rows are written

A collector whose lease was taken (it stalled past the lease, and another collector claimed the replica) stops
writing that replica, since two writers would store its blocks twice: the loss is logged as an error, counted in
`kvobs_collector_leases_lost_total{instance}`, and each renewal tries to take the lease back (the other writer
may have stopped).
"""

from __future__ import annotations

import logging
from collections import Counter

from kvobs.store.leases import LEASE_TTL_S, RENEW_EVERY_S, LeaseRefused, Leases, holder_name

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, leases: Leases, instances: list[str], *, ttl_s: float = LEASE_TTL_S) -> None:
        self.leases, self.ttl_s = leases, ttl_s
        self.instances = sorted(set(instances))
        self.holder = holder_name("collect")
        self.lost: set[str] = set()
        self.num_lost: Counter[str] = Counter()  # times each instance's lease was found taken
        self._renewed_at = 0.0

    def claim(self) -> None:
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
                log.error(
                    "lost the lease on %s to another writer: its KV events and scrapes are dropped here until it is "
                    "free again (kvobs_collector_leases_lost_total)",
                    instance,
                )
        for instance in sorted(self.lost):  # the other writer may have stopped: take it back when free
            try:
                self.leases.claim([instance], self.holder, ttl_s=self.ttl_s, now=now)
            except LeaseRefused:
                continue
            self.lost.discard(instance)
            log.warning("took the lease on %s back: writing it again", instance)

    def release(self) -> None:
        self.leases.release(self.instances, self.holder)
