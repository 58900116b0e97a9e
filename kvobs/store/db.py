"""Open a store by URL and migrate it to the latest schema.

    store = open_store("sqlite:///kvobs.db")      # the embedded default (a file, WAL mode)
    store = open_store("postgresql://user@host/db")    # one server
    store = open_store("clickhouse://user:pw@host:8123/kvobs")   # a fleet (kvobs.store.clickhouse)
    store = open_store("chdb:///var/lib/kvobs/ch")     # ClickHouse's engine in this process (one process at a time)

The URL comes from the caller, `--store`, or `KVOBS_STORE_URL`. `postgresql://` is read as
`postgresql+psycopg://`. Directory and file paths follow SQLAlchemy's SQLite form: three slashes and a relative
path, four for an absolute one. Opening runs the migrations (Alembic's `upgrade head` on SQL, versioned DDL on
ClickHouse), so a store is always at the schema this code expects. Every store is a `kvobs.store.interface.Store`:
its `reads` and `lookups` answer the pages, analytics and the collector, and it takes batches from
`kvobs.store.StoreWriter`. A new backend is a module with classes for those protocols and an entry in `BACKENDS`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from kvobs.semconv.endpoints import DEFAULT_STORE_URL, STORE_URL_ENV  # noqa: F401 (re-exported)
from kvobs.store.interface import Store

# URL scheme -> "module:function" that opens a store of it: open(url, *, migrate, must_exist) -> Store
BACKENDS = {
    "sqlite": "kvobs.store.sql.store:open_sql",
    "postgresql+psycopg": "kvobs.store.sql.store:open_sql",
    "clickhouse": "kvobs.store.clickhouse.store:open_clickhouse",
    "chdb": "kvobs.store.clickhouse.store:open_clickhouse",
}
ALIASES = {"postgresql": "postgresql+psycopg"}  # schemes people write -> the one opened

if TYPE_CHECKING:  # each opener in BACKENDS, so the type checker holds what it returns to `Store` (tests/test_types.py)
    from kvobs.store.clickhouse.store import open_clickhouse
    from kvobs.store.sql.store import open_sql

    OPENERS: tuple[Callable[..., Store], ...] = (open_sql, open_clickhouse)
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
    scheme = ALIASES.get(parsed.drivername, parsed.drivername)
    if scheme not in BACKENDS:
        raise ValueError(f"unsupported store {parsed.drivername!r} in {url!r}; use one of {EXAMPLES}")
    parsed = parsed.set(drivername=scheme)
    return parsed.render_as_string(hide_password=False)


def redacted_url(url: str) -> str:
    """The URL as shown to people: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


# the backends whose database many processes write at once (a server); SQLite and chDB take one writing process
MANY_WRITERS = frozenset({"postgresql+psycopg", "clickhouse"})


def takes_many_writers(url: str) -> bool:
    """Whether several processes may each write the store at `url` directly (PostgreSQL, a ClickHouse server)."""
    return make_url(normalize_url(store_url(url))).drivername in MANY_WRITERS


def open_store(url: str | None = None, *, migrate: bool = True, must_exist: bool = False) -> Store:
    """Connect, migrate to the latest schema, and return the store (`SqlStore` or `ClickHouseStore`: the backend
    `BACKENDS` names for the URL's scheme, imported only then).

    `must_exist`: a reader's open (alerts, what-if, the dashboard): a SQLite file or chDB directory that is not there
    is an error, not a new empty store (a misspelt `sqlite:///kvosb.db` would otherwise show nothing, silently).

    Raises:
        ValueError: unsupported URL scheme; a chDB directory another process holds; with `must_exist`, no such
            SQLite file or chDB directory.
        sqlalchemy.exc.OperationalError, kvobs.store.clickhouse.StoreUnreachable: the database cannot be reached.
    """
    url = normalize_url(store_url(url))
    module, _, function = BACKENDS[make_url(url).drivername].partition(":")
    opener = getattr(importlib.import_module(module), function)
    return opener(url, migrate=migrate, must_exist=must_exist)
