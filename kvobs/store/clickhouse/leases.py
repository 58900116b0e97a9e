"""The lease rows on ClickHouse (`kvobs.store.leases`), which has no transactions and no unique keys.

Every claim, renewal and release is a row (instance, holder, acquired_at, expires_at, written_at) in a
`ReplacingMergeTree` keyed by (instance, holder); a holder's state is its latest row (`argMax` by `written_at`, so
unmerged versions read right). An instance's holder is, of its live claims (not expired, not released), the one
acquired first (ties: the smaller holder name), the same answer for every reader. A claim writes its rows, waits
`CLAIM_SETTLE_S` so that a claim written at the same moment by another process is visible to both, then reads the
live claims again: if another claim is first on any instance, it releases its own and refuses. Two claimers that
start together thus agree on one winner whatever their clocks say; a claimer that starts later sees the live lease
first and refuses without writing.
"""

from __future__ import annotations

import time

import pandas as pd
import pyarrow as pa

from kvobs.store.leases import Lease, LeaseRefused

CLAIM_SETTLE_S = 1.0  # longer than a claim's insert takes to be visible to another process's read

_LIVE = """SELECT instance, holder, acquired_at, expires_at FROM (
        SELECT instance, holder, argMax(acquired_at, written_at) AS acquired_at,
               argMax(expires_at, written_at) AS expires_at
        FROM leases WHERE instance IN {names:Array(String)} GROUP BY instance, holder)
    WHERE expires_at >= {now:Float64} ORDER BY instance, acquired_at, holder"""
_ALL_LIVE = _LIVE.replace("WHERE instance IN {names:Array(String)} ", "")


class ClickHouseLeases:
    def __init__(self, store, *, settle_s: float = CLAIM_SETTLE_S) -> None:
        self.store, self.settle_s = store, settle_s
        self._written_at = 0.0  # the latest version this process wrote: a release always supersedes it

    def claim(self, instances: list[str], holder: str, *, ttl_s: float, now: float | None = None) -> list[Lease]:
        now = time.time() if now is None else now
        names = sorted(set(instances))
        if not names:
            return []
        firsts = self._firsts(names, now)
        held = _others(firsts, holder)
        if held:
            raise LeaseRefused(held, now)
        self._claim_rows(names, holder, firsts, now, ttl_s)
        time.sleep(self.settle_s)
        firsts = self._firsts(names, now)
        held = _others(firsts, holder)
        if held:
            self.release(names, holder)
            raise LeaseRefused(held, now)
        return [firsts[n] for n in names]

    def renew(self, instances: list[str], holder: str, *, ttl_s: float, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        names = sorted(set(instances))
        firsts = self._firsts(names, now)
        lost = [lease.instance for lease in _others(firsts, holder)]
        self._claim_rows([n for n in names if n not in lost], holder, firsts, now, ttl_s)
        return lost

    def release(self, instances: list[str], holder: str) -> None:
        self._write([(n, holder, 0.0, 0.0) for n in sorted(set(instances))], written_at=time.time())

    def current(self, now: float | None = None) -> list[Lease]:
        now = time.time() if now is None else now
        return list(_firsts(self.store.frame(_ALL_LIVE, {"now": now})).values())

    def _firsts(self, names: list[str], now: float) -> dict[str, Lease]:
        return _firsts(self.store.frame(_LIVE, {"names": names, "now": now}))

    def _claim_rows(self, names: list[str], holder: str, firsts: dict[str, Lease], now: float, ttl_s: float) -> None:
        """`holder`'s claim (or renewal) of `names` until now + `ttl_s`, keeping the start of a lease it holds."""
        self._write(
            [(n, holder, firsts[n].acquired_at if n in firsts else now, now + ttl_s) for n in names], written_at=now
        )

    def _write(self, rows: list[tuple[str, str, float, float]], *, written_at: float) -> None:
        if not rows:
            return
        written_at = self._written_at = max(written_at, self._written_at + 1e-6)
        instance, holder, acquired_at, expires_at = (list(c) for c in zip(*rows))
        table = pa.table(
            {
                "instance": pa.array(instance, pa.string()),
                "holder": pa.array(holder, pa.string()),
                "acquired_at": pa.array(acquired_at, pa.float64()),
                "expires_at": pa.array(expires_at, pa.float64()),
                "written_at": pa.array([written_at] * len(rows), pa.float64()),
            }
        )
        self.store.client.insert("leases", table)


def _others(firsts: dict[str, Lease], holder: str) -> list[Lease]:
    """The leases of `firsts` (an instance's holder each) that another holder has."""
    return [lease for lease in firsts.values() if lease.holder != holder]


def _firsts(live: pd.DataFrame) -> dict[str, Lease]:
    """Each instance's holder: the first of its live claims (the frame is ordered by acquired_at, then holder)."""
    firsts: dict[str, Lease] = {}
    for row in live.itertuples(index=False):
        if row.instance not in firsts:
            firsts[row.instance] = Lease(row.instance, row.holder, float(row.acquired_at), float(row.expires_at))
    return firsts
