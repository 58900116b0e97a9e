"""Open a store by URL: SQLite file by default (WAL mode), PostgreSQL at scale; migrate to the latest schema.

    store = open_store("sqlite:///kvobs.db")             # or postgresql+psycopg://user@host/db
    with store.session() as s: s.scalars(select(StepRow)).all()

The URL comes from the caller, `--store`, or `KVOBS_STORE_URL`. `postgresql://` is read as
`postgresql+psycopg://`. Opening runs Alembic's `upgrade head`, so a store is always at the
schema this code expects.
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

log = logging.getLogger(__name__)

DEFAULT_STORE_URL = "sqlite:///kvobs.db"
STORE_URL_ENV = "KVOBS_STORE_URL"
MIGRATIONS = Path(__file__).with_name("migrations")
SUPPORTED = ("sqlite", "postgresql", "postgresql+psycopg")


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
        raise ValueError(f"not a store URL: {url!r} (examples: sqlite:///kvobs.db, postgresql://user@host/db)") from exc
    if parsed.drivername not in SUPPORTED:
        raise ValueError(
            f"unsupported store {parsed.drivername!r} in {url!r}; use sqlite:///path.db or postgresql://user@host/db"
        )
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


@dataclass
class Store:
    url: str
    engine: Engine
    session: sessionmaker[Session]

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()


def open_store(url: str | None = None, *, migrate: bool = True) -> Store:
    """Connect, migrate to the latest schema, and return the store.

    Raises:
        ValueError: unsupported URL scheme.
        sqlalchemy.exc.OperationalError: the database cannot be reached.
    """
    url = normalize_url(store_url(url))
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
