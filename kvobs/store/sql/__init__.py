"""The SQL backend (SQLite, PostgreSQL) through SQLAlchemy Core: the store, its reads, lookups, writes and leases."""
