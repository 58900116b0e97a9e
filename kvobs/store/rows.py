"""One frozen record per store table, and one column batch for KV events: the only ways rows are written.

    writer.add(KVEventRecord(ts=now, instance="engine-0", kind=KVEventKind.EVICTED, block_hash=h, reason="capacity"))
    writer.upsert(SessionRecord("s1", num_steps=3))          # only the columns given are written
    KVEventRecord(ts=now, instance="e", kind="stored", blok_hash=1)   # TypeError here, not in the database

Each record has exactly the table's public columns (`kvobs.store.schema`, the schema table of docs/store.md) except the
row id the database assigns. A misspelt or missing column is a `TypeError` when the record is made. Columns a
record leaves out are NULL (or the column's default), except on `SessionRecord`, whose columns default to
`UNSET`: an upsert of a session writes only the columns it was given, so the agent SDK's counters and the
engine's first sighting of a session never overwrite each other.

`KVEventColumns` holds many `kv_events` rows as one list (or `Runs`) per column, for producers that write thousands
of KV events a second (the collector): no object per row is made; SQLite inserts it in one statement (`json_each`)
or executemany, PostgreSQL by binary COPY, ClickHouse as one Arrow table. It takes the same column names (a
misspelt one is a `TypeError`), and iterating it gives its rows as `KVEventRecord`s, which is how a refused row is
found and dropped alone.

    writer.add_many(KVEventColumns(ts=[t, t], instance=["vllm-a"] * 2, kind=["stored"] * 2, block_hash=[h1, h2]))
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, dataclass_transform

from kvobs.store.runs import Runs, as_list


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"

    def __reduce__(self) -> str:
        return "UNSET"  # pickled as this module's UNSET, so a record sent to another process keeps it unset


UNSET: Any = _Unset()  # a column the record does not write


class Record:
    """Base of every record: `table` names its table; `to_row()` is the column -> value dict the writer binds."""

    __slots__ = ()
    table: ClassVar[str]
    _columns: ClassVar[tuple[str, ...]]

    def to_row(self) -> dict[str, Any]:
        return {c: v for c in self._columns if (v := getattr(self, c)) is not UNSET}


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def _record(cls):
    """Make `cls` a frozen, slotted dataclass record and remember its column names."""
    cls = dataclass(frozen=True, slots=True)(cls)
    cls._columns = tuple(f.name for f in fields(cls))
    return cls


@_record
class SessionRecord(Record):
    table: ClassVar[str] = "sessions"

    session_id: str
    agent_name: str | None = UNSET
    started_at: float | None = UNSET
    ended_at: float | None = UNSET
    num_steps: int = UNSET
    num_failed_steps: int = UNSET
    source: str | None = UNSET  # sdk | vllm | engine
    parent_session_id: str | None = UNSET  # the session that started this one (a subagent's caller)


@_record
class StepRecord(Record):
    table: ClassVar[str] = "steps"

    session_id: str
    step_index: int
    started_at: float
    status: str  # ok | error
    trace_id: str | None = None
    span_id: str | None = None
    ended_at: float | None = None
    error_type: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    response_id: str | None = None  # the id the reply named (the one that joined its request, else its first)
    request_id: str | None = None  # the server request a step made of an agent's spans was joined to
    request_join: str | None = None  # how it was joined, or why it was not (`kvobs.semconv.spans.StepJoin`)
    # JSON list of the session's tool calls since its previous LLM call: name, start, end, status, error_type. A step
    # made of an agent's spans (one LLM call) lists those of the pause before its call; an SDK step, its own, run
    # inside it after its call: which they were is told by their times.
    tools: str | None = None


@_record
class StepVerdictRecord(Record):
    """A step's verdict (`kvobs.analytics.steps.verdicts`): why it failed, whether it was slow and why, its latency's
    parts against its session's typical step, and the evidence; decided once its session settled (the collector's
    keeper), or worked out by a page where no keeper decided it (then not stored)."""

    table: ClassVar[str] = "step_verdicts"

    session_id: str
    step_index: int
    started_at: float
    status: str
    decided_at: float
    failure_cause: str | None = None  # failed steps only
    failure_kind: str | None = None
    error_type: str | None = None
    trace_id: str | None = None
    span_id: str | None = None
    evidence: str | None = None
    slow: bool | None = None  # None on a row decided before every step was (a failed step's only)
    slow_cause: str | None = None  # "none" when not slow
    slow_s: float | None = None  # the slow cause's seconds over their typical value
    slow_share: float | None = None  # of the step's excess over its typical latency
    cause: str | None = None  # the KV record's costliest fact (`attribution.CAUSES`)
    causes: str | None = None  # every fact found, comma-separated
    num_requests: int | None = None
    latency_s: float | None = None
    typical_s: float | None = None
    excess_s: float | None = None
    # the parts that add up to latency_s, and the recomputes inside prefill_s (`latency_parts.PARTS`, `ESTIMATES`)
    queue_s: float | None = None
    preempted_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    tool_s: float | None = None
    other_s: float | None = None
    before_s: float | None = None  # NULL on rows decided before schema 0023 (then inside other_s)
    lost_recompute_s: float | None = None
    invalidated_recompute_s: float | None = None
    routed_recompute_s: float | None = None
    # JSON: the attribution's other columns for this step (its facts' counts, typical parts, excess by part, replica),
    # so a settled session's page reads its steps whole and attributes nothing; NULL on rows decided before 0028
    detail: str | None = None


@_record
class RequestRecord(Record):
    table: ClassVar[str] = "requests"

    request_id: str
    instance: str
    arrival_ts: float
    session_id: str | None = None
    trace_id: str | None = None
    span_id: str | None = None
    parent_span_id: str | None = None
    first_token_ts: float | None = None
    finished_ts: float | None = None
    queue_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    num_preemptions: int = 0
    finish_reason: str | None = None
    cached_from: str | None = None  # where cached_tokens came from (`kvobs.semconv.spans.CachedFrom`)


@_record
class RequestLookupRecord(Record):
    """A request's prefix lookup as the collector measured it (`kvobs.analytics.cache.routing.request_lookups`): the
    prompt's whole blocks, those found on its own replica, those another replica held (routing loss), and each
    missed block once, by why."""

    table: ClassVar[str] = "request_lookups"

    request_id: str
    instance: str
    lookup_ts: float
    prompt_tokens: int
    block_size: int
    prompt_blocks: int
    own_blocks: int
    available_blocks: int
    best_blocks: int
    routed_blocks: int
    cold_blocks: int
    invalidated_blocks: int
    pause_blocks: int
    capacity_blocks: int
    unexplained_blocks: int
    replicas_compared: int
    measured_at: float
    session_id: str | None = None
    best_instance: str | None = None  # the replica that held the routed blocks
    tier_blocks: int = 0  # of `own_blocks`, those its replica held only in a lower tier (loaded, not found cached)


@_record
class ConnectorLookupRecord(Record):
    """A request's lookup in a KV connector's own cache, as the connector's spans said it (LMCache's per-request
    span: `kvobs.semconv.lmcache_spans`): the prompt tokens it was asked for and found, by its levels, and the time
    its lookup, loads and stores took. `request_id` is the id the connector named (vLLM's internal one)."""

    table: ClassVar[str] = "connector_lookups"

    request_id: str
    instance: str  # the connector's process (its exporter's `service.instance.id`, else `service.name`)
    connector: str
    started_at: float
    ended_at: float | None = None
    requested_tokens: int | None = None
    hit_tokens: int | None = None
    l1_hit_tokens: int | None = None
    l2_hit_tokens: int | None = None
    early_exit_reason: str | None = None
    lookup_s: float | None = None  # its lookups' time, summed; None: no lookup span
    retrieve_s: float | None = None  # its loads' time, summed; None: no load
    store_s: float | None = None  # its stores' time, summed; None: no store
    num_retrieves: int = 0
    num_stores: int = 0
    trace_id: str | None = None
    span_id: str | None = None


@_record
class LookupProgressRecord(Record):
    """How far a collector has measured an instance's request lookups: every request that looked its prefix up by
    `measured_to` and whose hash chain was known has its `request_lookups` row; later ones are pending."""

    table: ClassVar[str] = "lookup_progress"

    instance: str
    measured_to: float
    updated_at: float


@_record
class VerdictProgressRecord(Record):
    """A collector's verdict keeper (`collectors.jobs.step_verdicts`) at its latest run: it decides every step
    started from `covers_from` once the step's session settles (steps up to `read_to` read so far); `updated_at`,
    the run's time, says it is still running."""

    table: ClassVar[str] = "verdict_progress"

    keeper: str  # "verdicts@host:pid/nonce"
    covers_from: float
    read_to: float
    updated_at: float


@_record
class KVEventRecord(Record):
    table: ClassVar[str] = "kv_events"

    ts: float
    instance: str
    kind: str  # a KVEventKind
    block_hash: int | None = None
    parent_hash: int | None = None
    num_tokens: int | None = None
    session_id: str | None = None
    request_id: str | None = None
    reason: str | None = None
    medium: str | None = None
    first_owner: int | None = None  # 1 on one row per block event, 0 on further owners' rows, None without a block
    num_blocks: int | None = None  # blocks an event without a block hash covers (hit, allocated, preempted, cleared)
    # As vLLM's BlockStored/BlockRemoved give them (None where not given): the KV-cache group of a hybrid model's
    # block (full attention, sliding window, ...: each group caches the same hashes apart), that group's kind, the
    # LoRA adapter the block was computed under, and the block's extra hash keys (JSON: multimodal ids, cache salt,
    # adapter; `kvobs.vllm.normalize.extra_keys_json`).
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    lora_name: str | None = None
    extra_keys: str | None = None
    # Known as the row is made (`kvobs.block_clock`): a loss's lifetime (None: its store not known); on a store, 1 when
    # it brought back a block lost on its instance and tier within the clock's horizon (0 when not), and after how long.
    lifetime_s: float | None = None
    restored: int | None = None
    restored_after_s: float | None = None
    # On a chain's first stored block: the tokens it began with as an earlier chain's first block did, 16 or more and
    # less than a block (a prefix shorter than a block: computed again, never found; `collectors.kv.shared_starts`).
    shared_start_tokens: int | None = None


class KVEventColumns:
    """`kv_events` rows as columns: equal-length columns named like `KVEventRecord`'s fields (one left out is all
    NULL), each a list (a value a row) or a `Runs` (a value a run of rows). Treat it as frozen once handed to the
    writer."""

    __slots__ = ("columns", "num_rows")
    table: ClassVar[str] = "kv_events"

    def __init__(self, **columns: list | Runs) -> None:
        names = KVEventRecord._columns
        unknown = set(columns) - set(names)
        if unknown:
            raise TypeError(f"KVEventColumns got unknown column(s) {', '.join(sorted(unknown))}")
        lengths = {len(values) for values in columns.values()}
        if len(lengths) > 1:
            raise ValueError(f"KVEventColumns columns differ in length: {sorted(lengths)}")
        self.num_rows = lengths.pop() if lengths else 0
        for required in ("ts", "instance", "kind"):
            if required not in columns and self.num_rows:
                raise TypeError(f"KVEventColumns needs the column {required!r}")
        none = Runs.of(None, self.num_rows)
        self.columns: dict[str, list | Runs] = {name: columns.get(name, none) for name in names}

    def __len__(self) -> int:
        return self.num_rows

    def column(self, name: str) -> list:
        """One column, a value a row."""
        return as_list(self.columns[name])

    def lists(self) -> dict[str, list]:
        """Every column, a value a row (for a store that binds rows)."""
        return {name: as_list(values) for name, values in self.columns.items()}

    def __iter__(self):
        """The rows as records (for isolating a refused row; the fast paths read `columns`)."""
        for values in zip(*self.lists().values()):
            yield KVEventRecord(*values)


@_record
class SnapshotRecord(Record):
    table: ClassVar[str] = "snapshots"

    ts: float
    instance: str
    session_id: str | None = None  # None: an instance-level row
    kv_usage: float | None = None
    blocks_total: int | None = None
    blocks_free: int | None = None
    blocks_resident: int | None = None
    session_blocks: int | None = None
    session_evicted_blocks: int | None = None
    session_evicted_idle_blocks: int | None = None  # lost in a tool pause (settled: the session came back)
    session_pending_idle_blocks: int | None = None  # lost while idle, pause or end not known yet
    session_hit_tokens: int | None = None
    hit_rate: float | None = None
    num_running: int | None = None
    num_waiting: int | None = None
    preemptions_total: int | None = None
    evictions_total: int | None = None


@_record
class RunRecord(Record):
    """One run of an engine: from its start (an empty cache) to the next run's start on the same instance.
    `run_id` is `run_id(instance, started_at)`, so whoever sees the same start (the engine itself, a collector
    scraping it) writes the same row."""

    table: ClassVar[str] = "runs"

    run_id: str
    instance: str
    started_at: float
    source: str  # engine (kvobs serve itself) | collector (seen from the replica's /metrics or KV events)
    model: str | None = None
    num_blocks: int | None = None  # usable KV blocks
    block_size: int | None = None
    eviction_policy: str | None = None
    offload_blocks: int | None = None  # the offload tier below the cache, in blocks (0: none; None: not said)
    engine: str | None = None  # `kvobs.semconv.spans.RunEngine` (None: not said)


def run_id(instance: str, started_at: float) -> str:
    """The id of `instance`'s run that started at `started_at` (epoch s, to the millisecond)."""
    return f"{instance}@{started_at:.3f}"


@_record
class MetricSampleRecord(Record):
    table: ClassVar[str] = "metric_samples"

    ts: float
    instance: str
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


@_record
class AlertRecord(Record):
    table: ClassVar[str] = "alerts"

    ts: float
    rule: str
    severity: str
    state: str  # firing | resolved
    instance: str | None = None
    session_id: str | None = None
    value: float | None = None
    summary: str | None = None


RECORDS: dict[str, type[Record]] = {
    cls.table: cls
    for cls in (
        SessionRecord,
        StepRecord,
        StepVerdictRecord,
        RequestRecord,
        RequestLookupRecord,
        ConnectorLookupRecord,
        LookupProgressRecord,
        VerdictProgressRecord,
        KVEventRecord,
        SnapshotRecord,
        MetricSampleRecord,
        AlertRecord,
        RunRecord,
    )
}

# the progress marks: one row a replica (`lookup_progress`) or a collector process's verdict keeper, pruned by retention
PROGRESS_TABLES = (LookupProgressRecord.table, VerdictProgressRecord.table)
