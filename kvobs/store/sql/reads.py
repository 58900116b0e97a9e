"""The reads of a SQL store (SQLite, PostgreSQL) through SQLAlchemy Core: `SqlReads`, the `Reads` of `SqlStore`.

Each read filters and aggregates in SQL on indexed columns and reads the result through `kvobs.store.sql.frames.read`
(result processors applied a column at a time: hashes come back as Python ints).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from sqlalchemy import Table, and_, case, distinct, func, select, tuple_, union_all

from kvobs.semconv.spans import STEP_JOINED, KVEventKind, StepStatus
from kvobs.store.composed import ComposedReads
from kvobs.store.interface import Instances
from kvobs.store.rollup_tables import KVEventMinuteRow
from kvobs.store.rollups import ROLLUPS as MINUTE_ROLLUPS
from kvobs.store.schema import (
    FOOTPRINT_COLUMNS,
    ROLLUPS,
    AlertRow,
    ConnectorLookupRow,
    KVEventRow,
    LookupProgressRow,
    MetricSampleRow,
    RequestLookupRow,
    RequestRow,
    RunRow,
    SessionFootprintRow,
    SessionRow,
    SnapshotRow,
    StepRow,
    StepVerdictRow,
    VerdictProgressRow,
)
from kvobs.store.sql.frames import SqlSource, _between, _columns, _of_instances, read


class SqlReads(ComposedReads):
    """`kvobs.store.interface.Reads` in SQLAlchemy Core."""

    def __init__(self, store: SqlSource) -> None:
        self.store = store

    def time_range(self) -> tuple[float, float] | None:
        """First and last timestamp of anything observed (snapshots, requests, KV events, steps); None when empty."""
        # min and max as two subqueries: each is one seek on an index of the column (SQLite's min/max optimisation
        # takes a query of a single min or max; both in one SELECT scan the whole index, 0.07 s at 1M KV events)
        with self.store.engine.connect() as conn:
            bounds = [
                conn.execute(
                    select(select(func.min(column)).scalar_subquery(), select(func.max(column)).scalar_subquery())
                ).one()
                for column in (SnapshotRow.ts, RequestRow.arrival_ts, KVEventRow.ts, StepRow.started_at)
            ]
        found = [(float(low), float(high)) for low, high in bounds if low is not None]
        return (min(b[0] for b in found), max(b[1] for b in found)) if found else None

    def instances(self) -> list[str]:
        """Every instance that reported anything: snapshots (scrapes, the engine), requests, KV events (the rollup)."""
        names = union_all(
            *(
                select(column).distinct()
                for column in (SnapshotRow.instance, RequestRow.instance, KVEventMinuteRow.instance)
            )
        )
        with self.store.engine.connect() as conn:
            return sorted(set(conn.execute(names).scalars()) - {None})

    def instance_snapshots(self, since=None, until=None, *, instances: Instances = None) -> pd.DataFrame:
        """Instance-level snapshots (`session_id` null), oldest first."""
        stmt = select(*_columns(SnapshotRow, "id")).where(SnapshotRow.session_id.is_(None))
        stmt = _of_instances(stmt, SnapshotRow.instance, instances)
        return read(self.store, _between(stmt, SnapshotRow.ts, since, until).order_by(SnapshotRow.ts))

    def raw_snapshot_times(self, since, until, bucket_s: float, *, instances: Instances = None) -> pd.DataFrame:
        bucket = (func.floor(SnapshotRow.ts / bucket_s) * bucket_s).label("bucket")
        stmt = select(
            SnapshotRow.instance,
            bucket,
            func.min(SnapshotRow.ts).label("first_ts"),
            func.max(SnapshotRow.ts).label("last_ts"),
            func.count().label("samples"),
        ).where(SnapshotRow.session_id.is_(None))
        stmt = _between(_of_instances(stmt, SnapshotRow.instance, instances), SnapshotRow.ts, since, until)
        return read(self.store, stmt.group_by(SnapshotRow.instance, bucket).order_by(SnapshotRow.instance, bucket))

    def session_snapshots(self, session_id: str) -> pd.DataFrame:
        """One session's footprint over time: blocks cached, lost, lost while idle, hit tokens."""
        stmt = select(*_columns(SnapshotRow, "id")).where(SnapshotRow.session_id == session_id)
        return read(self.store, stmt.order_by(SnapshotRow.ts))

    def session_footprints(self, since=None, until=None, *, instances: Instances = None) -> pd.DataFrame:
        """Every session's latest footprint in the window: one row per (session, instance).

        Read from the rollup (`session_footprints`, a row per session) for the sessions whose latest footprint falls in
        the window, which is every session when the window reaches the present; from the raw snapshots only for those
        whose latest footprint came after `until` (a window in the past)."""
        rollup = SessionFootprintRow.__table__.c
        stmt = _of_instances(select(*(rollup[c] for c in FOOTPRINT_COLUMNS)), rollup.instance, instances)
        frame = read(self.store, _between(stmt, rollup.ts, since, None))  # (past `until` too: is a raw read needed)
        if until is None or not (frame["ts"] > until).any():  # (a window that reaches the present: no raw read)
            return frame
        frame = frame[frame["ts"] <= until].reset_index(drop=True)
        later = _of_instances(
            select(rollup.session_id, rollup.instance).where(rollup.ts > until), rollup.instance, instances
        )
        latest = (
            _between(
                select(SnapshotRow.session_id, SnapshotRow.instance, func.max(SnapshotRow.ts).label("ts")).where(
                    tuple_(SnapshotRow.session_id, SnapshotRow.instance).in_(later)
                ),
                SnapshotRow.ts,
                since,
                until,
            )
            .group_by(SnapshotRow.session_id, SnapshotRow.instance)
            .subquery()
        )
        stmt = (
            select(*_columns(SnapshotRow, "id"))
            .join(
                latest,
                (SnapshotRow.session_id == latest.c.session_id)
                & (SnapshotRow.instance == latest.c.instance)
                & (SnapshotRow.ts == latest.c.ts),
            )
            .order_by(SnapshotRow.id)
        )
        earlier = read(self.store, stmt).drop_duplicates(["session_id", "instance"], keep="last")
        return frame if earlier.empty else pd.concat([frame, earlier], ignore_index=True)

    def request_rows(
        self, since=None, until=None, session_id: str | None = None, *, instances: Instances = None
    ) -> pd.DataFrame:
        stmt = _of_instances(select(*_columns(RequestRow, "id")), RequestRow.instance, instances)
        if session_id is not None:
            stmt = stmt.where(RequestRow.session_id == session_id)
        return read(self.store, _between(stmt, RequestRow.arrival_ts, since, until).order_by(RequestRow.arrival_ts))

    def steps(
        self,
        since=None,
        until=None,
        session_id: str | None = None,
        *,
        status: str | None = None,
        session_ids: Iterable[str] | None = None,
    ) -> pd.DataFrame:
        """Agent steps by start time."""
        stmt = select(*_columns(StepRow))
        if session_id is not None:
            stmt = stmt.where(StepRow.session_id == session_id)
        if session_ids is not None:
            stmt = stmt.where(StepRow.session_id.in_(list(session_ids)))
        if status is not None:
            stmt = stmt.where(StepRow.status == status)
        return read(self.store, _between(stmt, StepRow.started_at, since, until).order_by(StepRow.started_at))

    def step_outcomes(self, since=None, until=None) -> pd.DataFrame:
        step = StepRow
        known = and_(step.prompt_tokens.is_not(None), step.cached_tokens.is_not(None))
        counts = select(
            step.session_id,
            func.count().label("steps"),
            func.sum(case((step.status == StepStatus.ERROR.value, 1), else_=0)).label("failed"),
            func.sum(case((known, step.cached_tokens))).label("cached_tokens"),
            func.sum(case((known, step.prompt_tokens))).label("prompt_tokens"),
            func.count(step.request_join).label("judged"),
            func.sum(case((step.request_join.in_(sorted(STEP_JOINED)), 1), else_=0)).label("joined"),
        )
        outcome = _between(counts, step.started_at, since, until).group_by(step.session_id).subquery()
        # the median of each session's known e2e_s: the middle row, or the mean of the two middle rows, by rank
        ranks = select(
            step.session_id,
            step.e2e_s,
            func.row_number().over(partition_by=step.session_id, order_by=step.e2e_s).label("rank"),
            func.count().over(partition_by=step.session_id).label("n"),
        ).where(step.e2e_s.is_not(None))
        ranked = _between(ranks, step.started_at, since, until).subquery()
        middle = ranked.c["rank"].in_([(ranked.c.n + 1) // 2, (ranked.c.n + 2) // 2])
        medians = select(ranked.c.session_id, func.avg(ranked.c.e2e_s).label("e2e_p50")).where(middle)
        median = medians.group_by(ranked.c.session_id).subquery()
        stmt = select(
            outcome.c.session_id,
            outcome.c.steps,
            outcome.c.failed,
            median.c.e2e_p50,
            outcome.c.cached_tokens,
            outcome.c.prompt_tokens,
            outcome.c.judged,
            outcome.c.joined,
        ).join(median, median.c.session_id == outcome.c.session_id, isouter=True)
        return read(self.store, stmt.order_by(outcome.c.session_id))

    def step_windows(self, since, until, bucket_s: float) -> pd.DataFrame:
        step = StepRow
        bucket = (func.floor(step.started_at / bucket_s) * bucket_s).label("bucket")
        stmt = select(
            bucket,
            func.count().label("steps"),
            func.sum(case((step.status == StepStatus.ERROR.value, 1), else_=0)).label("failed"),
            func.min(step.started_at).label("first_ts"),
            func.max(step.started_at).label("last_ts"),
        )
        return read(self.store, _between(stmt, step.started_at, since, until).group_by(bucket).order_by(bucket))

    def minute_rollup(
        self,
        table: str,
        low,
        high,
        *,
        instances: Instances = None,
        bucket_s: float | None = None,
        metrics: Iterable[str] | None = None,
    ) -> pd.DataFrame:
        model = ROLLUPS[table].__table__
        assert isinstance(model, Table)
        among = [model.c.minute >= low, model.c.minute < high]
        if metrics is not None:
            among.append(model.c.metric.in_(list(metrics)))
        if bucket_s is None:
            stmt = _of_instances(select(*model.columns).where(*among), model.c.instance, instances)
            return read(self.store, stmt.order_by(*model.primary_key.columns))
        rollup = next(r for r in MINUTE_ROLLUPS if r.table == table)
        bucket = (func.floor(model.c.minute / bucket_s) * bucket_s).label("bucket")  # not `minute`: a column's name
        keys = [bucket if key == "minute" else model.c[key] for key in rollup.keys]
        merged = [getattr(func, how)(model.c[column]).label(column) for column, how in rollup.how().items()]
        stmt = select(*keys, *merged).where(*among)
        stmt = _of_instances(stmt, model.c.instance, instances).group_by(*keys).order_by(*keys)
        return read(self.store, stmt).rename(columns={"bucket": "minute"})

    def request_lookups(
        self, since=None, until=None, *, instances: Instances = None, session_id: str | None = None
    ) -> pd.DataFrame:
        model = RequestLookupRow
        stmt = _of_instances(select(*_columns(model)), model.instance, instances)
        if session_id is not None:
            stmt = stmt.where(model.session_id == session_id)
        return read(self.store, _between(stmt, model.lookup_ts, since, until).order_by(model.lookup_ts))

    def connector_lookups(self, since=None, until=None) -> pd.DataFrame:
        model = ConnectorLookupRow
        stmt = _between(select(*_columns(model)), model.started_at, since, until)
        return read(self.store, stmt.order_by(model.started_at, model.id))

    def lookup_progress(self, *, instances: Instances = None) -> pd.DataFrame:
        stmt = _of_instances(select(*_columns(LookupProgressRow)), LookupProgressRow.instance, instances)
        return read(self.store, stmt.order_by(LookupProgressRow.instance))

    def verdict_progress(self) -> pd.DataFrame:
        return read(self.store, select(*_columns(VerdictProgressRow)).order_by(VerdictProgressRow.keeper))

    def step_verdicts(
        self, since=None, until=None, *, status=None, session_id=None, slow=None, decided_in: bool = False
    ) -> pd.DataFrame:
        at = StepVerdictRow.decided_at if decided_in else StepVerdictRow.started_at
        stmt = _between(select(*_columns(StepVerdictRow)), at, since, until)
        if status is not None:
            stmt = stmt.where(StepVerdictRow.status == status)
        if session_id is not None:
            stmt = stmt.where(StepVerdictRow.session_id == session_id)
        if slow is not None:
            stmt = stmt.where(StepVerdictRow.slow.is_(bool(slow)))
        return read(self.store, stmt.order_by(StepVerdictRow.session_id, StepVerdictRow.step_index))

    def undecided_steps(self, since=None, until=None) -> pd.DataFrame:
        verdict = StepVerdictRow
        decided = select(verdict.step_index).where(
            verdict.session_id == StepRow.session_id, verdict.step_index == StepRow.step_index
        )
        stmt = select(StepRow.session_id, StepRow.step_index, StepRow.started_at).where(~decided.exists())
        return read(self.store, _between(stmt, StepRow.started_at, since, until).order_by(StepRow.started_at))

    def sessions(self) -> pd.DataFrame:
        return read(self.store, select(*_columns(SessionRow)).order_by(SessionRow.started_at))

    def runs(self, *, instances: Instances = None) -> pd.DataFrame:
        """Every recorded engine run (`runs`), by instance and start: a small table (a row per engine start)."""
        stmt = _of_instances(select(*_columns(RunRow)), RunRow.instance, instances)
        return read(self.store, stmt.order_by(RunRow.instance, RunRow.started_at))

    def kv_events(
        self,
        since=None,
        until=None,
        *,
        kinds: Iterable[str] | None = None,
        session_id: str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """KV event rows, oldest first (narrow them: a self.store may hold millions)."""
        stmt = select(*_columns(KVEventRow, "id"))
        if kinds is not None:
            stmt = stmt.where(KVEventRow.kind.in_(list(kinds)))
        if session_id is not None:
            stmt = stmt.where(KVEventRow.session_id == session_id)
        stmt = _between(stmt, KVEventRow.ts, since, until).order_by(KVEventRow.ts, KVEventRow.id)
        return read(self.store, stmt if limit is None else stmt.limit(limit))

    def session_events(
        self, windows: list[tuple[str, float, float]], *, kinds: Iterable[str], chunk: int = 200
    ) -> pd.DataFrame:
        """KV event rows of `kinds` in any of the (session id, after, until] windows, each row once, oldest first: a
        few steps' events out of millions, through the (session_id, ts) index."""
        frames, kinds, columns = [], list(kinds), (KVEventRow.id, *_columns(KVEventRow, "id"))
        for i in range(0, len(windows), chunk):  # one indexed range read per window, a UNION ALL per chunk
            frames.append(
                read(
                    self.store,
                    union_all(
                        *(
                            select(*columns).where(
                                KVEventRow.session_id == sid,
                                KVEventRow.ts > low,
                                KVEventRow.ts <= high,
                                KVEventRow.kind.in_(kinds),
                            )
                            for sid, low, high in windows[i : i + chunk]
                        )
                    ),
                )
            )
        if not frames:
            return read(self.store, select(*_columns(KVEventRow, "id")).limit(0))
        rows = pd.concat(frames).drop_duplicates("id").sort_values(["ts", "id"], kind="stable")
        return rows.drop(columns="id").reset_index(drop=True)

    def stored_blocks(
        self,
        since=None,
        until=None,
        *,
        latest: int | None = None,
        instances: Instances = None,
        unnamed: bool = False,
    ) -> pd.DataFrame:
        """`stored` events: the hash chains (`block_hash`, `parent_hash`) with who stored them and when, whether each
        brought back a block lost there (`restored`), and the tokens a chain's first block shared, short of a block,
        with an earlier chain's (`shared_start_tokens`), oldest first; `latest`: only the newest this many (chosen in
        SQL, by the `(kind, ts)` index); `unnamed`: only the stores that named no session."""
        stmt = select(
            KVEventRow.ts,
            KVEventRow.instance,
            KVEventRow.block_hash,
            KVEventRow.parent_hash,
            KVEventRow.num_tokens,
            KVEventRow.session_id,
            KVEventRow.request_id,
            KVEventRow.restored,
            KVEventRow.shared_start_tokens,
        )
        stmt = _of_instances(stmt.where(KVEventRow.kind == KVEventKind.STORED.value), KVEventRow.instance, instances)
        stmt = _between(stmt, KVEventRow.ts, since, until)
        if unnamed:
            stmt = stmt.where(KVEventRow.session_id.is_(None))
        if latest is None:
            return read(self.store, stmt.order_by(KVEventRow.ts, KVEventRow.id))
        newest = read(self.store, stmt.order_by(KVEventRow.ts.desc(), KVEventRow.id.desc()).limit(latest))
        return newest.iloc[::-1].reset_index(drop=True)

    def top_restored_blocks(
        self, since=None, until=None, *, limit: int = 20, instances: Instances = None
    ) -> pd.DataFrame:
        """Blocks brought back most often on one instance in the window (lost there, then computed again; the same
        block on two replicas is not a restore): `instance`, `block_hash`, `restores`, `sessions`, `first_ts`,
        `last_ts`, `restored_after_s` (the mean time each had been lost), most-restored first. Read from the
        restores known at ingest (`kv_events.restored`), one GROUP BY over the window's restores."""
        count = func.count()
        stmt = select(
            KVEventRow.instance,
            KVEventRow.block_hash,
            count.label("restores"),
            func.count(distinct(KVEventRow.session_id)).label("sessions"),
            func.min(KVEventRow.ts).label("first_ts"),
            func.max(KVEventRow.ts).label("last_ts"),
            func.avg(KVEventRow.restored_after_s).label("restored_after_s"),
        ).where(KVEventRow.kind == KVEventKind.STORED.value, KVEventRow.restored == 1)
        stmt = _between(_of_instances(stmt, KVEventRow.instance, instances), KVEventRow.ts, since, until)
        stmt = stmt.group_by(KVEventRow.instance, KVEventRow.block_hash)
        return read(self.store, stmt.order_by(count.desc(), func.min(KVEventRow.ts)).limit(limit))

    def metric_series(self, names: Iterable[str], since=None, until=None, instance=None) -> pd.DataFrame:
        """Scraped samples (`ts`, `instance`, `name`, `labels`, `value`) of the given names, oldest first."""
        stmt = select(*_columns(MetricSampleRow, "id")).where(MetricSampleRow.name.in_(list(names)))
        if instance is not None:
            stmt = stmt.where(MetricSampleRow.instance == instance)
        return read(self.store, _between(stmt, MetricSampleRow.ts, since, until).order_by(MetricSampleRow.ts))

    def alerts(self, since=None, until=None) -> pd.DataFrame:
        """Alert transitions (firing, resolved), newest first."""
        stmt = _between(select(*_columns(AlertRow)), AlertRow.ts, since, until)
        return read(self.store, stmt.order_by(AlertRow.ts.desc(), AlertRow.id.desc()))

    def raw_counts(
        self,
        since,
        until,
        bucket_s: float,
        kinds: list[str] | None,
        *,
        upper_open: bool = False,
        instances: list[str] | None = None,
        by_instance: bool = False,
    ) -> pd.DataFrame:
        """From `kv_events`: rows with `since <= ts <= until` (`< until` when `upper_open`)."""
        bucket = (func.floor(KVEventRow.ts / bucket_s) * bucket_s).label("bucket")
        keys = [bucket, *([KVEventRow.instance] if by_instance else []), KVEventRow.kind, KVEventRow.reason]
        stmt = select(
            *keys, func.count().label("events"), func.coalesce(func.sum(KVEventRow.first_owner), 0).label("blocks")
        )
        if since is not None:
            stmt = stmt.where(KVEventRow.ts >= since)
        if until is not None:
            stmt = stmt.where(KVEventRow.ts < until if upper_open else KVEventRow.ts <= until)
        if kinds is not None:
            stmt = stmt.where(KVEventRow.kind.in_(kinds))
        return read(self.store, _of_instances(stmt, KVEventRow.instance, instances).group_by(*keys))

    def minute_counts(
        self,
        low,
        high,
        bucket_s: float,
        kinds: list[str] | None,
        *,
        instances: list[str] | None = None,
        by_instance: bool = False,
    ) -> pd.DataFrame:
        """From `kv_event_minutes`: the minutes starting in [low, high)."""
        m = KVEventMinuteRow
        bucket = (func.floor(m.minute / bucket_s) * bucket_s).label("bucket")
        reason = func.nullif(m.reason, "").label("reason")
        keys = [bucket, *([m.instance] if by_instance else []), m.kind, reason]
        stmt = select(*keys, func.sum(m.events).label("events"), func.sum(m.blocks).label("blocks"))
        if low is not None:
            stmt = stmt.where(m.minute >= low)
        if high is not None:
            stmt = stmt.where(m.minute < high)
        if kinds is not None:
            stmt = stmt.where(m.kind.in_(kinds))
        return read(self.store, _of_instances(stmt, m.instance, instances).group_by(*keys))
