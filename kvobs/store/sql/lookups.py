"""The lookups of a SQL store (SQLite, PostgreSQL): `SqlLookups`, the `Lookups` of `SqlStore`: counters before a
time, restored blocks, block lifetimes, idle losses, step counts, alert states, session ends and trace sessions."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from sqlalchemy import and_, func, select

from kvobs.semconv.spans import BLOCK_LOSS_KINDS, CLOCK_KINDS, KVEventKind, StepStatus
from kvobs.store.schema import AlertRow, KVEventRow, RequestRow, SessionRow, SnapshotRow, StepRow, StepVerdictRow
from kvobs.store.sql.frames import SqlSource, _columns, _lookup, read


class SqlLookups:
    """`kvobs.store.interface.Lookups` in SQLAlchemy Core."""

    def __init__(self, store: SqlSource) -> None:
        self.store = store

    def instance_counter_before(
        self, column: str, ts: float, *, instances: Iterable[str] | None = None
    ) -> dict[str, float]:
        """Per instance: the latest value of an instance snapshot counter (e.g. `preemptions_total`) before `ts`."""
        # one seek down the (instance, ts) index per instance, newest first (of equal times the last written, as
        # ClickHouse's argMax by (ts, id)); a GROUP BY joined back scanned every snapshot of the store
        value = getattr(SnapshotRow, column)
        found = {}
        with self.store.engine.connect() as conn:
            names = conn.execute(select(SnapshotRow.instance).distinct()).scalars() if instances is None else instances
            for instance in names:
                latest = conn.execute(
                    select(value)
                    .where(SnapshotRow.instance == instance, SnapshotRow.ts < ts)
                    .where(SnapshotRow.session_id.is_(None), value.is_not(None))
                    .order_by(SnapshotRow.ts.desc(), SnapshotRow.id.desc())
                    .limit(1)
                ).scalar()
                if latest is not None:
                    found[instance] = float(latest)
        return found

    def restored_blocks(self, since: float, until: float) -> pd.DataFrame:
        """Per instance: blocks stored in the window (`stored`) and those among them that brought back a block lost
        there (`restored`), over the rows that know it (`kv_events.restored`: written at ingest since schema 0021)."""
        stmt = (
            select(
                KVEventRow.instance,
                func.count().label("stored"),
                func.sum(KVEventRow.restored).label("restored"),
            )
            .where(KVEventRow.kind == KVEventKind.STORED.value, KVEventRow.ts >= since, KVEventRow.ts <= until)
            .where(KVEventRow.restored.is_not(None))
            .group_by(KVEventRow.instance)
        )
        return read(self.store, stmt)

    def block_lifetimes(self, since: float, until: float) -> pd.DataFrame:
        """Blocks lost in the window (a block's first row: one per loss, whatever the owners) whose store is known,
        with `lifetime_s`: the time since it was stored on its instance and tier (written at ingest)."""
        stmt = select(KVEventRow.instance, KVEventRow.ts, KVEventRow.block_hash, KVEventRow.lifetime_s).where(
            KVEventRow.kind.in_(BLOCK_LOSS_KINDS),
            KVEventRow.ts >= since,
            KVEventRow.ts <= until,
            KVEventRow.first_owner == 1,
            KVEventRow.lifetime_s.is_not(None),
        )
        return read(self.store, stmt)

    def latest_kv_ts(self, instance: str) -> float | None:
        with self.store.engine.connect() as conn:  # one seek down the (instance, ts) index
            return conn.execute(select(func.max(KVEventRow.ts)).where(KVEventRow.instance == instance)).scalar()

    def block_history(self, instance: str, since: float, until: float) -> pd.DataFrame:
        stmt = (
            select(KVEventRow.ts, KVEventRow.kind, KVEventRow.block_hash, KVEventRow.medium, KVEventRow.group_idx)
            .where(KVEventRow.instance == instance, KVEventRow.ts >= since, KVEventRow.ts < until)
            .where(KVEventRow.kind.in_(CLOCK_KINDS))
            .order_by(KVEventRow.ts, KVEventRow.id)
        )
        return read(self.store, stmt)

    def cached_prompt_tokens(self, since: float, until: float) -> pd.DataFrame:
        """Per instance, the requests that arrived in the window and say how many prompt tokens were cached (our
        engine's; vLLM's spans do not): `instance`, `requests`, `cached_tokens`, `prompt_tokens` (their sums), what
        `kvobs.analytics.cache.hit_rate` reads without pulling the rows."""
        stmt = (
            select(
                RequestRow.instance,
                func.count().label("requests"),
                func.sum(RequestRow.cached_tokens).label("cached_tokens"),
                func.sum(RequestRow.prompt_tokens).label("prompt_tokens"),
            )
            .where(
                RequestRow.arrival_ts >= since,
                RequestRow.arrival_ts <= until,
                RequestRow.cached_tokens.is_not(None),
                RequestRow.prompt_tokens.is_not(None),
            )
            .group_by(RequestRow.instance)
            .order_by(RequestRow.instance)
        )
        return read(self.store, stmt)

    def session_idle_losses(self, until: float) -> pd.DataFrame:
        """Every session snapshot up to `until` with its running count of blocks lost while idle."""
        idle = SnapshotRow.session_evicted_idle_blocks
        stmt = select(SnapshotRow.session_id, SnapshotRow.instance, SnapshotRow.ts, idle).where(
            SnapshotRow.session_id.is_not(None), SnapshotRow.ts <= until, idle.is_not(None)
        )
        return read(self.store, stmt)

    def step_counts(self, since: float, until: float, *, exclude_errors: tuple[str, ...] = ()) -> tuple[int, int]:
        """(steps, failed steps) in the window, in one aggregate; failures of `exclude_errors` not counted."""
        is_failed = StepRow.status == StepStatus.ERROR.value
        if exclude_errors:
            is_failed = and_(is_failed, func.coalesce(StepRow.error_type, "").not_in(list(exclude_errors)))
        failed = func.sum(func.cast(is_failed, StepRow.step_index.type))
        stmt = select(func.count(), failed).where(StepRow.started_at >= since, StepRow.started_at <= until)
        with self.store.engine.connect() as conn:
            total, num_failed = conn.execute(stmt).one()
        return int(total or 0), int(num_failed or 0)

    def verdict_counts(self, since=None, until=None) -> tuple[int, int]:
        stmt = select(func.count(), func.count(StepVerdictRow.slow))
        if since is not None:
            stmt = stmt.where(StepVerdictRow.started_at >= since)
        if until is not None:
            stmt = stmt.where(StepVerdictRow.started_at <= until)
        with self.store.engine.connect() as conn:
            decided, weighed = conn.execute(stmt).one()
        return int(decided or 0), int(weighed or 0)

    def latest_alert_states(self) -> pd.DataFrame:
        """The latest row of every (rule, instance, session) alert key."""
        latest = (
            select(func.max(AlertRow.id).label("id"))
            .group_by(AlertRow.rule, AlertRow.instance, AlertRow.session_id)
            .subquery()
        )
        return read(self.store, select(*_columns(AlertRow)).join(latest, AlertRow.id == latest.c.id))

    def session_ends(self, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, float]:
        """session id -> `ended_at`, for the given sessions that have ended."""
        ends = _lookup(
            self.store, SessionRow.session_id, SessionRow.ended_at, session_ids, chunk, SessionRow.ended_at.is_not(None)
        )
        return {session_id: float(ended) for session_id, ended in ends.items()}

    def session_step_counts(self, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, tuple[int, int]]:
        """session id -> (the next step index, failed steps so far), for the given sessions that have steps."""
        failed = func.sum(func.cast(StepRow.status == StepStatus.ERROR.value, StepRow.step_index.type))
        stmt = select(StepRow.session_id, func.max(StepRow.step_index) + 1, failed).group_by(StepRow.session_id)
        keys, found = list(session_ids), dict[str, tuple[int, int]]()
        with self.store.engine.connect() as conn:
            for i in range(0, len(keys), chunk):
                rows = conn.execute(stmt.where(StepRow.session_id.in_(keys[i : i + chunk]))).all()
                found.update((sid, (int(n), int(f or 0))) for sid, n, f in rows)
        return found

    def trace_sessions(self, trace_ids: Iterable[str], *, chunk: int = 500) -> dict[str, str]:
        """trace id -> session id, from the agent steps recorded with those trace ids."""
        return _lookup(self.store, StepRow.trace_id, StepRow.session_id, trace_ids, chunk)
