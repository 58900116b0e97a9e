"""What a store backend is: the `Store`, `Reads` and `Lookups` protocols every backend implements.

    store = open_store(url)                      # a Store: SqlStore (SQLite, PostgreSQL) or ClickHouseStore
    store.reads.steps(since, until)              # a Reads: SqlReads or ClickHouseReads
    store.lookups.step_counts(since, until)      # a Lookups: SqlLookups or ClickHouseLookups

A backend is a class per protocol; `kvobs.store.db.BACKENDS` maps URL schemes to the function that opens one. The
type checker (mypy, run by tests/test_types.py) holds every backend to every method here, with these argument names;
the contract suite (tests/store/test_contract.py) holds them to equal answers. Reads that combine other reads
(`requests`, `kv_event_counts`, `block_losses`) are written once, in `kvobs.store.composed.ComposedReads`.

Every read takes `since`/`until` (epoch seconds, inclusive) where the table is large, filters and aggregates in the
database (a page never pulls a million rows) and returns plain columns (hashes as Python ints); the per-instance
tables (snapshots, requests, KV events) also take `instances`: only those (None: the whole fleet).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pandas as pd

    from kvobs.store.leases import Leases
    from kvobs.store.rows import KVEventColumns, Record

Instances = Iterable[str] | None  # which instances a read covers; None: all
# (op, records) pairs, what StoreWriter hands a store: op is insert | upsert | insert_missing
Batch = Sequence[tuple[str, "Sequence[Record] | KVEventColumns"]]
# A batch's ops: "insert", "upsert", "insert_missing" (`StoreWriter`), and this one: requests' cached tokens learnt
# after their rows were stored (`StoreWriter.fill_cached`).
FILL_CACHED = "fill_cached"


class Reads(Protocol):
    """What the pages, analytics, alerts and What-if read, as DataFrames."""

    def time_range(self) -> tuple[float, float] | None:
        """First and last timestamp of anything observed (snapshots, requests, KV events, steps); None when empty."""
        ...

    def instances(self) -> list[str]:
        """Every instance that reported anything: snapshots, requests, KV events (the rollup)."""
        ...

    def instance_snapshots(self, since=None, until=None, *, instances: Instances = None) -> pd.DataFrame:
        """Instance-level snapshots (`session_id` null), oldest first."""
        ...

    def snapshot_times(self, since, until, bucket_s: float, *, instances: Instances = None) -> pd.DataFrame:
        """When each instance reported, per time bucket, from its instance snapshots: `instance`, `bucket` (start),
        `first_ts`, `last_ts`, `samples`; a page's "was anything watching" from the rollup's whole minutes and the
        rows of the edges."""
        ...

    def raw_snapshot_times(self, since, until, bucket_s: float, *, instances: Instances = None) -> pd.DataFrame:
        """`snapshot_times` grouped from the rows in the database (`since <= ts <= until`)."""
        ...

    def session_snapshots(self, session_id: str) -> pd.DataFrame:
        """One session's footprint over time: blocks cached, lost, lost while idle, hit tokens."""
        ...

    def session_footprints(self, since=None, until=None, *, instances: Instances = None) -> pd.DataFrame:
        """Every session's latest footprint in the window: one row per (session, instance)."""
        ...

    def request_rows(
        self, since=None, until=None, session_id: str | None = None, *, instances: Instances = None
    ) -> pd.DataFrame:
        """Finished requests by arrival time, as stored (`requests` adds the latencies)."""
        ...

    def requests(
        self, since=None, until=None, session_id: str | None = None, *, instances: Instances = None
    ) -> pd.DataFrame:
        """Finished requests by arrival time, with `ttft_s`, `itl_s` (mean inter-token latency) and `e2e_s`."""
        ...

    def steps(
        self,
        since=None,
        until=None,
        session_id: str | None = None,
        *,
        status: str | None = None,
        session_ids: Iterable[str] | None = None,
    ) -> pd.DataFrame:
        """Agent steps by start time; with `status`, only those (e.g. the failed ones); with `session_ids`, only those
        sessions'."""
        ...

    def step_outcomes(self, since=None, until=None) -> pd.DataFrame:
        """Per session, its steps started in the window, aggregated in the database: `steps`, `failed`, `e2e_p50` (the
        median of the known `e2e_s`), `cached_tokens` and `prompt_tokens` summed over the steps that give both, and
        `judged` and `joined`: steps the collector tried to tie to their server request, and those it tied."""
        ...

    def step_windows(self, since, until, bucket_s: float) -> pd.DataFrame:
        """Agent steps started in the window per time bucket, counted in the database: `bucket` (start), `steps`,
        `failed`, `first_ts` and `last_ts` (the first and last start)."""
        ...

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
        """A per-minute rollup's rows (`kvobs.store.rollups.ROLLUPS`, by table name) of the minutes starting in
        [low, high), one per key, by key; with `bucket_s` (whole minutes), merged per bucket in the database, its start
        as `minute`; with `metrics` (a rollup keyed by `metric`: the latency sketch), only those metrics' rows."""
        ...

    def request_lookups(
        self, since=None, until=None, *, instances: Instances = None, session_id: str | None = None
    ) -> pd.DataFrame:
        """The request lookups a collector measured (`request_lookups`: `kvobs.store.rows.RequestLookupRecord`)
        whose lookup falls in the window, by lookup time."""
        ...

    def connector_lookups(self, since=None, until=None) -> pd.DataFrame:
        """The lookups in KV connectors' own caches their spans said (`connector_lookups`:
        `kvobs.store.rows.ConnectorLookupRecord`) that started in the window, by start."""
        ...

    def lookup_progress(self, *, instances: Instances = None) -> pd.DataFrame:
        """How far a collector has measured each instance's request lookups (`lookup_progress`: `instance`,
        `measured_to`, `updated_at`), by instance."""
        ...

    def verdict_progress(self) -> pd.DataFrame:
        """Each verdict keeper's latest run (`verdict_progress`: `keeper`, `covers_from`, `read_to`, `updated_at`):
        a keeper decides every step started from `covers_from` once its session settles."""
        ...

    def step_verdicts(
        self, since=None, until=None, *, status=None, session_id=None, slow=None, decided_in: bool = False
    ) -> pd.DataFrame:
        """The steps started in the window (decided in it, with `decided_in`; of `status`, of `session_id`, slow ones
        with `slow=True`, when given) whose verdict a writer decided once their session settled (`step_verdicts`; the
        latest decision of each step), by session and step."""
        ...

    def undecided_steps(self, since=None, until=None) -> pd.DataFrame:
        """The steps started in the window with no decided verdict (`session_id`, `step_index`, `started_at`): a
        session still running, or a store no collector decides for."""
        ...

    def sessions(self) -> pd.DataFrame:
        """Every session, by start."""
        ...

    def runs(self, *, instances: Instances = None) -> pd.DataFrame:
        """Every recorded engine run, by instance and start."""
        ...

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
        """KV events per bucket, kind and reason from `kv_events`: `since <= ts <= until` (`< until`: `upper_open`)."""
        ...

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
        """KV events per bucket, kind and reason from the per-minute rollup: the minutes starting in [low, high)."""
        ...

    def kv_event_counts(
        self,
        since=None,
        until=None,
        *,
        bucket_s: float = 60.0,
        kinds: Iterable[str] | None = None,
        instances: Instances = None,
        by_instance: bool = False,
    ) -> pd.DataFrame:
        """KV events per time bucket, kind and reason: `bucket`, `kind`, `reason`, `events`, `blocks`."""
        ...

    def block_losses(
        self, since=None, until=None, *, bucket_s: float = 60.0, instances: Instances = None
    ) -> pd.DataFrame:
        """Blocks lost per time bucket, kind and reason, each lost block once: `bucket`, `kind`, `reason`, `blocks`."""
        ...

    def kv_events(
        self,
        since=None,
        until=None,
        *,
        kinds: Iterable[str] | None = None,
        session_id: str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """KV event rows, oldest first (narrow them: a store may hold millions)."""
        ...

    def session_events(
        self, windows: list[tuple[str, float, float]], *, kinds: Iterable[str], chunk: int = 200
    ) -> pd.DataFrame:
        """KV event rows of `kinds` in any of the (session id, after, until] windows, each row once, oldest first."""
        ...

    def stored_blocks(
        self,
        since=None,
        until=None,
        *,
        latest: int | None = None,
        instances: Instances = None,
        unnamed: bool = False,
    ) -> pd.DataFrame:
        """`stored` events: the hash chains with who stored them and when, whether each was a restore (`restored`), and
        a chain start's tokens shared short of a block (`shared_start_tokens`), oldest first; `latest`: the newest N;
        `unnamed`: only the stores that named no session."""
        ...

    def top_restored_blocks(
        self, since=None, until=None, *, limit: int = 20, instances: Instances = None
    ) -> pd.DataFrame:
        """Blocks stored more than once on one instance in the window, most-stored first."""
        ...

    def metric_series(self, names: Iterable[str], since=None, until=None, instance=None) -> pd.DataFrame:
        """Scraped samples (`ts`, `instance`, `name`, `labels`, `value`) of the given names, oldest first."""
        ...

    def alerts(self, since=None, until=None) -> pd.DataFrame:
        """Alert transitions (firing, resolved), newest first."""
        ...


class Lookups(Protocol):
    """What alert signals and the collector look up: small answers over a window or a few keys."""

    def instance_counter_before(
        self, column: str, ts: float, *, instances: Iterable[str] | None = None
    ) -> dict[str, float]:
        """Per instance (of `instances`; None: every one): the latest value of an instance snapshot counter (e.g.
        `preemptions_total`) before `ts`, where it has one."""
        ...

    def restored_blocks(self, since: float, until: float) -> pd.DataFrame:
        """Per instance: blocks stored in the window (`stored`) and those among them that brought back a block lost
        there (`restored`), over the rows written with it known (`kv_events.restored`)."""
        ...

    def block_lifetimes(self, since: float, until: float) -> pd.DataFrame:
        """Blocks lost in the window with a known `lifetime_s`: the time since the block was stored on its instance
        and tier (one row per loss, its first owner's)."""
        ...

    def latest_kv_ts(self, instance: str) -> float | None:
        """The time of the instance's latest KV event (None: it has none)."""
        ...

    def block_history(self, instance: str, since: float, until: float) -> pd.DataFrame:
        """The instance's block stores, losses and clears with `since <= ts < until`, oldest first (`ts`, `kind`,
        `block_hash`, `medium`, `group_idx`): what a restarted collector's block clocks are rebuilt from, a window at a
        time (`collectors.kv.rebuild.rebuild_clocks`)."""
        ...

    def cached_prompt_tokens(self, since: float, until: float) -> pd.DataFrame:
        """Per instance, sums over the requests that say what was cached: `requests`, `cached_tokens`,
        `prompt_tokens`."""
        ...

    def session_idle_losses(self, until: float) -> pd.DataFrame:
        """Every session snapshot up to `until` with its running count of blocks lost while idle."""
        ...

    def step_counts(self, since: float, until: float, *, exclude_errors: tuple[str, ...] = ()) -> tuple[int, int]:
        """(steps, failed steps) started in the window; failures whose `error_type` is excluded not counted."""
        ...

    def verdict_counts(self, since=None, until=None) -> tuple[int, int]:
        """(decided, weighed): the steps started in the window with a decided verdict, and of them those with a slow
        verdict (`slow` not null: a row decided before every step was has none)."""
        ...

    def latest_alert_states(self) -> pd.DataFrame:
        """The latest row of every (rule, instance, session) alert key."""
        ...

    def session_ends(self, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, float]:
        """session id -> `ended_at`, for the given sessions that have ended."""
        ...

    def session_step_counts(self, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, tuple[int, int]]:
        """session id -> (the next step index, failed steps so far), for the given sessions that have steps."""
        ...

    def trace_sessions(self, trace_ids: Iterable[str], *, chunk: int = 500) -> dict[str, str]:
        """trace id -> session id, from the agent steps recorded with those trace ids."""
        ...


class Store(Protocol):
    """An open store: its reads, its lookups, and what the writer (`kvobs.store.StoreWriter`) calls."""

    url: str
    batch_rows: int  # rows per write the writer aims at
    flush_interval_s: float  # the longest a row waits in the writer

    @property
    def reads(self) -> Reads: ...

    @property
    def lookups(self) -> Lookups: ...

    @property
    def leases(self) -> Leases:
        """Which writer holds which instance (`kvobs.store.leases`)."""
        ...

    @property
    def dialect(self) -> str:
        """The database's name, for people (sqlite, postgresql, clickhouse); never a branch outside the backend."""
        ...

    def write(self, batch: Batch, *, token: str | None = None) -> None:
        """Write (op, records) pairs at once; a batch retried with the same `token` is stored once where the
        backend can tell."""
        ...

    def is_unreachable(self, exc: BaseException) -> bool:
        """Whether `exc` means the database cannot be reached (the writer spools and retries) rather than bad rows."""
        ...

    def expire_kv_events(self, before_ts: float) -> int:
        """Drop KV events older than `before_ts` (whole days on ClickHouse); rows dropped."""
        ...

    def expire_progress(self, before_ts: float) -> int:
        """Drop the progress marks (`PROGRESS_TABLES`: `lookup_progress`, `verdict_progress`) last updated before
        `before_ts`, those of replicas and keepers long gone (a collector's keeper is one a process); rows dropped."""
        ...

    def close(self) -> None: ...


def missing_store(url: str, path: str) -> ValueError:
    """A reader's error for a store whose file (SQLite) or directory (chDB) is not there: one wording for both
    backends (here, where they meet, so neither imports the module that opens them)."""
    return ValueError(
        f"no store at {url}: {Path(path).resolve()} does not exist (a misspelt URL? kvobs serve, collect, agents and "
        "demo create it)"
    )
