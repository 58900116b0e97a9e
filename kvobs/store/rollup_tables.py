"""The per-minute rollup tables the writer keeps from the raw rows in their transaction (`kvobs.store.rollups` says
how each is summed and merged); `kvobs.store.schema` lists them in `ROLLUPS` with the sessions' footprints.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from kvobs.semconv.limits import MAX_ID_BYTES
from kvobs.store.table_base import Base


class KVEventMinuteRow(Base):
    """The per-minute rollup of `kv_events` (sums only), kept by the writer in the transaction of the raw rows:
    `events` rows and `blocks` (sum of `first_owner`) per minute, instance, kind and reason ('' for none)."""

    __tablename__ = "kv_event_minutes"

    minute: Mapped[float] = mapped_column(Float, primary_key=True)  # the minute's start, UTC epoch s
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    reason: Mapped[str] = mapped_column(String(32), primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger)
    blocks: Mapped[int] = mapped_column(BigInteger)


class SnapshotMinuteRow(Base):
    """The per-minute rollup of the instance-level `snapshots` (`kvobs.store.rollups.SNAPSHOT_MINUTES`), kept by the
    writer in the transaction of the raw rows."""

    __tablename__ = "snapshot_minutes"

    minute: Mapped[float] = mapped_column(Float, primary_key=True)  # the minute's start, UTC epoch s
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    samples: Mapped[int] = mapped_column(BigInteger)
    usage_n: Mapped[int] = mapped_column(BigInteger)
    usage_sum: Mapped[float] = mapped_column(Float)
    resident_n: Mapped[int] = mapped_column(BigInteger)
    resident_sum: Mapped[float] = mapped_column(Float)
    waiting_n: Mapped[int] = mapped_column(BigInteger)
    waiting_sum: Mapped[float] = mapped_column(Float)
    counted: Mapped[int] = mapped_column(BigInteger)  # snapshots with a preemption count
    preemptions: Mapped[float] = mapped_column(Float)  # its increase over each one's previous snapshot
    usage_max: Mapped[float | None] = mapped_column(Float)
    last_ts: Mapped[float] = mapped_column(Float)
    first_ts: Mapped[float] = mapped_column(Float)


class RequestMinuteRow(Base):
    """The per-minute rollup of `requests` by arrival (`kvobs.store.rollups.REQUEST_MINUTES`)."""

    __tablename__ = "request_minutes"

    minute: Mapped[float] = mapped_column(Float, primary_key=True)
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    ttft_n: Mapped[int] = mapped_column(BigInteger)
    ttft_sum: Mapped[float] = mapped_column(Float)
    itl_n: Mapped[int] = mapped_column(BigInteger)
    itl_sum: Mapped[float] = mapped_column(Float)
    queue_n: Mapped[int] = mapped_column(BigInteger)
    queue_sum: Mapped[float] = mapped_column(Float)
    cached_said: Mapped[int] = mapped_column(BigInteger)  # requests that say how many prompt tokens were cached
    hit_requests: Mapped[int] = mapped_column(BigInteger)  # ... and their prompt tokens: the hit rate's requests
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    last_ts: Mapped[float] = mapped_column(Float)  # the latest arrival or finish
    last_arrival_ts: Mapped[float] = mapped_column(Float)
    first_ts: Mapped[float] = mapped_column(Float)  # the first arrival


class LookupMinuteRow(Base):
    """The per-minute rollup of `request_lookups` by lookup (`kvobs.store.rollups.LOOKUP_MINUTES`): tokens of whole
    prompt blocks found, available, and missed by why; the routing loss of the requests compared."""

    __tablename__ = "lookup_minutes"

    minute: Mapped[float] = mapped_column(Float, primary_key=True)
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    prompt_block_tokens: Mapped[int] = mapped_column(BigInteger)
    achieved_tokens: Mapped[int] = mapped_column(BigInteger)
    tier_tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")  # of those, loaded from a lower tier
    available_tokens: Mapped[int] = mapped_column(BigInteger)
    routed_tokens: Mapped[int] = mapped_column(BigInteger)
    cold_tokens: Mapped[int] = mapped_column(BigInteger)
    invalidated_tokens: Mapped[int] = mapped_column(BigInteger)
    pause_tokens: Mapped[int] = mapped_column(BigInteger)
    capacity_tokens: Mapped[int] = mapped_column(BigInteger)
    unexplained_tokens: Mapped[int] = mapped_column(BigInteger)
    compared_requests: Mapped[int] = mapped_column(BigInteger)  # those with another replica to compare with
    compared_prompt_tokens: Mapped[int] = mapped_column(BigInteger)  # ... and their prompt tokens
    last_ts: Mapped[float] = mapped_column(Float)  # the latest lookup
    first_ts: Mapped[float] = mapped_column(Float)


class LatencyMinuteRow(Base):
    """Each latency's sketch per minute and instance (`kvobs.store.rollups.LATENCY_MINUTES`): requests per bin."""

    __tablename__ = "latency_minutes"

    minute: Mapped[float] = mapped_column(Float, primary_key=True)
    instance: Mapped[str] = mapped_column(String(MAX_ID_BYTES), primary_key=True)
    metric: Mapped[str] = mapped_column(String(8), primary_key=True)  # ttft | itl | queue
    value_bin: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger)
