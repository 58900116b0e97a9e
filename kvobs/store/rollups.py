"""KV events per time bucket from the per-minute rollup (`kv_event_minutes`), exact at any window.

    counts(store, since, until, bucket_s=300)    # bucket, kind, reason, events, blocks

The minutes wholly inside [since, until] are read from the rollup (a few rows per minute, whatever the traffic);
the partial minutes at either edge, and buckets that are not whole minutes, from the raw rows. The two are sums of
the same things (`events`: rows; `blocks`: `first_owner`, one per block event), so the answer equals a count over
the raw rows exactly (tests/store/test_contract.py holds them to it). Each part has a SQL and a ClickHouse form.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd
from sqlalchemy import func, select

from kvobs.store.backends import per_backend
from kvobs.store.schema import MINUTE_S, KVEventMinuteRow, KVEventRow
from kvobs.store.sql_read import read

COLUMNS = ["bucket", "kind", "reason", "events", "blocks"]


def counts(store, since=None, until=None, bucket_s: float = 60.0, kinds: Iterable[str] | None = None) -> pd.DataFrame:
    """Events and blocks per bucket (its start, epoch s), kind and reason, oldest first."""
    kinds = None if kinds is None else list(kinds)
    if bucket_s < MINUTE_S or bucket_s % MINUTE_S:
        return _ordered(raw_counts(store, since, until, bucket_s, kinds))
    low = None if since is None else math.ceil(since / MINUTE_S) * MINUTE_S  # whole minutes: [low, high)
    high = None if until is None else math.floor(until / MINUTE_S) * MINUTE_S
    if low is not None and high is not None and low >= high:
        return _ordered(raw_counts(store, since, until, bucket_s, kinds))
    parts = [minute_counts(store, low, high, bucket_s, kinds)]
    if since is not None and since < low:
        parts.append(raw_counts(store, since, low, bucket_s, kinds, upper_open=True))
    if until is not None:
        parts.append(raw_counts(store, high, until, bucket_s, kinds))
    parts = [part for part in parts if not part.empty]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.concat(parts).astype({"reason": object})
    frame = frame.groupby(["bucket", "kind", "reason"], dropna=False, as_index=False)[["events", "blocks"]].sum()
    return _ordered(frame)


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.sort_values(["bucket", "kind"], kind="stable").reset_index(drop=True)
    frame["reason"] = pd.Series([None if pd.isna(r) else r for r in frame["reason"]], dtype=object)
    return frame.astype({"events": "int64", "blocks": "int64"})[COLUMNS]


@per_backend
def raw_counts(store, since, until, bucket_s: float, kinds: list[str] | None, *, upper_open: bool = False
               ) -> pd.DataFrame:  # fmt: skip
    """From `kv_events`: rows with `since <= ts <= until` (`< until` when `upper_open`)."""
    bucket = (func.floor(KVEventRow.ts / bucket_s) * bucket_s).label("bucket")
    stmt = select(bucket, KVEventRow.kind, KVEventRow.reason, func.count().label("events"),
                  func.coalesce(func.sum(KVEventRow.first_owner), 0).label("blocks"))  # fmt: skip
    if since is not None:
        stmt = stmt.where(KVEventRow.ts >= since)
    if until is not None:
        stmt = stmt.where(KVEventRow.ts < until if upper_open else KVEventRow.ts <= until)
    if kinds is not None:
        stmt = stmt.where(KVEventRow.kind.in_(kinds))
    return read(store, stmt.group_by(bucket, KVEventRow.kind, KVEventRow.reason))


@per_backend
def minute_counts(store, low, high, bucket_s: float, kinds: list[str] | None) -> pd.DataFrame:
    """From `kv_event_minutes`: the minutes starting in [low, high)."""
    m = KVEventMinuteRow
    bucket = (func.floor(m.minute / bucket_s) * bucket_s).label("bucket")
    reason = func.nullif(m.reason, "").label("reason")
    stmt = select(bucket, m.kind, reason, func.sum(m.events).label("events"), func.sum(m.blocks).label("blocks"))
    if low is not None:
        stmt = stmt.where(m.minute >= low)
    if high is not None:
        stmt = stmt.where(m.minute < high)
    if kinds is not None:
        stmt = stmt.where(m.kind.in_(kinds))
    return read(store, stmt.group_by(bucket, m.kind, reason))
