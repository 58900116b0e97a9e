"""Store fixtures on both backends: a SQLite file, and a fresh schema in the local PostgreSQL (database `test`).

Registered for every test directory by tests/conftest.py; `any_store` adds chDB."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text

from kvobs.store import open_store

POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def postgres_url(schema: str) -> str:
    """The local PostgreSQL's URL with `schema` as its search path (a schema of `postgres_schema`)."""
    return f"{POSTGRES}?options=-csearch_path%3D{schema}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kvobs.db'}"
        return
    with postgres_schema() as schema:
        yield postgres_url(schema)


@contextmanager
def postgres_schema():
    """A fresh schema in the local PostgreSQL, dropped afterwards."""
    schema = f"kvobs_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield schema
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql", "chdb"])
def any_store(request, tmp_path):
    """A fresh store on each of the three backends: SQLite, the local PostgreSQL, chDB."""
    if request.param == "postgresql":
        with postgres_schema() as schema:
            store = open_store(postgres_url(schema))
            yield store
            store.close()
        return
    store = open_store(
        f"sqlite:///{tmp_path / 'kvobs.db'}" if request.param == "sqlite" else f"chdb:///{tmp_path / 'ch'}"
    )
    yield store
    store.close()


@pytest.fixture
def store(store_url):
    s = open_store(store_url)
    yield s
    s.close()


def copy_store(source, target) -> None:
    """Every row of `source`'s tables and rollups into `target` (SQL stores), for a test that changes a copy."""
    from sqlalchemy import select

    from kvobs.store.schema import ROLLUPS, TABLES

    with source.session() as src, target.session() as dst, dst.begin():
        for row_class in (*TABLES.values(), *ROLLUPS.values()):  # the rollups are what the pages read
            for row in src.scalars(select(row_class)).all():
                src.expunge(row)
                dst.merge(row)
