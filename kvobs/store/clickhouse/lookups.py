"""The lookups of a ClickHouse store: `ClickHouseLookups`, the `Lookups` of `ClickHouseStore` (the collector's are
keyed by an array parameter, never a pasted list)."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from kvobs.semconv.spans import CLOCK_KINDS, StepStatus
from kvobs.store.clickhouse.reads import LOSSES, STORED, Queries, _columns, _Where
from kvobs.store.schema import TABLES

_OF_SESSIONS = "WHERE session_id IN {keys:Array(String)}"


class ClickHouseLookups:
    """`kvobs.store.interface.Lookups` in ClickHouse SQL."""

    def __init__(self, store: Queries) -> None:
        self.store = store

    def instance_counter_before(self, column: str, ts: float, *, instances=None) -> dict[str, float]:
        if column not in TABLES["snapshots"].__table__.columns:
            raise ValueError(f"no snapshot column {column!r}")
        scope = "" if instances is None else "AND instance IN {instances:Array(String)} "
        frame = self.store.frame(
            f"""SELECT instance, argMax({column}, (ts, id)) AS value FROM snapshots
            WHERE session_id IS NULL AND ts < {{ts:Float64}} AND {column} IS NOT NULL {scope}GROUP BY instance""",
            {"ts": ts, **({} if instances is None else {"instances": list(instances)})},
        )
        return dict(zip(frame["instance"], frame["value"].astype(float)))

    def restored_blocks(self, since: float, until: float) -> pd.DataFrame:
        return self.store.frame(
            f"""SELECT instance, toInt64(count()) AS stored, toInt64(sum(r)) AS restored
            FROM (SELECT instance, restored AS r FROM kv_events
                  WHERE kind = '{STORED}' AND ts >= {{since:Float64}} AND ts <= {{until:Float64}}
                    AND restored IS NOT NULL)
            GROUP BY instance""",
            {"since": float(since), "until": float(until)},
        )

    def block_lifetimes(self, since: float, until: float) -> pd.DataFrame:
        return self.store.frame(
            f"""SELECT instance, ts, block_hash, assumeNotNull(life) AS lifetime_s
            FROM (SELECT instance, ts, block_hash, lifetime_s AS life FROM kv_events
                  WHERE {LOSSES} AND ts >= {{since:Float64}} AND ts <= {{until:Float64}} AND first_owner = 1
                    AND lifetime_s IS NOT NULL)""",
            {"since": float(since), "until": float(until)},
        )

    def latest_kv_ts(self, instance: str) -> float | None:
        frame = self.store.frame(
            "SELECT max(ts) AS latest, count() AS n FROM kv_events WHERE instance = {instance:String}",
            {"instance": instance},
        )
        return float(frame["latest"].iloc[0]) if frame["n"].iloc[0] else None  # (max of no rows is 0 there)

    def block_history(self, instance: str, since: float, until: float) -> pd.DataFrame:
        kinds = ", ".join(f"'{kind}'" for kind in CLOCK_KINDS)
        return self.store.frame(
            f"""SELECT ts, kind, block_hash, medium, group_idx FROM kv_events
            WHERE instance = {{instance:String}} AND kind IN ({kinds})
              AND ts >= {{since:Float64}} AND ts < {{until:Float64}}
            ORDER BY ts, id""",
            {"instance": instance, "since": float(since), "until": float(until)},
        )

    def cached_prompt_tokens(self, since: float, until: float) -> pd.DataFrame:
        # the sums' aliases are the columns' names: filter in a subquery (ClickHouse resolves WHERE to the aliases)
        return self.store.frame(
            """SELECT instance, toInt64(count()) AS requests, sum(cached) AS cached_tokens,
            sum(prompt) AS prompt_tokens
            FROM (SELECT instance, cached_tokens AS cached, prompt_tokens AS prompt FROM requests FINAL
                  WHERE arrival_ts >= {since:Float64} AND arrival_ts <= {until:Float64}
                    AND cached_tokens IS NOT NULL AND prompt_tokens IS NOT NULL)
            GROUP BY instance ORDER BY instance""",
            {"since": float(since), "until": float(until)},
        )

    def session_idle_losses(self, until: float) -> pd.DataFrame:
        return self.store.frame(
            """SELECT session_id, instance, ts, session_evicted_idle_blocks FROM snapshots
            WHERE session_id IS NOT NULL AND ts <= {until:Float64} AND session_evicted_idle_blocks IS NOT NULL""",
            {"until": float(until)},
        )

    def step_counts(self, since: float, until: float, *, exclude_errors: tuple[str, ...] = ()) -> tuple[int, int]:
        frame = self.store.frame(
            f"""SELECT toInt64(count()) AS total, toInt64(countIf(status = '{StepStatus.ERROR.value}'
            AND coalesce(error_type, '') NOT IN {{excluded:Array(String)}})) AS failed FROM steps FINAL
            WHERE started_at >= {{since:Float64}} AND started_at <= {{until:Float64}}""",
            {"since": float(since), "until": float(until), "excluded": list(exclude_errors)},
        )
        return int(frame["total"].iloc[0]), int(frame["failed"].iloc[0])

    def verdict_counts(self, since=None, until=None) -> tuple[int, int]:
        where = _Where().window("started_at", since, until)
        frame = self.store.frame(
            f"SELECT toInt64(count()) AS decided, toInt64(count(slow)) AS weighed FROM step_verdicts FINAL{where}",
            where.params,
        )
        return int(frame["decided"].iloc[0]), int(frame["weighed"].iloc[0])

    def latest_alert_states(self) -> pd.DataFrame:
        return self.store.frame(f"""SELECT {_columns("alerts")} FROM (SELECT * FROM alerts ORDER BY id DESC
            LIMIT 1 BY rule, instance, session_id)""")

    def session_ends(self, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, float]:
        frame = self.store.frame(
            f"SELECT session_id, ended_at FROM sessions FINAL {_OF_SESSIONS} AND ended_at IS NOT NULL",
            {"keys": list(session_ids)},
        )
        return {session_id: float(ended) for session_id, ended in zip(frame["session_id"], frame["ended_at"])}

    def session_step_counts(self, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, tuple[int, int]]:
        frame = self.store.frame(
            f"SELECT session_id, max(step_index) + 1 AS n, countIf(status = '{StepStatus.ERROR.value}') "
            f"AS failed FROM steps FINAL {_OF_SESSIONS} GROUP BY session_id",
            {"keys": list(session_ids)},
        )
        return {sid: (int(n), int(failed)) for sid, n, failed in zip(frame["session_id"], frame["n"], frame["failed"])}

    def trace_sessions(self, trace_ids: Iterable[str], *, chunk: int = 500) -> dict[str, str]:
        sql = "SELECT trace_id, session_id FROM steps FINAL WHERE trace_id IN {keys:Array(String)}"
        return dict(
            self.store.frame(sql, {"keys": list(trace_ids)})[["trace_id", "session_id"]].itertuples(index=False)
        )
