"""The lease rows on SQLite and PostgreSQL (`kvobs.store.leases`): one row per instance, taken atomically.

A claim is one transaction: an `INSERT ... ON CONFLICT (instance) DO UPDATE ... WHERE` the row is this holder's or
expired, for every instance in a fixed order (so two claimers never wait on each other in a cycle), then a read of
those rows; if any is another holder's, the transaction is rolled back and nothing is taken. PostgreSQL locks the
row the conflict names, so of two concurrent claims the second sees the first's committed row; SQLite serialises
writers on the file.
"""

from __future__ import annotations

import time

from sqlalchemy import case, delete, or_, select, update

from kvobs.store.leases import Lease, LeaseRefused
from kvobs.store.schema import LeaseRow
from kvobs.store.sql.write import upsert_insert

_TABLE = LeaseRow.__table__


class SqlLeases:
    def __init__(self, store) -> None:
        self.store = store

    def claim(self, instances: list[str], holder: str, *, ttl_s: float, now: float | None = None) -> list[Lease]:
        now = time.time() if now is None else now
        names = sorted(set(instances))
        if not names:
            return []
        stmt = upsert_insert(self.store.dialect, _TABLE)
        mine_or_expired = or_(_TABLE.c.holder == stmt.excluded.holder, _TABLE.c.expires_at < stmt.excluded.acquired_at)
        stmt = stmt.on_conflict_do_update(
            index_elements=["instance"],
            set_={
                "holder": stmt.excluded.holder,
                "acquired_at": case(
                    (_TABLE.c.holder == stmt.excluded.holder, _TABLE.c.acquired_at), else_=stmt.excluded.acquired_at
                ),
                "expires_at": stmt.excluded.expires_at,
            },
            where=mine_or_expired,
        )
        rows = [{"instance": i, "holder": holder, "acquired_at": now, "expires_at": now + ttl_s} for i in names]
        with self.store.engine.begin() as conn:
            for row in rows:  # one by one, in order: the row locks are taken in the same order by every claimer
                conn.execute(stmt, row)
            leases = _leases(conn.execute(select(_TABLE).where(_TABLE.c.instance.in_(names))))
            held = [lease for lease in leases if lease.holder != holder]
            if held:
                raise LeaseRefused(held, now)  # leaving the block rolls the transaction back: nothing taken
        return leases

    def renew(self, instances: list[str], holder: str, *, ttl_s: float, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        names = sorted(set(instances))
        if not names:
            return []
        with self.store.engine.begin() as conn:
            mine = (_TABLE.c.instance.in_(names)) & (_TABLE.c.holder == holder)
            conn.execute(update(LeaseRow).where(mine).values(expires_at=now + ttl_s))
            kept = set(conn.execute(select(_TABLE.c.instance).where(mine)).scalars())
        return [name for name in names if name not in kept]

    def release(self, instances: list[str], holder: str) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(delete(LeaseRow).where(_TABLE.c.instance.in_(list(instances)), _TABLE.c.holder == holder))

    def current(self, now: float | None = None) -> list[Lease]:
        now = time.time() if now is None else now
        with self.store.engine.connect() as conn:
            return _leases(conn.execute(select(_TABLE).where(_TABLE.c.expires_at >= now).order_by(_TABLE.c.instance)))


def _leases(result) -> list[Lease]:
    return [Lease(r.instance, r.holder, r.acquired_at, r.expires_at) for r in result]
