"""Open a store by URL and migrate it to the latest schema.

    store = open_store("sqlite:///kvobs.db")      # the embedded default (a file, WAL mode)
    store = open_store("postgresql://user@host/db")    # one server
    store = open_store("clickhouse://user:pw@host:8123/kvobs")   # a fleet (kvobs.store.clickhouse)
    store = open_store("chdb:///var/lib/kvobs/ch")     # ClickHouse's engine in this process (one process at a time)

The URL comes from the caller, `--store`, or `KVOBS_STORE_URL`. `postgresql://` is read as
`postgresql+psycopg://`. Directory and file paths follow SQLAlchemy's SQLite form: three slashes and a relative
path, four for an absolute one. Opening runs the migrations (Alembic's `upgrade head` on SQL, versioned DDL on
ClickHouse), so a store is always at the schema this code expects. Every store answers `kvobs.store.queries` and
takes batches from `kvobs.store.StoreWriter`; `Store.engine` (SQLAlchemy) exists on SQL stores only.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from kvobs.semconv.endpoints import DEFAULT_STORE_URL, STORE_URL_ENV  # noqa: F401 (re-exported)
from kvobs.store.sql_write import Batch, SqlBatchWriter, is_unreachable

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")
SQL_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")
CLICKHOUSE_SCHEMES = ("clickhouse", "chdb")
EXAMPLES = "sqlite:///kvobs.db, postgresql://user@host/db, clickhouse://user@host:8123/db, chdb:///dir"


def store_url(url: str | None = None) -> str:
    """The URL to use: the argument, else `KVOBS_STORE_URL`, else `sqlite:///kvobs.db`."""
    return url or os.environ.get(STORE_URL_ENV) or DEFAULT_STORE_URL


def normalize_url(url: str) -> str:
    """Validate the scheme and pick the psycopg driver for PostgreSQL.

    Raises:
        ValueError: an unparseable URL or an unsupported database.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(f"not a store URL: {url!r} (examples: {EXAMPLES})") from exc
    if parsed.drivername not in SQL_SCHEMES + CLICKHOUSE_SCHEMES:
        raise ValueError(f"unsupported store {parsed.drivername!r} in {url!r}; use one of {EXAMPLES}")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def redacted_url(url: str) -> str:
    """The URL as shown to people: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


@dataclass
class Store:
    """A SQL store (SQLite, PostgreSQL) through SQLAlchemy."""

    url: str
    engine: Engine
    session: sessionmaker[Session]
    batch_rows: int = 5000  # rows per transaction the writer aims at
    flush_interval_s: float = 0.5

    def __post_init__(self) -> None:
        self._batches = SqlBatchWriter(self.engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def write(self, batch: Batch, *, token: str | None = None) -> None:
        """Write a batch of (op, records) in one transaction (`token` is for stores that deduplicate retries)."""
        self._batches.write(batch)

    def is_unreachable(self, exc: BaseException) -> bool:
        return is_unreachable(exc)

    def expire_kv_events(self, before_ts: float, *, chunk: int = 50_000) -> int:
        """Delete `kv_events` rows older than `before_ts` in chunks (one transaction each, by the `ts` index, so the
        writer is never held up for long); rows deleted."""
        from sqlalchemy import delete, select

        from kvobs.store.schema import KVEventRow

        total = 0
        while True:
            with self.engine.begin() as conn:
                ids = select(KVEventRow.id).where(KVEventRow.ts < before_ts).order_by(KVEventRow.ts).limit(chunk)
                deleted = conn.execute(delete(KVEventRow).where(KVEventRow.id.in_(ids.scalar_subquery()))).rowcount
            total += deleted
            if deleted < chunk:
                return total

    def close(self) -> None:
        self.engine.dispose()


def open_store(url: str | None = None, *, migrate: bool = True, must_exist: bool = False):
    """Connect, migrate to the latest schema, and return the store (`Store`, or `ClickHouseStore`).

    `must_exist`: a reader's open (alerts, what-if, the dashboard): a SQLite file that is not there is an error, not
    a new empty store (a misspelt `sqlite:///kvosb.db` would otherwise show nothing, silently).

    Raises:
        ValueError: unsupported URL scheme; a chDB directory another process holds; with `must_exist`, no such
            SQLite file.
        sqlalchemy.exc.OperationalError, kvobs.store.clickhouse.StoreUnreachable: the database cannot be reached.
    """
    url = normalize_url(store_url(url))
    if make_url(url).drivername in CLICKHOUSE_SCHEMES:
        from kvobs.store.clickhouse.store import open_clickhouse

        return open_clickhouse(url, migrate=migrate)
    parsed = make_url(url)
    file = parsed.database if parsed.get_backend_name() == "sqlite" and parsed.database != ":memory:" else None
    if must_exist and file and not Path(file).exists():
        raise ValueError(
            f"no store at {url}: {Path(file).resolve()} does not exist (a misspelt URL? kvobs serve, "
            "collect, agents and demo create it)"
        )
    engine = create_engine(url, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    if migrate:
        upgrade(engine)
    return Store(url, engine, sessionmaker(engine, expire_on_commit=False))


def upgrade(engine: Engine, revision: str = "head") -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers (the dashboard) never block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA cache_size=-65536")  # 64 MiB of pages: index inserts of random block hashes stay in memory
    cursor.close()
