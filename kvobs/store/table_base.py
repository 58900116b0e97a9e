"""The base every store table is declared on (`kvobs.store.schema` and `kvobs.store.rollup_tables`): one metadata,
which Alembic and `create_all` read whole once `kvobs.store.schema` is imported."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer
from sqlalchemy.orm import DeclarativeBase

ROW_ID = BigInteger().with_variant(Integer, "sqlite")  # SQLite auto-increments INTEGER PRIMARY KEY only


class Base(DeclarativeBase):
    pass
