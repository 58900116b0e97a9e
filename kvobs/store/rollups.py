"""KV events per time bucket from the per-minute rollup (`kv_event_minutes`), exact at any window.

    counts(store, since, until, bucket_s=300)    # bucket, kind, reason, events, blocks
    counts(store, since, until, 300, instances=["vllm-a"], by_instance=True)   # ... and instance, of vllm-a only

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
from kvobs.store.sql_read import _of_instances, read

COLUMNS = ["bucket", "kind", "reason", "events", "blocks"]


def counts(
    store,
    since=None,
    until=None,
    bucket_s: float = 60.0,
    kinds: Iterable[str] | None = None,
    *,
    instances: Iterable[str] | None = None,
    by_instance: bool = False,
) -> pd.DataFrame:
    """Events and blocks per bucket (its start, epoch s), kind and reason (and `instance`, `by_instance`), oldest
    first; of `instances` only (None: all)."""
    kinds = None if kinds is None else list(kinds)
    scope = {"instances": None if instances is None else list(instances), "by_instance": by_instance}
    if bucket_s < MINUTE_S or bucket_s % MINUTE_S:
        return _ordered(raw_counts(store, since, until, bucket_s, kinds, **scope), by_instance)
    low = None if since is None else math.ceil(since / MINUTE_S) * MINUTE_S  # whole minutes: [low, high)
    high = None if until is None else math.floor(until / MINUTE_S) * MINUTE_S
    if low is not None and high is not None and low >= high:
        return _ordered(raw_counts(store, since, until, bucket_s, kinds, **scope), by_instance)
    parts = [minute_counts(store, low, high, bucket_s, kinds, **scope)]
    if since is not None and since < low:
        parts.append(raw_counts(store, since, low, bucket_s, kinds, upper_open=True, **scope))
    if until is not None:
        parts.append(raw_counts(store, high, until, bucket_s, kinds, **scope))
    parts = [part for part in parts if not part.empty]
    if not parts:
        return pd.DataFrame(columns=_columns(by_instance))
    frame = pd.concat(parts).astype({"reason": object})
    keys = ["bucket", *(["instance"] if by_instance else []), "kind", "reason"]
    frame = frame.groupby(keys, dropna=False, as_index=False)[["events", "blocks"]].sum()
    return _ordered(frame, by_instance)


def _columns(by_instance: bool) -> list[str]:
    return ["bucket", "instance", *COLUMNS[1:]] if by_instance else COLUMNS


def _ordered(frame: pd.DataFrame, by_instance: bool = False) -> pd.DataFrame:
    order = ["bucket", "instance", "kind"] if by_instance else ["bucket", "kind"]
    frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
    frame["reason"] = pd.Series([None if pd.isna(r) else r for r in frame["reason"]], dtype=object)
    return frame.astype({"events": "int64", "blocks": "int64"})[_columns(by_instance)]


@per_backend
def raw_counts(
    store,
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
    return read(store, _of_instances(stmt, KVEventRow.instance, instances).group_by(*keys))


@per_backend
def minute_counts(
    store,
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
    return read(store, _of_instances(stmt, m.instance, instances).group_by(*keys))
