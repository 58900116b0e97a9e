"""Unsigned 64-bit block hashes on every SQL backend: NUMERIC(20) on PostgreSQL; on SQLite, whose integers are
signed 64-bit, the signed integer with the same 8 bytes (`kvobs.store.schema`'s docstring gives the SQL to read one
back)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Numeric
from sqlalchemy.types import TypeDecorator

MAX_UINT64 = 2**64 - 1
MAX_INT64 = 2**63 - 1
TWO_64 = 2**64


class UInt64(TypeDecorator):
    """An unsigned 64-bit integer stored losslessly on every backend: NUMERIC(20) on PostgreSQL, the signed 64-bit
    integer with the same bits on SQLite (8 bytes; equality, GROUP BY and joins work on it unchanged)."""

    impl = BigInteger
    cache_ok = True

    def load_dialect_impl(self, dialect):
        if dialect.name == "postgresql":
            return dialect.type_descriptor(Numeric(20, 0))
        return dialect.type_descriptor(BigInteger())

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        value = int(value)
        return value if dialect.name == "postgresql" and 0 <= value <= MAX_UINT64 else as_int64(value)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        value = int(value)
        return value + TWO_64 if value < 0 else value

    @staticmethod
    def column_from_db(values) -> list:
        """`process_result_value` of a whole column read from any SQL backend (SQLite's signed int, PostgreSQL's
        Decimal)."""
        return [v if v is None or type(v) is int and v >= 0 else int(v) + TWO_64 if v < 0 else int(v) for v in values]


def as_int64(value: int) -> int:
    """An unsigned 64-bit value as SQLite stores it: the signed integer with the same 64 bits."""
    if 0 <= value <= MAX_INT64:
        return value
    if MAX_INT64 < value <= MAX_UINT64:
        return value - TWO_64
    raise ValueError(f"block hash {value} is not an unsigned 64-bit integer")


def as_int64_column(values: list) -> list:
    """`as_int64` of a column at once (None stays None): how a column of hashes is bound on SQLite."""
    return [v if v is None or 0 <= v <= MAX_INT64 else as_int64(v) for v in values]


def checked_uint64_column(values: list) -> list:
    """A column of hashes as PostgreSQL's NUMERIC(20) holds them (as they are), refused as `UInt64` refuses a value
    that is no unsigned 64-bit integer (NUMERIC(20) would take 2**64)."""
    for v in values:
        if v is not None and not 0 <= v <= MAX_INT64:
            as_int64(v)  # raises for a value beyond 64 bits, as it does on SQLite
    return values
