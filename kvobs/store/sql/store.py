"""A SQL store (SQLite, PostgreSQL) through SQLAlchemy: `SqlStore`, opened and migrated by `open_sql`.

Opening runs Alembic's `upgrade head`, so the store is always at the schema this code expects. SQLite runs in WAL
mode (the dashboard's reads never block the writer). `SqlStore.engine` (SQLAlchemy) is for SQL code and tests; the
rest of kvobs uses the `kvobs.store.interface.Store` it implements.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, delete, event, make_url, select, text
from sqlalchemy.orm import Session, sessionmaker

from kvobs.store.interface import Batch, Lookups, Reads, missing_store
from kvobs.store.leases import Leases
from kvobs.store.rollups import PREEMPTIONS
from kvobs.store.schema import KVEventRow, LookupProgressRow, VerdictProgressRow
from kvobs.store.sql.leases import SqlLeases
from kvobs.store.sql.lookups import SqlLookups
from kvobs.store.sql.reads import SqlReads
from kvobs.store.sql.write import SqlBatchWriter, is_unreachable

MIGRATIONS = Path(__file__).parents[1] / "migrations"  # (kvobs/store/migrations)


@dataclass
class SqlStore:
    """`kvobs.store.interface.Store` on SQLite or PostgreSQL."""

    url: str
    engine: Engine
    session: sessionmaker[Session]
    batch_rows: int = 5000  # rows per transaction the writer aims at
    flush_interval_s: float = 0.5

    def __post_init__(self) -> None:
        self._batches = SqlBatchWriter(
            self.engine, lambda names, ts: self.lookups.instance_counter_before(PREEMPTIONS, ts, instances=names)
        )
        self.reads: Reads = SqlReads(self)
        self.lookups: Lookups = SqlLookups(self)
        self.leases: Leases = SqlLeases(self)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def write(self, batch: Batch, *, token: str | None = None) -> None:
        """Write a batch of (op, records) in one transaction (`token` is for stores that deduplicate retries)."""
        self._batches.write(batch)

    def is_unreachable(self, exc: BaseException) -> bool:
        return is_unreachable(exc)

    def write_alone(self) -> None:
        """Say that no other thread of this process competes for the interpreter lock while it writes (a process
        that only writes: `kvobs.store.sql.write_process`), so SQLite's KV events go by the driver's executemany."""
        self._batches.alone = True

    def expire_kv_events(self, before_ts: float, *, chunk: int = 50_000) -> int:
        """Delete `kv_events` rows older than `before_ts` in chunks (one transaction each, by the `ts` index, so the
        writer is never held up for long); rows deleted."""
        total = 0
        while True:
            with self.engine.begin() as conn:
                ids = select(KVEventRow.id).where(KVEventRow.ts < before_ts).order_by(KVEventRow.ts).limit(chunk)
                deleted = conn.execute(delete(KVEventRow).where(KVEventRow.id.in_(ids.scalar_subquery()))).rowcount
            total += deleted
            if deleted < chunk:
                return total

    def expire_progress(self, before_ts: float) -> int:
        """Delete the progress marks (`rows.PROGRESS_TABLES`) last updated before `before_ts`; rows deleted."""
        with self.engine.begin() as conn:
            return sum(
                conn.execute(delete(row).where(row.updated_at < before_ts)).rowcount
                for row in (LookupProgressRow, VerdictProgressRow)
            )

    def close(self) -> None:
        self.engine.dispose()


def open_sql(url: str, *, migrate: bool = True, must_exist: bool = False) -> SqlStore:
    """Connect to a normalised SQLite or PostgreSQL URL and migrate (see `kvobs.store.db.open_store`)."""
    parsed = make_url(url)
    file = parsed.database if parsed.get_backend_name() == "sqlite" and parsed.database != ":memory:" else None
    if must_exist and file and not Path(file).exists():
        raise missing_store(url, file)
    engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    if migrate:
        upgrade(engine)
    return SqlStore(url, engine, sessionmaker(engine, expire_on_commit=False))


# The key of the PostgreSQL advisory lock that migrations hold (any 64-bit constant of our own).
MIGRATION_LOCK = 0x6B766F6273_0001


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Alembic's upgrade, one process at a time: several writers started at once on a new store (collectors of a
    fleet, an engine beside them) would each create the tables, and all but one fail. On PostgreSQL an advisory lock
    held by the migration's transaction serialises them; on SQLite the transaction takes the write lock first
    (`BEGIN IMMEDIATE`), so a second migration waits (`busy_timeout`) and then finds the schema at head."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if revision == "head":  # at head already (every open but the first): no lock taken, a plain read
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
        if current is not None and current == ScriptDirectory.from_config(config).get_current_head():
            return
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        elif engine.dialect.name == "sqlite":
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


# Pages the write-ahead log holds before a commit checkpoints it (SQLite's default: 1,000): rarer checkpoints write a
# hot index page (the random block hashes') once for many commits (measured by bench/collector_ingest.py).
WAL_CHECKPOINT_PAGES = 20_000


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers (the dashboard) never block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA cache_size=-65536")  # 64 MiB of pages: index inserts of random block hashes stay in memory
    cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
    cursor.close()
