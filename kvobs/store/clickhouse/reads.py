"""The reads of a ClickHouse store in ClickHouse SQL: `ClickHouseReads`, the `Reads` of `ClickHouseStore`.

Same arguments, columns and values as on SQL (the contract tests compare every read on SQLite, PostgreSQL and chDB).
Updated tables are read with `FINAL`; one session's KV events are narrowed to its time range through
`kv_event_sessions`. Values are bound as ClickHouse query parameters, never pasted in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import pandas as pd

from kvobs.semconv.spans import BLOCK_LOSS_KINDS, STEP_JOINED, KVEventKind, StepStatus
from kvobs.store.clickhouse.ddl import FOOTPRINT_VALUES
from kvobs.store.clickhouse.rollups import merged_select
from kvobs.store.composed import ComposedReads
from kvobs.store.rollups import ROLLUPS
from kvobs.store.schema import FOOTPRINT_COLUMNS, TABLES


class Queries(Protocol):
    """What the reads and lookups use of a ClickHouse store (`kvobs.store.clickhouse.store.ClickHouseStore`): a query
    into a frame. A type of their own, so the rooms the store is built of never import the store."""

    def frame(self, sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame: ...


STORED = KVEventKind.STORED.value


def _columns(table: str, *exclude: str) -> str:
    return ", ".join(c.name for c in TABLES[table].__table__.columns if c.name not in exclude)


class _Where:
    """WHERE clauses and their parameters, built up one condition at a time."""

    def __init__(self, *clauses: str, **params) -> None:
        self.clauses, self.params = list(clauses), dict(params)

    def add(self, clause: str, **params) -> _Where:
        self.clauses.append(clause)
        self.params.update(params)
        return self

    def window(self, column: str, since, until) -> _Where:
        if since is not None:
            self.add(f"{column} >= {{since:Float64}}", since=float(since))
        if until is not None:
            self.add(f"{column} <= {{until:Float64}}", until=float(until))
        return self

    def instances(self, instances, column: str = "instance") -> _Where:
        if instances is not None:
            self.add(f"{column} IN {{instances:Array(String)}}", instances=list(instances))
        return self

    def __str__(self) -> str:
        return " WHERE " + " AND ".join(self.clauses) if self.clauses else ""


LOSSES = "kind IN (" + ", ".join(f"'{kind}'" for kind in BLOCK_LOSS_KINDS) + ")"


class ClickHouseReads(ComposedReads):
    """`kvobs.store.interface.Reads` in ClickHouse SQL."""

    def __init__(self, store: Queries) -> None:
        self.store = store

    def time_range(self) -> tuple[float, float] | None:
        # min, max and count of `ts` come from the parts' own minmax index (ClickHouse's implicit minmax_count
        # projection: no row read), so the sidebar's first read costs the same at any size; an empty table's 0 is
        # left out by its count
        bounds = self.store.frame("""SELECT minOrNull(low) AS low, maxOrNull(high) AS high FROM (
            SELECT if(n = 0, NULL, low) AS low, if(n = 0, NULL, high) AS high FROM (
                SELECT min(ts) AS low, max(ts) AS high, count() AS n FROM snapshots
                UNION ALL SELECT min(ts), max(ts), count() FROM kv_events)
            UNION ALL SELECT minOrNull(arrival_ts), maxOrNull(arrival_ts) FROM requests FINAL
            UNION ALL SELECT minOrNull(started_at), maxOrNull(started_at) FROM steps FINAL)""")
        low, high = bounds["low"].iloc[0], bounds["high"].iloc[0]
        return None if pd.isna(low) else (float(low), float(high))

    def instances(self) -> list[str]:
        return sorted(
            self.store.frame("""SELECT DISTINCT instance FROM (SELECT instance FROM snapshots
            UNION ALL SELECT instance FROM requests UNION ALL SELECT instance FROM kv_event_minutes)""")["instance"]
        )

    def instance_snapshots(self, since=None, until=None, *, instances=None) -> pd.DataFrame:
        where = _Where("session_id IS NULL").window("ts", since, until).instances(instances)
        return self.store.frame(
            f"SELECT {_columns('snapshots', 'id')} FROM snapshots{where} ORDER BY ts, id", where.params
        )

    def raw_snapshot_times(self, since, until, bucket_s: float, *, instances=None) -> pd.DataFrame:
        where = _Where("session_id IS NULL").window("ts", since, until).instances(instances)
        return self.store.frame(
            f"""SELECT instance, floor(ts / {{bucket:Float64}}) * {{bucket:Float64}} AS bucket, min(ts) AS first_ts,
            max(ts) AS last_ts, toInt64(count()) AS samples FROM snapshots{where}
            GROUP BY instance, bucket ORDER BY instance, bucket""",
            {**where.params, "bucket": float(bucket_s)},
        )

    def session_snapshots(self, session_id: str) -> pd.DataFrame:
        return self.store.frame(
            f"SELECT {_columns('snapshots', 'id')} FROM snapshots WHERE session_id = {{sid:String}} ORDER BY ts, id",
            {"sid": session_id},
        )

    def session_footprints(self, since=None, until=None, *, instances=None) -> pd.DataFrame:
        """From the rollup (`session_footprints`) for sessions whose latest footprint is in the window; from the raw
        snapshots for those whose latest came after `until`."""
        values = ", ".join(f"latest.{i} AS {name}" for i, name in enumerate(FOOTPRINT_VALUES, start=1))
        scope = _Where().instances(instances)
        rollup = f"""SELECT {", ".join(FOOTPRINT_COLUMNS)} FROM (SELECT session_id, instance, {values} FROM (
            SELECT session_id, instance, argMaxMerge(latest) AS latest FROM session_footprints{scope}
            GROUP BY session_id, instance))"""
        where = _Where().window("ts", since, None)  # (those past `until` too: whether the raw read is needed)
        frame = self.store.frame(f"{rollup}{where}", {**where.params, **scope.params})
        if until is None or not (frame["ts"] > until).any():  # (a window that reaches the present: no raw read)
            return frame
        frame = frame[frame["ts"] <= until].reset_index(drop=True)
        raw = (
            _Where("session_id IS NOT NULL")
            .window("ts", since, until)
            .instances(instances)
            .add(
                f"(assumeNotNull(session_id), instance) IN (SELECT session_id, instance FROM ({rollup}) "
                "WHERE ts > {until:Float64})"
            )
        )
        earlier = self.store.frame(
            f"""SELECT {_columns("snapshots", "id")} FROM (
            SELECT * FROM snapshots{raw} ORDER BY ts DESC, id DESC LIMIT 1 BY session_id, instance) ORDER BY id""",
            raw.params,
        )
        return frame if earlier.empty else pd.concat([frame, earlier], ignore_index=True)

    def request_rows(self, since=None, until=None, session_id: str | None = None, *, instances=None) -> pd.DataFrame:
        where = _Where().window("arrival_ts", since, until).instances(instances)
        if session_id is not None:
            where.add("session_id = {sid:String}", sid=session_id)
        sql = f"SELECT {_columns('requests', 'id')} FROM requests FINAL{where} ORDER BY arrival_ts"
        return self.store.frame(sql, where.params)

    def steps(
        self,
        since=None,
        until=None,
        session_id: str | None = None,
        *,
        status: str | None = None,
        session_ids: Iterable[str] | None = None,
    ) -> pd.DataFrame:
        where = _Where().window("started_at", since, until)
        if session_id is not None:
            where.add("session_id = {sid:String}", sid=session_id)
        if session_ids is not None:
            where.add("session_id IN {sids:Array(String)}", sids=list(session_ids))
        if status is not None:  # after FINAL: the latest version's status (no PREWHERE with FINAL)
            where.add("status = {status:String}", status=status)
        return self.store.frame(f"SELECT {_columns('steps')} FROM steps FINAL{where} ORDER BY started_at", where.params)

    def step_outcomes(self, since=None, until=None) -> pd.DataFrame:
        where = _Where().window("started_at", since, until)
        known = "prompt_tokens IS NOT NULL AND cached_tokens IS NOT NULL"
        return self.store.frame(
            f"""SELECT session_id, toInt64(count()) AS steps, toInt64(countIf(status = '{StepStatus.ERROR.value}'))
            AS failed, quantileExactInclusive(0.5)(e2e_s) AS e2e_p50,
            if(countIf({known}) = 0, NULL, sumIf(toInt64(cached_tokens), {known})) AS cached_sum,
            if(countIf({known}) = 0, NULL, sumIf(toInt64(prompt_tokens), {known})) AS prompt_sum,
            toInt64(count(request_join)) AS judged, toInt64(countIf(request_join IN {{joined:Array(String)}})) AS joined
            FROM steps FINAL{where} GROUP BY session_id ORDER BY session_id""",
            {**where.params, "joined": sorted(STEP_JOINED)},
        ).rename(columns={"cached_sum": "cached_tokens", "prompt_sum": "prompt_tokens"})  # (an alias of a column's
        # own name would stand for the column inside the other aggregates)

    def step_windows(self, since, until, bucket_s: float) -> pd.DataFrame:
        where = _Where().window("started_at", since, until)
        return self.store.frame(
            f"""SELECT floor(started_at / {{bucket:Float64}}) * {{bucket:Float64}} AS bucket, toInt64(count()) AS
            steps, toInt64(countIf(status = '{StepStatus.ERROR.value}')) AS failed, min(started_at) AS first_ts,
            max(started_at) AS last_ts FROM steps FINAL{where} GROUP BY bucket ORDER BY bucket""",
            {**where.params, "bucket": float(bucket_s)},
        )

    def minute_rollup(
        self, table: str, low, high, *, instances=None, bucket_s: float | None = None, metrics=None
    ) -> pd.DataFrame:
        rollup = {r.table: r for r in ROLLUPS}[table]
        where = _Where("minute >= {low:Float64}", "minute < {high:Float64}", low=float(low), high=float(high))
        if metrics is not None:
            where.add("metric IN {metrics:Array(String)}", metrics=list(metrics))
        bucket = "minute" if bucket_s is None else "floor(minute / {bucket:Float64}) * {bucket:Float64}"
        keys = ", ".join("bucket" if key == "minute" else key for key in rollup.keys)
        params = {**where.params, **({} if bucket_s is None else {"bucket": float(bucket_s)})}
        return self.store.frame(
            f"{merged_select(rollup, bucket)}{where.instances(instances)} GROUP BY {keys} ORDER BY {keys}",
            {**params, **where.params},
        ).rename(columns={"bucket": "minute"})

    def request_lookups(self, since=None, until=None, *, instances=None, session_id: str | None = None) -> pd.DataFrame:
        where = _Where().window("lookup_ts", since, until).instances(instances)
        if session_id is not None:
            where.add("session_id = {sid:String}", sid=session_id)
        sql = f"SELECT {_columns('request_lookups')} FROM request_lookups{where} ORDER BY lookup_ts, instance"
        return self.store.frame(sql, where.params)

    def connector_lookups(self, since=None, until=None) -> pd.DataFrame:
        where = _Where().window("started_at", since, until)
        columns = _columns("connector_lookups", "id")
        sql = f"SELECT {columns} FROM connector_lookups{where} ORDER BY started_at, instance"
        return self.store.frame(sql, where.params)

    def lookup_progress(self, *, instances=None) -> pd.DataFrame:
        where = _Where().instances(instances)
        sql = f"SELECT {_columns('lookup_progress')} FROM lookup_progress FINAL{where} ORDER BY instance"
        return self.store.frame(sql, where.params)

    def verdict_progress(self) -> pd.DataFrame:
        return self.store.frame(f"SELECT {_columns('verdict_progress')} FROM verdict_progress FINAL ORDER BY keeper")

    def step_verdicts(
        self, since=None, until=None, *, status=None, session_id=None, slow=None, decided_in: bool = False
    ) -> pd.DataFrame:
        where = _Where().window("decided_at" if decided_in else "started_at", since, until)
        if status is not None:  # after FINAL: the latest decision's
            where.add("status = {status:String}", status=status)
        if session_id is not None:
            where.add("session_id = {sid:String}", sid=session_id)
        if slow is not None:
            where.add("slow = {slow:Bool}", slow=bool(slow))
        return self.store.frame(
            f"SELECT {_columns('step_verdicts')} FROM step_verdicts FINAL{where} ORDER BY session_id, step_index",
            where.params,
        )

    def undecided_steps(self, since=None, until=None) -> pd.DataFrame:
        where = _Where().window("started_at", since, until)
        decided = f"SELECT session_id, step_index FROM step_verdicts{_Where().window('started_at', since, until)}"
        where.add(f"(session_id, step_index) NOT IN ({decided})")
        return self.store.frame(
            f"SELECT session_id, step_index, started_at FROM steps FINAL{where} ORDER BY started_at", where.params
        )

    def sessions(self) -> pd.DataFrame:
        return self.store.frame(f"SELECT {_columns('sessions')} FROM sessions FINAL ORDER BY started_at")

    def runs(self, *, instances=None) -> pd.DataFrame:
        where = _Where().instances(instances)
        return self.store.frame(
            f"SELECT {_columns('runs')} FROM runs FINAL{where} ORDER BY instance, started_at", where.params
        )

    def raw_counts(
        self,
        since,
        until,
        bucket_s: float,
        kinds,
        *,
        upper_open: bool = False,
        instances=None,
        by_instance: bool = False,
    ) -> pd.DataFrame:
        where = _Where().instances(instances)
        if since is not None:
            where.add("ts >= {since:Float64}", since=float(since))
        if until is not None:
            where.add(f"ts {'<' if upper_open else '<='} {{until:Float64}}", until=float(until))
        if kinds is not None:
            where.add("kind IN {kinds:Array(String)}", kinds=list(kinds))
        keys = "bucket, instance, kind, reason" if by_instance else "bucket, kind, reason"
        return self.store.frame(
            f"""SELECT floor(ts / {{bucket:Float64}}) * {{bucket:Float64}} AS bucket,
            {"instance," if by_instance else ""} kind, reason,
            toInt64(count()) AS events, toInt64(sum(coalesce(first_owner, 0))) AS blocks FROM kv_events{where}
            GROUP BY {keys}""",
            {**where.params, "bucket": float(bucket_s)},
        )

    def minute_counts(
        self, low, high, bucket_s: float, kinds, *, instances=None, by_instance: bool = False
    ) -> pd.DataFrame:
        where = _Where().instances(instances)
        if low is not None:
            where.add("minute >= {low:Float64}", low=float(low))
        if high is not None:
            where.add("minute < {high:Float64}", high=float(high))
        if kinds is not None:
            where.add("kind IN {kinds:Array(String)}", kinds=list(kinds))
        return self.store.frame(
            f"""SELECT floor(minute / {{bucket:Float64}}) * {{bucket:Float64}} AS bucket,
            {"instance," if by_instance else ""} kind,
            nullIf(reason, '') AS reason, toInt64(sum(events)) AS events, toInt64(sum(blocks)) AS blocks
            FROM kv_event_minutes{where} GROUP BY bucket, {"instance, " if by_instance else ""}kind, reason""",
            {**where.params, "bucket": float(bucket_s)},
        )

    def kv_events(
        self,
        since=None,
        until=None,
        *,
        kinds: Iterable[str] | None = None,
        session_id: str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        where = _Where().window("ts", since, until)
        if kinds is not None:
            where.add("kind IN {kinds:Array(String)}", kinds=list(kinds))
        if session_id is not None:  # the session's time range first: a narrow read of the (instance, kind, ts) order
            where.add("session_id = {sid:String}", sid=session_id)
            where.add("ts >= (SELECT min(first_ts) FROM kv_event_sessions WHERE session_id = {sid:String})")
            where.add("ts <= (SELECT max(last_ts) FROM kv_event_sessions WHERE session_id = {sid:String})")
        sql = f"SELECT {_columns('kv_events', 'id')} FROM kv_events{where} ORDER BY ts, id"
        return self.store.frame(sql if limit is None else f"{sql} LIMIT {int(limit)}", where.params)

    def session_events(self, windows: list[tuple[str, float, float]], *, kinds, chunk: int = 200) -> pd.DataFrame:
        """The windows as a table joined on the session, then the range: a narrow read of the (instance, kind, ts) order
        per kind."""
        sids, lows, highs = (list(column) for column in zip(*windows)) if windows else ([], [], [])
        return self.store.frame(
            f"""SELECT {_columns("kv_events", "id")} FROM (
            SELECT DISTINCT e.* FROM kv_events AS e
            INNER JOIN (SELECT w.1 AS sid, w.2 AS low, w.3 AS high FROM (
                SELECT arrayJoin(arrayZip({{sids:Array(String)}}, {{lows:Array(Float64)}},
                                      {{highs:Array(Float64)}})) AS w)
            ) AS win ON assumeNotNull(e.session_id) = win.sid
            WHERE e.kind IN {{kinds:Array(String)}} AND e.session_id IN {{sids:Array(String)}}
              AND e.ts > win.low AND e.ts <= win.high) ORDER BY ts, id""",
            {"sids": sids, "lows": [float(x) for x in lows], "highs": [float(x) for x in highs], "kinds": list(kinds)},
        )

    def stored_blocks(
        self, since=None, until=None, *, latest: int | None = None, instances=None, unnamed: bool = False
    ) -> pd.DataFrame:
        where = _Where(f"kind = '{STORED}'").window("ts", since, until).instances(instances)
        if unnamed:
            where.add("session_id IS NULL")
        columns = (
            "ts, instance, block_hash, parent_hash, num_tokens, session_id, request_id, restored, shared_start_tokens"
        )
        if latest is None:
            return self.store.frame(f"SELECT {columns} FROM kv_events{where} ORDER BY ts, id", where.params)
        newest = self.store.frame(
            f"SELECT {columns} FROM kv_events{where} ORDER BY ts DESC, id DESC LIMIT {int(latest)}", where.params
        )
        return newest.iloc[::-1].reset_index(drop=True)

    def top_restored_blocks(self, since=None, until=None, *, limit: int = 20, instances=None) -> pd.DataFrame:
        where = _Where(f"kind = '{STORED}' AND restored = 1").window("ts", since, until).instances(instances)
        return self.store.frame(
            f"""SELECT instance, block_hash, toInt64(count()) AS restores,
            toInt64(uniqExact(session_id)) AS sessions, min(ts) AS first_ts, max(ts) AS last_ts,
            avg(gap) AS restored_after_s
            FROM (SELECT instance, block_hash, session_id, ts, restored_after_s AS gap FROM kv_events{where})
            GROUP BY instance, block_hash ORDER BY restores DESC, first_ts LIMIT {int(limit)}""",
            where.params,
        )

    def metric_series(self, names: Iterable[str], since=None, until=None, instance=None) -> pd.DataFrame:
        where = _Where("name IN {names:Array(String)}", names=list(names)).window("ts", since, until)
        if instance is not None:
            where.add("instance = {instance:String}", instance=instance)
        sql = f"SELECT {_columns('metric_samples', 'id')} FROM metric_samples{where} ORDER BY ts, id"
        return self.store.frame(sql, where.params)

    def alerts(self, since=None, until=None) -> pd.DataFrame:
        where = _Where().window("ts", since, until)
        return self.store.frame(
            f"SELECT {_columns('alerts')} FROM alerts{where} ORDER BY ts DESC, id DESC", where.params
        )
