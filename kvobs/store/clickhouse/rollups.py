"""The per-minute rollups of snapshots and requests on ClickHouse (`kvobs.store.rollups`): AggregatingMergeTree
tables whose values merge as SQL's upsert merges them (`SimpleAggregateFunction` sum, max, min), so a batch's
partial minutes are inserted as they are and the reads merge them (`GROUP BY` the keys).

    STATEMENTS, LOOKUP_STATEMENT            # schema versions 10 and 12 (`ddl.MIGRATIONS`)
    fill(client)                            # the rollups of the rows stored before
    client.insert(table, as_arrow(rollup, frame), token=...)
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from kvobs.store.rollups import (
    LATENCY_MINUTES,
    LOOKUP_MINUTES,
    REQUEST_COLUMNS,
    REQUEST_MINUTES,
    SNAPSHOT_COLUMNS,
    SNAPSHOT_MINUTES,
    Rollup,
    stored_rollups,
)

_KEY_TYPES = {"minute": "Float64", "instance": "LowCardinality(String)", "metric": "LowCardinality(String)"}
_NULLABLE = {"usage_max"}  # a minute whose snapshots give no usage has no highest usage
_CHUNK = 1_000_000  # rows read at a time while filling the rollups


def value_type(column: str) -> str:
    """A rollup value column's ClickHouse type: counts are Int64, sums of seconds, usage and times Float64."""
    floats = column.endswith(("_sum", "_ts", "_max")) or column in ("preemptions", "minute")
    return "Float64" if floats else "Int64"


def create_statement(rollup: Rollup) -> str:
    keys = [f"{c} {_KEY_TYPES.get(c, 'Int32')}" for c in rollup.keys]
    values = []
    for column, how in rollup.how().items():
        inner = value_type(column)
        inner = f"Nullable({inner})" if column in _NULLABLE else inner
        values.append(f"{column} SimpleAggregateFunction({how}, {inner})")
    order = ("instance", *(k for k in rollup.keys if k != "instance"))
    return (
        f"CREATE TABLE IF NOT EXISTS {rollup.table} ({', '.join(keys + values)}) "
        f"ENGINE = AggregatingMergeTree ORDER BY ({', '.join(order)})"
    )


def as_arrow(rollup: Rollup, frame: pd.DataFrame) -> pa.Table:
    """Partial rows keyed by `window` (`kvobs.store.rollups`) as the insert's Arrow table."""
    frame = frame.rename(columns={"window": "minute"})
    columns = {}
    for column in rollup.columns:
        if column in ("instance", "metric"):
            columns[column] = pa.array(frame[column].astype(str).to_numpy(object), pa.string())
        elif column == "value_bin":
            columns[column] = pa.array(frame[column].to_numpy("int32"), pa.int32())
        elif value_type(column) == "Float64":
            columns[column] = pa.array(frame[column].to_numpy(float), pa.float64(), from_pandas=True)
        else:
            columns[column] = pa.array(frame[column].to_numpy("int64"), pa.int64())
    return pa.table(columns)


def merged_select(rollup: Rollup, minute: str = "minute") -> str:
    """`SELECT` of a rollup's rows merged per key, its minute as `bucket` (`minute`: an expression of it, to merge
    minutes into longer buckets; the WHERE and GROUP BY follow)."""
    keys = ", ".join(f"{minute} AS bucket" if key == "minute" else key for key in rollup.keys)
    values = ", ".join(f"{how}({c}) AS {c}" for c, how in rollup.how().items())
    return f"SELECT {keys}, {values} FROM {rollup.table}"


def fill(client) -> None:
    """The rollups of the snapshots and requests stored before them, by the writer's own functions, a chunk of rows
    at a time (version 10 of the schema)."""
    snaps = _chunks(
        client, f"SELECT {', '.join(SNAPSHOT_COLUMNS)} FROM snapshots WHERE session_id IS NULL ORDER BY ts, id"
    )
    reqs = _chunks(client, f"SELECT {', '.join(REQUEST_COLUMNS)} FROM requests FINAL ORDER BY arrival_ts")
    for rollup, merged in stored_rollups(snaps, reqs):
        if not merged.empty:
            client.insert(rollup.table, as_arrow(rollup, merged))


def _chunks(client, sql: str):
    offset = 0
    while True:
        chunk = client.query_df(f"{sql} LIMIT {_CHUNK} OFFSET {offset}")
        if chunk.empty:
            return
        yield chunk.assign(**{c: pd.to_numeric(chunk[c]).astype(float) for c in chunk.columns if c != "instance"})
        offset += len(chunk)


STATEMENTS = [create_statement(rollup) for rollup in (SNAPSHOT_MINUTES, REQUEST_MINUTES, LATENCY_MINUTES)]  # v10
LOOKUP_STATEMENT = create_statement(LOOKUP_MINUTES)  # v12
