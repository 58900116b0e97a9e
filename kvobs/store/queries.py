"""Every read of the store, as pandas DataFrames: what analytics, alerts, what-if, collectors and the dashboard read.

    window = time_range(store)                                # (first, last) epoch seconds, None when empty
    snaps, rates = instance_snapshots(store, *window), kv_event_counts(store, *window, bucket_s=60)

Every function takes `since`/`until` (epoch seconds, inclusive) where the table is large, filters and aggregates
in SQL on indexed columns (a page never pulls a million rows) and returns plain columns (hashes as Python ints).
The per-instance tables (snapshots, requests, KV events) also take `instances`: only those (None: the whole fleet).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from sqlalchemy import distinct, func, select, tuple_, union_all

from kvobs.semconv.spans import BLOCK_LOSS_KINDS, KVEventKind
from kvobs.store import rollups
from kvobs.store.backends import per_backend
from kvobs.store.db import Store
from kvobs.store.schema import (
    FOOTPRINT_COLUMNS,
    AlertRow,
    KVEventMinuteRow,
    KVEventRow,
    MetricSampleRow,
    RequestRow,
    RunRow,
    SessionFootprintRow,
    SessionRow,
    SnapshotRow,
    StepRow,
)
from kvobs.store.sql_read import _between, _columns, _of_instances, read  # noqa: F401  (read: part of the interface)

Instances = Iterable[str] | None  # which instances a read covers; None: all


@per_backend
def time_range(store: Store) -> tuple[float, float] | None:
    """First and last timestamp of anything observed (snapshots, requests, KV events, steps); None when empty."""
    with store.engine.connect() as conn:
        bounds = [
            conn.execute(select(func.min(column), func.max(column))).one()
            for column in (SnapshotRow.ts, RequestRow.arrival_ts, KVEventRow.ts, StepRow.started_at)
        ]
    bounds = [(low, high) for low, high in bounds if low is not None]
    return (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else None


@per_backend
def instances(store: Store) -> list[str]:
    """Every instance that reported anything: snapshots (scrapes, the engine), requests, KV events (the rollup)."""
    names = union_all(
        *(
            select(column).distinct()
            for column in (SnapshotRow.instance, RequestRow.instance, KVEventMinuteRow.instance)
        )
    )
    with store.engine.connect() as conn:
        return sorted(set(conn.execute(names).scalars()) - {None})


@per_backend
def instance_snapshots(store: Store, since=None, until=None, *, instances: Instances = None) -> pd.DataFrame:
    """Instance-level snapshots (`session_id` null), oldest first."""
    stmt = select(*_columns(SnapshotRow, "id")).where(SnapshotRow.session_id.is_(None))
    stmt = _of_instances(stmt, SnapshotRow.instance, instances)
    return read(store, _between(stmt, SnapshotRow.ts, since, until).order_by(SnapshotRow.ts))


@per_backend
def session_snapshots(store: Store, session_id: str) -> pd.DataFrame:
    """One session's footprint over time: blocks cached, lost, lost while idle, hit tokens."""
    stmt = select(*_columns(SnapshotRow, "id")).where(SnapshotRow.session_id == session_id)
    return read(store, stmt.order_by(SnapshotRow.ts))


@per_backend
def session_footprints(store: Store, since=None, until=None, *, instances: Instances = None) -> pd.DataFrame:
    """Every session's latest footprint in the window: one row per (session, instance).

    Read from the rollup (`session_footprints`, a row per session) for the sessions whose latest footprint falls in
    the window, which is every session when the window reaches the present; from the raw snapshots only for those
    whose latest footprint came after `until` (a window in the past)."""
    rollup = SessionFootprintRow.__table__.c
    stmt = _of_instances(select(*(rollup[c] for c in FOOTPRINT_COLUMNS)), rollup.instance, instances)
    frame = read(store, _between(stmt, rollup.ts, since, until))
    if until is None:
        return frame
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
    earlier = read(store, stmt).drop_duplicates(["session_id", "instance"], keep="last")
    return frame if earlier.empty else pd.concat([frame, earlier], ignore_index=True)


def requests(
    store: Store, since=None, until=None, session_id: str | None = None, *, instances: Instances = None
) -> pd.DataFrame:
    """Finished requests by arrival time, with `ttft_s`, `itl_s` (mean inter-token latency) and `e2e_s` added."""
    return with_latencies(request_rows(store, since, until, session_id, instances=instances))


@per_backend
def request_rows(
    store: Store, since=None, until=None, session_id: str | None = None, *, instances: Instances = None
) -> pd.DataFrame:
    stmt = _of_instances(select(*_columns(RequestRow, "id")), RequestRow.instance, instances)
    if session_id is not None:
        stmt = stmt.where(RequestRow.session_id == session_id)
    return read(store, _between(stmt, RequestRow.arrival_ts, since, until).order_by(RequestRow.arrival_ts))


def with_latencies(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["ttft_s"] = frame["first_token_ts"] - frame["arrival_ts"]
    decode_tokens = (frame["completion_tokens"] - 1).where(frame["completion_tokens"] > 1)
    frame["itl_s"] = (frame["finished_ts"] - frame["first_token_ts"]) / decode_tokens
    frame["e2e_s"] = frame["finished_ts"] - frame["arrival_ts"]
    return frame


@per_backend
def steps(store: Store, since=None, until=None, session_id: str | None = None) -> pd.DataFrame:
    """Agent steps by start time."""
    stmt = select(*_columns(StepRow))
    if session_id is not None:
        stmt = stmt.where(StepRow.session_id == session_id)
    return read(store, _between(stmt, StepRow.started_at, since, until).order_by(StepRow.started_at))


@per_backend
def sessions(store: Store) -> pd.DataFrame:
    return read(store, select(*_columns(SessionRow)).order_by(SessionRow.started_at))


@per_backend
def runs(store: Store, *, instances: Instances = None) -> pd.DataFrame:
    """Every recorded engine run (`runs`), by instance and start: a small table (a row per engine start)."""
    stmt = _of_instances(select(*_columns(RunRow)), RunRow.instance, instances)
    return read(store, stmt.order_by(RunRow.instance, RunRow.started_at))


def kv_event_counts(
    store: Store,
    since=None,
    until=None,
    *,
    bucket_s: float = 60.0,
    instances: Instances = None,
    by_instance: bool = False,
) -> pd.DataFrame:
    """KV events per time bucket, kind and reason: `bucket` (its start, epoch s), `kind`, `reason`, `events` (rows),
    `blocks` (block events: a block lost by several owning sessions, one row each, counts once); per `instance`
    too with `by_instance`. From the per-minute rollup where the window holds whole minutes (`kvobs.store.rollups`),
    equal to counting the raw rows."""
    return rollups.counts(store, since, until, bucket_s, instances=instances, by_instance=by_instance)


def block_losses(
    store: Store, since=None, until=None, *, bucket_s: float = 60.0, instances: Instances = None
) -> pd.DataFrame:
    """Blocks lost per time bucket, kind and reason, each lost block once: `bucket`, `kind`, `reason`, `blocks`.
    "Blocks lost" everywhere (Overview, What-if): evictions, invalidations and vLLM's removals (`BLOCK_LOSS_KINDS`),
    one per (instance, time, block) however many owning sessions recorded it (`first_owner`), so a block lost twice
    counts twice. Resets (`cleared`), dropping every cached block at once, are shown on their own. From the rollup."""
    return losses_in(rollups.counts(store, since, until, bucket_s, kinds=BLOCK_LOSS_KINDS, instances=instances))


def losses_in(counts: pd.DataFrame) -> pd.DataFrame:
    """The "blocks lost" rows of `kv_event_counts` (what `block_losses` returns for the same window and bucket;
    with `instance` when the counts have it)."""
    columns = ["bucket", *(["instance"] if "instance" in counts else []), "kind", "reason", "blocks"]
    return counts.loc[counts["kind"].isin(BLOCK_LOSS_KINDS), columns].reset_index(drop=True)


@per_backend
def kv_events(
    store: Store,
    since=None,
    until=None,
    *,
    kinds: Iterable[str] | None = None,
    session_id: str | None = None,
    limit: int | None = None,
) -> pd.DataFrame:
    """KV event rows, oldest first (narrow them: a store may hold millions)."""
    stmt = select(*_columns(KVEventRow, "id"))
    if kinds is not None:
        stmt = stmt.where(KVEventRow.kind.in_(list(kinds)))
    if session_id is not None:
        stmt = stmt.where(KVEventRow.session_id == session_id)
    stmt = _between(stmt, KVEventRow.ts, since, until).order_by(KVEventRow.ts, KVEventRow.id)
    return read(store, stmt if limit is None else stmt.limit(limit))


@per_backend
def session_events(
    store: Store, windows: list[tuple[str, float, float]], *, kinds: Iterable[str], chunk: int = 200
) -> pd.DataFrame:
    """KV event rows of `kinds` in any of the (session id, after, until] windows, each row once, oldest first: a
    few steps' events out of millions, through the (session_id, ts) index."""
    frames, kinds, columns = [], list(kinds), (KVEventRow.id, *_columns(KVEventRow, "id"))
    for i in range(0, len(windows), chunk):  # one indexed range read per window, a UNION ALL per chunk
        frames.append(
            read(
                store,
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
        return read(store, select(*_columns(KVEventRow, "id")).limit(0))
    rows = pd.concat(frames).drop_duplicates("id").sort_values(["ts", "id"], kind="stable")
    return rows.drop(columns="id").reset_index(drop=True)


@per_backend
def stored_blocks(
    store: Store, since=None, until=None, *, latest: int | None = None, instances: Instances = None
) -> pd.DataFrame:
    """`stored` events: the hash chains (`block_hash`, `parent_hash`) with who stored them and when, oldest first;
    `latest`: only the newest this many (chosen in SQL, by the `(kind, ts)` index)."""
    stmt = select(
        KVEventRow.ts,
        KVEventRow.instance,
        KVEventRow.block_hash,
        KVEventRow.parent_hash,
        KVEventRow.num_tokens,
        KVEventRow.session_id,
        KVEventRow.request_id,
    )
    stmt = _of_instances(stmt.where(KVEventRow.kind == KVEventKind.STORED.value), KVEventRow.instance, instances)
    stmt = _between(stmt, KVEventRow.ts, since, until)
    if latest is None:
        return read(store, stmt.order_by(KVEventRow.ts, KVEventRow.id))
    newest = read(store, stmt.order_by(KVEventRow.ts.desc(), KVEventRow.id.desc()).limit(latest))
    return newest.iloc[::-1].reset_index(drop=True)


@per_backend
def top_restored_blocks(
    store: Store, since=None, until=None, *, limit: int = 20, instances: Instances = None
) -> pd.DataFrame:
    """Blocks stored more than once on one instance in the window (lost, then computed again; the same block on two
    replicas is not a restore): `instance`, `block_hash`, `stores`, `sessions`, `first_ts`, `last_ts`, most-stored
    first.

    Two steps in one query: the hashes stored more than once in scope (a GROUP BY of one integer column), then
    the per-instance detail of those only, through the hash index (at 1M events: 0.9 s as one GROUP BY, 0.4 s as
    two)."""

    def in_scope(stmt, kind=KVEventRow.kind, instance=KVEventRow.instance, ts=KVEventRow.ts):
        stmt = _of_instances(stmt.where(kind == KVEventKind.STORED.value), instance, instances)
        return _between(stmt, ts, since, until)

    again = in_scope(select(KVEventRow.block_hash.label("again"))).group_by(KVEventRow.block_hash)
    again = again.having(func.count() > 1).subquery()
    stmt = select(
        KVEventRow.instance,
        KVEventRow.block_hash,
        func.count().label("stores"),
        func.count(distinct(KVEventRow.session_id)).label("sessions"),
        func.min(KVEventRow.ts).label("first_ts"),
        func.max(KVEventRow.ts).label("last_ts"),
    )
    # The detail's filters on `kind || ''`, `instance || ''` and `ts + 0`: the same values, but no index on them, so
    # the planner reaches the rows through the hash index, not by walking the (kind, ts) range a second time
    # (SQLite, 1M events, no restores: 0.54 -> 0.40 s, median of 5 interleaved runs; what is left is the first
    # step's GROUP BY).
    stmt = in_scope(
        stmt.select_from(again).join(KVEventRow, KVEventRow.block_hash == again.c.again),
        KVEventRow.kind.concat(""),
        KVEventRow.instance.concat(""),
        KVEventRow.ts + 0,
    )
    stmt = stmt.group_by(KVEventRow.instance, KVEventRow.block_hash).having(func.count() > 1)
    return read(store, stmt.order_by(func.count().desc()).limit(limit))


@per_backend
def metric_series(store: Store, names: Iterable[str], since=None, until=None, instance=None) -> pd.DataFrame:
    """Scraped samples (`ts`, `instance`, `name`, `labels`, `value`) of the given names, oldest first."""
    stmt = select(*_columns(MetricSampleRow, "id")).where(MetricSampleRow.name.in_(list(names)))
    if instance is not None:
        stmt = stmt.where(MetricSampleRow.instance == instance)
    return read(store, _between(stmt, MetricSampleRow.ts, since, until).order_by(MetricSampleRow.ts))


@per_backend
def alerts(store: Store, since=None, until=None) -> pd.DataFrame:
    """Alert transitions (firing, resolved), newest first."""
    stmt = _between(select(*_columns(AlertRow)), AlertRow.ts, since, until)
    return read(store, stmt.order_by(AlertRow.ts.desc(), AlertRow.id.desc()))


# Alert signals and the collector's lookups: part of this interface, defined in `kvobs.store.lookups`.
from kvobs.store.lookups import (  # noqa: E402, F401
    block_lifetimes,
    cached_prompt_tokens,
    instance_counter_before,
    latest_alert_states,
    restored_blocks,
    session_ends,
    session_idle_losses,
    session_step_counts,
    step_counts,
    trace_sessions,
)
