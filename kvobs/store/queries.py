"""Every read of the store, as pandas DataFrames: what analytics, alerts, what-if, collectors and the dashboard read.

    window = time_range(store)                                # (first, last) epoch seconds, None when empty
    snaps, rates = instance_snapshots(store, *window), kv_event_counts(store, *window, bucket_s=60)

Every function takes `since`/`until` (epoch seconds, inclusive) where the table is large, filters and aggregates
in SQL on indexed columns (a page never pulls a million rows) and returns plain columns (hashes as Python ints).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
from sqlalchemy import and_, distinct, exists, func, select, union_all
from sqlalchemy.orm import aliased

from kvobs.semconv.metrics import INCREASE_SUFFIX, vllm
from kvobs.semconv.spans import KVEventKind, StepStatus
from kvobs.store import rollups
from kvobs.store.backends import per_backend
from kvobs.store.db import Store
from kvobs.store.schema import AlertRow, KVEventRow, MetricSampleRow, RequestRow, SessionRow, SnapshotRow, StepRow
from kvobs.store.sql_read import _between, _columns, _lookup, read  # noqa: F401  (read: part of this module's interface)

# Kinds that end a cached block's content: the engine's `evicted`/`invalidated`, vLLM's `removed`.
BLOCK_LOSS_KINDS = (KVEventKind.EVICTED.value, KVEventKind.INVALIDATED.value, KVEventKind.REMOVED.value)


@per_backend
def time_range(store: Store) -> tuple[float, float] | None:
    """First and last timestamp of anything observed (snapshots, requests, KV events, steps); None when empty."""
    with store.engine.connect() as conn:
        bounds = [conn.execute(select(func.min(column), func.max(column))).one()
                  for column in (SnapshotRow.ts, RequestRow.arrival_ts, KVEventRow.ts, StepRow.started_at)]  # fmt: skip
    bounds = [(low, high) for low, high in bounds if low is not None]
    return (min(b[0] for b in bounds), max(b[1] for b in bounds)) if bounds else None


@per_backend
def instances(store: Store) -> list[str]:
    with store.engine.connect() as conn:
        return sorted(conn.execute(select(SnapshotRow.instance).distinct()).scalars())


@per_backend
def instance_snapshots(store: Store, since=None, until=None, instance: str | None = None) -> pd.DataFrame:
    """Instance-level snapshots (`session_id` null), oldest first."""
    stmt = select(*_columns(SnapshotRow, "id")).where(SnapshotRow.session_id.is_(None))
    if instance is not None:
        stmt = stmt.where(SnapshotRow.instance == instance)
    return read(store, _between(stmt, SnapshotRow.ts, since, until).order_by(SnapshotRow.ts))


@per_backend
def session_snapshots(store: Store, session_id: str) -> pd.DataFrame:
    """One session's footprint over time: blocks cached, lost, lost while idle, hit tokens."""
    stmt = select(*_columns(SnapshotRow, "id")).where(SnapshotRow.session_id == session_id)
    return read(store, stmt.order_by(SnapshotRow.ts))


@per_backend
def session_footprints(store: Store, since=None, until=None) -> pd.DataFrame:
    """Every session's latest footprint in the window: one row per (session, instance)."""
    latest = _between(
        select(SnapshotRow.session_id, SnapshotRow.instance, func.max(SnapshotRow.ts).label("ts"))
        .where(SnapshotRow.session_id.is_not(None)), SnapshotRow.ts, since, until,
    ).group_by(SnapshotRow.session_id, SnapshotRow.instance).subquery()  # fmt: skip
    stmt = select(*_columns(SnapshotRow, "id")).join(
        latest, (SnapshotRow.session_id == latest.c.session_id) & (SnapshotRow.instance == latest.c.instance)
        & (SnapshotRow.ts == latest.c.ts),
    ).order_by(SnapshotRow.id)  # fmt: skip
    return read(store, stmt).drop_duplicates(["session_id", "instance"], keep="last")


def requests(store: Store, since=None, until=None, session_id: str | None = None) -> pd.DataFrame:
    """Finished requests by arrival time, with `ttft_s`, `itl_s` (mean inter-token latency) and `e2e_s` added."""
    return with_latencies(request_rows(store, since, until, session_id))


@per_backend
def request_rows(store: Store, since=None, until=None, session_id: str | None = None) -> pd.DataFrame:
    stmt = select(*_columns(RequestRow, "id"))
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


def kv_event_counts(store: Store, since=None, until=None, *, bucket_s: float = 60.0) -> pd.DataFrame:
    """KV events per time bucket, kind and reason: `bucket` (its start, epoch s), `kind`, `reason`, `events` (rows),
    `blocks` (block events: a block lost by several owning sessions, one row each, counts once). From the per-minute
    rollup where the window holds whole minutes (`kvobs.store.rollups`), equal to counting the raw rows."""
    return rollups.counts(store, since, until, bucket_s)


def block_losses(store: Store, since=None, until=None, *, bucket_s: float = 60.0) -> pd.DataFrame:
    """Blocks lost per time bucket, kind and reason, each lost block once: `bucket`, `kind`, `reason`, `blocks`.
    "Blocks lost" everywhere (Overview, What-if): evictions, invalidations and vLLM's removals (`BLOCK_LOSS_KINDS`),
    one per (instance, time, block) however many owning sessions recorded it (`first_owner`), so a block lost twice
    counts twice. Resets (`cleared`), dropping every cached block at once, are shown on their own. From the rollup."""
    return losses_in(rollups.counts(store, since, until, bucket_s, kinds=BLOCK_LOSS_KINDS))


def losses_in(counts: pd.DataFrame) -> pd.DataFrame:
    """The "blocks lost" rows of `kv_event_counts` (what `block_losses` returns for the same window and bucket)."""
    losses = counts.loc[counts["kind"].isin(BLOCK_LOSS_KINDS), ["bucket", "kind", "reason", "blocks"]]
    return losses.reset_index(drop=True)


def scraped_hit_rate(store: Store, since=None, until=None) -> float | None:
    """Prefix-cache hit tokens / queried tokens from vLLM's scraped counters (their stored increases) in the range."""
    names = [spec.name + INCREASE_SUFFIX for spec in (vllm.PREFIX_CACHE_HITS, vllm.PREFIX_CACHE_QUERIES)]
    samples = metric_series(store, names, since, until)
    totals = samples.groupby("name")["value"].sum()
    queried = float(totals.get(names[1], 0.0))
    return float(totals.get(names[0], 0.0)) / queried if queried else None


@per_backend
def kv_events(store: Store, since=None, until=None, *, kinds: Iterable[str] | None = None,
              session_id: str | None = None, limit: int | None = None) -> pd.DataFrame:  # fmt: skip
    """KV event rows, oldest first (narrow them: a store may hold millions)."""
    stmt = select(*_columns(KVEventRow, "id"))
    if kinds is not None:
        stmt = stmt.where(KVEventRow.kind.in_(list(kinds)))
    if session_id is not None:
        stmt = stmt.where(KVEventRow.session_id == session_id)
    stmt = _between(stmt, KVEventRow.ts, since, until).order_by(KVEventRow.ts, KVEventRow.id)
    return read(store, stmt if limit is None else stmt.limit(limit))


@per_backend
def session_events(store: Store, windows: list[tuple[str, float, float]], *, kinds: Iterable[str],
                   chunk: int = 200) -> pd.DataFrame:  # fmt: skip
    """KV event rows of `kinds` in any of the (session id, after, until] windows, each row once, oldest first: a
    few steps' events out of millions, through the (session_id, ts) index."""
    frames, kinds, columns = [], list(kinds), (KVEventRow.id, *_columns(KVEventRow, "id"))
    for i in range(0, len(windows), chunk):  # one indexed range read per window, a UNION ALL per chunk
        frames.append(read(store, union_all(*(select(*columns).where(
            KVEventRow.session_id == sid, KVEventRow.ts > low, KVEventRow.ts <= high, KVEventRow.kind.in_(kinds))
            for sid, low, high in windows[i : i + chunk]))))  # fmt: skip
    if not frames:
        return read(store, select(*_columns(KVEventRow, "id")).limit(0))
    rows = pd.concat(frames).drop_duplicates("id").sort_values(["ts", "id"], kind="stable")
    return rows.drop(columns="id").reset_index(drop=True)


@per_backend
def stored_blocks(store: Store, since=None, until=None, *, latest: int | None = None) -> pd.DataFrame:
    """`stored` events: the hash chains (`block_hash`, `parent_hash`) with who stored them and when, oldest first;
    `latest`: only the newest this many (chosen in SQL, by the `(kind, ts)` index)."""
    stmt = select(KVEventRow.ts, KVEventRow.instance, KVEventRow.block_hash, KVEventRow.parent_hash,
                  KVEventRow.num_tokens, KVEventRow.session_id, KVEventRow.request_id)  # fmt: skip
    stmt = _between(stmt.where(KVEventRow.kind == KVEventKind.STORED.value), KVEventRow.ts, since, until)
    if latest is None:
        return read(store, stmt.order_by(KVEventRow.ts, KVEventRow.id))
    newest = read(store, stmt.order_by(KVEventRow.ts.desc(), KVEventRow.id.desc()).limit(latest))
    return newest.iloc[::-1].reset_index(drop=True)


@per_backend
def top_restored_blocks(store: Store, since=None, until=None, *, limit: int = 20) -> pd.DataFrame:
    """Blocks stored more than once in the window (evicted, then computed again): `block_hash`, `stores`,
    `sessions`, `first_ts`, `last_ts`, most-stored first."""
    stmt = select(KVEventRow.block_hash, func.count().label("stores"),
                  func.count(distinct(KVEventRow.session_id)).label("sessions"),
                  func.min(KVEventRow.ts).label("first_ts"), func.max(KVEventRow.ts).label("last_ts"))  # fmt: skip
    stmt = _between(stmt.where(KVEventRow.kind == KVEventKind.STORED.value), KVEventRow.ts, since, until)
    stmt = stmt.group_by(KVEventRow.block_hash).having(func.count() > 1)
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


# ---- alert signals and the collector's lookups ----------------------------------------------------------------
@per_backend
def instance_counter_before(store: Store, column: str, ts: float) -> dict[str, float]:
    """Per instance: the latest value of an instance snapshot counter (e.g. `preemptions_total`) before `ts`."""
    value = getattr(SnapshotRow, column)
    latest = (select(SnapshotRow.instance, func.max(SnapshotRow.ts).label("ts"))
              .where(SnapshotRow.session_id.is_(None), SnapshotRow.ts < ts, value.is_not(None))
              .group_by(SnapshotRow.instance).subquery())  # fmt: skip
    stmt = select(SnapshotRow.instance, value).join(
        latest, (SnapshotRow.instance == latest.c.instance) & (SnapshotRow.ts == latest.c.ts)
    )
    frame = read(store, stmt.where(SnapshotRow.session_id.is_(None)))
    return dict(zip(frame["instance"], frame[column].astype(float)))


@per_backend
def restored_blocks(store: Store, since: float, until: float) -> pd.DataFrame:
    """Per instance: blocks stored in the window (`stored`) and those among them stored before (`restored`)."""
    earlier = aliased(KVEventRow)
    seen_before = exists().where(and_(
        earlier.kind == KVEventKind.STORED.value, earlier.block_hash == KVEventRow.block_hash,
        earlier.instance == KVEventRow.instance, earlier.ts < KVEventRow.ts,
    ))  # fmt: skip
    stmt = (select(KVEventRow.instance, func.count().label("stored"),
                   func.sum(func.cast(seen_before, KVEventRow.num_tokens.type)).label("restored"))
            .where(KVEventRow.kind == KVEventKind.STORED.value, KVEventRow.ts >= since, KVEventRow.ts <= until)
            .group_by(KVEventRow.instance))  # fmt: skip
    return read(store, stmt)


@per_backend
def block_lifetimes(store: Store, since: float, until: float) -> pd.DataFrame:
    """Blocks lost in the window (one per block and time, whatever the owners), with `lifetime_s`: the time since
    the same block was last stored on the same instance."""
    stored = aliased(KVEventRow)
    last_stored = (select(func.max(stored.ts)).where(
        stored.kind == KVEventKind.STORED.value, stored.block_hash == KVEventRow.block_hash,
        stored.instance == KVEventRow.instance, stored.ts <= KVEventRow.ts,
    ).scalar_subquery())  # fmt: skip
    stmt = (select(KVEventRow.instance, KVEventRow.ts, KVEventRow.block_hash, (KVEventRow.ts - last_stored)
                   .label("lifetime_s"))
            .where(KVEventRow.kind.in_(BLOCK_LOSS_KINDS), KVEventRow.ts >= since, KVEventRow.ts <= until)
            .distinct())  # fmt: skip
    return read(store, stmt).dropna(subset=["lifetime_s"])


@per_backend
def session_idle_losses(store: Store, until: float) -> pd.DataFrame:
    """Every session snapshot up to `until` with its running count of blocks lost while idle."""
    idle = SnapshotRow.session_evicted_idle_blocks
    stmt = (select(SnapshotRow.session_id, SnapshotRow.instance, SnapshotRow.ts, idle)
            .where(SnapshotRow.session_id.is_not(None), SnapshotRow.ts <= until, idle.is_not(None)))  # fmt: skip
    return read(store, stmt)


@per_backend
def step_counts(store: Store, since: float, until: float, *, exclude_errors: tuple[str, ...] = ()) -> tuple[int, int]:
    """(steps, failed steps) started in the window; failures whose `error_type` is in `exclude_errors` not counted."""
    is_failed = StepRow.status == StepStatus.ERROR.value
    if exclude_errors:
        is_failed = and_(is_failed, func.coalesce(StepRow.error_type, "").not_in(list(exclude_errors)))
    failed = func.sum(func.cast(is_failed, StepRow.step_index.type))
    stmt = select(func.count(), failed).where(StepRow.started_at >= since, StepRow.started_at <= until)
    with store.engine.connect() as conn:
        total, num_failed = conn.execute(stmt).one()
    return int(total or 0), int(num_failed or 0)


@per_backend
def latest_alert_states(store: Store) -> pd.DataFrame:
    """The latest row of every (rule, instance, session) alert key."""
    latest = (select(func.max(AlertRow.id).label("id"))
              .group_by(AlertRow.rule, AlertRow.instance, AlertRow.session_id).subquery())  # fmt: skip
    return read(store, select(*_columns(AlertRow)).join(latest, AlertRow.id == latest.c.id))


@per_backend
def session_ends(store: Store, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, float]:
    """session id -> `ended_at`, for the given sessions that have ended."""
    ends = _lookup(
        store, SessionRow.session_id, SessionRow.ended_at, session_ids, chunk, SessionRow.ended_at.is_not(None)
    )
    return {session_id: float(ended) for session_id, ended in ends.items()}


@per_backend
def trace_sessions(store: Store, trace_ids: Iterable[str], *, chunk: int = 500) -> dict[str, str]:
    """trace id -> session id, from the agent steps recorded with those trace ids."""
    return _lookup(store, StepRow.trace_id, StepRow.session_id, trace_ids, chunk)
